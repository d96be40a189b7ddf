// cli/src/vllm_flags.cpp on its own (compiled into this test): --config FILE's expansion into
// flags (lists, maps as JSON, booleans, empty values, the command line winning, a positional
// model, --help), --speculative-config and --override-generation-config — and each fuzzed with
// random input: an answer or an error, never a crash or an exception.
#include "../../cli/src/vllm_flags.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "../model/temp_dir.hpp"

namespace llmesh::cli {
namespace {

std::vector<std::string> expand(const std::string& yaml, std::vector<std::string> args, std::string* error = nullptr) {
  model::testing::temp_dir dir;
  std::ofstream(dir.path() + "/c.yaml") << yaml;
  args.insert(args.begin(), {"serve", "--config", dir.path() + "/c.yaml"});
  auto r = expand_config_file(args);
  if (!r) {
    if (error) *error = r.err().message;
    return {};
  }
  return *r;
}

TEST(ExpandConfigFile, FlagsFromYamlAheadOfTheCommandLine) {
  using v = std::vector<std::string>;
  EXPECT_EQ(expand("port: 8000\nenable_prefix_caching: false\nserved-model-name: [a, b]\n"
                   "speculative-config: {method: ngram, num_speculative_tokens: 3}\nchat-template: ''\n",
                   {"--host", "0.0.0.0"}),
            (v{"serve", "--port=8000", "--enable-prefix-caching=false", "--served-model-name=a", "--served-model-name=b",
               R"(--speculative-config={"method":"ngram","num_speculative_tokens":3})", "--host", "0.0.0.0"}));
  // The command line's own flag wins (the file's is skipped); so does a positional model.
  EXPECT_EQ(expand("port: 8000\nmodel: /m\n", {"/cli-model", "--port", "9000"}), (v{"serve", "/cli-model", "--port", "9000"}));
  EXPECT_EQ(expand("model: /m\n", {}), (v{"serve", "--model=/m"}));
  // --help: the arguments as they were.
  EXPECT_EQ(expand("port: [\n", {"--help"}).size(), 4u);
  std::string why;
  EXPECT_TRUE(expand("- a\n- b\n", {}, &why).empty());
  EXPECT_NE(why.find("not a map of flag: value"), std::string::npos) << why;
  EXPECT_TRUE(expand("port: [\n", {}, &why).empty());
  EXPECT_NE(why.find("not YAML"), std::string::npos) << why;
  EXPECT_TRUE(expand_config_file({"serve", "--config", "/no/such.yaml"}).err().message.find("cannot read it") != std::string::npos);
  EXPECT_EQ(*expand_config_file({"serve", "--port", "1"}), (v{"serve", "--port", "1"}));
}

TEST(ExpandConfigFile, RandomFilesGiveFlagsOrAnErrorNeverACrash) {
  std::mt19937_64 rng(7);
  const std::string alphabet = "abc-_:[]{}\"',\n #!&*|>%@`?-=0123456789 \t.~";
  for (int i = 0; i < 1500; ++i) {
    std::string yaml;
    const size_t n = rng() % 60;
    for (size_t k = 0; k < n; ++k) yaml += alphabet[rng() % alphabet.size()];
    if (i % 3 == 0) yaml = "key: " + yaml;
    std::string why;
    EXPECT_NO_THROW(expand(yaml, {"--x"}, &why)) << yaml;
  }
}

TEST(SpeculativeConfig, NgramFieldsSetAndOthersRefused) {
  actors::speculation_config c;
  std::string draft = "left over";
  ASSERT_TRUE(apply_speculative_config(R"({"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2})",
                                       c, draft));
  EXPECT_EQ(c.tokens, 5u);
  EXPECT_EQ(c.max_n, 4u);
  EXPECT_EQ(c.min_n, 2u);
  EXPECT_EQ(draft, "") << "prompt lookup names no draft model";
  for (const char* bad : {R"({"method":"eagle","model":"x","num_speculative_tokens":3})", R"({"method":"mtp"})",
                          R"({"model":"draft"})", R"({"model":"draft","num_speculative_tokens":0})",
                          R"({"method":"draft_model","num_speculative_tokens":3})",
                          R"({"method":"ngram","model":"draft","num_speculative_tokens":3})",
                          R"({"model":"draft","num_speculative_tokens":3,"draft_tensor_parallel_size":2})",
                          R"({"num_speculative_tokens":3,"draft_tensor_parallel_size":1})",
                          R"({"model":"draft","num_speculative_tokens":3,"prompt_lookup_max":3})", R"({"model":7})",
                          R"({"model":"","num_speculative_tokens":3})", R"({"num_speculative_tokens":-1})",
                          R"({"num_speculative_tokens":99})", R"({"prompt_lookup_min":0})", R"({"foo":1})", "[]", "nope"}) {
    actors::speculation_config d;
    std::string dd = "kept";
    EXPECT_FALSE(apply_speculative_config(bad, d, dd)) << bad;
    EXPECT_EQ(d.tokens, 0u) << "a refused config changes nothing: " << bad;
    EXPECT_EQ(dd, "kept") << bad;
  }
}

