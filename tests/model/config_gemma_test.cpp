// config.json of the Gemma family: the released checkpoints' configs (as shipped by Google on
// the hub, abridged to the keys llmesh or HF read), transformers v5's per-layer-type rotary,
// and the refusals.
#include <cmath>

#include "config_fixture.hpp"

namespace llmesh::model {
namespace {

using testing::json;
using testing::parse_err;
using testing::parse_ok;

/// google/gemma-2b's config.json (hidden_act "gelu", no hidden_activation: HF runs the tanh GELU).
json gemma_2b() {
  return json::parse(R"({"architectures": ["GemmaForCausalLM"], "attention_bias": false, "bos_token_id": 2,
    "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu", "hidden_size": 2048, "intermediate_size": 16384,
    "max_position_embeddings": 8192, "model_type": "gemma", "num_attention_heads": 8, "num_hidden_layers": 18,
    "num_key_value_heads": 1, "pad_token_id": 0, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 10000.0,
    "torch_dtype": "bfloat16", "vocab_size": 256000})");
}

/// google/gemma-2-2b-it's.
json gemma2_2b() {
  return json::parse(R"({"architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attn_logit_softcapping": 50.0,
    "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 107], "final_logit_softcapping": 30.0,
    "head_dim": 256, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
    "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
    "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "bfloat16",
    "vocab_size": 256000})");
}

/// google/gemma-3-1b-it's.
json gemma3_1b() {
  return json::parse(R"({"architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attn_logit_softcapping": null,
    "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106], "final_logit_softcapping": null,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
    "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512,
    "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "vocab_size": 262144})");
}

TEST(ParseGemmaConfig, Gemma) {
  auto c = parse_ok(gemma_2b());
  EXPECT_EQ(c.arch, architecture::gemma);
  EXPECT_TRUE(c.gemma.on);
  EXPECT_FALSE(c.gemma.sandwich_norms);
  EXPECT_TRUE(c.tie_embeddings);  // GemmaConfig's default: the checkpoint has no lm_head
  EXPECT_EQ(c.head_dim, 256u);
  EXPECT_EQ(c.n_kv_heads, 1u);
  EXPECT_EQ(c.attn_scale, 0.0);  // 1/sqrt(head_dim)
  EXPECT_EQ(c.gemma.attn_softcap, 0.0f);
  EXPECT_EQ(c.gemma.final_softcap, 0.0f);
  EXPECT_TRUE(c.sliding_layers.empty());
  EXPECT_EQ(layer_window(c, 0), 0u);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(std::string(cpu_only_family(c)), "Gemma models");

  auto j = gemma_2b();
  j.erase("head_dim");  // GemmaConfig defaults it to 256, not hidden / heads
  EXPECT_EQ(parse_ok(j).head_dim, 256u);
  j["tie_word_embeddings"] = false;
  EXPECT_FALSE(parse_ok(j).tie_embeddings);
}

TEST(ParseGemmaConfig, Gemma2AlternatesWindowsAndSoftCaps) {
  auto c = parse_ok(gemma2_2b());
  EXPECT_EQ(c.arch, architecture::gemma2);
  EXPECT_TRUE(c.gemma.sandwich_norms);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_FLOAT_EQ(c.gemma.attn_softcap, 50.0f);
  EXPECT_FLOAT_EQ(c.gemma.final_softcap, 30.0f);
  EXPECT_DOUBLE_EQ(c.attn_scale, 1.0 / 16.0);
  EXPECT_EQ(c.sliding_window, 4096u);
  ASSERT_EQ(c.sliding_layers.size(), 26u);
  for (size_t i = 0; i < 26; ++i) {  // HF: is_sliding = not bool(layer_idx % 2)
    EXPECT_EQ(layer_window(c, i), i % 2 == 0 ? 4096u : 0u) << i;
  }
  EXPECT_FALSE(c.rope_local.has_value());
  EXPECT_EQ(c.eos_ids, (std::vector<int32_t>{1, 107}));

  auto j = gemma2_2b();  // Gemma2Config's defaults: caps 50 / 30, query_pre_attn_scalar 256
  j.erase("attn_logit_softcapping");
  j.erase("final_logit_softcapping");
  j.erase("query_pre_attn_scalar");
  c = parse_ok(j);
  EXPECT_FLOAT_EQ(c.gemma.attn_softcap, 50.0f);
  EXPECT_FLOAT_EQ(c.gemma.final_softcap, 30.0f);
  EXPECT_DOUBLE_EQ(c.attn_scale, 1.0 / 16.0);
  j["final_logit_softcapping"] = nullptr;  // null: none
  j["query_pre_attn_scalar"] = 144;          // Gemma 2 27B's hidden / heads
  c = parse_ok(j);
  EXPECT_EQ(c.gemma.final_softcap, 0.0f);
  EXPECT_DOUBLE_EQ(c.attn_scale, 1.0 / 12.0);
  j["sliding_window"] = nullptr;  // no window: every layer global
  c = parse_ok(j);
  for (size_t i = 0; i < 26; ++i) EXPECT_EQ(layer_window(c, i), 0u);
}

