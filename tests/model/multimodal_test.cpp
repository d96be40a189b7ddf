// A multimodal checkpoint's language model (config_multimodal.cpp, tensor_store::take_language_model):
// Gemma3ForConditionalGeneration's and Mistral3ForConditionalGeneration's released configs read
// as their text models', and a checkpoint written in either transformers layout (language_model.model.*
// or model.language_model.*, beside a vision tower) gives the text model's logits bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint_edit.hpp"
#include "gguf_test_util.hpp"
#include "llmesh/kernels/rope.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/lora.hpp"
#include "llmesh/model/random_model.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;
using testing::temp_dir;

result<model_config> parse(const json& j) { return parse_config(j.dump()); }

TEST(Multimodal, Gemma3sTextConfigTakesGemma3TextConfigsDefaults) {
  // google/gemma-3-4b-it's config.json (vision_config abridged): text_config lists only what
  // differs from Gemma3TextConfig.
  const json j = json::parse(R"({"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02,
    "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "model_type": "siglip_vision_model", "num_hidden_layers": 27}})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->arch, architecture::gemma3);
  EXPECT_EQ(c->arch_name, "Gemma3ForConditionalGeneration");
  EXPECT_TRUE(c->language_model_of_multimodal);
  EXPECT_EQ(c->hidden, 2560u);
  EXPECT_EQ(c->n_layers, 34u);
  EXPECT_EQ(c->n_heads, 8u);
  EXPECT_EQ(c->n_kv_heads, 4u);
  EXPECT_EQ(c->head_dim, 256u);
  EXPECT_EQ(c->vocab, 262208u);
  EXPECT_EQ(c->max_positions, 131072u);  // Gemma 3: its linear scaling leaves the context as it is (config_rope.cpp)
  EXPECT_TRUE(c->tie_embeddings);
  EXPECT_EQ(c->eos_ids, (std::vector<int32_t>{1, 106}));
  EXPECT_EQ(layer_window(*c, 0), 1024u);
  EXPECT_EQ(layer_window(*c, 5), 0u);
  EXPECT_DOUBLE_EQ(layer_rope(*c, 5).linear_factor, 8.0);
  EXPECT_DOUBLE_EQ(layer_rope(*c, 0).linear_factor, 1.0);
  // A text model's config is not one.
  auto text = j["text_config"];
  text["architectures"] = {"Gemma3ForCausalLM"};
  text["vocab_size"] = 262208;
  text["num_attention_heads"] = 8;
  text["num_key_value_heads"] = 4;
  auto t = parse(text);
  ASSERT_TRUE(t.ok()) << t.err().message;
  EXPECT_FALSE(t->language_model_of_multimodal);
}

TEST(Multimodal, Mistral3sTextConfigIsMistrals) {
  // mistralai/Mistral-Small-3.1-24B-Instruct-2503's config.json (vision_config abridged).
  const json j = json::parse(R"({"architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10,
    "model_type": "mistral3", "multimodal_projector_bias": false, "projector_hidden_act": "gelu", "spatial_merge_size": 2,
    "text_config": {"attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
      "initializer_range": 0.02, "intermediate_size": 32768, "max_position_embeddings": 131072, "model_type": "mistral",
      "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
      "rope_theta": 1000000000.0, "sliding_window": null, "use_cache": true, "vocab_size": 131072},
    "torch_dtype": "bfloat16", "vision_config": {"model_type": "pixtral", "hidden_size": 1024},
    "vision_feature_layer": -1})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->arch, architecture::mistral);
  EXPECT_TRUE(c->language_model_of_multimodal);
  EXPECT_EQ(c->hidden, 5120u);
  EXPECT_EQ(c->head_dim, 128u);
  EXPECT_EQ(c->vocab, 131072u);
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e9);
  EXPECT_EQ(c->sliding_window, 0u);
  EXPECT_FALSE(c->tie_embeddings);
  // Another text model inside is refused by name; so is a text_config that is not an object.
  auto other = j;
  other["text_config"]["model_type"] = "qwen2";
  auto r = parse(other);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::unsupported);
  EXPECT_NE(r.err().message.find("model_type 'qwen2'"), std::string::npos) << r.err().message;
  other["text_config"] = 3;
  EXPECT_NE(parse(other).err().message.find("text_config must be an object"), std::string::npos);
}

