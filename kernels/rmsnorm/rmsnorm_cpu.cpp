// RMSNorm on one row (HF LlamaRMSNorm order: x * rsqrt(mean(x^2) + eps), then * weight).
// The sum of squares uses the canonical dot() so it has the fixed reduction order.
#include <cmath>

#include "llmesh/kernels/elementwise.hpp"
#include "llmesh/kernels/matmul.hpp"

namespace llmesh::kernels {

void rmsnorm(const float* x, const float* weight, float* out, size_t n, float eps) {
  float mean = dot(x, x, n) / static_cast<float>(n);
  float scale = 1.0f / std::sqrt(mean + eps);
  for (size_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * weight[i];
}

}  // namespace llmesh::kernels
