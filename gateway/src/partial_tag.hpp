// A streamed text's held-back end (private to the gateway's shapers: tool_calls.cpp,
// reasoning.cpp): how many of its last bytes could begin a tag the next piece may complete.
#pragma once

#include <algorithm>
#include <string_view>

namespace llmesh::gateway::detail {

inline size_t partial_tag(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (tag.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

}  // namespace llmesh::gateway::detail
