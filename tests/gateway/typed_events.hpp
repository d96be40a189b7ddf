// The typed SSE streams of the Responses and Messages APIs as tests read them
// (responses_api_test, messages_api_test): `event: TYPE\ndata: {...}\n\n` events, each checked
// to name its own type; a chat chunk as the chat stream sends it; the fuzz tests' check.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llmesh::gateway::testing {

inline std::vector<nlohmann::ordered_json> typed_events(const std::string& sse) {
  std::vector<nlohmann::ordered_json> out;
  size_t at = 0;
  while (at < sse.size()) {
    const size_t end = sse.find("\n\n", at);
    if (end == std::string::npos) {
      ADD_FAILURE() << "an event without its blank line: " << sse.substr(at);
      break;
    }
    const std::string ev = sse.substr(at, end - at);
    at = end + 2;
    const size_t type_end = ev.find('\n');
    EXPECT_EQ(ev.substr(0, 7), "event: ");
    const auto data = nlohmann::ordered_json::parse(ev.substr(ev.find("data: ") + 6));
    EXPECT_EQ(data["type"], ev.substr(7, type_end - 7));
    out.push_back(data);
  }
  return out;
}

inline std::string sse_data(const std::string& chunk) { return "data: " + chunk + "\n\n"; }

/// What a renderer wrote from a mutated stream: whole events, each JSON naming its own type.
inline void expect_well_typed(const std::string& out) {
  for (size_t at = 0; at < out.size();) {
    const size_t end = out.find("\n\n", at);
    ASSERT_NE(end, std::string::npos);
    const std::string ev = out.substr(at, end - at);
    at = end + 2;
    const size_t data_at = ev.find("\ndata: ");
    ASSERT_NE(data_at, std::string::npos) << ev;
    const auto d = nlohmann::ordered_json::parse(ev.substr(data_at + 7), nullptr, false);
    ASSERT_FALSE(d.is_discarded()) << ev;
    EXPECT_EQ("event: " + d["type"].get<std::string>(), ev.substr(0, data_at));
  }
}

}  // namespace llmesh::gateway::testing