TEST(Multimodal, Ministral3sTextModelHasYarnAndTheQueryTemperature) {
  // Shaped like mistralai/Ministral-3-8B-Instruct-2512's config.json (vision_config abridged).
  const json j = json::parse(R"({"architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10,
    "model_type": "mistral3", "spatial_merge_size": 2,
    "text_config": {"head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
      "max_position_embeddings": 262144, "model_type": "ministral3", "num_attention_heads": 32, "num_hidden_layers": 34,
      "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
      "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0, "llama_4_scaling_beta": 0.1,
                          "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 16384,
                          "rope_theta": 1000000.0, "rope_type": "yarn", "type": "yarn"},
      "sliding_window": null, "tie_word_embeddings": false, "vocab_size": 131072},
    "vision_config": {"model_type": "pixtral"}})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->arch, architecture::mistral);
  EXPECT_TRUE(c->language_model_of_multimodal);
  EXPECT_TRUE(c->rope.yarn);
  EXPECT_DOUBLE_EQ(c->rope.factor, 16.0);
  EXPECT_DOUBLE_EQ(c->rope.original_max_position, 16384.0);
  EXPECT_DOUBLE_EQ(c->rope.attention_factor, 1.0);  // mscale / mscale_all_dim
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);
  EXPECT_EQ(c->max_positions, 262144u);
  EXPECT_DOUBLE_EQ(c->query_temperature.beta, 0.1);
  EXPECT_DOUBLE_EQ(c->query_temperature.original, 16384.0);
  // The scale: 1 within the original context, then 1 + 0.1·ln(1 + floor(p / 16384)).
  EXPECT_EQ(kernels::llama4_query_scale(0, 0.1, 16384), 1.0f);
  EXPECT_EQ(kernels::llama4_query_scale(16383, 0.1, 16384), 1.0f);
  EXPECT_EQ(kernels::llama4_query_scale(16384, 0.1, 16384), static_cast<float>(1.0 + 0.1 * std::log(2.0)));
  EXPECT_EQ(kernels::llama4_query_scale(3 * 16384 + 5, 0.1, 16384), static_cast<float>(1.0 + 0.1 * std::log(4.0)));
  // Ministral3Config's defaults for a bare text config; plain Mistral has no temperature.
  json bare = {{"architectures", {"Ministral3ForCausalLM"}}, {"hidden_size", 4096}, {"intermediate_size", 14336},
               {"num_hidden_layers", 34}, {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"vocab_size", 131072}};
  auto d = parse(bare);
  ASSERT_TRUE(d.ok()) << d.err().message;
  EXPECT_FALSE(d->language_model_of_multimodal);
  EXPECT_DOUBLE_EQ(d->query_temperature.beta, 0.1);
  EXPECT_TRUE(d->rope.yarn);
  EXPECT_EQ(d->max_positions, 262144u);
  EXPECT_FLOAT_EQ(d->rms_norm_eps, 1e-5f);
  bare["architectures"] = {"MistralForCausalLM"};
  EXPECT_EQ(parse(bare)->query_temperature.beta, 0.0);
  auto broken = j;
  broken["text_config"]["rope_parameters"]["llama_4_scaling_beta"] = "0.1";
  EXPECT_NE(parse(broken).err().message.find("llama_4_scaling_beta"), std::string::npos);
}

/// A random Gemma 3 checkpoint, and the same weights written as a multimodal one in `layout`
/// ("old": language_model.model.* and language_model.lm_head.*; "new": model.language_model.*
/// and lm_head.*), with a vision tower tensor the loader must leave alone.
void as_multimodal(const temp_dir& dir, const std::string& layout) {
  testing::rewrite(
      dir,
      [&](tensor_spec& s) {
        const bool head = s.name.starts_with("lm_head.");
        if (layout == "old") s.name = "language_model." + s.name;
        if (layout == "new" && !head) s.name = "model.language_model." + s.name.substr(std::string("model.").size());
        return true;
      },
      {tensor_spec{layout == "old" ? "vision_tower.vision_model.embeddings.patch_embedding.weight"
                                   : "model.vision_tower.vision_model.embeddings.patch_embedding.weight",
                   kernels::dtype::f32, {4, 4}, [](std::span<uint8_t> out) { std::fill(out.begin(), out.end(), 0x7f); }}});
  std::ifstream in(dir / "config.json");
  json text = json::parse(in);
  text.erase("architectures");
  json j = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"}, {"text_config", text},
            {"eos_token_id", text["eos_token_id"]}, {"vision_config", {{"model_type", "siglip_vision_model"}}}};
  j["text_config"].erase("eos_token_id");
  std::ofstream(dir / "config.json") << j.dump(2);
}

/// A small Gemma 3: three layers, the middle one global.
random_model_spec small_gemma3() {
  random_model_spec s;
  s.arch = "gemma3";
  s.hidden = 64;
  s.intermediate = 128;
  s.n_layers = 3;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 16;
  s.vocab = 300;
  s.sliding_window = 4;
  s.sliding_pattern = 2;
  s.dtype = kernels::dtype::bf16;
  s.seed = 71;
  return s;
}

