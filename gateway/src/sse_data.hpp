// The chat stream's SSE bytes as the Responses and Messages renderers read them
// (responses_api.cpp, messages_api.cpp): whole `data: ...` events, each ending in a blank line.
#pragma once

#include <string_view>

namespace llmesh::gateway::detail {

/// Calls f(payload) for each `data: PAYLOAD` event of `sse`, in order (other lines are skipped).
template <class F>
void for_each_sse_data(std::string_view sse, F&& f) {
  size_t at = 0;
  while (at < sse.size()) {
    size_t end = sse.find("\n\n", at);
    if (end == std::string_view::npos) end = sse.size();
    std::string_view ev = sse.substr(at, end - at);
    at = end + 2;
    if (ev.starts_with("data: ")) f(ev.substr(6));
  }
}

}  // namespace llmesh::gateway::detail
