// SwiGLU, GeGLU, soft-capping and the residual add on one row. Plain loops: the compiler vectorises them, and since
// they are elementwise the vector width never changes the bits.
#include "llmesh/kernels/elementwise.hpp"

namespace llmesh::kernels {

void add_inplace(float* x, const float* delta, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = x[i] + delta[i];
}

void swiglu(const float* gate, const float* up, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float g = gate[i];
    out[i] = (g / (1.0f + exp_det(-g))) * up[i];
  }
}

void gpt_oss_glu(const float* gate, const float* up, float* out, size_t n, float limit) {
  constexpr float alpha = 1.702f;
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i] > limit ? limit : gate[i];  // torch.clamp(max=): NaN passes
    const float u = up[i] > limit ? limit : up[i] < -limit ? -limit : up[i];
    out[i] = (u + 1.0f) * (g / (1.0f + exp_det(-alpha * g)));
  }
}

void softcap_inplace(float* x, size_t n, float cap) {
  for (size_t i = 0; i < n; ++i) x[i] = cap * tanh_det(x[i] / cap);
}

void geglu_tanh(const float* gate, const float* up, float* out, size_t n) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (size_t i = 0; i < n; ++i) {
    float g = gate[i];
    out[i] = (0.5f * g * (1.0f + tanh_det(k * (g + 0.044715f * g * g * g)))) * up[i];
  }
}

}  // namespace llmesh::kernels
