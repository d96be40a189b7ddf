// Stop-string matching across pieces (stop_matcher.hpp). Held text is at most the longest
// stop string minus one byte, so the work per piece is bounded by the stops' total length.
#include "llmesh/gateway/stop_matcher.hpp"

#include <algorithm>

namespace llmesh::gateway {

stop_matcher::stop_matcher(std::vector<std::string> stops, bool include) : include_(include) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

stop_matcher::output stop_matcher::push(std::string_view piece, bool match) {
  output out;
  if (stopped_) return out;
  held_.append(piece);
  // The earliest complete stop string wins; it must end in the new piece. (With every push
  // matched, held_ before the piece holds no whole stop string anyway: it would have been
  // found then.)
  size_t first = std::string::npos, length = 0;  // at the earliest position, the first stop listed
  const std::string* which = nullptr;
  if (match) {
    for (const auto& s : stops_) {
      const size_t from = searched_ >= s.size() ? searched_ - s.size() + 1 : 0;
      const size_t at = held_.find(s, from);
      if (at < first) {
        first = at;
        length = s.size();
        which = &s;
      }
    }
  }
  if (first != std::string::npos) {
    matched_ = *which;
    out.text = held_.substr(0, include_ ? first + length : first);
    out.stopped = stopped_ = true;
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  out.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  searched_ = held_.size();
  return out;
}

std::string stop_matcher::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  return out;
}

}  // namespace llmesh::gateway
