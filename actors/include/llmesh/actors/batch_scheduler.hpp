// The replica's continuous-batching scheduler (iteration-level, vLLM/Orca style), a plain
// class: each call plans one forward step over the running requests under a token budget —
// every decoding request's next token first, then prompt chunks (chunked prefill; at most
// long_prefill_threshold tokens a prompt), then new requests admitted in arrival order (within
// vLLM's priorities, lower first; vLLM's partial-prefill limits) while KV blocks allow — and then applies the sampled tokens, finishing requests on max_tokens or an
// end-of-sequence id. When a running request cannot get a block, the most recently admitted
// request of the lowest priority is preempted: its blocks are freed and it waits at the head
// of its priority's queue to be recomputed (prompt + output so far; the prefix cache often
// still holds most of it). A waiting request whose prompt is mostly a prefix a
// running request is still computing (n choices of one prompt, a burst of requests behind one
// long system prompt) waits for those blocks to reach the prefix cache instead of computing
// them again beside it; requests behind it are admitted meanwhile. Stop strings are the
// caller's (they need text).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "llmesh/actors/block_manager.hpp"
#include "llmesh/actors/ngram_proposer.hpp"
#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/shard_executor.hpp"

namespace llmesh::model {
class model;
}

namespace llmesh::actors {

class draft_model_proposer;
struct draft_query;

struct scheduler_config {
  size_t max_batch_tokens = 2048;  ///< tokens per step (prefill chunks + decodes)
  size_t max_seqs = 256;           ///< sequences per step
  /// vLLM's --long-prefill-token-threshold: a prompt runs at most this many tokens a step, so
  /// one long prompt leaves the budget's rest to the requests behind it (their first tokens do
  /// not wait for all of it); a prompt with more than this many left to compute is "long".
  /// 0: no cap (a prompt takes what the budget has), nothing is long.
  size_t long_prefill_threshold = 0;
  /// vLLM's --max-num-partial-prefills (V0's meaning; V0 also split the step's budget among
  /// them, here each takes up to the threshold): above 1, at most this many prompts are being
  /// computed at once (across steps); a waiting prompt is admitted only below it. 0 or 1: no
  /// such limit.
  size_t max_partial_prefills = 1;
  /// vLLM's --max-long-partial-prefills (with max_partial_prefills above 1): of those, at most
  /// this many long ones (at least 1); a long prompt past it waits while shorter prompts behind
  /// it are admitted (they jump the queue). Long counts a waiting prompt's tokens before its
  /// prefix-cache hit, as V0 does.
  size_t max_long_partial_prefills = 1;
  /// Speculative decoding by prompt lookup (off by default): a decoding request that may
  /// speculate (request_spec::speculate) runs its next token with up to `tokens` drafts, and
  /// keeps each draft the model itself draws at that position, plus the token drawn after the
  /// last one kept. Drafts are planned after everything else, from the budget and unused
  /// blocks left over. Each drawn token is the one a plain decode would draw (the caller's kernels
  /// are batch- and chunk-invariant and its sampling keyed by position), so the output is the
  /// same, in fewer steps when drafts are right.
  speculation_config speculation;
  /// vLLM's automatic prefix caching (on by default; --no-enable-prefix-caching turns it off: no
  /// request reuses another's KV blocks, every prompt is computed whole).
  bool prefix_caching = true;
  /// Speculation from a draft model (vLLM's speculative_config "model"; null: prompt lookup):
  /// the replica (replica_core) runs it on an engine of its own, and speculation.tokens
  /// drafts per step are its greedy continuation instead of a lookup's.
  std::shared_ptr<const model::model> draft_model;
};

/// vLLM's default for the long-prefill threshold: with more than one partial prefill allowed
/// and no threshold given, 4 % of the served context (at least 1).
inline void default_long_prefill_threshold(scheduler_config& c, size_t context) {
  if (c.max_partial_prefills > 1 && c.long_prefill_threshold == 0) c.long_prefill_threshold = std::max<size_t>(1, context * 4 / 100);
}

/// The partial-prefill settings in words for a log line ("" when off): "prompts at most 128
/// tokens a step, at most 4 at once, 1 of them long".
inline std::string prefill_limits_text(const scheduler_config& c) {
  std::string out;
  if (c.long_prefill_threshold > 0) out = "prompts at most " + std::to_string(c.long_prefill_threshold) + " tokens a step";
  if (c.max_partial_prefills > 1) {
    out += (out.empty() ? "prompts " : ", ") + std::string("at most ") + std::to_string(c.max_partial_prefills) + " at once, " +
           std::to_string(std::max<size_t>(1, c.max_long_partial_prefills)) + " of them long";
  }
  return out;
}

/// An embedding request's pooling (vLLM's pooling types; none: a generation): the model's
/// final hidden state at the last prompt token, their mean over the prompt, the first
/// token's (BERT's CLS), or every prompt position's, in order (vLLM's ALL: /pooling's
/// token_embed and token_classify).
enum class pooling : uint8_t { none, last, mean, cls, all };

struct request_spec {
  uint64_t id = 0;
  std::vector<int32_t> prompt;  ///< at least one token
  size_t max_tokens = 16;       ///< tokens to generate at most (≥ 1)
  std::vector<int32_t> eos_ids; ///< generation ends after any of these (empty: never)
  /// Score the prompt (kernels::sampling_params::prompt_logprobs; -1: no): every prompt
  /// position is computed (no prefix-cache hit until the first token is out) and each chunk
  /// asks for its positions' successors to be scored.
  int prompt_logprobs = -1;
  /// Its drafts may run (scheduler_config::speculation): the caller says so when it can draw
  /// each row as a plain decode would (its logits do not depend on the batch, and each row's
  /// adjustments count the drafts before it).
  bool speculate = false;
  /// vLLM's priority: lower is served first. Waiting requests are admitted in (priority,
  /// arrival) order, and a running request short of blocks preempts the one of the highest
  /// value admitted last (itself, when that is it). All 0: first come, first served.
  int32_t priority = 0;
  /// vLLM's cache_salt, as a 64-bit key (0: none): the prefix-cache chain of its blocks starts
  /// from it, so it shares cached blocks only with requests of the same salt (a tenant cannot
  /// learn from hits what another's prompts were).
  uint64_t cache_salt = 0;
  /// Not none: an embedding request. Its prompt runs (its chunks want the final hidden rows
  /// its pooling needs: the last position's; every position's for mean and all, the first's
  /// for cls, these computed whole like a scored prompt) and nothing is drawn: one event (token -1, finish length)
  /// ends it once the prompt is computed. max_tokens is not used.
  pooling pool = pooling::none;
  /// The LoRA adapter its steps run with (an id in the model's loras(); -1: none). Its KV
  /// blocks hold that adapter's keys and values: the prefix cache keys them apart (prefix_key;
  /// ids are never reused, so a block cached under a removed adapter matches nothing).
  int32_t lora = -1;
  /// That adapter, held for the request's life: removing it from the model lets the requests
  /// running with it finish with it.
  std::shared_ptr<const model::lora_adapter> adapter;
};

/// The key a request's prefix-cache chain starts from: its cache_salt, mixed with its adapter
/// when it has one (blocks computed under different adapters differ). Never 0 with an adapter.
inline uint64_t prefix_key(const request_spec& s) {
  if (s.lora < 0) return s.cache_salt;
  uint64_t z = s.cache_salt ^ (0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(s.lora) + 1));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z == 0 ? 1 : z;
}

