// Tests of config.json's rotary settings beyond the plain and llama3 ones: YaRN (Qwen's
// long-context recipe), LongRoPE (Phi-3.5, Phi-3-128k, Phi-4-mini) and partial_rotary_factor —
// their values, defaults, the long/short choice by the served context (choose_longrope), and a
// named error for each malformed field.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config_fixture.hpp"
#include "llmesh/model/config.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;
using testing::minimal_llama;
using testing::parse_err;
using testing::parse_ok;
using testing::with_arch;

/// Phi-4-mini's rotary on a small model: head_dim 16, a quarter of it passing unrotated, so
/// the factor lists have 6 entries.
json phi4_mini_like() {
  json j = with_arch(minimal_llama(), "Phi3ForCausalLM");
  j["max_position_embeddings"] = 131072;
  j["original_max_position_embeddings"] = 4096;
  j["partial_rotary_factor"] = 0.75;
  j["rope_scaling"] = {{"type", "longrope"},
                       {"short_factor", {1.0, 1.1, 1.2, 1.3, 1.4, 1.5}},
                       {"long_factor", {1.0, 2.0, 4.0, 8.0, 16.0, 32.0}}};
  return j;
}

TEST(ConfigRope, PartialRotaryFactorSetsTheRotaryDimension) {
  json j = minimal_llama();  // head_dim 16
  EXPECT_EQ(parse_ok(j).rope.head_dim, 16u);
  j["partial_rotary_factor"] = 0.5;
  model_config c = parse_ok(j);
  EXPECT_EQ(c.head_dim, 16u);  // the head keeps its size
  EXPECT_EQ(c.rope.head_dim, 8u);
  j.erase("partial_rotary_factor");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.25}};  // transformers v5
  EXPECT_EQ(parse_ok(j).rope.head_dim, 4u);
  j.erase("rope_parameters");
  for (double bad : {0.0, -0.5, 1.5, 0.1 /* 1.6: none */, 0.3125 /* 5: odd */}) {
    j["partial_rotary_factor"] = bad;
    EXPECT_NE(parse_err(j).message.find("partial_rotary_factor"), std::string::npos) << bad;
  }
  j["partial_rotary_factor"] = "half";
  EXPECT_NE(parse_err(j).message.find("partial_rotary_factor"), std::string::npos);
}

TEST(ConfigRope, YarnTakesItsFieldsAndDefaults) {
  json j = with_arch(minimal_llama(), "Qwen3ForCausalLM");
  j["max_position_embeddings"] = 40960;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  model_config c = parse_ok(j);
  EXPECT_TRUE(c.rope.yarn);
  EXPECT_FALSE(c.rope.llama3);
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);  // the config's, as vLLM takes it
  EXPECT_DOUBLE_EQ(c.rope.original_max_position, 32768.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1.0);
  EXPECT_TRUE(c.rope.yarn_truncate);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 0.1 * std::log(4.0) + 1.0);
  EXPECT_DOUBLE_EQ(kernels::rope_scale(c.rope), 0.1 * std::log(4.0) + 1.0);
  EXPECT_EQ(c.max_positions, 131072u);  // vLLM's context: the original one times the factor

  j["rope_scaling"].erase("original_max_position_embeddings");  // HF: the model's context
  c = parse_ok(j);
  EXPECT_DOUBLE_EQ(c.rope.original_max_position, 40960.0);
  EXPECT_EQ(c.max_positions, 4u * 40960u);
  j["rope_scaling"]["beta_fast"] = 16;
  j["rope_scaling"]["beta_slow"] = 2;
  j["rope_scaling"]["truncate"] = false;  // gpt-oss
  j["rope_scaling"]["attention_factor"] = 1.5;  // HF's: replaces the computed factor
  j["rope_scaling"]["attn_factor"] = 2.0;       // vLLM's: multiplies it
  c = parse_ok(j);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 2.0);
  EXPECT_FALSE(c.rope.yarn_truncate);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 3.0);
  j["rope_scaling"].erase("attention_factor");
  j["rope_scaling"].erase("attn_factor");
  j["rope_scaling"]["mscale"] = 1.0;  // HF's DeepSeek form: a ratio of two mscales
  j["rope_scaling"]["mscale_all_dim"] = 0.5;
  EXPECT_DOUBLE_EQ(parse_ok(j).rope.attention_factor, (0.1 * std::log(4.0) + 1.0) / (0.05 * std::log(4.0) + 1.0));
  j["rope_scaling"]["factor"] = 1.0;  // no stretch: no temperature
  EXPECT_DOUBLE_EQ(parse_ok(j).rope.attention_factor, 1.0);
}

