// Drafts for speculative decoding from a smaller model of the same vocabulary (vLLM's
// "draft_model" method, llama.cpp's --model-draft, TGI's speculative model): the draft model's
// greedy continuation of each sequence, k tokens. A plain class owning the draft's engine and
// its KV cache: each sequence keeps the draft KV of the tokens it has seen, so a step runs only
// what is new (the tokens the target kept since, or the whole prompt the first time) and then
// k - 1 one-token decodes, all sequences of the step batched together. The target model then
// checks every draft in one step (batch_scheduler); the output does not depend on the drafts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/model/engine.hpp"

namespace llmesh::actors {

/// One sequence's request for drafts: its tokens so far (prompt and output) and how many
/// drafts to propose at most.
struct draft_query {
  uint64_t id = 0;
  std::span<const int32_t> history;
  size_t k = 0;
};

/// Loads the draft model in `dir` for `target` (whose tokenizer is in `target_tokenizer_dir`)
/// and checks that it can draft for it: a causal LM (not a classifier) whose vocabulary size is
/// within 128 of the target's (llama.cpp's rule: padding differs between sizes of one family)
/// and whose tokenizer spells every id both vocabularies hold, special tokens aside, as the
/// target's does. Errors name the draft's directory and what differs. `max_model_len`: the
/// context served (0: the target's); a longrope draft's factors follow it, capped at its own.
[[nodiscard]] result<std::shared_ptr<const model::model>> load_draft_model(const std::string& dir, const model::model& target,
                                                                           const std::string& target_tokenizer_dir,
                                                                           size_t max_model_len = 0);
/// The same checks of an already loaded draft (its tokenizer read from its directory).
[[nodiscard]] status check_draft_model(const model::model& draft, const model::model& target,
                                       const std::string& target_tokenizer_dir);

/// Thread affinity: one caller at a time (the replica's thread); the draft's kernels run on its
/// engine's pool.
class draft_model_proposer {
 public:
  struct options {
    int threads = 1;          ///< the draft engine's kernel threads
    size_t kv_tokens = 0;     ///< its KV cache in positions (every sequence's history and drafts)
    size_t block_size = 16;
    kernels::dtype kv_type = kernels::dtype::f32;
    int32_t target_vocab = 0;  ///< drafts at or past this id are cut (the target cannot draw them)
    size_t chunk = 512;        ///< tokens per draft forward while catching up on a prompt
    /// History tokens one propose() runs at most (a replica's max_batch_tokens): a longer
    /// catch-up (a long prompt) goes on at the next call, its drafts after it.
    size_t catch_up = 2048;
  };
  [[nodiscard]] static result<std::unique_ptr<draft_model_proposer>> create(std::shared_ptr<const model::model> draft,
                                                                            options opt);
  ~draft_model_proposer();

  /// Proposes drafts for every query: out[i] (cleared first) receives up to queries[i].k
  /// tokens, the draft model's greedy continuation of its history, cut before the first id
  /// outside the target's vocabulary. A query whose KV does not fit (after dropping the state
  /// of sequences not asked now), that would pass the draft's positions or whose history holds
  /// an id outside the draft's vocabulary gets none, as does one still catching up (its
  /// history beyond what options::catch_up let run). An error (its engine failed, or threw)
  /// clears every sequence's state: no drafts now; the engine stays failed.
  [[nodiscard]] status propose(std::span<const draft_query> queries, std::vector<std::vector<int32_t>>& out);
  /// Drops a sequence's draft state (it finished or was cancelled). Unknown ids are ignored.
  void forget(uint64_t id);

  /// Sequences with draft state, and the draft KV blocks free.
  size_t sequences() const { return seqs_.size(); }
  size_t free_blocks() const { return free_.size(); }
  /// Draft tokens run through the draft model since construction (catch-up and decodes).
  size_t tokens_run() const { return tokens_run_; }

 private:
  struct sequence {
    std::vector<int32_t> blocks;
    std::vector<int32_t> tokens;  ///< tokens whose draft KV is in `blocks`, positions 0..
    uint64_t used = 0;            ///< the propose() call that last asked for it (eviction order)
  };
  draft_model_proposer(std::unique_ptr<model::engine> eng, options opt);
  /// Blocks for `positions` positions of `s`, taking them from sequences not in `keep`
  /// (least recently asked first) when the free list is short. False when they do not fit.
  bool reserve(uint64_t id, sequence& s, size_t positions, const std::unordered_map<uint64_t, size_t>& keep);
  [[nodiscard]] status run(std::span<const draft_query> queries, std::vector<std::vector<int32_t>>& out);
  /// Drops every sequence's state and `out`'s drafts: the error `why`.
  [[nodiscard]] status fail(const std::string& why, std::vector<std::vector<int32_t>>& out);
  void release(sequence& s);

  std::unique_ptr<model::engine> eng_;
  options opt_;
  size_t max_positions_ = 0;
  size_t draft_vocab_ = 0;
  std::vector<int32_t> free_;
  std::unordered_map<uint64_t, sequence> seqs_;
  uint64_t calls_ = 0;
  size_t tokens_run_ = 0;
};

}  // namespace llmesh::actors
