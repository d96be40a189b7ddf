// Causal GQA attention over the paged KV cache on the device, flash-attention style: a block
// takes one query tile (≤ 16 consecutive tokens of one sequence), one head and one 512-position
// partition; it stages 32 keys and values at a time in shared memory and keeps an online
// softmax per row (lane j scores key j; a warp owns up to 4 rows). Rows whose context spans
// several partitions write partial (acc, max, sum) triples that a second kernel merges in
// partition order. Tile and partition boundaries sit at absolute positions (multiples of 32
// and 512), so a row's numbers depend on its position and its sequence only — never on the
// batch or on how the prompt was chunked.
// Layout: q/out [T][n_heads][hd]; cache [slot][n_kv_heads][hd] float32, slot = block·bs + p % bs.
// Benchmark: part of `llmesh bench engine --device cuda`; CPU oracle: attention_cpu.cpp.
#include <cmath>

#include "device/cuda_common.cuh"
#include "llmesh/kernels/cuda_ops.hpp"

namespace llmesh::kernels::cuda {
namespace {

constexpr unsigned warps = 4;
constexpr unsigned rows_per_warp = attention_tile_rows / warps;  // 4
constexpr unsigned key_tile = 32;                                 // one key per lane
constexpr unsigned max_dims_per_lane = 8;                         // head_dim ≤ 256

size_t shared_bytes(size_t hd) { return (key_tile * (hd + 1) + key_tile * hd + attention_tile_rows * hd) * sizeof(float); }

__device__ __forceinline__ float warp_max(float v) {
  for (unsigned off = 16; off >= 1; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (unsigned off = 16; off >= 1; off /= 2) v = v + __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ size_t window_begin(int64_t pos, size_t window) {
  return (window > 0 && pos + 1 > static_cast<int64_t>(window)) ? static_cast<size_t>(pos + 1 - static_cast<int64_t>(window)) : 0;
}

__global__ void attention_kernel(attention_args a) {
  extern __shared__ float smem[];
  const size_t hd = a.head_dim;
  float* ks = smem;                        // [32][hd + 1] (padded: lane j reads row j conflict-free)
  float* vs = ks + key_tile * (hd + 1);    // [32][hd]
  float* qs = vs + key_tile * hd;          // [16][hd]

  const unsigned tile = blockIdx.x, head = blockIdx.y, part = blockIdx.z;
  const int rows = a.tile_rows[tile];
  if (rows <= 0) return;
  const size_t tok0 = static_cast<size_t>(a.tile_token0[tile]);
  const int64_t pmin = a.pos[tok0], pmax = a.pos[tok0 + rows - 1];
  const size_t part_begin = static_cast<size_t>(part) * attention_partition;
  if (static_cast<int64_t>(part_begin) > pmax) return;
  const size_t part_end = min(part_begin + attention_partition, static_cast<size_t>(pmax) + 1);
  const size_t lo_tile = window_begin(pmin, a.sliding_window);
  if (lo_tile >= part_end) return;  // the whole partition is outside every row's window
  const size_t kvh = head / (a.n_heads / a.n_kv_heads);
  const int32_t* bt = a.block_tables + a.bt_offset[tok0];
  const size_t kv_row = a.n_kv_heads * hd;

  for (size_t e = threadIdx.x; e < static_cast<size_t>(rows) * hd; e += blockDim.x) {
    const size_t r = e / hd, d = e % hd;
    qs[r * hd + d] = a.q[((tok0 + r) * a.n_heads + head) * hd + d];
  }

  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x & 31u;
  float m[rows_per_warp], l[rows_per_warp], acc[rows_per_warp][max_dims_per_lane];
#pragma unroll
  for (unsigned j = 0; j < rows_per_warp; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.0f;
#pragma unroll
    for (unsigned i = 0; i < max_dims_per_lane; ++i) acc[j][i] = 0.0f;
  }

  const size_t start = lo_tile > part_begin ? lo_tile / key_tile * key_tile : part_begin;
  for (size_t k0 = start; k0 < part_end; k0 += key_tile) {
    __syncthreads();  // previous tile consumed (and qs written, on the first pass)
    for (size_t e = threadIdx.x; e < key_tile * hd; e += blockDim.x) {
      const size_t j = e / hd, d = e % hd, p = k0 + j;
      float kv = 0.0f, vv = 0.0f;
      if (p < part_end) {
        const size_t slot = static_cast<size_t>(bt[p / a.block_size]) * a.block_size + p % a.block_size;
        kv = a.k_cache[slot * kv_row + kvh * hd + d];
        vv = a.v_cache[slot * kv_row + kvh * hd + d];
      }
      ks[j * (hd + 1) + d] = kv;
      vs[j * hd + d] = vv;
    }
    __syncthreads();
#pragma unroll
    for (unsigned j = 0; j < rows_per_warp; ++j) {
      const int r = static_cast<int>(warp + warps * j);
      if (r >= rows) continue;  // uniform across the warp
      const int64_t prow = a.pos[tok0 + r];
      const size_t lo = window_begin(prow, a.sliding_window);
      const size_t p = k0 + lane;
      const bool valid = p >= lo && static_cast<int64_t>(p) <= prow && p < part_end;
      float score = -INFINITY;
      if (valid) {
        const float* q = qs + r * hd;
        const float* k = ks + lane * (hd + 1);
        // Four interleaved partial sums (d mod 4), then (s0 + s1) + (s2 + s3): a fixed order
        // with a quarter of the dependent-FMA latency.
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        size_t d = 0;
        for (; d + 4 <= hd; d += 4) {
          s0 = __fmaf_rn(q[d], k[d], s0);
          s1 = __fmaf_rn(q[d + 1], k[d + 1], s1);
          s2 = __fmaf_rn(q[d + 2], k[d + 2], s2);
          s3 = __fmaf_rn(q[d + 3], k[d + 3], s3);
        }
        for (; d < hd; ++d) s0 = __fmaf_rn(q[d], k[d], s0);
        score = ((s0 + s1) + (s2 + s3)) * a.scale;
      }
      const float tile_max = warp_max(score);
      if (tile_max == -INFINITY) continue;
      const float m_new = fmaxf(m[j], tile_max);
      const float pr = valid ? detail::exp_det(score - m_new) : 0.0f;
      const float corr = m[j] == -INFINITY ? 0.0f : detail::exp_det(m[j] - m_new);
      l[j] = l[j] * corr + warp_sum(pr);
#pragma unroll
      for (unsigned i = 0; i < max_dims_per_lane; ++i) acc[j][i] = acc[j][i] * corr;
      for (unsigned kj = 0; kj < key_tile; ++kj) {
        const float pk = __shfl_sync(0xffffffffu, pr, kj);
#pragma unroll
        for (unsigned i = 0; i < max_dims_per_lane; ++i) {
          const size_t d = lane + 32 * i;
          if (d < hd) acc[j][i] = __fmaf_rn(pk, vs[kj * hd + d], acc[j][i]);
        }
      }
      m[j] = m_new;
    }
  }

#pragma unroll
  for (unsigned j = 0; j < rows_per_warp; ++j) {
    const int r = static_cast<int>(warp + warps * j);
    if (r >= rows) continue;
    const size_t t = tok0 + r;
    const int64_t prow = a.pos[t];
    if (static_cast<int64_t>(part_begin) > prow) continue;  // this partition is after the row
    if (prow < static_cast<int64_t>(attention_partition)) {  // one partition: the final answer
      float* out = a.out + (t * a.n_heads + head) * hd;
      const float inv = 1.0f / l[j];
#pragma unroll
      for (unsigned i = 0; i < max_dims_per_lane; ++i) {
        const size_t d = lane + 32 * i;
        if (d < hd) out[d] = acc[j][i] * inv;
      }
    } else {
      float* pt = a.partials + ((t * a.n_heads + head) * a.max_partitions + part) * (hd + 2);
#pragma unroll
      for (unsigned i = 0; i < max_dims_per_lane; ++i) {
        const size_t d = lane + 32 * i;
        if (d < hd) pt[d] = acc[j][i];
      }
      if (lane == 0) {
        pt[hd] = m[j];
        pt[hd + 1] = l[j];
      }
    }
  }
}

/// Merges a row's partitions in order: out = Σ acc_p·e^(m_p−M) / Σ l_p·e^(m_p−M).
__global__ void combine_kernel(attention_args a) {
  const size_t t = blockIdx.x, head = blockIdx.y, hd = a.head_dim;
  const int64_t prow = a.pos[t];
  if (prow < static_cast<int64_t>(attention_partition)) return;  // padding or written directly
  const size_t last = static_cast<size_t>(prow) / attention_partition;
  const size_t first = window_begin(prow, a.sliding_window) / attention_partition;
  const float* base = a.partials + (t * a.n_heads + head) * a.max_partitions * (hd + 2);
  float mx = -INFINITY;
  for (size_t p = first; p <= last; ++p) mx = fmaxf(mx, base[p * (hd + 2) + hd]);
  for (size_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    for (size_t p = first; p <= last; ++p) {
      const float* pt = base + p * (hd + 2);
      if (pt[hd] == -INFINITY) continue;  // no visible key in this partition
      const float w = detail::exp_det(pt[hd] - mx);
      num = num + pt[d] * w;
      den = den + pt[hd + 1] * w;
    }
    a.out[(t * a.n_heads + head) * hd + d] = num / den;
  }
}

}  // namespace

size_t attention_partials_floats(size_t n_tokens, size_t n_heads, size_t head_dim, size_t max_partitions) {
  return max_partitions > 1 ? n_tokens * n_heads * max_partitions * (head_dim + 2) : 0;
}

status attention(const attention_args& a, stream_t s) {
  if (a.n_tiles == 0 || a.n_tokens == 0) return ok_status();
  if (a.head_dim == 0 || a.head_dim > 32 * max_dims_per_lane) {
    return make_error(errc::invalid_request, "cuda attention: head_dim must be 1..256");
  }
  if (a.n_kv_heads == 0 || a.n_heads % a.n_kv_heads != 0) {
    return make_error(errc::invalid_request, "cuda attention: heads do not group evenly over kv heads");
  }
  if (a.max_partitions > 1 && a.partials == nullptr) {
    return make_error(errc::internal, "cuda attention: long contexts need the partials scratch");
  }
  static const bool raised = [] {
    return cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(shared_bytes(256))) == cudaSuccess;
  }();
  if (!raised) return make_error(errc::internal, "cuda attention: cannot raise the shared-memory limit");
  dim3 grid(static_cast<unsigned>(a.n_tiles), static_cast<unsigned>(a.n_heads), static_cast<unsigned>(a.max_partitions));
  attention_kernel<<<grid, warps * 32, shared_bytes(a.head_dim), s>>>(a);
  LLMESH_TRY(detail::launched("attention"));
  if (a.max_partitions > 1) {
    dim3 g2(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_heads));
    combine_kernel<<<g2, 128, 0, s>>>(a);
    LLMESH_TRY(detail::launched("attention combine"));
  }
  return ok_status();
}

}  // namespace llmesh::kernels::cuda
