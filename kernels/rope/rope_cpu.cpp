// RoPE on CPU. The llama3 rule is the one HF's _compute_llama3_parameters implements.
#include <cmath>
#include <numbers>

#include "llmesh/kernels/rope.hpp"

namespace llmesh::kernels {

std::vector<double> rope_inv_freq(const rope_config& cfg) {
  size_t half = cfg.head_dim / 2;
  std::vector<double> inv(half);
  for (size_t i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(cfg.theta, static_cast<double>(2 * i) / static_cast<double>(cfg.head_dim));
    if (cfg.linear_factor != 1.0) inv[i] = inv[i] / cfg.linear_factor;
  }
  if (!cfg.llama3) return inv;
  double low_wavelen = cfg.original_max_position / cfg.low_freq_factor;
  double high_wavelen = cfg.original_max_position / cfg.high_freq_factor;
  for (double& f : inv) {
    double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      f = f / cfg.factor;
    } else {
      double smooth = (cfg.original_max_position / wavelen - cfg.low_freq_factor) /
                      (cfg.high_freq_factor - cfg.low_freq_factor);
      f = (1.0 - smooth) * f / cfg.factor + smooth * f;
    }
  }
  return inv;
}

void rope_angles(const std::vector<double>& inv_freq, size_t position, float* cos_out, float* sin_out) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    double a = static_cast<double>(position) * inv_freq[i];
    cos_out[i] = static_cast<float>(std::cos(a));
    sin_out[i] = static_cast<float>(std::sin(a));
  }
}

void rope_apply(float* v, size_t n_heads, size_t head_dim, const float* cos, const float* sin) {
  size_t half = head_dim / 2;
  for (size_t h = 0; h < n_heads; ++h) {
    float* x = v + h * head_dim;
    for (size_t i = 0; i < half; ++i) {
      float a = x[i], b = x[i + half];
      x[i] = a * cos[i] - b * sin[i];
      x[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

}  // namespace llmesh::kernels