TEST(Multimodal, ALanguageModelUnderEitherLayoutGivesTheTextModelsLogits) {
  random_model_spec s = small_gemma3();
  const std::vector<int32_t> prompt = {5, 17, 200, 42, 8, 99, 1};
  for (const bool tied : {false, true}) {
    for (const std::string layout : {"old", "new"}) {
      SCOPED_TRACE(layout + (tied ? ", tied" : ""));
      s.tie_embeddings = tied;
      temp_dir dir;
      ASSERT_TRUE(write_random_model(s, dir.path()).ok());
      std::vector<std::vector<float>> expect;  // each tp's numbers are its own (the all-reduce's order)
      {
        auto plain = model::load(dir.path());  // read before the rewrite replaces the file it maps
        ASSERT_TRUE(plain.ok());
        for (int tp : {1, 2}) expect.push_back(gguf_testing::first_logits(*plain, tp, prompt));
      }
      as_multimodal(dir, layout);
      auto m = model::load(dir.path());
      ASSERT_TRUE(m.ok()) << m.err().message;
      EXPECT_TRUE((*m)->config().language_model_of_multimodal);
      for (int tp : {1, 2}) {
        const auto& want = expect[tp - 1];
        ASSERT_FALSE(want.empty());
        const auto got = gguf_testing::first_logits(*m, tp, prompt);
        ASSERT_EQ(got.size(), want.size()) << tp;
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "tp " << tp;
      }
    }
  }
  // A multimodal config over a checkpoint with no language model tensors is refused, naming why.
  temp_dir empty;
  ASSERT_TRUE(write_random_model(s, empty.path()).ok());
  as_multimodal(empty, "old");
  testing::rewrite(empty, [](tensor_spec& t) { return t.name.starts_with("vision_tower."); });
  auto bad = model::load(empty.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("no language model tensors"), std::string::npos) << bad.err().message;
}

// PEFT adapters trained on a multimodal checkpoint name its language model's modules under
// either layout; they load as the text model's adapter, the vision tower's modules left out
// (a text request never runs the tower). On a text model such names stay refused.
TEST(Multimodal, AnAdapterOfTheMultimodalCheckpointLoadsAsTheTextModels) {
  const random_model_spec s = small_gemma3();
  temp_dir text, adapter;
  ASSERT_TRUE(write_random_model(s, text.path()).ok());
  random_lora_spec ls;
  ASSERT_TRUE(write_random_lora(ls, text.path(), adapter.path()).ok());
  const auto text_cfg = load_config(text.path());
  ASSERT_TRUE(text_cfg.ok());
  auto want = load_lora({"a", adapter.path()}, *text_cfg);
  ASSERT_TRUE(want.ok()) << want.err().message;
  temp_dir multi;
  ASSERT_TRUE(write_random_model(s, multi.path()).ok());
  as_multimodal(multi, "new");
  const auto multi_cfg = load_config(multi.path());
  ASSERT_TRUE(multi_cfg.ok());
  for (const std::string layout : {"old", "new"}) {
    SCOPED_TRACE(layout);
    temp_dir renamed;
    std::filesystem::copy(adapter.path(), renamed.path(), std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(renamed / "adapter_model.safetensors", renamed / "model.safetensors");  // rewrite's file
    testing::rewrite(
        renamed,
        [&](tensor_spec& t) {
          const std::string rest = t.name.substr(std::string("base_model.model.model.").size());
          t.name = (layout == "old" ? "base_model.model.language_model.model." : "base_model.model.model.language_model.") + rest;
          return true;
        },
        {tensor_spec{"base_model.model." + std::string(layout == "old" ? "" : "model.") +
                         "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.lora_A.weight",
                     kernels::dtype::f32, {8, 4}, [](std::span<uint8_t> out) { std::fill(out.begin(), out.end(), 0); }}});
    std::filesystem::rename(renamed / "model.safetensors", renamed / "adapter_model.safetensors");
    auto got = load_lora({"a", renamed.path()}, *multi_cfg);
    ASSERT_TRUE(got.ok()) << got.err().message;
    ASSERT_EQ(got->layers.size(), want->layers.size());
    for (size_t l = 0; l < want->layers.size(); ++l) {
      for (size_t t = 0; t < lora_target_count; ++t) {
        const auto& a = want->layers[l].pairs[t];
        const auto& b = got->layers[l].pairs[t];
        EXPECT_EQ(b.r, a.r) << l << "," << t;
        EXPECT_EQ(b.scale, a.scale);
        EXPECT_EQ(b.a.bytes, a.a.bytes);
        EXPECT_EQ(b.b.bytes, a.b.bytes);
      }
    }
    auto refused = load_lora({"a", renamed.path()}, *text_cfg);
    EXPECT_FALSE(refused.ok());
  }
}

}  // namespace
}  // namespace llmesh::model
