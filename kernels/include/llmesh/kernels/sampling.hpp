// Token sampling: greedy, temperature, top-k, top-p, driven by a counter-based RNG keyed by
// (seed, position). The same (logits, params, seed, position) give the same token on every
// machine and replica: that is what lets a migrated request continue its stream exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace llmesh::kernels {

class thread_pool;

/// How to pick the next token. temperature <= 0 (or top_k == 1) means greedy.
struct sampling_params {
  float temperature = 0.0f;
  int top_k = 0;         ///< 0: off
  float top_p = 1.0f;    ///< 1: off; keep the smallest most-likely set whose mass reaches top_p (>= 1 token; 0 = greedy)
  uint64_t seed = 0;
  /// -1: none. n >= 0 (at most max_logprobs): each drawn token comes with its log-probability
  /// and the n most likely tokens' (token_logprobs). Does not change which token is drawn.
  int logprobs = -1;
  /// Penalties on the logits before the draw (vLLM's / OpenAI's): repetition (1: off) divides a
  /// positive logit of a token seen in the prompt or the output and multiplies a negative one;
  /// then frequency subtracts (its count in the output) times itself, presence subtracts itself
  /// once for a token in the output. See logits_adjust.
  float presence_penalty = 0.0f, frequency_penalty = 0.0f, repetition_penalty = 1.0f;
  /// The request's end ids cannot be drawn before this many output tokens (vLLM's min_tokens).
  int min_tokens = 0;
  /// The request adds biases to some tokens' logits (OpenAI's logit_bias; the biases
  /// themselves come with the row's logits_adjust).
  bool logit_bias = false;
  /// vLLM's / llama.cpp's min_p (0: off): only tokens at least min_p times as likely as the
  /// most likely one may be drawn (before top-k and top-p, as vLLM orders them).
  float min_p = 0.0f;
  /// vLLM's prompt_logprobs (-1: none; n in 0..max_logprobs): every prompt token after the
  /// first comes with its log-probability under the logits before it and the n most likely
  /// tokens' (the engine's steps score them). Does not change the draw on the CPU or in
  /// CUDA's deterministic mode; CUDA's fast mode, whose LM-head GEMM depends on its row count
  /// as at any batch size, may.
  int prompt_logprobs = -1;
  /// The request's draws are masked (a structured output's grammar, or allowed_token_ids): each
  /// draw may only pick the tokens its row's logits_adjust::allowed holds. Decided per
  /// request, so every rank knows.
  bool constrained = false;
  /// The request has vLLM's bad_words: its rows ban the tokens that would complete one
  /// (logits_adjust::banned). Decided per request, so every rank knows.
  bool bad_words = false;
  /// The logprobs (not prompt_logprobs) are of the logits after the row's adjustments —
  /// biases, penalties, bans, grammar masks, before temperature — rather than the model's raw
  /// ones (vLLM's logprobs_mode "processed_logits"): a masked token is -inf. The gateway's beam
  /// search ranks these, so its beams honour what the request allows.
  bool processed_logprobs = false;
};

/// The most alternatives a request may ask for (OpenAI's top_logprobs bound, vLLM's default).
inline constexpr int max_logprobs = 20;

struct token_logprob {
  int32_t id = 0;
  float logprob = 0.0f;
  bool operator==(const token_logprob&) const = default;
};

/// A drawn token's log-probability and its row's most likely tokens', from the model's raw
/// logits (log-softmax before temperature or filters, as vLLM reports them by default).
struct token_logprobs {
  float logprob = 0.0f;            ///< the drawn token's
  std::vector<token_logprob> top;  ///< the n most likely, by log-probability then the lower id
  /// The drawn token's rank in its row: the tokens whose logit is at least its own, itself
  /// included (vLLM's Logprob.rank: ties take the worse rank); 0 when the token is outside
  /// the row or its logit is NaN.
  int32_t rank = 0;
  bool operator==(const token_logprobs&) const = default;
};

/// log-softmax of `logits` at `chosen`, its rank, and its `n` largest entries (n clamped to
/// [0, vocab]).
/// The normaliser's terms are exp_det's (floats, relative error near 1e-7), summed in eight
/// double lanes (lane j: the ids ≡ j mod 8, in id order) added in a fixed order: the same
/// numbers on every machine. A masked logit (-inf) has log-probability -inf.
token_logprobs compute_logprobs(std::span<const float> logits, int32_t chosen, int n);

/// A request's bias on one token's logit (OpenAI's logit_bias).
struct token_bias {
  int32_t id = 0;
  float bias = 0.0f;
  bool operator==(const token_bias&) const = default;
};

/// A token a request has seen: `count` times in its output (0: only in its prompt).
struct seen_token {
  int32_t id = 0;
  int32_t count = 0;
  bool operator==(const seen_token&) const = default;
};

/// What one row's logits need before its draw, besides its parameters: the request's tokens
/// seen so far (each id once; for the penalties) and the ids it may not draw now (its end ids
/// while min_tokens is not reached). Borrowed: the caller keeps them alive during the step.
struct logits_adjust {
  std::span<const seen_token> seen;
  std::span<const int32_t> banned;
  std::span<const token_bias> bias;  ///< each id once
  /// Structured outputs: a bitmask over the vocabulary (bit id % 32 of word id / 32) of the
  /// tokens the grammar allows now; the others become -inf after the bans. Empty: no mask.
  std::span<const uint32_t> allowed;
};

