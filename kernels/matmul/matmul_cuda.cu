// Projections on CUDA cores: y = x · wᵀ (+ bias) with float32 activations and F32/F16/BF16
// weights, the decode path and the batch-invariant (--deterministic) path. One warp per
// output column j; lane l reads the 8-element chunks l, l+32, l+64, ... of w[j] (16-byte loads,
// U chunks in flight) and keeps one float32 sum per activation row, then the warp folds with a
// fixed xor butterfly. The order depends only on k, never on m: batch-invariant.
// m ≤ 8 reads each weight once (memory-bound, the decode case); larger m runs in slices of 8
// rows, re-reading the weights per slice (that is what the deterministic mode costs).
// Layout: x [m][ldx], w [n][ldw] (HF [out, in]), y [m][ldy]. CPU oracle: matmul_cpu.cpp.
// Benchmark: `llmesh bench engine --device cuda` (decode tokens/s against copy bandwidth).
#include <algorithm>
#include <type_traits>

#include "device/cuda_common.cuh"
#include "llmesh/kernels/cuda_ops.hpp"

namespace llmesh::kernels::cuda {
namespace {

constexpr unsigned warps_per_block = 8;
constexpr unsigned max_jobs = 4;
constexpr unsigned chunks_in_flight = 4;  // 4 × 16 B of weights per lane before the first use

struct dense_launch {
  dense_job jobs[max_jobs];
  unsigned n_jobs;
  size_t m;
};

template <class W>
struct chunk {  // 8 consecutive weights as float32
  float v[8];
};

template <class W, bool Vec>
__device__ __forceinline__ chunk<W> load_chunk(const W* w, size_t k0, size_t k) {
  chunk<W> c;
  if constexpr (Vec) {
    if (k0 + 8 <= k) {
      if constexpr (sizeof(W) == 4) {
        float4 a = __ldg(reinterpret_cast<const float4*>(w + k0));
        float4 b = __ldg(reinterpret_cast<const float4*>(w + k0 + 4));
        c.v[0] = a.x; c.v[1] = a.y; c.v[2] = a.z; c.v[3] = a.w;
        c.v[4] = b.x; c.v[5] = b.y; c.v[6] = b.z; c.v[7] = b.w;
      } else {
        uint4 raw = __ldg(reinterpret_cast<const uint4*>(w + k0));
        const W* h = reinterpret_cast<const W*>(&raw);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if constexpr (std::is_same_v<W, __half>) c.v[e] = __half2float(h[e]);
          else c.v[e] = __bfloat162float(h[e]);
        }
      }
      return c;
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    size_t i = k0 + e;
    if (i < k) {
      if constexpr (sizeof(W) == 4) c.v[e] = w[i];
      else if constexpr (std::is_same_v<W, __half>) c.v[e] = __half2float(w[i]);
      else c.v[e] = __bfloat162float(w[i]);
    } else {
      c.v[e] = 0.0f;
    }
  }
  return c;
}

template <int M, bool Vec>
__device__ __forceinline__ void fma_chunk(float (&acc)[M], const float* const (&xr)[M], size_t k0, size_t k,
                                          const float (&w)[8]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
    if (Vec && k0 + 8 <= k) {
      float4 a = __ldg(reinterpret_cast<const float4*>(xr[i] + k0));
      float4 b = __ldg(reinterpret_cast<const float4*>(xr[i] + k0 + 4));
      float s = acc[i];
      s = __fmaf_rn(a.x, w[0], s); s = __fmaf_rn(a.y, w[1], s);
      s = __fmaf_rn(a.z, w[2], s); s = __fmaf_rn(a.w, w[3], s);
      s = __fmaf_rn(b.x, w[4], s); s = __fmaf_rn(b.y, w[5], s);
      s = __fmaf_rn(b.z, w[6], s); s = __fmaf_rn(b.w, w[7], s);
      acc[i] = s;
    } else {
      float s = acc[i];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (k0 + e < k) s = __fmaf_rn(xr[i][k0 + e], w[e], s);
      }
      acc[i] = s;
    }
  }
}

