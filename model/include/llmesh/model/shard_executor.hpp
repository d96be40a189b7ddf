// One tensor-parallel rank of a model: its slice of the attention heads, of the MLP, of the LM
// head and of the KV cache. It runs one forward step for a batch of sequences and meets its
// peers in all-reduces through a communicator (Megatron-style: column-parallel q/k/v and
// gate/up, row-parallel o and down, vocabulary-parallel LM head).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/attention.hpp"
#include "llmesh/kernels/communicator.hpp"
#include "llmesh/kernels/sampling.hpp"
#include "llmesh/kernels/thread_pool.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model {
namespace detail {
class lora_runner;
struct row_slice;
}

/// The slice of the model one rank owns. Heads and the MLP split evenly; when there are fewer
/// KV heads than ranks, each rank holds a replica of the one KV head its query heads use.
/// A mixture of experts splits each expert's intermediate (inter0, n_inter) over the ranks, or,
/// expert-parallel (vLLM's --enable-expert-parallel), gives each rank whole experts: n_inter is
/// then the whole intermediate and [expert0, expert0 + n_experts) the rank's experts (vLLM's
/// split: n / tp each, the first n % tp ranks one more). The shared expert is always split.
struct shard_layout {
  int rank = 0, tp = 1;
  bool expert_parallel = false;
  size_t q_head0 = 0, n_heads = 0;
  size_t kv_head0 = 0, n_kv_heads = 0;
  size_t inter0 = 0, n_inter = 0;
  size_t expert0 = 0, n_experts = 0;  ///< the routed experts this rank runs (every one unless expert_parallel)
  size_t shared0 = 0, n_shared = 0;  ///< Qwen2-MoE's shared expert's intermediate slice
  size_t vocab0 = 0, n_vocab = 0;  ///< LM head rows; the last rank takes the remainder
};

/// Computes rank `rank` of `tp`, or an error naming the dimension that cannot split.
/// expert_parallel splits a mixture of experts' experts instead of their intermediate (a dense
/// model ignores it, as vLLM does); it needs at least as many experts as ranks.
[[nodiscard]] result<shard_layout> make_shard_layout(const model_config& cfg, int rank, int tp, bool expert_parallel = false);

/// Paged KV cache geometry (identical on every rank; the block ids come from the caller).
struct kv_cache_config {
  size_t block_size = 16;  ///< positions per block (vLLM's default)
  size_t n_blocks = 0;
  kernels::dtype type = kernels::dtype::f32;  ///< f32, bf16, f8_e4m3 or f8_e5m2 (--kv-cache-dtype)
};

/// The final hidden states a sequence wants from a step (embeddings: a pooling model's
/// /v1/embeddings): none, its last position's, its first's (of this chunk), or every
/// position's, each normalised by the model's final norm (the rows its LM head would take).
enum class hidden_rows : uint8_t { none, last, first, all };

/// One sequence's part of a step: new tokens at positions pos0.., the block table covering
/// them, and whether the caller wants the logits of its last token.
struct step_sequence {
  std::span<const int32_t> tokens;
  size_t pos0 = 0;
  std::span<const int32_t> block_table;
  bool want_logits = true;
  /// Prompt log-probabilities (vLLM's prompt_logprobs, OpenAI's echo with logprobs): n >= 0
  /// (at most kernels::max_logprobs) scores every token of `tokens` whose successor is known:
  /// the successor's log-probability under the logits at that position, with the n most
  /// likely tokens' (kernels::compute_logprobs on the raw logits). The successor of tokens[i]
  /// is tokens[i + 1], and of the last one `next` (-1: not scored; the chunk ends the prompt
  /// and its last position is drawn from instead).
  int prompt_logprobs = -1;
  int32_t next = -1;
  /// Rows drawn from (with want_logits): the last `draws` positions each give one, in order —
  /// a decode step that verifies speculated tokens (the token after position pos0 + i is drawn
  /// from that position's logits, which are those a step ending there would give). At least 1,
  /// at most tokens.size() and max_draws; above 1 only without prompt scoring.
  uint32_t draws = 1;
  /// Its final hidden rows come back (rank 0's step_logprobs::hidden). They are the rows the
  /// LM head would take at those positions, whatever else the step holds.
  hidden_rows hidden = hidden_rows::none;
  /// The LoRA adapter its projections add (an id in model::loras()), or -1 for none.
  int32_t lora = -1;
  /// That adapter itself, held by the caller for the step (a replica pins it for the request's
  /// life, so that removing the adapter does not stop the requests running with it); null: the
  /// executor looks `lora` up in model::loras() for the step.
  const lora_adapter* adapter = nullptr;
};