/// How to draw the token of one row of a step's logits: the request's parameters, keyed by the
/// position the token will take (the (seed, position) key of model::generate), and what its
/// logits need first (null: nothing; the rank that draws the tokens needs it, others do not).
struct sample_row {
  sampling_params params;
  uint64_t position = 0;
  const logits_adjust* adjust = nullptr;
};

/// Whether params set a repetition, frequency or presence penalty.
bool has_penalties(const sampling_params& params);

/// Whether params change the logits before the draw (a penalty, min_tokens, a logit bias, bad
/// words, or a mask: constrained).
bool has_adjustments(const sampling_params& params);

/// Whether this row's logits change before its draw now: an adjust with biases, with
/// penalties that apply to some seen token, or with banned ids.
bool row_adjusts(const sample_row& row);

/// The biases, penalties and bans of one row, in place, in vLLM's order: each bias is added;
/// then for each seen token, repetition (l > 0 ? l / r : l * r), then
/// l -= frequency · count + presence · (count > 0); then each banned id becomes -inf, and
/// with a mask (allowed) each id outside it.
void apply_adjust(std::span<float> logits, const sampling_params& params, const logits_adjust& adjust);

/// A uniform double in [0, 1) that depends only on (seed, position) (the draw's 53 high bits).
double sampling_uniform(uint64_t seed, uint64_t position);

/// True when params pick the most likely token (temperature <= 0 or NaN, or top_k == 1).
bool is_greedy(const sampling_params& params);

/// True when every row is greedy (a step whose tokens are argmaxes only).
bool all_greedy(std::span<const sample_row> rows);

/// True when every row is greedy and none asks for logprobs or adjustments: a step whose
/// tokens need only each row's argmax, never the whole row (a split LM head may gather argmax
/// pairs instead). Decided from the parameters alone, so every rank decides alike.
bool argmax_only(std::span<const sample_row> rows);

/// Index of the largest logit; the lowest index wins ties.
int32_t argmax(std::span<const float> logits);

/// One slice's part of the argmax of a row split over ranks (a vocabulary-parallel LM head):
/// what the ranks gather instead of the whole row when every row is greedy.
struct argmax_candidate {
  float value = 0.0f;
  int32_t id = -1;  ///< -1: the slice offers none (all NaN)
};

/// The candidate of the slice holding ids [first_id, first_id + slice.size()): its first
/// largest non-NaN value; the first slice (first_id 0) offers id 0 as +inf when logit 0 is
/// NaN (argmax's running maximum starts there and nothing beats a NaN).
argmax_candidate argmax_part(std::span<const float> slice, int32_t first_id);

/// argmax of the whole row from its slices' candidates, given in id order: equal to argmax()
/// of the concatenated slices, NaNs and ties included.
int32_t argmax_merge(std::span<const argmax_candidate> parts);

/// Picks a token from logits for the token at absolute `position` of the sequence (logits
/// already adjusted: see sample_rows).
/// Order of filters as in HF: temperature, then top-k, then top-p over the renormalised rest.
/// Exactly (the device kernel, cuda::sample, gives the same token):
///  1. greedy params, a non-finite largest logit or 1/temperature: argmax;
///  2. each token's probability relative to the most likely, exp_det((l - max) / T), becomes an
///     integer mass (sampling_fixed.hpp: p · 2^40, truncated); with min_p, a mass below
///     min_mass(min_p) (floor(min_p · 2^32) · 2^40 / 2^32) becomes 0: never drawn;
///  3. order by mass, ties the lower id first; top-k keeps the first k; top-p keeps the
///     shortest prefix of those whose mass reaches floor(their mass · top_p) (at least 1);
///  4. u = high 64 bits of (64 bits keyed by (seed, position)) · (kept mass); the token is the
///     first kept one, in id order, whose running mass exceeds u.
int32_t sample(std::span<const float> logits, const sampling_params& params, uint64_t position);

/// One token per row of `logits` ([rows][vocab]): sample() on the row, after apply_adjust on
/// a copy of it when the row has an adjust with something to do (`logits` is not changed);
/// with a pool, the rows are split over its threads (each row's token is the same either way).
std::vector<int32_t> sample_rows(std::span<const float> logits, size_t vocab, std::span<const sample_row> rows,
                                 thread_pool* pool = nullptr);

/// Per row of a step: its token's logprobs, for the rows that ask (params.logprobs >= 0).
using row_logprobs = std::vector<std::optional<token_logprobs>>;

/// compute_logprobs for each row of `logits` ([rows][vocab]) that asks, at its drawn token
/// (`tokens[r]`); nullopt for the others. Empty when no row asks.
row_logprobs logprobs_rows(std::span<const float> logits, size_t vocab, std::span<const sample_row> rows,
                           std::span<const int32_t> tokens);

/// Whether any row asks for logprobs.
bool any_logprobs(std::span<const sample_row> rows);

}  // namespace llmesh::kernels
