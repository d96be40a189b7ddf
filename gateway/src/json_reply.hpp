// What the Responses and Conversations routes share (api_responses.cpp, api_conversations.cpp):
// a JSON value as compact text (invalid UTF-8 replaced), and as a 200 reply's body.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/completion_stream.hpp"

namespace llmesh::gateway::detail {

inline std::string dumped(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

inline http_reply json_body(const nlohmann::ordered_json& j) {
  http_reply r;
  r.body = dumped(j);
  return r;
}

}  // namespace llmesh::gateway::detail
