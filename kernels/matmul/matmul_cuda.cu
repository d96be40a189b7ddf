// Projections on CUDA cores: y = x · wᵀ (+ bias) with float32 activations and F32/F16/BF16
// weights, the decode path and the batch-invariant (--deterministic) path. Each output column's
// k range is split into S segments (S = 1, 2 or 4 by k), one warp each; lane l reads the
// segment's 8-element chunks l, l+32, ... (16-byte loads, 4 in flight) and keeps one float32
// sum per activation row; the warp folds with a fixed xor butterfly, then the segments are
// added in order. The order depends only on k, never on m: batch-invariant.
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

constexpr int chunks_in_flight = 4;  // 4 × 16 B of weights per lane before their first use

/// Split-K: each output's k range is cut into S contiguous segments (whole 8-element chunks),
/// one warp each, summed in segment order. S depends on k alone, so the order still does:
/// long rows (the down projection) get more warps in flight.
__host__ __device__ inline unsigned segments_for(size_t k) { return k >= 8192 ? 4u : (k >= 4096 ? 2u : 1u); }

template <class W, int M, bool Vec>
__global__ void __launch_bounds__(warps_per_block * 32) dense_kernel(dense_launch L) {
  __shared__ float partial[warps_per_block][M];
  const dense_job& job = L.jobs[blockIdx.y];
  const unsigned S = segments_for(job.k), warp = threadIdx.x / 32, lane = threadIdx.x & 31u;
  const size_t j = static_cast<size_t>(blockIdx.x) * (warps_per_block / S) + warp / S;
  const unsigned seg = warp % S;
  const bool active = j < job.n;
  const size_t row0 = static_cast<size_t>(blockIdx.z) * M;
  const size_t k = job.k, n_chunks = (k + 7) / 8, per_seg = (n_chunks + S - 1) / S;
  const size_t c_begin = seg * per_seg, c_end = active ? min(n_chunks, c_begin + per_seg) : 0;
  const float* xr[M];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    size_t r = row0 + i < L.m ? row0 + i : L.m - 1;  // rows past m repeat the last one; not stored
    xr[i] = job.x + r * job.ldx;
  }
  const W* w = static_cast<const W*>(job.w) + (active ? j : 0) * job.ldw;
  float acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0.0f;
  // One x chunk per activation row: 8 products each, in k order.
  auto consume = [&](const chunk<W>& wc, size_t k0) {
    const bool full = k0 + 8 <= k;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float xv[8];
      if (Vec && full) {
        float4 a = __ldg(reinterpret_cast<const float4*>(xr[i] + k0));
        float4 b = __ldg(reinterpret_cast<const float4*>(xr[i] + k0 + 4));
        xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
        xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) xv[e] = k0 + e < k ? xr[i][k0 + e] : 0.0f;
      }
      float sum = acc[i];
      if (full) {
#pragma unroll
        for (int e = 0; e < 8; ++e) sum = __fmaf_rn(xv[e], wc.v[e], sum);
      } else {
        for (int e = 0; e < 8; ++e) {
          if (k0 + e < k) sum = __fmaf_rn(xv[e], wc.v[e], sum);
        }
      }
      acc[i] = sum;
    }
  };
  size_t c = c_begin + lane;
  if constexpr (Vec && sizeof(W) == 2 && M <= 2) {
    // Software-pipelined: the next group's raw 16-byte loads are issued before the current
    // group is converted and consumed, so each lane always has loads in flight. Chunks are
    // still consumed in increasing k. H200: +9% decode at m = 1 (8B: 144 → 157 tok/s), but at
    // m = 8 the extra registers cost occupancy (1B batch 8: 1544 → 1034 tok/s): m ≤ 2 only.
    const size_t full_end = min(c_end, k / 8);  // chunks wholly inside k
    uint4 next[chunks_in_flight];
#pragma unroll
    for (int u = 0; u < chunks_in_flight; ++u) {
      if (c + 32 * u < full_end) next[u] = __ldg(reinterpret_cast<const uint4*>(w + (c + 32 * u) * 8));
    }
    while (c + 32 * (chunks_in_flight - 1) < full_end) {
      uint4 cur[chunks_in_flight];
#pragma unroll
      for (int u = 0; u < chunks_in_flight; ++u) cur[u] = next[u];
      const size_t cn = c + 32 * chunks_in_flight;
#pragma unroll
      for (int u = 0; u < chunks_in_flight; ++u) {
        if (cn + 32 * u < full_end) next[u] = __ldg(reinterpret_cast<const uint4*>(w + (cn + 32 * u) * 8));
      }
#pragma unroll
      for (int u = 0; u < chunks_in_flight; ++u) {
        chunk<W> wc;
        const W* h = reinterpret_cast<const W*>(&cur[u]);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if constexpr (std::is_same_v<W, __half>) wc.v[e] = __half2float(h[e]);
          else wc.v[e] = __bfloat162float(h[e]);
        }
        consume(wc, (c + 32 * u) * 8);
      }
      c = cn;
    }
  } else {
    for (; c + 32 * (chunks_in_flight - 1) < c_end; c += 32 * chunks_in_flight) {
      chunk<W> ws[chunks_in_flight];
#pragma unroll
      for (int u = 0; u < chunks_in_flight; ++u) ws[u] = load_chunk<W, Vec>(w, (c + 32 * u) * 8, k);
#pragma unroll
      for (int u = 0; u < chunks_in_flight; ++u) consume(ws[u], (c + 32 * u) * 8);
    }
  }
  for (; c < c_end; c += 32) consume(load_chunk<W, Vec>(w, c * 8, k), c * 8);
