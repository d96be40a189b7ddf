#include "request_log.hpp"

#include <nlohmann/json.hpp>
#include <sstream>

namespace llmesh::gateway {

std::string request_log_line(const std::string& id, const std::string& model, size_t index, size_t count,
                             const std::string& prompt_text, const std::vector<int32_t>& prompt_ids, size_t max_tokens,
                             const generation_fields& g, uint64_t seed, size_t max_len) {
  std::string text = prompt_text;
  const bool text_cut = max_len > 0 && text.size() > max_len;
  if (text_cut) {
    text.resize(max_len);
    while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();  // whole characters
    if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.pop_back();
  }
  const size_t shown = max_len > 0 ? std::min(max_len, prompt_ids.size()) : prompt_ids.size();
  std::ostringstream out;
  out << "llmesh: request " << id;
  if (count > 1) out << " (prompt " << index << " of " << count << ")";
  // dump() escapes: the prompt stays on one line whatever it holds.
  out << " for '" << model << "': prompt " << nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
      << (text_cut ? "..." : "") << " (" << prompt_ids.size() << " tokens: [";
  for (size_t i = 0; i < shown; ++i) out << (i ? ", " : "") << prompt_ids[i];
  if (shown < prompt_ids.size()) out << ", ...";
  out << "]), max_tokens " << max_tokens << ", temperature " << g.temperature << ", top_p " << g.top_p << ", top_k "
      << g.top_k << ", min_p " << g.min_p << ", seed " << seed << ", n " << std::max<size_t>(g.n, 1);
  if (g.best_of > 1) out << ", best_of " << g.best_of;
  if (g.beam_search) out << ", beam search";
  if (g.logprobs >= 0) out << ", logprobs " << g.logprobs;
  out << (g.stream ? ", streamed" : "");
  return out.str();
}

}  // namespace llmesh::gateway
