// Drafts for speculative decoding by prompt lookup (vLLM's "ngram" method, llama.cpp's lookup
// decoding, TGI's n-gram speculation): the tokens that followed the most recent earlier
// occurrence of the sequence's last n tokens. Text that copies its context (summaries, code
// edits, quoted documents, repetition) continues as it did before; the model then checks every
// draft in one step. A plain function: no model, no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace llmesh::actors {

/// Drafts per step at most.
inline constexpr size_t max_speculative_tokens = 32;

struct speculation_config {
  size_t tokens = 0;  ///< drafts per step at most (vLLM's num_speculative_tokens; 0: off, at most max_speculative_tokens)
  size_t max_n = 4;   ///< longest suffix looked up (prompt_lookup_max)
  size_t min_n = 2;   ///< shortest suffix that counts as a match (prompt_lookup_min), at least 1
  /// No drafts in a step while more requests than this run (vLLM's
  /// speculative_disable_by_batch_size): a large batch is compute-bound, where draft rows cost
  /// what they save. 0: no such limit.
  size_t disable_by_batch_size = 0;
};

/// Proposes up to `k` drafts after `history` into `out` (cleared first) and returns how many.
/// The match is the longest suffix of `history` (min_n..max_n tokens) that also ends earlier in
/// it, the most recent such occurrence; the drafts are the tokens that followed it. A match
/// that overlaps the suffix (a repeating period) continues periodically past the history's end.
/// Cost: one backward pass over `history`, each position compared at most max_n times.
size_t propose_ngram(std::span<const int32_t> history, const speculation_config& cfg, size_t k, std::vector<int32_t>& out);

}  // namespace llmesh::actors
