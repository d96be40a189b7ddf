// config.json test helpers shared by config_test.cpp and config_arch_test.cpp.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "llmesh/model/config.hpp"

namespace llmesh::model::testing {

using json = nlohmann::json;

/// The smallest Llama config: only the required fields.
inline json minimal_llama() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"hidden_size", 64},
          {"intermediate_size", 160},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"vocab_size", 300}};
}

inline json with_arch(json j, const std::string& arch) {
  j["architectures"] = {arch};
  return j;
}

inline model_config parse_ok(const json& j) {
  auto c = parse_config(j.dump());
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.err().message) << "\n" << j.dump();
  return c.ok() ? c.value() : model_config{};
}

inline error parse_err(const json& j) {
  auto c = parse_config(j.dump());
  EXPECT_FALSE(c.ok()) << "accepted: " << j.dump();
  return c.ok() ? error{} : c.err();
}

}  // namespace llmesh::model::testing
