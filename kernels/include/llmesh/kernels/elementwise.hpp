// Row-wise ops of the decoder block: RMSNorm, residual add, SwiGLU / GeGLU, soft-capping, and the
// deterministic exp and tanh.
// None of these reduce across a batch; RMSNorm reduces within a row with the canonical dot().
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace llmesh::kernels {

/// exp(x) for float32 with ~2 ulp error, written with plain multiplies and adds (no libm, no
/// implicit fusing), so it gives the same bits on every CPU and vectorises under any flags.
/// Returns 0 below -87.3 and is clamped near FLT_MAX above 88.3.
inline float exp_det(float x) {
  if (x < -87.3f) return 0.0f;
  x = x > 88.3f ? 88.3f : x;
  float t = x * 1.44269504088896341f;                  // x · log2(e)
  float n = (t + 12582912.0f) - 12582912.0f;           // round to nearest (|t| < 2^22)
  float r = x - n * 0.693359375f;                      // Cody-Waite: ln2 high part (exact product)
  r = r - n * -2.12194440e-4f;                         // ln2 low part
  float p = 1.9875691500e-4f;                          // Cephes expf minimax polynomial
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = (p * (r * r) + r) + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, 4);
  return y * scale;
}

/// tanh(x) from exp_det (same bits on every CPU): an odd Taylor polynomial below |x| < 0.125,
/// else sign(x) · (1 − 2 / (exp(2|x|) + 1)). Relative error below 1e-6.
inline float tanh_det(float x) {
  const float a = x < 0.0f ? -x : x;
  if (a < 0.125f) {
    const float x2 = x * x;  // x − x³/3 + 2x⁵/15 − 17x⁷/315 (next term < 2e-10 here)
    return x * (1.0f + x2 * (-0.333333343f + x2 * (0.133333340f + x2 * -0.0539682545f)));
  }
  const float t = 1.0f - 2.0f / (exp_det(2.0f * a) + 1.0f);
  return x < 0.0f ? -t : t;
}

/// Gemma 2's soft-capping: cap · tanh(x / cap) on each of n values, in place (cap > 0).
void softcap_inplace(float* x, size_t n, float cap);

/// out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i] for one row of n (HF LlamaRMSNorm order).
/// out may alias x.
void rmsnorm(const float* x, const float* weight, float* out, size_t n, float eps);

/// x[i] += delta[i].
void add_inplace(float* x, const float* delta, size_t n);

/// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may alias gate.
void swiglu(const float* gate, const float* up, float* out, size_t n);

/// out[i] = gelu_tanh(gate[i]) * up[i] (Gemma's GeGLU; PyTorch's gelu(approximate="tanh"):
/// 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))). out may alias gate.
void geglu_tanh(const float* gate, const float* up, float* out, size_t n);

/// GPT-OSS's clamped SwiGLU (HF GptOssExperts): g = min(gate[i], limit), u = clamp(up[i], −limit,
/// limit), out[i] = (u + 1) · g · sigmoid(1.702 · g) (limit > 0; a NaN stays NaN). out may alias gate.
void gpt_oss_glu(const float* gate, const float* up, float* out, size_t n, float limit);

}  // namespace llmesh::kernels