/// One sequence's part of a planned step. Spans point into the scheduler's request state and
/// stay valid until complete() or the next schedule().
struct scheduled_seq {
  uint64_t id = 0;
  std::span<const int32_t> tokens;       ///< tokens to run, at positions pos0..
  size_t pos0 = 0;
  std::span<const int32_t> block_table;  ///< covers pos0 + tokens.size()
  bool want_logits = false;              ///< the chunk ends the known tokens: sample after it
  int prompt_logprobs = -1;              ///< score the chunk's prompt positions (model::step_sequence)
  int32_t next = -1;                     ///< the token after the chunk, when it is a prompt token
  /// Rows drawn from its last positions: 1, or 1 + its drafts (tokens = the last token, then
  /// the drafts) when it speculates.
  uint32_t draws = 1;
  model::hidden_rows hidden = model::hidden_rows::none;  ///< an embedding request's (request_spec::pool)
  int32_t lora = -1;                                     ///< request_spec::lora
  const model::lora_adapter* adapter = nullptr;          ///< request_spec::adapter
};

struct step_plan {
  std::vector<scheduled_seq> seqs;
  size_t n_tokens = 0;
  std::vector<uint64_t> preempted;  ///< requests sent back to the queue while planning
};

enum class finish_reason { none, length, eos, cancelled };