TEST(ConfigRope, ALinearFactorStretchesTheContextButGemma3sAlreadyCountsIt) {
  json j = minimal_llama();
  j["max_position_embeddings"] = 4096;
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};  // vicuna-13b-v1.5-16k's
  EXPECT_EQ(parse_ok(j).max_positions, 16384u);
  j["rope_scaling"]["factor"] = 0.5;  // never shrunk
  EXPECT_EQ(parse_ok(j).max_positions, 4096u);
  j = with_arch(minimal_llama(), "Gemma3ForCausalLM");
  j["head_dim"] = 16;
  j["max_position_embeddings"] = 131072;
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  EXPECT_EQ(parse_ok(j).max_positions, 131072u);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", 8192}};
  EXPECT_EQ(parse_ok(j).max_positions, 131072u);  // nor yarn's (vLLM skips Gemma 3's)
}

TEST(ConfigRope, AScaledContextBeyond2To30IsRefused) {
  json j = minimal_llama();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 1e12}, {"original_max_position_embeddings", 4096}};
  EXPECT_NE(parse_err(j).message.find("2^30"), std::string::npos);
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 1e300}};
  EXPECT_NE(parse_err(j).message.find("2^30"), std::string::npos);
}

TEST(ConfigRope, YarnRefusesWhatItCannotUse) {
  json j = minimal_llama();
  j["rope_scaling"] = {{"rope_type", "yarn"}};
  EXPECT_NE(parse_err(j).message.find("factor"), std::string::npos);
  for (auto [key, value] : std::vector<std::pair<std::string, json>>{{"factor", 0.0},
                                                                     {"factor", "4"},
                                                                     {"beta_fast", -1.0},
                                                                     {"beta_slow", 0.0},
                                                                     {"original_max_position_embeddings", 0},
                                                                     {"attention_factor", -1.0},
                                                                     {"truncate", "yes"}}) {
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
    j["rope_scaling"][key] = value;
    error e = parse_err(j);
    EXPECT_EQ(e.code, errc::invalid_request) << key;
    EXPECT_NE(e.message.find("rope_scaling"), std::string::npos) << key << ": " << e.message;
  }
}

TEST(ConfigRope, LongropeReadsPhi3sLayoutAndPicksTheLongFactorsForALongContext) {
  model_config c = parse_ok(phi4_mini_like());
  EXPECT_TRUE(c.rope.longrope);
  EXPECT_EQ(c.rope.head_dim, 12u);
  EXPECT_EQ(c.rope.short_factor, (std::vector<double>{1.0, 1.1, 1.2, 1.3, 1.4, 1.5}));
  EXPECT_EQ(c.rope.long_factor, (std::vector<double>{1.0, 2.0, 4.0, 8.0, 16.0, 32.0}));
  EXPECT_DOUBLE_EQ(c.rope.original_max_position, 4096.0);
  const double mscale = std::sqrt(1.0 + std::log(32.0) / std::log(4096.0));  // Phi-3.5's 1.19024...
  EXPECT_DOUBLE_EQ(c.rope.short_mscale, mscale);
  EXPECT_DOUBLE_EQ(c.rope.long_mscale, mscale);
  EXPECT_TRUE(c.rope.use_long);  // served at its 131072 positions
  const auto inv_long = kernels::rope_inv_freq(c.rope);
  ASSERT_EQ(inv_long.size(), 6u);
  EXPECT_DOUBLE_EQ(inv_long[5], 1.0 / std::pow(10000.0, 10.0 / 12.0) / 32.0);

  // vLLM's rule: a server granting at most the original context rotates by the short factors.
  choose_longrope(c, 4096);
  EXPECT_FALSE(c.rope.use_long);
  EXPECT_DOUBLE_EQ(kernels::rope_inv_freq(c.rope)[5], 1.0 / std::pow(10000.0, 10.0 / 12.0) / 1.5);
  choose_longrope(c, 4097);
  EXPECT_TRUE(c.rope.use_long);
  choose_longrope(c, 0);  // the model's own context
  EXPECT_TRUE(c.rope.use_long);

  json j = phi4_mini_like();  // transformers v5 nests the original context with the factors
  j.erase("original_max_position_embeddings");
  j["rope_scaling"]["original_max_position_embeddings"] = 8192;
  j["rope_scaling"]["short_mscale"] = 1.25;  // vLLM's per-choice overrides
  j["rope_scaling"]["long_mscale"] = 1.5;
  c = parse_ok(j);
  EXPECT_DOUBLE_EQ(c.rope.original_max_position, 8192.0);
  EXPECT_DOUBLE_EQ(kernels::rope_scale(c.rope), 1.5);
  choose_longrope(c, 8192);
  EXPECT_DOUBLE_EQ(kernels::rope_scale(c.rope), 1.25);

  j = phi4_mini_like();
  j["max_position_embeddings"] = 4096;  // no longer than the original: no temperature, short factors
  c = parse_ok(j);
  EXPECT_FALSE(c.rope.use_long);
  EXPECT_DOUBLE_EQ(kernels::rope_scale(c.rope), 1.0);
  j["rope_scaling"]["type"] = "su";  // early Phi-3 configs' name
  EXPECT_TRUE(parse_ok(j).rope.longrope);
}

