// Rotary position embedding, HF rotate_half convention, with optional llama3 frequency scaling.
#pragma once

#include <cstddef>
#include <vector>

namespace llmesh::kernels {

/// How rotary frequencies are built. rope_type "default", "linear" or "llama3".
struct rope_config {
  size_t head_dim = 0;    ///< rotary dimension (even)
  double theta = 10000.0;
  bool llama3 = false;    ///< apply the llama3 rope_scaling rule below
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_position = 8192.0;
  double linear_factor = 1.0;  ///< rope_type "linear": every frequency divided by it (positions interpolated)
};

/// inv_freq[i] = theta^(-2i/head_dim) / linear_factor for i < head_dim/2, llama3-adjusted when
/// configured.
std::vector<double> rope_inv_freq(const rope_config& cfg);

/// Fills cos/sin [head_dim/2] for one position (computed in double, rounded once).
void rope_angles(const std::vector<double>& inv_freq, size_t position, float* cos_out, float* sin_out);

/// Rotates n_heads vectors of head_dim in place: for i < d/2, with a = v[i], b = v[i+d/2]:
/// v[i] = a·cos − b·sin, v[i+d/2] = b·cos + a·sin.
void rope_apply(float* v, size_t n_heads, size_t head_dim, const float* cos, const float* sin);

}  // namespace llmesh::kernels
