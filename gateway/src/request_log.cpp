#include "request_log.hpp"

#include <nlohmann/json.hpp>
#include <sstream>

namespace llmesh::gateway {

namespace {

/// `text`'s first `max_len` characters (UTF-8; 0: all), as vLLM's --max-log-len slices the
/// prompt string; `cut` says whether any were left out.
std::string capped(std::string text, size_t max_len, bool& cut) {
  cut = false;
  if (max_len == 0) return text;
  size_t chars = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) continue;  // a continuation byte
    if (chars++ == max_len) {
      text.resize(i);
      cut = true;
      break;
    }
  }
  return text;
}

/// JSON-quoted (escaped: one line whatever it holds; invalid UTF-8 replaced).
std::string quoted(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void ids_to(std::ostringstream& out, const std::vector<int32_t>& ids, size_t max_len) {
  const size_t shown = max_len > 0 ? std::min(max_len, ids.size()) : ids.size();
  out << ids.size() << " tokens: [";
  for (size_t i = 0; i < shown; ++i) out << (i ? ", " : "") << ids[i];
  if (shown < ids.size()) out << ", ...";
  out << "]";
}

}  // namespace

std::string output_log_line(const std::string& id, size_t index, const std::string& finish, const std::vector<int32_t>& ids,
                            const std::string& text, size_t max_len) {
  bool cut = false;
  const std::string shown = capped(text, max_len, cut);
  std::ostringstream out;
  out << "llmesh: response " << id << " choice " << index << ": finish " << (finish.empty() ? "none" : finish) << ", output "
      << quoted(shown) << (cut ? "..." : "") << " (";
  ids_to(out, ids, max_len);
  out << ")";
  return out.str();
}

std::string request_log_line(const std::string& id, const std::string& model, size_t index, size_t count,
                             const std::string& prompt_text, const std::vector<int32_t>& prompt_ids, size_t max_tokens,
                             const generation_fields& g, uint64_t seed, size_t max_len) {
  bool text_cut = false;
  const std::string text = capped(prompt_text, max_len, text_cut);
  std::ostringstream out;
  out << "llmesh: request " << id;
  if (count > 1) out << " (prompt " << index << " of " << count << ")";
  out << " for '" << model << "': prompt " << quoted(text) << (text_cut ? "..." : "") << " (";
  ids_to(out, prompt_ids, max_len);
  out << "), max_tokens " << max_tokens << ", temperature " << g.temperature << ", top_p " << g.top_p << ", top_k "
      << g.top_k << ", min_p " << g.min_p << ", seed " << seed << ", n " << std::max<size_t>(g.n, 1);
  if (g.best_of > 1) out << ", best_of " << g.best_of;
  if (g.beam_search) out << ", beam search";
  if (g.logprobs >= 0) out << ", logprobs " << g.logprobs;
  out << (g.stream ? ", streamed" : "");
  return out.str();
}

}  // namespace llmesh::gateway
