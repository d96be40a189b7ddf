// config.json parsing of the architectures after Llama, Mistral and Qwen2: Qwen3 (per-head q/k
// norms, head_dim 128 by default), Phi-3 (fused projections, sliding window, refused rope
// variants), mixtures of experts (Qwen3-MoE, Mixtral, Qwen2-MoE's shared expert), Granite's
// multipliers, and transformers v5's rope_parameters.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "config_fixture.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/shard_executor.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;
using testing::minimal_llama;
using testing::parse_err;
using testing::parse_ok;
using testing::with_arch;

TEST(ParseConfig, Qwen3NormalisesQAndKPerHead) {
  // Shaped like Qwen3-0.6B: head_dim 128 while hidden / heads is 64.
  json j = with_arch(minimal_llama(), "Qwen3ForCausalLM");
  j["hidden_size"] = 1024;
  j["num_attention_heads"] = 16;
  j["num_key_value_heads"] = 8;
  j["head_dim"] = 128;
  j["attention_bias"] = false;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = 28;
  j["rope_scaling"] = nullptr;
  j["rope_theta"] = 1000000;
  model_config c = parse_ok(j);
  EXPECT_EQ(c.arch, architecture::qwen3);
  EXPECT_EQ(c.arch_name, "Qwen3ForCausalLM");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.head_dim, 128u);
  EXPECT_EQ(c.sliding_window, 0u);
  EXPECT_FALSE(c.rope.llama3);
  j["attention_bias"] = true;  // Qwen3's attention_bias puts biases on q, k, v and o
  c = parse_ok(j);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
  j["use_sliding_window"] = true;
  auto r = parse_config(j.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::unsupported);
  EXPECT_NE(r.err().message.find("Qwen3ForCausalLM use_sliding_window"), std::string::npos) << r.err().message;
}

TEST(ParseConfig, Qwen3HeadDimDefaultsTo128AsInTransformers) {
  json j = with_arch(minimal_llama(), "Qwen3ForCausalLM");
  j.erase("head_dim");
  EXPECT_EQ(parse_ok(j).head_dim, 128u);
  EXPECT_EQ(parse_ok(with_arch(j, "Qwen2ForCausalLM")).head_dim, parse_ok(j).hidden / parse_ok(j).n_heads);
}

// transformers v5 writes rope_theta and rope_scaling together as rope_parameters.
TEST(ParseConfig, RopeParametersOfTransformersV5) {
  json j = minimal_llama();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  model_config c = parse_ok(j);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1000000.0);
  EXPECT_FALSE(c.rope.llama3);
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  c = parse_ok(j);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_TRUE(c.rope.llama3);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}, {"original_max_position_embeddings", 4096}};
  c = parse_ok(j);
  EXPECT_TRUE(c.rope.yarn);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.max_positions, 16384u);
  j["rope_parameters"] = {{"rope_type", "mrope"}, {"rope_theta", 10000.0}, {"factor", 4.0}};
  auto r = parse_config(j.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("'mrope'"), std::string::npos) << r.err().message;
  j["rope_parameters"] = {{"full_attention", {{"rope_theta", 1e6}}}, {"sliding_attention", {{"rope_theta", 1e4}}}};
  r = parse_config(j.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::unsupported);
  EXPECT_NE(r.err().message.find("rope_parameters"), std::string::npos) << r.err().message;
}

TEST(ParseConfig, Phi3HasFusedProjectionsAndASlidingWindow) {
  // Shaped like Phi-3-mini-4k-instruct.
  json j = with_arch(minimal_llama(), "Phi3ForCausalLM");
  j["sliding_window"] = 2047;
  j["original_max_position_embeddings"] = 4096;
  j["rope_scaling"] = nullptr;
  model_config c = parse_ok(j);
  EXPECT_EQ(c.arch, architecture::phi3);
  EXPECT_TRUE(c.fused_projections);
  EXPECT_EQ(c.sliding_window, 2047u);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.qk_norm);
  j["sliding_window"] = nullptr;
  EXPECT_EQ(parse_ok(j).sliding_window, 0u);
  j["partial_rotary_factor"] = 1.0;
  EXPECT_EQ(parse_ok(j).rope.head_dim, c.head_dim);
  j["partial_rotary_factor"] = 0.75;  // Phi-4-mini (config_rope_test.cpp has the rest)
  EXPECT_EQ(parse_ok(j).rope.head_dim, c.head_dim * 3 / 4);
  EXPECT_FALSE(parse_ok(minimal_llama()).fused_projections);
}