/// How many hidden rows `s` wants from a step, and the chunk position of the first of them
/// (they are consecutive).
inline size_t hidden_row_count(const step_sequence& s) {
  return s.hidden == hidden_rows::none ? 0 : s.hidden == hidden_rows::all ? s.tokens.size() : 1;
}
inline size_t hidden_row_first(const step_sequence& s) {
  return s.hidden == hidden_rows::last ? s.tokens.size() - 1 : 0;
}

/// The most rows one sequence may draw from in a step (step_sequence::draws).
inline constexpr uint32_t max_draws = 64;
/// The rows `s` draws from: its draws when it wants logits, else none.
inline size_t drawn_rows(const step_sequence& s) { return s.want_logits ? s.draws : 0; }

/// How many positions of `s` a step scores (step_sequence::prompt_logprobs).
size_t scored_positions(const step_sequence& s);
/// The token scored at position i of `s` (i < scored_positions(s)): its successor.
inline int32_t scored_target(const step_sequence& s, size_t i) { return i + 1 < s.tokens.size() ? s.tokens[i + 1] : s.next; }

/// What a step gives back besides its tokens, rank 0's: log-probabilities and hidden rows.
struct step_logprobs {
  kernels::row_logprobs rows;  ///< the drawn rows' (kernels::logprobs_rows; empty when none asks)
  /// Every scored position's, sequences in batch order, positions in order.
  std::vector<kernels::token_logprobs> prompt;
  /// [n][hidden]: the hidden rows the sequences want (step_sequence::hidden), in batch order,
  /// each sequence's in position order.
  std::vector<float> hidden;
  void clear() {
    rows.clear();
    prompt.clear();
    hidden.clear();
  }
};

/// Refuses a step whose sampling rows do not match its sequences' drawn rows (drawn_rows), one to one.
[[nodiscard]] status check_sample_rows(std::span<const step_sequence> batch, size_t rows);

/// One rank's forward step on some device: the CPU (shard_executor below) or a GPU
/// (cuda_executor.hpp). The engine and the shard actors see only this.
class step_executor {
 public:
  virtual ~step_executor() = default;

  /// Runs one step. On success every rank's `logits` holds [n_want][vocab] (the drawn rows,
  /// drawn_rows of each sequence, in batch order). REQUIRES: token ids < vocab, block tables
  /// cover pos0 + tokens.size() (the engine checks both before calling).
  [[nodiscard]] virtual status forward(std::span<const step_sequence> batch, std::vector<float>& logits) = 0;

