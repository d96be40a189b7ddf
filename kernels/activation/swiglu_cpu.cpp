// SwiGLU and the residual add on one row. Plain loops: the compiler vectorises them, and since
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

}  // namespace llmesh::kernels
