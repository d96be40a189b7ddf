// RMSNorm on the device, bit-identical to rmsnorm_cpu.cpp: one warp per row computes the sum of
// squares with the canonical 16-lane dot, then x * (1 / sqrt(mean + eps)) * w. Also the fused
// residual add (h += delta, then the norm) and the row gather for the LM head.
// Layout: rows of n float32, contiguous. Benchmark: part of `llmesh bench engine --device cuda`.
#include "device/cuda_common.cuh"
#include "llmesh/kernels/cuda_ops.hpp"

namespace llmesh::kernels::cuda {
namespace {

constexpr unsigned rows_per_block = 4;  // one warp per row

__global__ void rmsnorm_kernel(float* h, const float* delta, const float* w, float* out, size_t rows, size_t n,
                               float eps) {
  const size_t row = blockIdx.x * rows_per_block + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together
  const unsigned lane = threadIdx.x & 31u;
  float* x = h + row * n;
  if (delta) {
    const float* d = delta + row * n;
    for (size_t i = lane; i < n; i += 32) x[i] = x[i] + d[i];
    __syncwarp();
  }
  float sum = detail::dot16_warp(n, [x](size_t i) { return x[i]; }, [x](size_t i) { return x[i]; });
  float scale = 0.0f;
  if (lane == 0) {
    float mean = sum / static_cast<float>(n);
    scale = 1.0f / sqrtf(mean + eps);
  }
  scale = __shfl_sync(0xffffffffu, scale, 0);
  float* o = out + row * n;
  for (size_t i = lane; i < n; i += 32) o[i] = (x[i] * scale) * w[i];
}

__global__ void gather_kernel(const float* x, size_t ld, const int32_t* rows, size_t n, float* out) {
  const size_t r = blockIdx.y;
  const float* src = x + static_cast<size_t>(rows[r]) * ld;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[r * n + i] = src[i];
}

}  // namespace

status rmsnorm(const float* x, const float* w, float* out, size_t rows, size_t n, float eps, stream_t s) {
  if (rows == 0) return ok_status();
  // The kernel only writes through `h` when delta is set; reading through a non-const alias is fine.
  rmsnorm_kernel<<<detail::blocks_for(rows, rows_per_block), rows_per_block * 32, 0, s>>>(
      const_cast<float*>(x), nullptr, w, out, rows, n, eps);
  return detail::launched("rmsnorm");
}

status add_rmsnorm(float* h, const float* delta, const float* w, float* out, size_t rows, size_t n, float eps,
                   stream_t s) {
  if (rows == 0) return ok_status();
  rmsnorm_kernel<<<detail::blocks_for(rows, rows_per_block), rows_per_block * 32, 0, s>>>(h, delta, w, out, rows, n,
                                                                                          eps);
  return detail::launched("add_rmsnorm");
}

status gather_rows(const float* x, size_t ld, const int32_t* rows, size_t n_rows, size_t n, float* out, stream_t s) {
  if (n_rows == 0) return ok_status();
  dim3 grid(detail::blocks_for(n, 256) > 8 ? 8 : detail::blocks_for(n, 256), static_cast<unsigned>(n_rows));
  gather_kernel<<<grid, 256, 0, s>>>(x, ld, rows, n, out);
  return detail::launched("gather_rows");
}

}  // namespace llmesh::kernels::cuda
