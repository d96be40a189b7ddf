// The replica's work loop as a plain class: requests in, one engine step per call, tokens out.
// It joins the batch scheduler (what runs), the block manager (where its KV lives, with
// prefix caching) and the engine (the tensor-parallel group), and samples each finished row
// with the request's own (seed, position) RNG — so a request's tokens are the ones
// model::generate would produce alone, whatever else shares its steps (the kernels are
// batch- and chunk-invariant). The replica actor will be a thin shell over this.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "llmesh/actors/batch_scheduler.hpp"
#include "llmesh/actors/block_manager.hpp"
#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/constraint.hpp"
#include "llmesh/model/constraint_cache.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/token_mask.hpp"

namespace llmesh::actors {

struct replica_request {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  size_t max_tokens = 16;
  kernels::sampling_params sampling;  ///< seed included (the gateway picks one if absent)
  std::vector<int32_t> eos_ids;       ///< generation ends after any of these
  /// The model it is for: routers pick among that model's replicas. Stays in the gateway's
  /// process (not on the wire): the replica it reaches serves that model.
  std::string model;
  /// How many of the prompt's last tokens are output already generated (a request continued
  /// after failover): they count for the penalties and min_tokens as the output they were.
  size_t generated = 0;
  /// Biases added to these tokens' logits before every draw (OpenAI's logit_bias; each id
  /// once, within the vocabulary, finite). submit() sets sampling.logit_bias to match.
  std::vector<kernels::token_bias> logit_bias;
  /// What the output must match (structured outputs; kind none: anything). submit() compiles
  /// it (refusing a bad one, or any when the replica has no tokenizer) and sets
  /// sampling.constrained to match.
  model::constraint_spec constraint;
  /// vLLM's allowed_token_ids: non-empty, only these may be drawn (each within the vocabulary;
  /// not with a constraint). submit() sets sampling.constrained, and every row gets the mask.
  std::vector<int32_t> allowed_ids;
  /// vLLM's bad_words as token ids (each non-empty, within the vocabulary): a word's last token
  /// is banned from every draw whose output so far ends with the word's other tokens (a
  /// one-token word: always).
  std::vector<std::vector<int32_t>> bad_words;
  /// Non-empty (with a constraint): the constraint holds only for the output after these
  /// tokens first appear in it (a reasoning model's "</think>": it thinks unconstrained, then
  /// answers in the grammar). Such a request does not speculate.
  std::vector<int32_t> constraint_after;
  /// vLLM's priority (lower first; request_spec::priority): the replica's scheduler admits and
  /// preempts by it. 0 unless the gateway's scheduling policy is priority.
  int32_t priority = 0;
  /// vLLM's cache_salt as a 64-bit key (request_spec::cache_salt; 0: none).
  uint64_t cache_salt = 0;
  /// The router's affinity key (OpenAI's prompt_cache_key, hashed; 0: none): a key's requests
  /// go where its last one went unless that replica is much busier (balancer::pick). Stays in
  /// the gateway's process, as `model` does.
  uint64_t route_key = 0;
  /// Not none: an embedding request (request_spec::pool). Its one message is the end (token
  /// -1, finish length) with the pooled final hidden state: the last prompt token's, the mean
  /// over the prompt (summed in position order in double: the same bits however the prompt is
  /// chunked), the first token's, or every prompt token's ([prompt][hidden], in order); not
  /// normalised. A classifier's are its score head's logits for that state (for all: each
  /// position's, [prompt][labels]). For all, prompt × values a position must not exceed
  /// transport::max_embedding (one message; refused at submit). Nothing is sampled: max_tokens must be 1
  /// (a failover then continues it as a generation of one token would), and the fields of
  /// generation (sampling's logprobs, bias, constraints, bad words) must be unset.
  pooling pool = pooling::none;
  /// The LoRA adapter to run it with, by name (its model's --lora-modules; "": none). A name
  /// the replica's model did not load is a not_found.
  std::string lora;
};

using kernels::sample_row;
using kernels::sample_rows;

/// A prompt's leading whole blocks of KV as one replica hands them to another (disaggregated
/// prefill: a prefill replica computes a long prompt, a decode replica takes its blocks into
/// its prefix cache and computes only the rest). The bytes are model::engine::export_kv's.
struct kv_prefix {
  std::vector<int32_t> tokens;  ///< the positions the blocks hold (whole blocks of the prompt's start)
  uint64_t cache_salt = 0;      ///< replica_request::cache_salt: blocks are cached under it
  std::string lora = {};        ///< replica_request::lora: they hold that adapter's keys and values
  uint32_t block_size = 0;
  kernels::dtype kv_type = kernels::dtype::f32;
  uint64_t block_bytes = 0;     ///< model::engine::kv_block_bytes() of the exporter
  std::shared_ptr<const std::vector<std::byte>> data;  ///< tokens / block_size blocks
  size_t blocks() const { return block_size ? tokens.size() / block_size : 0; }
};

/// Thread affinity: one thread (the replica actor's). Ownership: borrows the engine, which it
/// drives through engine::forward with its own block tables.
class replica_core {
 public:
  replica_core(model::engine& eng, scheduler_config cfg, bool prefix_caching = true);
  ~replica_core();
  replica_core(const replica_core&) = delete;
  replica_core& operator=(const replica_core&) = delete;

