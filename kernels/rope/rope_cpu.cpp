// RoPE on CPU. The llama3 rule is the one HF's _compute_llama3_parameters implements; yarn is
// vLLM's YaRNScalingRotaryEmbedding (HF's _compute_yarn_parameters); longrope vLLM's
// Phi3LongRoPEScaledRotaryEmbedding with its factors chosen once (rope_config::use_long).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "llmesh/kernels/rope.hpp"

namespace llmesh::kernels {
namespace {

/// The dimension (of head_dim) at which a frequency turns `rotations` times over the
/// pretrained context.
double yarn_correction_dim(double rotations, const rope_config& cfg) {
  const auto d = static_cast<double>(cfg.head_dim);
  return d * std::log(cfg.original_max_position / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(cfg.theta));
}

void apply_yarn(const rope_config& cfg, std::vector<double>& inv) {
  double low = yarn_correction_dim(cfg.beta_fast, cfg), high = yarn_correction_dim(cfg.beta_slow, cfg);
  if (cfg.yarn_truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(cfg.head_dim) - 1.0);
  if (low == high) high += 0.001;  // no singularity
  for (size_t i = 0; i < inv.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;  // 1: extrapolated (kept), 0: interpolated
    inv[i] = inv[i] / cfg.factor * (1.0 - keep) + inv[i] * keep;
  }
}

void apply_llama3(const rope_config& cfg, std::vector<double>& inv) {
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
}

}  // namespace

std::vector<double> rope_inv_freq(const rope_config& cfg) {
  size_t half = cfg.head_dim / 2;
  std::vector<double> inv(half);
  for (size_t i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(cfg.theta, static_cast<double>(2 * i) / static_cast<double>(cfg.head_dim));
    if (cfg.linear_factor != 1.0) inv[i] = inv[i] / cfg.linear_factor;
  }
  if (cfg.llama3) apply_llama3(cfg, inv);
  if (cfg.yarn) apply_yarn(cfg, inv);
  if (cfg.longrope) {
    const auto& f = cfg.use_long ? cfg.long_factor : cfg.short_factor;
    for (size_t i = 0; i < half && i < f.size(); ++i) inv[i] = inv[i] / f[i];
  }
  return inv;
}

double rope_scale(const rope_config& cfg) {
  if (cfg.longrope) return cfg.use_long ? cfg.long_mscale : cfg.short_mscale;
  return cfg.yarn ? cfg.attention_factor : 1.0;
}

void rope_angles(const std::vector<double>& inv_freq, size_t position, float* cos_out, float* sin_out, double scale) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    double a = static_cast<double>(position) * inv_freq[i];
    cos_out[i] = static_cast<float>(std::cos(a) * scale);
    sin_out[i] = static_cast<float>(std::sin(a) * scale);
  }
}

void rope_apply(float* v, size_t n_heads, size_t head_dim, size_t rotary_dim, const float* cos, const float* sin) {
  size_t half = rotary_dim / 2;
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