template <class W, int M, bool Vec>
__global__ void __launch_bounds__(warps_per_block * 32) dense_kernel(dense_launch L) {
  const dense_job& job = L.jobs[blockIdx.y];
  const size_t j = static_cast<size_t>(blockIdx.x) * warps_per_block + threadIdx.x / 32;
  if (j >= job.n) return;
  const unsigned lane = threadIdx.x & 31u;
  const size_t row0 = static_cast<size_t>(blockIdx.z) * M;
  const float* xr[M];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    size_t r = row0 + i < L.m ? row0 + i : L.m - 1;  // rows past m repeat the last one; not stored
    xr[i] = job.x + r * job.ldx;
  }
  const W* w = static_cast<const W*>(job.w) + j * job.ldw;
  const size_t k = job.k, n_chunks = (k + 7) / 8;
  float acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0.0f;

  size_t c = lane;
  for (; c + 32 * (chunks_in_flight - 1) < n_chunks; c += 32 * chunks_in_flight) {
    chunk<W> ws[chunks_in_flight];
#pragma unroll
    for (unsigned u = 0; u < chunks_in_flight; ++u) ws[u] = load_chunk<W, Vec>(w, (c + 32 * u) * 8, k);
#pragma unroll
    for (unsigned u = 0; u < chunks_in_flight; ++u) fma_chunk<M, Vec>(acc, xr, (c + 32 * u) * 8, k, ws[u].v);
  }
  for (; c < n_chunks; c += 32) {
    chunk<W> wc = load_chunk<W, Vec>(w, c * 8, k);
    fma_chunk<M, Vec>(acc, xr, c * 8, k, wc.v);
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
    float v = acc[i];
    for (unsigned off = 16; off >= 1; off /= 2) v = v + __shfl_xor_sync(0xffffffffu, v, off);
    acc[i] = v;
  }
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (row0 + i < L.m) job.y[(row0 + i) * job.ldy + j] = job.bias ? acc[i] + job.bias[j] : acc[i];
    }
  }
}

template <class W, int M>
void launch_typed(const dense_launch& L, bool vec, dim3 grid, stream_t s) {
  if (vec) dense_kernel<W, M, true><<<grid, warps_per_block * 32, 0, s>>>(L);
  else dense_kernel<W, M, false><<<grid, warps_per_block * 32, 0, s>>>(L);
}

template <class W>
void launch_m(const dense_launch& L, bool vec, dim3 grid, stream_t s) {
  if (L.m <= 1) launch_typed<W, 1>(L, vec, grid, s);
  else if (L.m <= 2) launch_typed<W, 2>(L, vec, grid, s);
  else if (L.m <= 4) launch_typed<W, 4>(L, vec, grid, s);
  else launch_typed<W, 8>(L, vec, grid, s);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

status dense(std::span<const dense_job> jobs, size_t m, stream_t s) {
  if (jobs.empty() || m == 0) return ok_status();
  if (jobs.size() > max_jobs) return make_error(errc::internal, "cuda dense: at most 4 jobs per launch");
  dense_launch L{};
  L.n_jobs = static_cast<unsigned>(jobs.size());
  L.m = m;
  size_t max_n = 0;
  bool vec = true;
  const dtype type = jobs[0].w_type;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const auto& j = jobs[i];
    if (!j.x || !j.w || !j.y || j.ldx < j.k || j.ldw < j.k || j.ldy < j.n) {
      return make_error(errc::internal, "cuda dense: null pointer or leading dimension below k / n");
    }
    if (j.w_type != type) return make_error(errc::internal, "cuda dense: jobs of one launch share a dtype");
    L.jobs[i] = j;
    max_n = std::max(max_n, j.n);
    vec = vec && aligned16(j.w) && (j.ldw * dtype_size(type)) % 16 == 0 && aligned16(j.x) && (j.ldx * 4) % 16 == 0;
  }
  const unsigned slices = m <= 8 ? 1u : static_cast<unsigned>((m + 7) / 8);
  dim3 grid(detail::blocks_for(max_n, warps_per_block), L.n_jobs, slices);
  switch (type) {
    case dtype::f32: launch_m<float>(L, vec, grid, s); break;
    case dtype::f16: launch_m<__half>(L, vec, grid, s); break;
    default: launch_m<__nv_bfloat16>(L, vec, grid, s); break;
  }
  return detail::launched("dense");
}

}  // namespace llmesh::kernels::cuda