TEST(ParseGemmaConfig, Gemma3HasLocalRotaryAndQkNorm) {
  auto c = parse_ok(gemma3_1b());
  EXPECT_EQ(c.arch, architecture::gemma3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.gemma.sandwich_norms);
  EXPECT_EQ(c.gemma.attn_softcap, 0.0f);
  EXPECT_EQ(c.gemma.final_softcap, 0.0f);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  ASSERT_TRUE(c.rope_local.has_value());
  EXPECT_DOUBLE_EQ(c.rope_local->theta, 1e4);
  EXPECT_EQ(c.rope_local->head_dim, 256u);
  for (size_t i = 0; i < 26; ++i) {  // HF: is_sliding = bool((layer_idx + 1) % sliding_window_pattern)
    const bool sliding = (i + 1) % 6 != 0;
    EXPECT_EQ(layer_window(c, i), sliding ? 512u : 0u) << i;
    EXPECT_DOUBLE_EQ(layer_rope(c, i).theta, sliding ? 1e4 : 1e6) << i;
  }
  // Gemma 3 4B's text part: the global layers' rotary is linearly scaled, the local one not.
  auto j = gemma3_1b();
  j["rope_scaling"] = {{"factor", 8.0}, {"rope_type", "linear"}};
  c = parse_ok(j);
  EXPECT_DOUBLE_EQ(c.rope.linear_factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_local->linear_factor, 1.0);
}

TEST(ParseGemmaConfig, MissingKeysTakeTheConfigClassesDefaults) {
  auto j = gemma3_1b();
  j.erase("rope_theta");
  j.erase("sliding_window");
  j.erase("max_position_embeddings");
  auto c = parse_ok(j);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.sliding_window, 4096u);
  EXPECT_EQ(c.max_positions, 131072u);
  j = gemma2_2b();
  j.erase("sliding_window");
  j.erase("max_position_embeddings");
  c = parse_ok(j);
  EXPECT_EQ(layer_window(c, 0), 4096u);
  EXPECT_EQ(c.max_positions, 8192u);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e4);
}

TEST(ParseGemmaConfig, Gemma3SlidingLayersKeepTheirRotaryWithoutAWindow) {
  auto j = gemma3_1b();  // HF picks the rotary by the layer's type, whatever the window
  j["sliding_window"] = nullptr;
  auto c = parse_ok(j);
  EXPECT_EQ(layer_window(c, 0), 0u);
  EXPECT_DOUBLE_EQ(layer_rope(c, 0).theta, 1e4);
  EXPECT_DOUBLE_EQ(layer_rope(c, 5).theta, 1e6);
}

TEST(ParseGemmaConfig, LayerTypesOverrideThePattern) {
  auto j = gemma3_1b();
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
  auto c = parse_ok(j);
  EXPECT_EQ(layer_window(c, 0), 0u);
  EXPECT_EQ(layer_window(c, 1), 512u);
  EXPECT_EQ(layer_window(c, 2), 0u);
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_NE(parse_err(j).message.find("layer_types"), std::string::npos);
  j["layer_types"] = {"full_attention", "chunked_attention", "full_attention"};
  EXPECT_NE(parse_err(j).message.find("layer_types"), std::string::npos);
}

TEST(ParseGemmaConfig, TransformersV5RotaryPerLayerType) {
  auto j = gemma3_1b();
  j.erase("rope_theta");
  j.erase("rope_local_base_freq");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1000000.0}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  auto c = parse_ok(j);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rope.linear_factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_local->theta, 1e4);
  j["rope_parameters"]["sliding_attention"]["rope_type"] = "linear";
  EXPECT_EQ(parse_err(j).code, errc::unsupported);
  j["rope_parameters"]["sliding_attention"] = {{"type", "linear"}, {"factor", 2.0}};  // the legacy key
  EXPECT_EQ(parse_err(j).code, errc::unsupported);
  j["rope_parameters"]["sliding_attention"] = {{"rope_type", nullptr}, {"rope_theta", 5000.0}};
  EXPECT_DOUBLE_EQ(parse_ok(j).rope_local->theta, 5000.0);
  j["rope_parameters"]["sliding_attention"] = 3;
  EXPECT_EQ(parse_err(j).code, errc::invalid_request);
}

TEST(ParseGemmaConfig, Refusals) {
  auto j = gemma2_2b();
  j["hidden_activation"] = "gelu";  // exact erf GELU
  EXPECT_NE(parse_err(j).message.find("hidden_activation"), std::string::npos);
  j = gemma3_1b();
  j["use_bidirectional_attention"] = true;  // EmbeddingGemma
  EXPECT_EQ(parse_err(j).code, errc::unsupported);
  j = gemma3_1b();
  j["architectures"] = {"Gemma3ForConditionalGeneration"};  // its language model is text_config (multimodal_test.cpp)
  auto e = parse_err(j);
  EXPECT_EQ(e.code, errc::invalid_request);
  EXPECT_NE(e.message.find("missing field 'text_config'"), std::string::npos);
  j = gemma2_2b();
  j["attn_logit_softcapping"] = -1.0;
  EXPECT_EQ(parse_err(j).code, errc::invalid_request);
  j = gemma2_2b();
  j["query_pre_attn_scalar"] = 0;
  EXPECT_EQ(parse_err(j).code, errc::invalid_request);
  j = gemma3_1b();
  j["sliding_window_pattern"] = 0;
  EXPECT_EQ(parse_err(j).code, errc::invalid_request);
}

TEST(ParseConfig, LinearRopeScalingForAnyArchitecture) {
  auto j = testing::minimal_llama();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_DOUBLE_EQ(parse_ok(j).rope.linear_factor, 2.0);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 0.0}};
  EXPECT_EQ(parse_err(j).code, errc::invalid_request);
  j["rope_scaling"] = {{"type", "linear"}};
  EXPECT_EQ(parse_err(j).code, errc::invalid_request);
  EXPECT_EQ(parse_ok(testing::minimal_llama()).rope.linear_factor, 1.0);
}

}  // namespace
}  // namespace llmesh::model
