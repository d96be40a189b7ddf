// Whitespace around model output as the tool-call parsers read it (private to the gateway:
// tool_calls.cpp, qwen3_coder_calls.cpp, messages_api.cpp): space, tab, newline, return.
#pragma once

#include <string_view>

namespace llmesh::gateway::detail {

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

inline std::string_view lstripped(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return s;
}

inline std::string_view stripped(std::string_view s) {
  s = lstripped(s);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace llmesh::gateway::detail