/// A request's time on the replica that runs it, in microseconds (-1: not known): queued (its
/// arrival there to its first admission), prefill (first admission to its first token) and
/// inference (first admission to its last token; prefill + decode). vLLM's request_queue_time,
/// request_prefill_time and request_inference_time. A preemption does not restart them.
struct replica_times {
  int64_t queued_us = -1, prefill_us = -1, inference_us = -1;
  bool operator==(const replica_times&) const = default;
  /// Takes `later`'s fields that are set: a later message's word stands (after a migration, the
  /// replica that finished the request).
  void update(const replica_times& later) {
    if (later.queued_us >= 0) queued_us = later.queued_us;
    if (later.prefill_us >= 0) prefill_us = later.prefill_us;
    if (later.inference_us >= 0) inference_us = later.inference_us;
  }
  /// Becomes `o` when o's generation took longer (a longer inference, else without either one a
  /// longer prefill, else a longer wait): a response reports its slowest generation's times,
  /// all from that one generation.
  void keep_slower(const replica_times& o) {
    const bool slower = o.inference_us != inference_us ? o.inference_us > inference_us
                        : o.prefill_us != prefill_us   ? o.prefill_us > prefill_us
                                                       : o.queued_us > queued_us;
    if (slower) *this = o;
  }
};

/// What a completed step produced for one request.
struct token_event {
  uint64_t id = 0;
  int32_t token = -1;                        ///< the new token (-1 for a cancellation)
  finish_reason finish = finish_reason::none;
  std::optional<kernels::token_logprobs> logprobs;  ///< when the request asked (replica_core sets it)
  /// With a request's first token, when it asked: prompt token i + 1's at i (replica_core sets it).
  std::vector<kernels::token_logprobs> prompt_logprobs;
  /// The request failed here (token -1, finish cancelled; replica_core sets it): its grammar
  /// reached a point no vocabulary token continues.
  std::optional<error> failure;
  /// The step's row this token was drawn from (rows of the want_logits sequences in plan order,
  /// draws each): where its logprobs are.
  size_t row = 0;
  /// With a request's first token: how many of its tokens the prefix cache held when it was
  /// first admitted (OpenAI's cached_tokens); -1 on its other tokens.
  int32_t cached_tokens = -1;
  /// An embedding request's end: its pooled hidden state (replica_core sets it).
  std::vector<float> embedding = {};
  /// With a request's first token: queued and prefill; with its last (an embedding's end too):
  /// all three. Unset (-1) on the tokens between.
  replica_times times = {};
};

/// Thread affinity: the replica's thread. Ownership: owns request state; borrows the block
/// manager (one scheduler per manager).
class batch_scheduler {
 public:
  batch_scheduler(scheduler_config cfg, block_manager& blocks);
  ~batch_scheduler();

  /// Queues a request (FCFS). Refuses an empty prompt, max_tokens 0 (unless it pools) or a
  /// duplicate id.
  [[nodiscard]] status add(request_spec r);
  /// Drops a request (queued or running) and frees its blocks at once.
  /// Returns false for unknown ids.
  bool cancel(uint64_t id);

  /// Speculation: how many of a request's drafts (its leading ones) may run; the caller's
  /// knowledge of what can be drawn (a grammar). Unset: all.
  using draft_filter = std::function<size_t(uint64_t id, std::span<const int32_t> drafts)>;
  void set_draft_filter(draft_filter f) { filter_ = std::move(f); }
  /// Drafts from a draft model (scheduler_config::draft_model) instead of prompt lookup; every
  /// speculating request of a step asks it at once.
  void set_draft_model(std::unique_ptr<draft_model_proposer> d);
  const draft_model_proposer* draft_model() const { return drafter_.get(); }
  /// Times the draft model failed (its engine is then dropped: later steps run without drafts).
  size_t draft_failures() const { return draft_failures_; }

  /// Plans the next step (reserves its blocks). An empty plan means nothing can run now.
  step_plan schedule();
  /// Applies a step's results: `sampled` holds one token per drawn row of `plan` (draws per
  /// want_logits sequence, in plan order). A speculating sequence keeps its drafts up to the
  /// first one its drawn token differs from and gives an event per token kept, stopping at an
  /// end id or max_tokens. Finished requests are removed and their blocks released.
  std::vector<token_event> complete(const step_plan& plan, std::span<const int32_t> sampled);

  size_t waiting() const { return waiting_.size(); }
  size_t running() const { return running_.size(); }
  size_t preemptions() const { return preemptions_; }
  /// Steps × waiting requests put off to share a prefix a running request was computing.
  size_t deferrals() const { return deferrals_; }
  /// Speculative decoding: drafts run, and drafts kept (drawn as proposed), since construction.
  size_t drafted() const { return drafted_; }
  size_t accepted() const { return accepted_; }
  /// Generated tokens so far of a live request (empty for unknown ids).
  std::span<const int32_t> output(uint64_t id) const;
  /// A live request's replica_times now, as its `last` token would carry them (what is not
  /// known yet: -1; unknown ids: all -1). For a caller that ends a request itself (a grammar
  /// that is complete).
  replica_times times(uint64_t id, bool last) const;

