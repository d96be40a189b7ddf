// Projections on CUDA cores: y = x · wᵀ (+ bias) with float32 activations and F32/F16/BF16
// weights, the decode path and the batch-invariant (--deterministic) path. One warp per
// R output columns (each x chunk loaded serves R weight rows); lane l reads the 8-element chunks
// l, l+32, l+64, ... of each row (16-byte loads, U chunks per row in flight) and keeps one
// float32 sum per (activation row, column), then the warp folds with a fixed xor butterfly.
// The order depends only on k, never on m or on R: batch-invariant.
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

/// Rows of w per warp (R: each x chunk loaded serves R rows) and weight chunks in flight per
/// row (U), by activation rows M: fewer x loads per weight byte as M grows, with a register
/// budget of about 64 floats of weights in flight.
template <int M> struct tiling { static constexpr int R = M <= 2 ? 2 : 4, U = M <= 2 ? 4 : (M <= 4 ? 2 : 1); };

template <class W, int M, bool Vec>
__global__ void __launch_bounds__(warps_per_block * 32) dense_kernel(dense_launch L) {
  constexpr int R = tiling<M>::R, U = tiling<M>::U;
  const dense_job& job = L.jobs[blockIdx.y];
  const size_t j0 = (static_cast<size_t>(blockIdx.x) * warps_per_block + threadIdx.x / 32) * R;
  if (j0 >= job.n) return;  // whole warps leave together
  const unsigned lane = threadIdx.x & 31u;
  const size_t row0 = static_cast<size_t>(blockIdx.z) * M;
  const float* xr[M];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    size_t r = row0 + i < L.m ? row0 + i : L.m - 1;  // rows past m repeat the last one; not stored
    xr[i] = job.x + r * job.ldx;
  }
  const W* w[R];
#pragma unroll
  for (int r = 0; r < R; ++r) w[r] = static_cast<const W*>(job.w) + (j0 + r < job.n ? j0 + r : j0) * job.ldw;
  const size_t k = job.k, n_chunks = (k + 7) / 8;
  float acc[M][R];
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;
  }
  // One x chunk per activation row, applied to all R weight rows: 8 products each, in k order.
  auto consume = [&](const chunk<W> (&wc)[R], size_t k0) {
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
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float sum = acc[i][r];
        if (full) {
#pragma unroll
          for (int e = 0; e < 8; ++e) sum = __fmaf_rn(xv[e], wc[r].v[e], sum);
        } else {
          for (int e = 0; e < 8; ++e) {
            if (k0 + e < k) sum = __fmaf_rn(xv[e], wc[r].v[e], sum);
          }
        }
        acc[i][r] = sum;
      }
    }
  };
  size_t c = lane;
  for (; c + 32 * (U - 1) < n_chunks; c += 32 * U) {
    chunk<W> ws[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r) ws[u][r] = load_chunk<W, Vec>(w[r], (c + 32 * u) * 8, k);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) consume(ws[u], (c + 32 * u) * 8);
  }
  for (; c < n_chunks; c += 32) {
    chunk<W> ws[R];
#pragma unroll
    for (int r = 0; r < R; ++r) ws[r] = load_chunk<W, Vec>(w[r], c * 8, k);
    consume(ws, c * 8);
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[i][r];
      for (unsigned off = 16; off >= 1; off /= 2) v = v + __shfl_xor_sync(0xffffffffu, v, off);
      acc[i][r] = v;
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const size_t j = j0 + r;
        if (row0 + i < L.m && j < job.n) job.y[(row0 + i) * job.ldy + j] = job.bias ? acc[i][r] + job.bias[j] : acc[i][r];
      }
    }
  }
}

template <class W, int M>
void launch_typed(const dense_launch& L, bool vec, size_t max_n, unsigned slices, stream_t s) {
  const size_t rows_per_block = warps_per_block * static_cast<size_t>(tiling<M>::R);
  dim3 grid(static_cast<unsigned>((max_n + rows_per_block - 1) / rows_per_block), L.n_jobs, slices);
  if (vec) dense_kernel<W, M, true><<<grid, warps_per_block * 32, 0, s>>>(L);
  else dense_kernel<W, M, false><<<grid, warps_per_block * 32, 0, s>>>(L);
}

template <class W>
void launch_m(const dense_launch& L, bool vec, size_t max_n, unsigned slices, stream_t s) {
  if (L.m <= 1) launch_typed<W, 1>(L, vec, max_n, slices, s);
  else if (L.m <= 2) launch_typed<W, 2>(L, vec, max_n, slices, s);
  else if (L.m <= 4) launch_typed<W, 4>(L, vec, max_n, slices, s);
  else launch_typed<W, 8>(L, vec, max_n, slices, s);
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
  switch (type) {
    case dtype::f32: launch_m<float>(L, vec, max_n, slices, s); break;
    case dtype::f16: launch_m<__half>(L, vec, max_n, slices, s); break;
    default: launch_m<__nv_bfloat16>(L, vec, max_n, slices, s); break;
  }
  return detail::launched("dense");
}

}  // namespace llmesh::kernels::cuda
