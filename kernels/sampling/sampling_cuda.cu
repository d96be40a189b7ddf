// Greedy sampling on the device: the index of the largest logit per row, lowest index on ties
// (exactly kernels::argmax), so only token ids cross back to the host.
// Layout: logits [rows][vocab] float32. One block per row.
#include <climits>
#include <cmath>
#include <cstdint>

#include "device/cuda_common.cuh"
#include "llmesh/kernels/cuda_ops.hpp"

namespace llmesh::kernels::cuda {
namespace {

constexpr unsigned threads = 1024;

__device__ __forceinline__ bool better(float v, int32_t i, float bv, int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void argmax_kernel(const float* logits, size_t vocab, int32_t* out) {
  const float* row = logits + blockIdx.x * vocab;
  // Four independent candidates per thread (loads in flight), each the first maximum of its
  // stride; merging with better() keeps the lowest index among equal values.
  float bv[4];
  int32_t bi[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) { bv[u] = -INFINITY; bi[u] = INT32_MAX; }
  size_t i = threadIdx.x;
  for (; i + 3 * threads < vocab; i += 4 * threads) {
    float v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = row[i + u * threads];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (better(v[u], static_cast<int32_t>(i + u * threads), bv[u], bi[u])) { bv[u] = v[u]; bi[u] = static_cast<int32_t>(i + u * threads); }
    }
  }
  for (; i < vocab; i += threads) {
    if (better(row[i], static_cast<int32_t>(i), bv[0], bi[0])) { bv[0] = row[i]; bi[0] = static_cast<int32_t>(i); }
  }
  float best = bv[0];
  int32_t best_i = bi[0];
#pragma unroll
  for (int u = 1; u < 4; ++u) {
    if (better(bv[u], bi[u], best, best_i)) { best = bv[u]; best_i = bi[u]; }
  }
  for (unsigned off = 16; off >= 1; off /= 2) {
    float v = __shfl_down_sync(0xffffffffu, best, off);
    int32_t i = __shfl_down_sync(0xffffffffu, best_i, off);
    if (better(v, i, best, best_i)) { best = v; best_i = i; }
  }
  __shared__ float sv[threads / 32];
  __shared__ int32_t si[threads / 32];
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x & 31u;
  if (lane == 0) { sv[warp] = best; si[warp] = best_i; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < threads / 32; ++w) {
      if (better(sv[w], si[w], best, best_i)) { best = sv[w]; best_i = si[w]; }
    }
    out[blockIdx.x] = best_i == INT32_MAX ? 0 : best_i;  // all NaN: index 0, as the CPU
  }
}

}  // namespace

status argmax(const float* logits, size_t rows, size_t vocab, int32_t* out, stream_t s) {
  if (rows == 0 || vocab == 0) return ok_status();
  argmax_kernel<<<static_cast<unsigned>(rows), threads, 0, s>>>(logits, vocab, out);
  return detail::launched("argmax");
}

}  // namespace llmesh::kernels::cuda