  /// Queues a request. Refuses empty prompts, max_tokens 0, duplicate ids, and prompts that
  /// cannot fit the model's context or the KV cache even alone.
  [[nodiscard]] status submit(replica_request r);
  /// The vocabulary's token bytes, for requests with a constraint (structured outputs): without
  /// one, submit() refuses them.
  void set_vocabulary(std::shared_ptr<const model::token_vocabulary> v) { vocab_ = std::move(v); }
  const model::token_mask_cache& mask_cache() const { return masks_; }

  /// Drops a request (a client went away); its blocks are free for the next step.
  bool cancel(uint64_t id);

  /// Runs one step. Returns the new tokens (with finish reasons); empty when nothing is
  /// queued. An engine failure is returned as is: the replica is then dead.
  [[nodiscard]] result<std::vector<token_event>> step();

  /// The same step in two halves, for a caller that runs the engine's ranks itself (the
  /// replica actor and its shard actors): begin_step() plans it (false: nothing to run), then
  /// batch() and rows() describe it, then finish_step() takes one sampled token per row (and
  /// the step's logprobs: the rows' if any asked, as kernels::logprobs_rows gives them, and the
  /// scored prompt positions'). No submit or cancel may come between the halves (the batch
  /// points into request state).
  bool begin_step();
  std::span<const model::step_sequence> batch() const { return batch_; }
  std::span<const sample_row> rows() const { return rows_; }
  std::vector<token_event> finish_step(std::span<const int32_t> sampled, const model::step_logprobs& logprobs = {});
  bool in_step() const { return in_step_; }

  /// Disaggregated prefill, the prefill side: the leading whole blocks of `prompt` (never the
  /// block of its last token, as a prefix-cache hit) that the prefix cache holds now — after a
  /// request with that prompt ran here — with their KV. Between steps. unsupported when prefix
  /// caching is off or the engine cannot copy its cache (CUDA, a spread group).
  [[nodiscard]] result<kv_prefix> export_prefix(std::span<const int32_t> prompt, uint64_t cache_salt, const std::string& lora);
  /// The decode side: writes the blocks of `p` the prefix cache does not hold yet into free
  /// blocks and caches them (evictable as any cached block), so that a request with that prompt
  /// finds them. Returns the blocks written. Between steps. Refuses (changing nothing) a prefix
  /// of another block size, KV dtype or block shape, tokens outside the vocabulary, an unknown
  /// adapter, or more blocks than are free.
  [[nodiscard]] result<size_t> import_prefix(const kv_prefix& p);

  /// Empties the prefix cache (block_manager::reset_prefix_cache; requests keep their blocks).
  /// Between steps. Returns the blocks that left it.
  size_t reset_prefix_cache() { return blocks_.reset_prefix_cache(); }

  bool idle() const { return sched_.waiting() + sched_.running() == 0; }
  size_t waiting() const { return sched_.waiting(); }
  size_t running() const { return sched_.running(); }
  const block_manager& blocks() const { return blocks_; }
  const batch_scheduler& scheduler() const { return sched_; }

 private:
  /// The prefix-cache key of requests with this salt and adapter (not_found: an unknown adapter).
  result<uint64_t> cache_key(uint64_t cache_salt, const std::string& lora) const;

