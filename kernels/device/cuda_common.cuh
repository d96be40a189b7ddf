// Helpers shared by the .cu files: launch checks, weight loads per dtype, and the device twins
// of the CPU's bit-exact building blocks (exp_det, the canonical 16-lane dot of matmul.hpp).
// Every .cu file builds with --fmad=false, so these round exactly like their CPU versions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/dtype.hpp"

namespace llmesh::kernels::cuda::detail {

/// Status of the launch just made (and of earlier asynchronous errors on this thread).
inline status launched(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ok_status();
  return make_error(errc::internal, std::string(what) + ": " + cudaGetErrorString(e));
}

inline unsigned blocks_for(size_t n, unsigned threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

/// Element i of a weight buffer as float32 (exact, as kernels::load_as_f32).
__device__ __forceinline__ float load_w(const void* w, dtype t, size_t i) {
  switch (t) {
    case dtype::f32: return static_cast<const float*>(w)[i];
    case dtype::f16: return __half2float(static_cast<const __half*>(w)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(w)[i]);
  }
}

/// kernels::exp_det, operation for operation.
__device__ __forceinline__ float exp_det(float x) {
  if (x < -87.3f) return 0.0f;
  x = x > 88.3f ? 88.3f : x;
  float t = x * 1.44269504088896341f;
  float n = (t + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = (p * (r * r) + r) + 1.0f;
  float scale = __int_as_float((static_cast<int32_t>(n) + 127) << 23);
  return y * scale;
}

/// The canonical dot of matmul.hpp computed by lanes 0..15 of a warp: lane l sums the
/// products of k ≡ l (mod 16) with fused multiply-adds (the tail padded with zeros, as the
/// CPU does), then the fold i+8→i, i+4→i, i+2→i, i+1→i. The result is valid in lane 0; all
/// 32 lanes must call it.
template <class LoadA, class LoadB>
__device__ __forceinline__ float dot16_warp(size_t n, LoadA a, LoadB b) {
  const unsigned lane = threadIdx.x & 31u;
  float acc = 0.0f;
  if (lane < 16) {
    const size_t full = n / 16 * 16;
    size_t i = lane;
#pragma unroll 8
    for (; i < full; i += 16) acc = __fmaf_rn(a(i), b(i), acc);
    if (full < n) {  // the tail, zero-padded as on the CPU
      bool in = i < n;
      acc = __fmaf_rn(in ? a(i) : 0.0f, in ? b(i) : 0.0f, acc);
    }
  }
  for (unsigned half = 8; half >= 1; half /= 2) {
    float other = __shfl_down_sync(0xffffffffu, acc, half);
    if (lane < half) acc = acc + other;
  }
  return acc;
}

}  // namespace llmesh::kernels::cuda::detail