TEST(ParseConfig, MixturesOfExperts) {
  // Qwen3-30B-A3B's shape (the experts' size is moe_intermediate_size).
  json q = with_arch(minimal_llama(), "Qwen3MoeForCausalLM");
  q["moe_intermediate_size"] = 768;
  q["num_experts"] = 128;
  q["num_experts_per_tok"] = 8;
  q["norm_topk_prob"] = true;
  q["decoder_sparse_step"] = 1;
  q["mlp_only_layers"] = json::array();
  model_config c = parse_ok(q);
  EXPECT_EQ(c.arch, architecture::qwen3_moe);
  EXPECT_EQ(c.intermediate, 768u);
  EXPECT_EQ(c.moe.n_experts, 128u);
  EXPECT_EQ(c.moe.experts_per_token, 8u);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 128u);
  q["mlp_only_layers"] = {0};
  EXPECT_EQ(parse_err(q).code, errc::unsupported);
  q["mlp_only_layers"] = json::array();
  q["decoder_sparse_step"] = 2;
  EXPECT_EQ(parse_err(q).code, errc::unsupported);
  q["decoder_sparse_step"] = 1;
  q["num_experts_per_tok"] = 129;
  EXPECT_NE(parse_err(q).message.find("num_experts_per_tok"), std::string::npos);
  q.erase("num_experts");
  EXPECT_NE(parse_err(q).message.find("num_experts"), std::string::npos);
  // Mixtral-8x7B's: experts of intermediate_size, always renormalised, Mistral's window.
  json m = with_arch(minimal_llama(), "MixtralForCausalLM");
  m["num_local_experts"] = 8;
  m["num_experts_per_tok"] = 2;
  m["sliding_window"] = nullptr;
  c = parse_ok(m);
  EXPECT_EQ(c.arch, architecture::mixtral);
  EXPECT_EQ(c.intermediate, 160u);
  EXPECT_EQ(c.moe.n_experts, 8u);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(parse_ok(minimal_llama()).moe.n_experts, 0u);
}

TEST(ParseConfig, Qwen2MoeHasASharedExpert) {
  // Qwen/Qwen1.5-MoE-A2.7B's config.json (abridged).
  auto j = json::parse(R"({"architectures": ["Qwen2MoeForCausalLM"], "decoder_sparse_step": 1, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
    "model_type": "qwen2_moe", "moe_intermediate_size": 1408, "norm_topk_prob": false, "num_attention_heads": 16,
    "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "shared_expert_intermediate_size": 5632, "sliding_window": 32768,
    "tie_word_embeddings": false, "use_sliding_window": false, "vocab_size": 151936})");
  auto c = parse_ok(j);
  EXPECT_EQ(c.arch, architecture::qwen2_moe);
  EXPECT_EQ(c.intermediate, 1408u);  // each expert's
  EXPECT_EQ(c.moe.n_experts, 60u);
  EXPECT_EQ(c.moe.experts_per_token, 4u);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.shared_intermediate, 5632u);
  EXPECT_TRUE(c.qkv_bias);  // Qwen2's attention
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0u);
  EXPECT_NE(cpu_only_family(c), nullptr);
  j.erase("shared_expert_intermediate_size");  // Qwen2MoeConfig's default
  EXPECT_EQ(parse_ok(j).moe.shared_intermediate, 5632u);
  j["mlp_only_layers"] = {0};
  EXPECT_EQ(parse_err(j).code, errc::unsupported);
  j.erase("mlp_only_layers");
  j["use_sliding_window"] = true;
  EXPECT_EQ(parse_err(j).code, errc::unsupported);
  // Shards: the shared expert splits like the experts, and must split evenly.
  j["use_sliding_window"] = false;
  j["shared_expert_intermediate_size"] = 5633;
  c = parse_ok(j);
  auto l = make_shard_layout(c, 1, 2);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.err().message.find("shared_expert_intermediate_size"), std::string::npos);
  c.moe.shared_intermediate = 5632;
  l = make_shard_layout(c, 1, 2);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->shared0, 2816u);
  EXPECT_EQ(l->n_shared, 2816u);
}