TEST(SpeculativeConfig, ADraftModelNamesItsDirectory) {
  actors::speculation_config c;
  std::string draft;
  ASSERT_TRUE(apply_speculative_config(R"({"model":"/m/draft","num_speculative_tokens":4,"draft_tensor_parallel_size":1,
                                           "disable_by_batch_size":8})",
                                       c, draft));
  EXPECT_EQ(draft, "/m/draft");
  EXPECT_EQ(c.tokens, 4u);
  EXPECT_EQ(c.disable_by_batch_size, 8u);
  actors::speculation_config c2;
  ASSERT_TRUE(apply_speculative_config(R"({"method":"draft_model","model":"d","num_speculative_tokens":2})", c2, draft));
  EXPECT_EQ(draft, "d");
  EXPECT_EQ(c2.tokens, 2u);
  ASSERT_TRUE(apply_speculative_config(R"({"method":null,"model":"d2","num_speculative_tokens":2})", c2, draft));
  EXPECT_EQ(draft, "d2") << "a null method is vLLM's: worked out from the model";
  ASSERT_TRUE(apply_speculative_config(R"({"model":"[ngram]","num_speculative_tokens":2})", c2, draft));
  EXPECT_EQ(draft, "") << "vLLM's \"[ngram]\" model is prompt lookup";
}

TEST(SpeculativeConfig, RandomJsonGivesABoundedConfigOrAnError) {
  std::mt19937_64 rng(11);
  const char* keys[] = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "disable_by_batch_size", "model",
                        "draft_tensor_parallel_size"};
  const nlohmann::json values[] = {"ngram", "eagle", 0, 1, 3, 64, 65, -5, 1.5, nullptr, true, "[ngram]", nlohmann::json::array(),
                                   "draft_model", "/d"};
  for (int i = 0; i < 2000; ++i) {
    nlohmann::json j = nlohmann::json::object();
    for (size_t k = rng() % 5; k > 0; --k) j[keys[rng() % 7]] = values[rng() % 15];
    actors::speculation_config c;
    std::string draft;
    if (apply_speculative_config(j.dump(), c, draft)) {
      EXPECT_LE(c.tokens, actors::max_speculative_tokens) << j;
      EXPECT_GE(c.min_n, 1u) << j;
      EXPECT_LE(c.min_n, c.max_n) << j;
      EXPECT_LE(c.max_n, 64u) << j;
      if (!draft.empty()) {
        EXPECT_GE(c.tokens, 1u) << j;
      }
    }
  }
}

TEST(OverrideGenerationConfig, SamplingDefaultsOrAnError) {
  model::model_config c;
  ASSERT_TRUE(model::override_generation_config(c, R"({"temperature":0.5,"top_k":20})"));
  EXPECT_EQ(c.sampling.temperature, 0.5f);
  EXPECT_EQ(c.sampling.top_k, 20);
  EXPECT_FALSE(c.sampling.top_p);
  std::mt19937_64 rng(13);
  const char* keys[] = {"temperature", "top_p", "top_k", "min_p", "eos_token_id"};
  const nlohmann::json values[] = {0, 0.5, 1, 2, -1, 1e9, "x", nullptr, 1.5, nlohmann::json::array({1, 2})};
  for (int i = 0; i < 2000; ++i) {
    nlohmann::json j = nlohmann::json::object();
    for (size_t k = rng() % 4; k > 0; --k) j[keys[rng() % 5]] = values[rng() % 10];
    model::model_config d;
    if (model::override_generation_config(d, j.dump())) {
      if (d.sampling.top_p) {
        EXPECT_LE(*d.sampling.top_p, 1.0f) << j;
      }
      if (d.sampling.temperature) {
        EXPECT_GE(*d.sampling.temperature, 0.0f) << j;
      }
      if (d.sampling.top_k) {
        EXPECT_GE(*d.sampling.top_k, 0) << j;
      }
    }
  }
}

}  // namespace
}  // namespace llmesh::cli
