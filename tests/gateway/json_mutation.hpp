// The request fuzzers' mutation (openai_api_test, responses_api_test): 1-6 random edits of a
// valid body — a byte replaced, 1-3 bytes erased, or a byte inserted — from JSON's own
// characters plus a backslash and two bytes that are not UTF-8.
#pragma once

#include <random>
#include <string>

namespace llmesh::gateway::testing {

inline std::string mutate_json(std::string body, std::mt19937& rng) {
  static const std::string alphabet = "{}[]\",:0123456789.-+eE truefalsnul\\\x80\xff";
  const int edits = 1 + static_cast<int>(rng() % 6);
  for (int e = 0; e < edits && !body.empty(); ++e) {
    const size_t at = rng() % body.size();
    switch (rng() % 3) {
      case 0: body[at] = alphabet[rng() % alphabet.size()]; break;
      case 1: body.erase(at, 1 + rng() % 3); break;
      default: body.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
    }
  }
  return body;
}

}  // namespace llmesh::gateway::testing
