// Greedy sampling on the device: the index of the largest logit per row, lowest index on ties
// (exactly kernels::argmax), so only token ids cross back to the host.
// Layout: logits [rows][vocab] float32. One block per row.
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
  float best = row[0];
  int32_t best_i = 0;
  for (size_t i = threadIdx.x; i < vocab; i += threads) {
    if (row[i] > best) {  // strictly greater: the first index wins within a thread
      best = row[i];
      best_i = static_cast<int32_t>(i);
    }
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
    out[blockIdx.x] = best_i;
  }
}

}  // namespace

status argmax(const float* logits, size_t rows, size_t vocab, int32_t* out, stream_t s) {
  if (rows == 0 || vocab == 0) return ok_status();
  argmax_kernel<<<static_cast<unsigned>(rows), threads, 0, s>>>(logits, vocab, out);
  return detail::launched("argmax");
}

}  // namespace llmesh::kernels::cuda