  model::engine& eng_;
  block_manager blocks_;
  batch_scheduler sched_;
  std::unordered_map<uint64_t, kernels::sampling_params> sampling_;
  /// Per request with penalties or min_tokens: its tokens seen so far and its output count.
  struct adjust_state {
    std::vector<kernels::seen_token> seen;
    std::unordered_map<int32_t, size_t> index;  ///< id → its entry in seen
    std::vector<int32_t> end_ids;               ///< banned while generated < min_tokens
    std::vector<kernels::token_bias> bias;
    size_t generated = 0;
    /// Structured outputs: where the output is in its grammar.
    std::optional<model::grammar_matcher> matcher;
    /// The step's, one per drawn row, pointed to by its rows (row j: after j of the step's
    /// drafts): the seen counts with those drafts as output (penalties only; row 0 uses
    /// `seen`), and the grammar's mask there (held while the step runs: allowed points into it).
    std::vector<kernels::logits_adjust> views;
    std::vector<std::vector<kernels::seen_token>> seen_rows;
    std::vector<std::shared_ptr<const std::vector<uint32_t>>> masks;
    /// allowed_ids as a bitmask over the vocabulary (empty: none), every row's mask.
    std::vector<uint32_t> allowed_ids;
    bool allowed_only_end_ids = false;  ///< the set holds end ids only: min_tokens yields
    /// vLLM's bad_words (ids), the output's last tokens they are compared with (as many as the
    /// longest word less one), and the step's bans per row (end ids before min_tokens, and
    /// each word's last token where the output, with the row's drafts, ends with its rest).
    std::vector<std::vector<int32_t>> bad_words;
    /// constraint_after until the output shows it (empty: the grammar, if any, holds now).
    std::vector<int32_t> wait_for;
    std::vector<int32_t> recent;
    size_t recent_keep = 0;
    std::vector<std::vector<int32_t>> bans;
    void see(int32_t id, bool output);
    /// The grammar that masks the draws now: none while it waits for constraint_after.
    const model::grammar_matcher* active() const { return matcher && wait_for.empty() ? &*matcher : nullptr; }
    /// Whether the output so far and then `drafts` end with `prefix`.
    bool output_ends_with(std::span<const int32_t> prefix, std::span<const int32_t> drafts) const;
  };
  /// Fills st.views for a step that draws after the last token and after each of `drafts`
  /// (each a draft_filter kept: the grammar accepts it).
  void build_views(adjust_state& st, const kernels::sampling_params& p, std::span<const int32_t> drafts);
  /// How many of a constrained request's drafts its grammar accepts (the scheduler's filter).
  size_t grammatical_drafts(uint64_t id, std::span<const int32_t> drafts) const;
  /// The grammar of a request's constraint, compiled once per distinct spec in the process
  /// (model::constraint_cache::shared()).
  result<std::shared_ptr<const model::grammar>> grammar_of(const model::constraint_spec& spec);
  /// Follows a constrained request's new token: go on, end here (its grammar is complete and
  /// it has no end id to draw), or fail (the token is outside its grammar: drawn from a row the
  /// mask left empty, where no token of the vocabulary continues the grammar).
  enum class followed { on, done, outside };
  followed follow(adjust_state& st, int32_t token) const;
  std::unordered_map<uint64_t, adjust_state> adjust_;  ///< node-based: rows point into it
  /// Per request that scores its prompt (sampling.prompt_logprobs): prompt token i + 1's entry
  /// at i, filled as its chunks run (a recomputed chunk writes the same values again), handed
  /// out with its first token.
  std::unordered_map<uint64_t, std::vector<kernels::token_logprobs>> scored_;
  /// Per embedding request: its pooling, the positions it has pooled (a recomputed chunk's
  /// rows are not added again) and the pooled state ([hidden] sums in double for mean; the
  /// row itself for last and cls; every row so far, [next][hidden], for all — a classifier's
  /// logits of each, [next][labels]).
  struct pool_state {
    pooling pool = pooling::none;
    size_t positions = 0;  ///< the prompt's (mean, all: the rows it must have pooled at the end)
    size_t next = 0;
    std::vector<double> sum;
    std::vector<float> row;
  };
  std::unordered_map<uint64_t, pool_state> pooled_;
  /// Adds a step's hidden rows of a pooling sequence (`rows`: [k][hidden], its last k positions).
  void pool_rows(pool_state& st, const model::step_sequence& s, std::span<const float> rows) const;
  std::shared_ptr<const model::token_vocabulary> vocab_;
  model::token_mask_cache masks_;
  step_plan plan_;
  std::vector<model::step_sequence> batch_;
  std::vector<sample_row> rows_;
  bool in_step_ = false;
};

}  // namespace llmesh::actors