TEST(ShardLayout, ExpertParallelGivesEachRankWholeExpertsAsVllmPlacesThem) {
  model_config c;
  c.hidden = 64;
  c.n_heads = 6;
  c.n_kv_heads = 6;
  c.vocab = 100;
  c.intermediate = 100;  // splits over no 3 ranks: expert-parallel does not split it
  c.moe.n_experts = 8;
  c.moe.experts_per_token = 2;
  c.moe.shared_intermediate = 30;
  auto sliced = make_shard_layout(c, 0, 3);
  ASSERT_FALSE(sliced.ok());
  EXPECT_NE(sliced.err().message.find("intermediate_size"), std::string::npos);
  const size_t expert0[] = {0, 3, 6}, n_experts[] = {3, 3, 2};  // 8 / 3, the first 8 % 3 ranks one more
  for (int r = 0; r < 3; ++r) {
    auto l = make_shard_layout(c, r, 3, true);
    ASSERT_TRUE(l.ok()) << l.err().message;
    EXPECT_TRUE(l->expert_parallel);
    EXPECT_EQ(l->expert0, expert0[r]);
    EXPECT_EQ(l->n_experts, n_experts[r]);
    EXPECT_EQ(l->inter0, 0u);
    EXPECT_EQ(l->n_inter, 100u);  // whole experts
    EXPECT_EQ(l->shared0, 10u * static_cast<size_t>(r));  // the shared expert still splits
    EXPECT_EQ(l->n_shared, 10u);
    EXPECT_EQ(l->n_heads, 2u);
  }
  c.intermediate = 99;
  auto tp1 = make_shard_layout(c, 0, 1, true);  // one rank: every expert, whole
  ASSERT_TRUE(tp1.ok());
  EXPECT_EQ(tp1->n_experts, 8u);
  EXPECT_EQ(tp1->n_inter, 99u);
  // Without the flag every rank runs every expert's slice.
  c.intermediate = 96;
  auto l = make_shard_layout(c, 2, 3);
  ASSERT_TRUE(l.ok());
  EXPECT_FALSE(l->expert_parallel);
  EXPECT_EQ(l->expert0, 0u);
  EXPECT_EQ(l->n_experts, 8u);
  EXPECT_EQ(l->inter0, 64u);
  EXPECT_EQ(l->n_inter, 32u);
  // More ranks than experts: refused by name.
  c.n_heads = 12;
  c.n_kv_heads = 12;
  c.intermediate = 120;
  c.moe.shared_intermediate = 0;
  auto many = make_shard_layout(c, 0, 12, true);
  ASSERT_FALSE(many.ok());
  EXPECT_EQ(many.err().code, errc::invalid_request);
  EXPECT_NE(many.err().message.find("at least as many experts as ranks"), std::string::npos) << many.err().message;
  // A dense model ignores the flag (as vLLM does) and splits its MLP.
  c.moe = {};
  auto dense = make_shard_layout(c, 1, 2, true);
  ASSERT_TRUE(dense.ok());
  EXPECT_FALSE(dense->expert_parallel);
  EXPECT_EQ(dense->inter0, 60u);
  EXPECT_EQ(dense->n_inter, 60u);
  EXPECT_EQ(dense->n_experts, 0u);
}

TEST(ParseConfig, GraniteHasItsMultipliers) {
  // ibm-granite/granite-3.0-2b-instruct's config.json (abridged).
  auto j = json::parse(R"({"architectures": ["GraniteForCausalLM"], "attention_bias": false, "attention_multiplier": 0.015625,
    "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 8192, "logits_scaling": 8.0, "max_position_embeddings": 4096, "mlp_bias": false,
    "model_type": "granite", "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
    "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
    "tie_word_embeddings": true, "vocab_size": 49155})");
  auto c = parse_ok(j);
  EXPECT_EQ(c.arch, architecture::granite);
  EXPECT_FLOAT_EQ(c.scaling.embedding, 12.0f);
  EXPECT_DOUBLE_EQ(c.attn_scale, 0.015625);
  EXPECT_FLOAT_EQ(c.scaling.residual, 0.22f);
  EXPECT_FLOAT_EQ(c.scaling.logits_divisor, 8.0f);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.head_dim, 64u);
  EXPECT_EQ(std::string(cpu_only_family(c)), "Granite models");
  for (const char* key : {"embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"}) {
    auto bad = j;
    bad[key] = 0.0;
    EXPECT_EQ(parse_err(bad).code, errc::invalid_request) << key;
    auto absent = j;
    absent.erase(key);  // GraniteConfig's defaults are 1
    EXPECT_TRUE(parse_config(absent.dump()).ok()) << key;
  }
  // The other architectures keep scale 1 and 1/sqrt(head_dim).
  c = parse_ok(minimal_llama());
  EXPECT_EQ(c.scaling.embedding, 1.0f);
  EXPECT_EQ(c.scaling.residual, 1.0f);
  EXPECT_EQ(c.scaling.logits_divisor, 1.0f);
  EXPECT_EQ(c.attn_scale, 0.0);
}

