// Token sampling: greedy, temperature, top-k, top-p, driven by a counter-based RNG keyed by
// (seed, position). The same (logits, params, seed, position) give the same token on every
// machine and replica: that is what lets a migrated request continue its stream exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace llmesh::kernels {

/// How to pick the next token. temperature <= 0 (or top_k == 1) means greedy.
struct sampling_params {
  float temperature = 0.0f;
  int top_k = 0;         ///< 0: off
  float top_p = 1.0f;    ///< 1: off; keep the smallest most-likely set whose mass reaches top_p (>= 1 token; 0 = greedy)
  uint64_t seed = 0;
};

/// A uniform double in [0, 1) that depends only on (seed, position).
double sampling_uniform(uint64_t seed, uint64_t position);

/// Index of the largest logit; the lowest index wins ties.
int32_t argmax(std::span<const float> logits);

/// Picks a token from logits for the token at absolute `position` of the sequence.
/// Order of filters as in HF: temperature, then top-k, then top-p over the renormalised rest.
int32_t sample(std::span<const float> logits, const sampling_params& params, uint64_t position);

}  // namespace llmesh::kernels