  /// Runs one step and draws the token of each wanted row (kernels::sample with rows[i]: the
  /// drawn rows of each sequence, in batch order): rank 0's `tokens` get one per row,
  /// other ranks' are left empty. On a GPU only the ids cross back to the host (and the rows
  /// of those that ask for logprobs, the scored positions' and the hidden rows). With
  /// `logprobs`, rank 0 also fills its rows as kernels::logprobs_rows does (empty when no row
  /// asks), its prompt entries (step_sequence::prompt_logprobs) and its hidden rows
  /// (step_sequence::hidden; every rank holds them after the last all-reduce). Scoring runs whatever `logprobs` is (every
  /// rank takes part in its LM-head collectives): its results are dropped without it.
  [[nodiscard]] virtual status forward_sample(std::span<const step_sequence> batch, std::span<const kernels::sample_row> rows,
                                              std::vector<int32_t>& tokens, step_logprobs* logprobs) = 0;
  [[nodiscard]] status forward_sample(std::span<const step_sequence> batch, std::span<const kernels::sample_row> rows,
                                      std::vector<int32_t>& tokens) {
    return forward_sample(batch, rows, tokens, nullptr);
  }

  virtual const shard_layout& layout() const = 0;

  /// KV transfer (disaggregated prefill): copies whole blocks of this rank's cache out to, or
  /// in from, `data`, laid out per block as [layer][keys, values][position][the model's KV
  /// heads][head_dim] elements of the cache's type (kv_transfer.cpp); a rank reads and writes its
  /// own heads only. REQUIRES: ids in range and data of blocks × that size (the engine checks).
  /// unsupported where the backend cannot (the default).
  [[nodiscard]] virtual status kv_copy_out(std::span<const int32_t> blocks, std::span<std::byte> data) const;
  [[nodiscard]] virtual status kv_copy_in(std::span<const int32_t> blocks, std::span<const std::byte> data);

  /// Per-op device time since the last reset, one line per op ("" where not profiled).
  virtual std::string profile_report() const { return ""; }
  virtual void profile_reset() {}
};

/// The CPU executor.
/// Thread affinity: one thread drives forward() at a time; it uses `pool` for its kernels.
/// Ownership: shares the model; owns its KV cache; borrows the communicator and the pool.
class shard_executor final : public step_executor {
 public:
  shard_executor(std::shared_ptr<const model> m, shard_layout layout, kv_cache_config kv,
                 kernels::communicator* comm, kernels::thread_pool* pool);
  ~shard_executor() override;

  /// Makes this rank's int8 copies of the K-quant row-parallel slices (o_proj, down_proj, each
  /// expert's and a shared expert's down_proj) that would cut a super-block (row_slices.hpp);
  /// nothing for other weights. Called once, before the first step; fails when such a slice
  /// holds a non-finite value.
  [[nodiscard]] status make_row_slices();

  [[nodiscard]] status forward(std::span<const step_sequence> batch, std::vector<float>& logits) override;
  using step_executor::forward_sample;
  [[nodiscard]] status forward_sample(std::span<const step_sequence> batch, std::span<const kernels::sample_row> rows,
                                      std::vector<int32_t>& tokens, step_logprobs* logprobs) override;
  const shard_layout& layout() const override { return layout_; }
  [[nodiscard]] status kv_copy_out(std::span<const int32_t> blocks, std::span<std::byte> data) const override;
  [[nodiscard]] status kv_copy_in(std::span<const int32_t> blocks, std::span<const std::byte> data) override;

