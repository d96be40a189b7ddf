// RMSNorm on the device, bit-identical to rmsnorm_cpu.cpp: one block per row stages the row in
// shared memory, computes the sum of squares with the canonical 16-lane dot, then
// x * (1 / sqrt(mean + eps)) * w. Also the fused residual add (h += delta, then the norm) and
// the row gather for the LM head.
// Layout: rows of n float32, contiguous. Benchmark: part of `llmesh bench engine --device cuda`.
#include "device/cuda_common.cuh"
#include "llmesh/kernels/cuda_ops.hpp"

namespace llmesh::kernels::cuda {
namespace {

constexpr unsigned threads = 512;  // a 4096-wide row: 8 loads per thread, issued together

/// One block per row: the row (after the residual add) is staged in shared memory by all
/// threads with coalesced loads, then lanes 0..15 of warp 0 run the canonical 16-lane sum of
/// squares from shared memory (no dependent global loads), and all threads scale and store.
__global__ void __launch_bounds__(threads) rmsnorm_kernel(float* h, const float* delta, const float* w, float* out,
                                                          size_t n, float eps) {
  extern __shared__ float row_s[];
  __shared__ float scale_s;
  const size_t row = blockIdx.x;
  float* x = h + row * n;
  const float* d = delta ? delta + row * n : nullptr;
#pragma unroll 4
  for (size_t i = threadIdx.x; i < n; i += threads) {
    float v = x[i];
    if (d) {
      v = v + d[i];
      x[i] = v;
    }
    row_s[i] = v;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float sum = detail::dot16_warp(n, [](size_t i) { return row_s[i]; }, [](size_t i) { return row_s[i]; });
    if (threadIdx.x == 0) {
      float mean = sum / static_cast<float>(n);
      scale_s = 1.0f / sqrtf(mean + eps);
    }
  }
  __syncthreads();
  const float scale = scale_s;
  float* o = out + row * n;
#pragma unroll 4
  for (size_t i = threadIdx.x; i < n; i += threads) o[i] = (row_s[i] * scale) * w[i];
}

status launch(float* h, const float* delta, const float* w, float* out, size_t rows, size_t n, float eps, stream_t s,
              const char* what) {
  if (rows == 0) return ok_status();
  const size_t bytes = n * sizeof(float);
  if (bytes > 48 * 1024) {
    static const bool raised = cudaFuncSetAttribute(rmsnorm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    200 * 1024) == cudaSuccess;
    if (!raised || bytes > 200 * 1024) return make_error(errc::invalid_request, "cuda rmsnorm: row too long");
  }
  rmsnorm_kernel<<<static_cast<unsigned>(rows), threads, bytes, s>>>(h, delta, w, out, n, eps);
  return detail::launched(what);
}

__global__ void gather_kernel(const float* x, size_t ld, const int32_t* rows, size_t n, float* out) {
  const size_t r = blockIdx.y;
  const float* src = x + static_cast<size_t>(rows[r]) * ld;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[r * n + i] = src[i];
}

}  // namespace

status rmsnorm(const float* x, const float* w, float* out, size_t rows, size_t n, float eps, stream_t s) {
  // The kernel writes through `h` only when delta is set.
  return launch(const_cast<float*>(x), nullptr, w, out, rows, n, eps, s, "rmsnorm");
}

status add_rmsnorm(float* h, const float* delta, const float* w, float* out, size_t rows, size_t n, float eps,
                   stream_t s) {
  return launch(h, delta, w, out, rows, n, eps, s, "add_rmsnorm");
}

status gather_rows(const float* x, size_t ld, const int32_t* rows, size_t n_rows, size_t n, float* out, stream_t s) {
  if (n_rows == 0) return ok_status();
  dim3 grid(detail::blocks_for(n, 256) > 8 ? 8 : detail::blocks_for(n, 256), static_cast<unsigned>(n_rows));
  gather_kernel<<<grid, 256, 0, s>>>(x, ld, rows, n, out);
  return detail::launched("gather_rows");
}

}  // namespace llmesh::kernels::cuda