TEST(ParseConfig, SmolLM3sNoPeLayersAndWindow) {
  // Shaped like HuggingFaceTB/SmolLM3-3B's config.json (abridged): every fourth layer NoPE.
  json rope_layers = json::array();
  for (int i = 0; i < 36; ++i) rope_layers.push_back((i + 1) % 4 != 0 ? 1 : 0);
  json j = {{"architectures", {"SmolLM3ForCausalLM"}}, {"attention_bias", false}, {"eos_token_id", 128012},
            {"hidden_act", "silu"}, {"hidden_size", 2048}, {"intermediate_size", 11008}, {"max_position_embeddings", 65536},
            {"mlp_bias", false}, {"model_type", "smollm3"}, {"no_rope_layer_interval", 4}, {"no_rope_layers", rope_layers},
            {"num_attention_heads", 16}, {"num_hidden_layers", 36}, {"num_key_value_heads", 4}, {"rms_norm_eps", 1e-6},
            {"rope_scaling", nullptr}, {"rope_theta", 5000000.0}, {"sliding_window", nullptr}, {"use_sliding_window", false},
            {"vocab_size", 128256}};
  auto c = parse_ok(j);
  EXPECT_EQ(c.arch, architecture::smollm3);
  EXPECT_EQ(c.head_dim, 128u);
  EXPECT_TRUE(c.tie_embeddings);  // SmolLM3Config's default
  EXPECT_DOUBLE_EQ(c.rope.theta, 5e6);
  for (size_t i = 0; i < 36; ++i) {
    EXPECT_EQ(layer_nope(c, i), i % 4 == 3) << i;
    EXPECT_EQ(layer_window(c, i), 0u) << i;
  }
  EXPECT_EQ(cpu_only_family(c), nullptr);  // the CUDA backend skips the rotary on the NoPE layers too
  // Without the list: no_rope_layer_interval; the defaults are SmolLM3Config's (theta 2e6, 32768 positions).
  auto k = j;
  k.erase("no_rope_layers");
  k.erase("rope_theta");
  k.erase("max_position_embeddings");
  k["no_rope_layer_interval"] = 3;
  c = parse_ok(k);
  for (size_t i = 0; i < 36; ++i) EXPECT_EQ(layer_nope(c, i), i % 3 == 2) << i;
  EXPECT_DOUBLE_EQ(c.rope.theta, 2e6);
  EXPECT_EQ(c.max_positions, 32768u);
  // use_sliding_window: the NoPE layers slide (SmolLM3Config's layer_types), or layer_types' own.
  k = j;
  k["use_sliding_window"] = true;
  k["sliding_window"] = 4096;
  c = parse_ok(k);
  for (size_t i = 0; i < 36; ++i) EXPECT_EQ(layer_window(c, i), i % 4 == 3 ? 4096u : 0u) << i;
  json types = json::array();
  for (int i = 0; i < 36; ++i) types.push_back(i == 0 ? "sliding_attention" : "full_attention");
  k["layer_types"] = types;
  c = parse_ok(k);
  EXPECT_EQ(layer_window(c, 0), 4096u);
  EXPECT_EQ(layer_window(c, 3), 0u);
  // Bad lists are errors naming the field.
  k = j;
  k["no_rope_layers"] = json::array({1, 0});
  EXPECT_NE(parse_err(k).message.find("no_rope_layers must list every layer"), std::string::npos);
  k["no_rope_layers"] = rope_layers;
  k["no_rope_layers"][5] = 2;
  EXPECT_NE(parse_err(k).message.find("no_rope_layers entries must be 0 or 1"), std::string::npos);
  k = j;
  k.erase("no_rope_layers");
  k["no_rope_layer_interval"] = 0;
  EXPECT_NE(parse_err(k).message.find("no_rope_layer_interval must be positive"), std::string::npos);
  // Only SmolLM3 has NoPE layers.
  EXPECT_TRUE(parse_ok(minimal_llama()).nope_layers.empty());
}

TEST(ParseConfig, OnlyQwen3HasQkNorm) {
  for (const char* arch : {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}) {
    EXPECT_FALSE(parse_ok(with_arch(minimal_llama(), arch)).qk_norm) << arch;
  }
}

}  // namespace
}  // namespace llmesh::model