TEST(ConfigRope, LongropeRefusesMalformedFactors) {
  json j = phi4_mini_like();
  j["rope_scaling"]["long_factor"] = {1.0, 2.0};  // 6 needed for a rotary dimension of 12
  error e = parse_err(j);
  EXPECT_NE(e.message.find("long_factor"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("6"), std::string::npos) << e.message;
  j = phi4_mini_like();
  j["rope_scaling"]["short_factor"] = {1.0, 1.0, 1.0, 1.0, 1.0, 0.0};
  EXPECT_NE(parse_err(j).message.find("short_factor"), std::string::npos);
  j = phi4_mini_like();
  j["rope_scaling"].erase("short_factor");
  EXPECT_NE(parse_err(j).message.find("short_factor"), std::string::npos);
  j = phi4_mini_like();
  j.erase("original_max_position_embeddings");
  EXPECT_NE(parse_err(j).message.find("original_max_position_embeddings"), std::string::npos);
  j = phi4_mini_like();
  j.erase("partial_rotary_factor");  // now 8 factors are needed
  EXPECT_NE(parse_err(j).message.find("8"), std::string::npos);
}

// vLLM's dynamic NTK: one base, NTK-aware scaling's at max_position_embeddings × factor.
TEST(ConfigRope, DynamicNtkGivesVllmsFixedBaseAndContext) {
  json j = minimal_llama();  // head_dim 16
  j["max_position_embeddings"] = 2048;
  j["rope_theta"] = 10000.0;
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  auto c = parse_ok(j);
  EXPECT_EQ(c.max_positions, 4096u);
  EXPECT_NEAR(c.rope.theta, 10000.0 * std::pow(3.0, 16.0 / 14.0), 1e-6);  // 2·4096/2048 − 1 = 3
  EXPECT_FALSE(c.rope.yarn || c.rope.llama3 || c.rope.longrope);
  EXPECT_EQ(c.rope.linear_factor, 1.0);
  j["partial_rotary_factor"] = 0.5;  // the exponent counts the rotating dimensions: 8 / 6
  EXPECT_NEAR(parse_ok(j).rope.theta, 10000.0 * std::pow(3.0, 8.0 / 6.0), 1e-6);
  j.erase("partial_rotary_factor");
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"alpha", 1000.0}};  // Hunyuan's form
  c = parse_ok(j);
  EXPECT_EQ(c.max_positions, 2048u);
  EXPECT_NEAR(c.rope.theta / (10000.0 * std::pow(1000.0, 16.0 / 14.0)), 1.0, 1e-12);
  j["rope_scaling"]["factor"] = 2.0;  // vLLM's context rule takes a factor beside alpha
  EXPECT_EQ(parse_ok(j).max_positions, 4096u);
  j = with_arch(j, "Gemma3ForCausalLM");  // Gemma 3's context already counts its scaling
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  EXPECT_EQ(parse_ok(j).max_positions, 2048u);
  j = minimal_llama();
  for (const json& bad : {json{{"type", "dynamic"}}, json{{"type", "dynamic"}, {"factor", 0.0}},
                          json{{"type", "dynamic"}, {"factor", "2"}}, json{{"type", "dynamic"}, {"alpha", -1.0}},
                          json{{"type", "dynamic"}, {"factor", 1e200}}, json{{"type", "dynamic"}, {"alpha", 1e300}}}) {
    j["rope_scaling"] = bad;
    error e = parse_err(j);
    EXPECT_EQ(e.code, errc::invalid_request) << bad.dump();
    EXPECT_NE(e.message.find("rope_scaling"), std::string::npos) << e.message;
  }
}

TEST(ConfigRope, OtherScalingTypesAreStillRefusedByName) {
  json j = minimal_llama();
  j["rope_scaling"] = {{"rope_type", "ntk-by-parts"}, {"factor", 2.0}};
  error e = parse_err(j);
  EXPECT_EQ(e.code, errc::unsupported);
  EXPECT_NE(e.message.find("'ntk-by-parts'"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("yarn"), std::string::npos) << e.message;  // the list of what is supported
  EXPECT_NE(e.message.find("dynamic"), std::string::npos) << e.message;
}

}  // namespace
}  // namespace llmesh::model
