// Prompt-lookup drafts (ngram_proposer.hpp).
#include "llmesh/actors/ngram_proposer.hpp"

#include <algorithm>

namespace llmesh::actors {

size_t propose_ngram(std::span<const int32_t> history, const speculation_config& cfg, size_t k, std::vector<int32_t>& out) {
  out.clear();
  const size_t len = history.size();
  const size_t min_n = std::max<size_t>(cfg.min_n, 1);
  const size_t max_n = std::min(cfg.max_n, len > 0 ? len - 1 : 0);
  if (k == 0 || max_n < min_n) return 0;
  // An occurrence ends at j (j < len - 1: a token follows it); its length is the common suffix
  // of history[..j] and history[..len - 1], capped at max_n. Keep the longest, the most recent
  // of equals (the first met walking back); max_n ends the walk.
  size_t best_end = 0, best_n = 0;
  for (size_t j = len - 1; j-- > 0;) {
    if (history[j] != history[len - 1]) continue;
    size_t n = 1;
    while (n < max_n && n <= j && history[j - n] == history[len - 1 - n]) ++n;
    if (n > best_n) {
      best_n = n;
      best_end = j;
      if (n == max_n) break;
    }
  }
  if (best_n < min_n) return 0;
  const size_t period = len - 1 - best_end;  // the drafts repeat with it past the end
  for (size_t t = 0; t < k; ++t) {
    const size_t at = best_end + 1 + t;
    out.push_back(at < len ? history[at] : out[t - period]);
  }
  return out.size();
}

}  // namespace llmesh::actors