 private:
  struct request {
    request_spec spec;
    std::vector<int32_t> tokens;  ///< prompt, then every generated token
    size_t n_generated = 0;
    size_t n_computed = 0;        ///< tokens whose KV is in `blocks`
    block_list blocks;
    std::vector<int32_t> step_tokens;  ///< a speculating step's: the last token, then the drafts
    /// Adaptive speculation: drafts to propose at most (one more than it kept last time, twice
    /// as many when it kept them all), and steps to sit out after drafts none of which was kept
    /// (doubling with each such step in a row): text a lookup cannot guess costs little.
    size_t draft_cap = max_speculative_tokens;
    size_t sit_out = 0;
    unsigned misses = 0;
    std::optional<size_t> cached;  ///< the prefix-cache hit at its first admission
    bool cached_reported = false;  ///< its first token (which carries `cached`) is out
    /// When it was added, first admitted and drew its first token (replica_times).
    std::chrono::steady_clock::time_point added, admitted, first_token;
  };
  /// `r`'s replica_times now: queued and prefill once known, inference when `last`.
  static replica_times times_of(const request& r, bool last);
  void preempt(uint64_t id);
  /// Queues a waiting request: at the end of its priority's requests, or (`front`: a preempted
  /// one, which came before them) at their head.
  void enqueue(uint64_t id, bool front);
  /// The running request to preempt for blocks: the highest priority value, the newest of those.
  uint64_t victim() const;
  /// Speculation over the step's picks: each decoding request that may speculate gets drafts
  /// (prompt lookup, one after another from the budget left; or the draft model for all of
  /// them at once) and runs its last token and them (its pick's count becomes 1 + its drafts);
  /// the drafts come out of `budget`.
  void speculate(std::vector<std::pair<uint64_t, size_t>>& picks, size_t& budget);
  /// How many drafts `r` may propose now from `left` tokens of budget (0: none this step).
  size_t draft_limit(request& r, size_t left);
  /// Runs `drafts` (cut at an end id, by the filter, to unused blocks) after r's last token:
  /// its step's tokens, 1 when none is left.
  size_t take_drafts(request& r, std::vector<int32_t>& drafts);
  bool admit(request& r, size_t& budget);
  /// Tokens r runs this step from position `from` within `budget`: what is left of its known
  /// tokens, at most the long-prefill threshold.
  size_t chunk_of(const request& r, size_t from, size_t budget) const;
  /// It has more than its last token to compute (a prompt, or a preempted request's context).
  static bool prefilling(const request& r) { return r.tokens.size() - r.n_computed > 1; }
  /// A prefill with more left than the long-prefill threshold.
  bool long_prefill(const request& r) const {
    return cfg_.long_prefill_threshold > 0 && r.tokens.size() - r.n_computed > cfg_.long_prefill_threshold;
  }
  /// Whether `r` should wait for a running request to finish computing the prefix they share:
  /// whole blocks covering at least half of r's tokens that the prefix cache does not hold yet.
  bool awaits_shared_prefix(const request& r) const;
  /// It scores its prompt and has not drawn its first token yet: its tokens are the prompt,
  /// computed whole (no prefix-cache hit).
  static bool scoring(const request& r) { return r.spec.prompt_logprobs >= 0 && r.n_generated == 0; }
  /// Its prompt is computed whole, every position (no prefix-cache hit): it scores it, or it
  /// pools over its positions (mean, cls, all).
  static bool whole(const request& r) {
    return scoring(r) || r.spec.pool == pooling::mean || r.spec.pool == pooling::cls || r.spec.pool == pooling::all;
  }

  scheduler_config cfg_;
  block_manager& blocks_;
  std::map<uint64_t, request> requests_;
  std::deque<uint64_t> waiting_;
  std::vector<uint64_t> running_;  ///< admission order
  size_t preemptions_ = 0;
  size_t deferrals_ = 0;
  size_t drafted_ = 0, accepted_ = 0;
  std::vector<draft_query> queries_;           ///< scratch
  std::vector<std::vector<int32_t>> drafts_;  ///< scratch
  draft_filter filter_;
  std::unique_ptr<draft_model_proposer> drafter_;
  size_t draft_failures_ = 0;
};

}  // namespace llmesh::actors
