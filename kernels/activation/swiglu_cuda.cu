// SwiGLU on the device, bit-identical to swiglu_cpu.cpp: out = (g / (1 + exp_det(-g))) * up.
// Layout: flat float32 arrays. Benchmark: part of `llmesh bench engine --device cuda`.
#include "device/cuda_common.cuh"
#include "llmesh/kernels/cuda_ops.hpp"

namespace llmesh::kernels::cuda {
namespace {

__global__ void swiglu_kernel(const float* gate, const float* up, float* out, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float g = gate[i];
    out[i] = (g / (1.0f + detail::exp_det(-g))) * up[i];
  }
}

}  // namespace

status swiglu(const float* gate, const float* up, float* out, size_t n, stream_t s) {
  if (n == 0) return ok_status();
  unsigned blocks = detail::blocks_for(n, 256);
  swiglu_kernel<<<blocks > 4096 ? 4096 : blocks, 256, 0, s>>>(gate, up, out, n);
  return detail::launched("swiglu");
}

}  // namespace llmesh::kernels::cuda