 private:
  status attention_block(size_t layer, std::span<const step_sequence> batch, size_t n_tokens);
  status mlp_block(size_t layer, size_t n_tokens);
  /// An MoE layer's MLP on the normed rows in xn_ (moe_block.cpp): the router, each token's
  /// experts, this rank's slice of each of its experts run on the rows routed to it, the
  /// weighted sum per token in its experts' order, the all-reduce and the residual.
  status moe_block(size_t layer, size_t n_tokens);
  /// Tokens [t0, t0 + n_tokens) of it, into their rows of proj_ (before the all-reduce).
  status moe_chunk(size_t layer, size_t t0, size_t n_tokens);
  /// The step; with `greedy` (tp > 1 only), rank 0's greedy tokens instead of logits; rank 0's
  /// scored positions into `scored` (if given).
  status run(std::span<const step_sequence> batch, std::vector<float>& logits, std::vector<int32_t>* greedy,
             std::vector<kernels::token_logprobs>* scored, std::vector<float>* hidden = nullptr);
  /// The final-normed hidden rows the batch wants (step_sequence::hidden), from h_.
  void hidden_out(std::span<const step_sequence> batch, std::vector<float>& out);
  status lm_head(std::span<const step_sequence> batch, std::vector<float>& logits, std::vector<int32_t>* greedy);
  /// This rank's LM-head rows for the n_want normed rows in xn_: local [n_want][n_vocab].
  status lm_head_slice(size_t n_want, std::vector<float>& local);
  /// The LM head over the first n rows of xn_: [n][vocab] (vocabulary-parallel at tp > 1).
  status head_rows(size_t n, std::vector<float>& logits);
  /// Vocabulary-parallel argmax: each rank's slice candidate per row, gathered and merged.
  status greedy_head(size_t n_want, std::vector<int32_t>& tokens);
  /// The scored positions of the batch (step_sequence::prompt_logprobs), in blocks of
  /// score_block rows (so the logits held stay small); rank 0 fills `out` (if given).
  status score_prompts(std::span<const step_sequence> batch, std::vector<kernels::token_logprobs>* out);
  void ensure_buffers(size_t n_tokens);
  /// h += proj, proj first RMS-normalised by `post_norm` when it is not empty (Gemma 2/3) and
  /// scaled by Granite's residual_multiplier.
  status add_residual(const std::vector<float>& post_norm, size_t n_tokens);
  /// Granite's logits_scaling (a division) and Gemma 2's final_logit_softcapping on n logits,
  /// in place (nothing for the other models).
  void finish_logits(float* logits, size_t n);

  std::shared_ptr<const model> model_;
  shard_layout layout_;
  /// Per layer, this rank's own copy of its o_proj / down_proj columns (an MoE layer's: of its
  /// shared expert's), or null: read in place; per layer and expert, of each expert's down_proj.
  std::vector<std::shared_ptr<const detail::row_slice>> o_slices_, down_slices_;
  std::vector<std::vector<std::shared_ptr<const detail::row_slice>>> expert_down_slices_;
  kv_cache_config kv_;
  kernels::communicator* comm_;
  kernels::thread_pool* pool_;
  kernels::attention_shape attn_shape_;
  std::vector<double> inv_freq_, inv_freq_local_;  ///< the second: Gemma 3's sliding layers'
  double rope_scale_ = 1.0, rope_scale_local_ = 1.0;  ///< cos and sin times these (kernels::rope_scale)
  float embed_scale_ = 1.0f;  ///< Gemma: sqrt(hidden) in the embedding's dtype; Granite: embedding_multiplier; else 1
  std::vector<std::vector<std::byte>> keys_, values_;  ///< per layer, the cache's elements (kv_.type)

  // Step buffers, [n_tokens][...], grown on demand and reused.
  std::vector<float> sample_logits_, score_logits_;
  std::vector<float> h_, xn_, q_, k_, v_, attn_, proj_, gate_, up_, cos_, sin_, cos_local_, sin_local_;
  std::vector<float> q_temp_;  ///< per token: Ministral 3's query temperature (kernels::llama4_query_scale), else 1
  std::vector<float> router_, expert_x_, expert_gate_, expert_up_, expert_y_;  ///< MoE layers' (moe_block.cpp)
  std::vector<float> shared_gate_, shared_up_, shared_y_, shared_scale_;         ///< Qwen2-MoE's shared expert's
  std::vector<uint32_t> chosen_;  ///< per (token, slot): its expert
  std::vector<float> weight_;     ///< per (token, slot): its expert's weight
  std::vector<size_t> row_of_;    ///< per (token, slot): its row among the chunk's expert rows (none: another rank's expert)
  std::unique_ptr<detail::lora_runner> lora_;  ///< this step's rows by LoRA adapter (lora_runner.hpp)
};

}  // namespace llmesh::model