#pragma unroll
  for (int i = 0; i < M; ++i) {
    float v = acc[i];
    for (unsigned off = 16; off >= 1; off /= 2) v = v + __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) partial[warp][i] = v;
  }
  __syncthreads();
  if (!active || seg != 0 || lane != 0) return;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    if (row0 + i >= L.m) continue;
    float v = partial[warp][i];
    for (unsigned sg = 1; sg < S; ++sg) v = v + partial[warp + sg][i];
    job.y[(row0 + i) * job.ldy + j] = job.bias ? v + job.bias[j] : v;
  }
}

template <class W, int M>
void launch_typed(const dense_launch& L, bool vec, unsigned blocks, unsigned slices, stream_t s) {
  dim3 grid(blocks, L.n_jobs, slices);
  if (vec) dense_kernel<W, M, true><<<grid, warps_per_block * 32, 0, s>>>(L);
  else dense_kernel<W, M, false><<<grid, warps_per_block * 32, 0, s>>>(L);
}

template <class W>
void launch_m(const dense_launch& L, bool vec, unsigned blocks, unsigned slices, stream_t s) {
  if (L.m <= 1) launch_typed<W, 1>(L, vec, blocks, slices, s);
  else if (L.m <= 2) launch_typed<W, 2>(L, vec, blocks, slices, s);
  else if (L.m <= 4) launch_typed<W, 4>(L, vec, blocks, slices, s);
  else launch_typed<W, 8>(L, vec, blocks, slices, s);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

status dense(std::span<const dense_job> jobs, size_t m, stream_t s) {
  if (jobs.empty() || m == 0) return ok_status();
  if (jobs.size() > max_jobs) return make_error(errc::internal, "cuda dense: at most 4 jobs per launch");
  dense_launch L{};
  L.n_jobs = static_cast<unsigned>(jobs.size());
  L.m = m;
  size_t blocks = 0;
  bool vec = true;
  const dtype type = jobs[0].w_type;
  for (const auto& j : jobs) {
    if (is_quantized(j.w_type)) return make_error(errc::internal, "cuda dense: block weights (int8, int4, K-quants) run on the CPU backend only");
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    const auto& j = jobs[i];
    if (!j.x || !j.w || !j.y || j.ldx < j.k || j.ldw < j.k || j.ldy < j.n) {
      return make_error(errc::internal, "cuda dense: null pointer or leading dimension below k / n");
    }
    if (j.w_type != type) return make_error(errc::internal, "cuda dense: jobs of one launch share a dtype");
    L.jobs[i] = j;
    const size_t rows_per_block = warps_per_block / segments_for(j.k);
    blocks = std::max(blocks, (j.n + rows_per_block - 1) / rows_per_block);
    vec = vec && aligned16(j.w) && (j.ldw * dtype_size(type)) % 16 == 0 && aligned16(j.x) && (j.ldx * 4) % 16 == 0;
  }
  const unsigned slices = m <= 8 ? 1u : static_cast<unsigned>((m + 7) / 8);
  switch (type) {
    case dtype::f32: launch_m<float>(L, vec, static_cast<unsigned>(blocks), slices, s); break;
    case dtype::f16: launch_m<__half>(L, vec, static_cast<unsigned>(blocks), slices, s); break;
    default: launch_m<__nv_bfloat16>(L, vec, static_cast<unsigned>(blocks), slices, s); break;
  }
  return detail::launched("dense");
}

}  // namespace llmesh::kernels::cuda
