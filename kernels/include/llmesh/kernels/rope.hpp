// Rotary position embedding, HF rotate_half convention, with the rope_scaling rules of HF and
// vLLM: linear, llama3, yarn and longrope; a partial rotary (the first dims of each head).
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

namespace llmesh::kernels {

/// How rotary frequencies are built. rope_type "default", "linear", "llama3", "yarn" or
/// "longrope".
struct rope_config {
  /// Rotary dimension (even): the first head_dim entries of each head rotate, any after them
  /// pass unchanged (HF's partial_rotary_factor: head size × factor).
  size_t head_dim = 0;
  double theta = 10000.0;
  bool llama3 = false;    ///< apply the llama3 rope_scaling rule below
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;  ///< llama3's; `factor` also yarn's
  double original_max_position = 8192.0;  ///< the pretrained context (llama3, yarn, longrope)
  double linear_factor = 1.0;  ///< rope_type "linear": every frequency divided by it (positions interpolated)
  /// YaRN: frequencies below the correction range interpolated by `factor`, those above kept,
  /// a linear ramp between (beta_fast, beta_slow rotations over original_max_position; the
  /// range's ends rounded outwards unless !yarn_truncate).
  bool yarn = false;
  double beta_fast = 32.0, beta_slow = 1.0;
  bool yarn_truncate = true;
  double attention_factor = 1.0;  ///< yarn: cos and sin are multiplied by it (0.1·ln(factor) + 1 unless given)
  /// LongRoPE (Phi-3.5, Phi-4-mini): frequency i divided by short_factor[i] or long_factor[i]
  /// (use_long), cos and sin multiplied by short_mscale or long_mscale.
  bool longrope = false;
  std::vector<double> short_factor, long_factor;
  double short_mscale = 1.0, long_mscale = 1.0;
  bool use_long = false;
};

/// inv_freq[i] = theta^(-2i/head_dim) / linear_factor for i < head_dim/2, then llama3-,
/// yarn- or longrope-adjusted when configured.
std::vector<double> rope_inv_freq(const rope_config& cfg);

/// What cos and sin are multiplied by: yarn's attention factor, longrope's mscale, else 1.
double rope_scale(const rope_config& cfg);

/// Fills cos/sin [inv_freq.size()] for one position, each times `scale` (computed in double,
/// rounded once).
void rope_angles(const std::vector<double>& inv_freq, size_t position, float* cos_out, float* sin_out, double scale = 1.0);

/// Llama 4's attention temperature (Ministral 3's llama_4_scaling_beta): what the queries at
/// `position` are multiplied by after the rotary, 1 + beta·ln(1 + floor(position / original)),
/// computed in double and rounded once (1 below `original`).
inline float llama4_query_scale(size_t position, double beta, double original) {
  return static_cast<float>(1.0 + beta * std::log(1.0 + std::floor(static_cast<double>(position) / original)));
}

/// Rotates n_heads vectors of head_dim in place over their first rotary_dim entries: for
/// i < rotary_dim/2, with a = v[i], b = v[i + rotary_dim/2]: v[i] = a·cos − b·sin,
/// v[i + rotary_dim/2] = b·cos + a·sin. The rest of each head is left as it is.
void rope_apply(float* v, size_t n_heads, size_t head_dim, size_t rotary_dim, const float* cos, const float* sin);

}  // namespace llmesh::kernels
