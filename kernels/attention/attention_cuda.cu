// Causal GQA attention over the paged KV cache on the device (cuda_ops.hpp states the fixed
// structure that makes it batch- and chunk-invariant). Two paths, one arithmetic:
//  - multi-row tiles (prefill): one block per (tile, head) stages 32 keys and values at a time
//    in shared memory, a warp owns up to 4 rows, and each row folds tile → partition → row
//    states as it walks its keys;
//  - one-row tiles (decode): one block per (row, head, partition); its 4 warps compute the
//    partition's 4 key tiles in parallel straight from the cache, warp 0 folds them in order;
//    rows spanning several partitions are folded by a second kernel, in order.
// Every tile state is made by the same code (scores with 4 partial sums over d, exp_det, a
// xor-butterfly sum, Σp·v in key order) and every fold by fold(), so both paths give a row
// the same bits. Layout: q/out [T][n_heads][hd]; cache [slot][n_kv_heads][hd] float32,
// slot = block·bs + p % bs. CPU oracle: attention_cpu.cpp (another order: within 1e-5).
// Benchmark: `llmesh bench engine --device cuda --profile`.
#include <cmath>

#include "device/cuda_common.cuh"
#include "llmesh/kernels/cuda_ops.hpp"

namespace llmesh::kernels::cuda {
namespace {

constexpr unsigned warps = 4;
constexpr unsigned rows_per_warp = attention_tile_rows / warps;  // 4
constexpr unsigned key_tile = 32;                                 // one key per lane
constexpr unsigned tiles_per_partition = attention_partition / key_tile;
constexpr unsigned max_dims_per_lane = 8;                         // head_dim ≤ 256
// Kernels are instantiated for D = 1, 2, 4, 8 dims per lane (the smallest power of two with
// 32·D ≥ head_dim): unused dims cost neither registers nor instructions. D follows from
// head_dim alone, so it never changes a row's arithmetic.
static_assert(tiles_per_partition == warps, "decode path: one warp per key tile of a partition");

/// A softmax state: running max, sum of exp, and this lane's Σ p·v for d = lane + 32·i.
template <unsigned D>
struct state {
  float m, l, acc[D];
};

template <unsigned D>
__device__ __forceinline__ void clear(state<D>& s) {
  s.m = -INFINITY;
  s.l = 0.0f;
#pragma unroll
  for (unsigned i = 0; i < D; ++i) s.acc[i] = 0.0f;
}

/// a ← a ⊕ b (b's keys come after a's). Empty states (m = -inf) are identities.
template <unsigned D>
__device__ __forceinline__ void fold(state<D>& a, const state<D>& b) {
  if (b.m == -INFINITY) return;
  if (a.m == -INFINITY) {
    a = b;
    return;
  }
  const float m = fmaxf(a.m, b.m);
  const float ea = detail::exp_det(a.m - m), eb = detail::exp_det(b.m - m);
  a.l = a.l * ea + b.l * eb;
#pragma unroll
  for (unsigned i = 0; i < D; ++i) a.acc[i] = a.acc[i] * ea + b.acc[i] * eb;
  a.m = m;
}

__device__ __forceinline__ float warp_max(float v) {
  for (unsigned off = 16; off >= 1; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (unsigned off = 16; off >= 1; off /= 2) v = v + __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

/// q·k · scale with four interleaved partial sums (d mod 4), then (s0 + s1) + (s2 + s3).
template <class LoadK>
__device__ __forceinline__ float score_of(const float* q, LoadK k, unsigned hd, float scale) {
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
  unsigned d = 0;
  for (; d + 4 <= hd; d += 4) {
    s0 = __fmaf_rn(q[d], k(d), s0);
    s1 = __fmaf_rn(q[d + 1], k(d + 1), s1);
    s2 = __fmaf_rn(q[d + 2], k(d + 2), s2);
    s3 = __fmaf_rn(q[d + 3], k(d + 3), s3);
  }
  for (; d < hd; ++d) s0 = __fmaf_rn(q[d], k(d), s0);
  return ((s0 + s1) + (s2 + s3)) * scale;
}

/// score_of for a 16-byte aligned k with hd % 4 == 0, 8 loads in flight: the same sums.
__device__ __forceinline__ float score_of4(const float* q, const float* k, unsigned hd, float scale) {
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
  const float4* k4 = reinterpret_cast<const float4*>(k);
#pragma unroll 8
  for (unsigned d4 = 0; d4 < hd / 4; ++d4) {
    const float4 kv = __ldg(k4 + d4);
    const unsigned d = 4 * d4;
    s0 = __fmaf_rn(q[d], kv.x, s0);
    s1 = __fmaf_rn(q[d + 1], kv.y, s1);
    s2 = __fmaf_rn(q[d + 2], kv.z, s2);
    s3 = __fmaf_rn(q[d + 3], kv.w, s3);
  }
  return ((s0 + s1) + (s2 + s3)) * scale;
}

/// The state of one 32-key tile; lane j holds key j's score (valid or not). vrow(kj) returns
/// key kj's value row (called by the whole warp); invalid keys contribute nothing (their p is 0
/// and they are skipped).
template <unsigned D, class ValueRow>
__device__ __forceinline__ state<D> tile_state(float score, bool valid, ValueRow vrow, unsigned hd) {
  const unsigned lane = threadIdx.x & 31u;
  constexpr unsigned G = D <= 4 ? 8 : 4;  // keys whose value loads are issued together
  state<D> t;
  clear(t);
  t.m = warp_max(valid ? score : -INFINITY);
  if (t.m == -INFINITY) return t;  // uniform across the warp
  const float p = valid ? detail::exp_det(score - t.m) : 0.0f;
  t.l = warp_sum(p);
  // Keys in order, G at a time: their value loads are issued together (all addresses are
  // valid: masked keys point at slot 0), then each key with p ≠ 0 is accumulated in key order.
  for (unsigned kj = 0; kj < key_tile; kj += G) {
    float pk[G], vals[G][D];
#pragma unroll
    for (unsigned u = 0; u < G; ++u) {
      pk[u] = __shfl_sync(0xffffffffu, p, kj + u);
      const float* v = vrow(kj + u);
#pragma unroll
      for (unsigned i = 0; i < D; ++i) {
        const unsigned d = lane + 32 * i;
        vals[u][i] = d < hd ? v[d] : 0.0f;
      }
    }
#pragma unroll
    for (unsigned u = 0; u < G; ++u) {
      if (pk[u] == 0.0f) continue;  // uniform: masked (or underflowed) keys add nothing
#pragma unroll
      for (unsigned i = 0; i < D; ++i) {
        if (lane + 32 * i < hd) t.acc[i] = __fmaf_rn(pk[u], vals[u][i], t.acc[i]);
      }
    }
  }
  return t;
}

__device__ __forceinline__ unsigned window_begin(int pos, unsigned window) {
  return (window > 0 && pos + 1 > static_cast<int>(window)) ? static_cast<unsigned>(pos + 1 - static_cast<int>(window)) : 0u;
}

__device__ __forceinline__ unsigned slot_of(const int32_t* bt, unsigned p, unsigned bs) {
  return static_cast<unsigned>(bt[p / bs]) * bs + p % bs;
}

template <unsigned D>
__device__ __forceinline__ void store_out(float* out, const state<D>& s, unsigned hd) {
  const unsigned lane = threadIdx.x & 31u;
  const float inv = 1.0f / s.l;
#pragma unroll
  for (unsigned i = 0; i < D; ++i) {
    const unsigned d = lane + 32 * i;
    if (d < hd) out[d] = s.acc[i] * inv;
  }
}

size_t prefill_shared_bytes(size_t hd) {
  return (key_tile * (hd + 1) + key_tile * hd + attention_tile_rows * hd) * sizeof(float);
}

/// Multi-row tiles: grid (tile, head); blocks of one-row tiles leave (the decode kernel has them).
template <unsigned D>
__global__ void __launch_bounds__(warps * 32) prefill_kernel(attention_args a) {
  extern __shared__ float smem[];
  const unsigned hd = static_cast<unsigned>(a.head_dim);
  float* ks = smem;                      // [32][hd + 1]: lane j reads row j conflict-free
  float* vs = ks + key_tile * (hd + 1);  // [32][hd]
  float* qs = vs + key_tile * hd;        // [16][hd]
  const unsigned tile = blockIdx.x, head = blockIdx.y;
  const int rows = a.tile_rows[tile];
  if (rows <= 1) return;
  const unsigned tok0 = static_cast<unsigned>(a.tile_token0[tile]);
  const int pmin = a.pos[tok0], pmax = a.pos[tok0 + rows - 1];
  const unsigned window = static_cast<unsigned>(a.sliding_window), bs = static_cast<unsigned>(a.block_size);
  const unsigned kvh = head / static_cast<unsigned>(a.n_heads / a.n_kv_heads);
  const int32_t* bt = a.block_tables + a.bt_offset[tok0];
  const unsigned kv_row = static_cast<unsigned>(a.n_kv_heads) * hd, nh = static_cast<unsigned>(a.n_heads);
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x & 31u;

  for (unsigned r = warp; r < static_cast<unsigned>(rows); r += warps) {
    for (unsigned d = lane; d < hd; d += 32) qs[r * hd + d] = a.q[(static_cast<size_t>(tok0 + r) * nh + head) * hd + d];
  }
  state<D> row_s[rows_per_warp], part_s[rows_per_warp];
#pragma unroll
  for (unsigned j = 0; j < rows_per_warp; ++j) clear(row_s[j]);

  const unsigned lo_tile = window_begin(pmin, window);
  for (unsigned part = lo_tile / attention_partition; part * attention_partition <= static_cast<unsigned>(pmax); ++part) {
#pragma unroll
    for (unsigned j = 0; j < rows_per_warp; ++j) clear(part_s[j]);
    for (unsigned t = 0; t < tiles_per_partition; ++t) {
      const unsigned k0 = part * attention_partition + t * key_tile;
      if (k0 > static_cast<unsigned>(pmax)) break;        // later tiles: no row sees them
      if (k0 + key_tile <= lo_tile) continue;             // earlier tiles: outside every window
      __syncthreads();  // the previous tile is consumed (and qs is written, the first time)
      // Warp w stages keys w, w+4, ..., w+28: all its loads are issued before the stores.
      if (hd % 4 == 0 && hd <= 128) {
        float4 kr[key_tile / warps], vr[key_tile / warps];
        const unsigned d = 4 * lane;
#pragma unroll
        for (unsigned u = 0; u < key_tile / warps; ++u) {
          const unsigned p = k0 + warp + warps * u;
          const bool in = p <= static_cast<unsigned>(pmax) && d < hd;
          const size_t base = in ? static_cast<size_t>(slot_of(bt, p, bs)) * kv_row + kvh * hd + d : 0;
          kr[u] = in ? __ldg(reinterpret_cast<const float4*>(a.k_cache + base)) : make_float4(0, 0, 0, 0);
          vr[u] = in ? __ldg(reinterpret_cast<const float4*>(a.v_cache + base)) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (unsigned u = 0; u < key_tile / warps; ++u) {
          const unsigned j = warp + warps * u;
          if (d < hd) {
            float* kd = ks + j * (hd + 1) + d;
            kd[0] = kr[u].x; kd[1] = kr[u].y; kd[2] = kr[u].z; kd[3] = kr[u].w;
            *reinterpret_cast<float4*>(vs + j * hd + d) = vr[u];
          }
        }
      } else {
        for (unsigned j = warp; j < key_tile; j += warps) {
          const unsigned p = k0 + j;
          const bool in = p <= static_cast<unsigned>(pmax);
          const size_t base = in ? static_cast<size_t>(slot_of(bt, p, bs)) * kv_row + kvh * hd : 0;
#pragma unroll 4
          for (unsigned d = lane; d < hd; d += 32) {
            ks[j * (hd + 1) + d] = in ? a.k_cache[base + d] : 0.0f;
            vs[j * hd + d] = in ? a.v_cache[base + d] : 0.0f;
          }
        }
      }
      __syncthreads();
#pragma unroll
      for (unsigned j = 0; j < rows_per_warp; ++j) {
        const unsigned r = warp + warps * j;
        if (r >= static_cast<unsigned>(rows)) continue;  // uniform across the warp
        const int prow = a.pos[tok0 + r];
        const unsigned p = k0 + lane;
        const bool valid = p >= window_begin(prow, window) && static_cast<int>(p) <= prow;
        const float* q = qs + r * hd;
        const float* k = ks + lane * (hd + 1);
        const float sc = valid ? score_of(q, [k](unsigned d) { return k[d]; }, hd, a.scale) : 0.0f;
        state<D> ts = tile_state<D>(sc, valid, [vs, hd](unsigned kj) -> const float* { return vs + kj * hd; }, hd);
        fold(part_s[j], ts);
      }
    }
#pragma unroll
    for (unsigned j = 0; j < rows_per_warp; ++j) fold(row_s[j], part_s[j]);
  }
#pragma unroll
  for (unsigned j = 0; j < rows_per_warp; ++j) {
    const unsigned r = warp + warps * j;
    if (r >= static_cast<unsigned>(rows)) continue;
    store_out(a.out + (static_cast<size_t>(tok0 + r) * nh + head) * hd, row_s[j], hd);
  }
}

/// One-row tiles: grid (tile, head, partition); warp w computes key tile w of the partition.
template <unsigned D>
__global__ void __launch_bounds__(warps * 32) decode_kernel(attention_args a) {
  __shared__ float qs[32 * D];
  __shared__ float ms[warps], ls[warps];
  const unsigned tile = blockIdx.x, head = blockIdx.y, part = blockIdx.z;
  if (a.tile_rows[tile] != 1) return;
  const unsigned t = static_cast<unsigned>(a.tile_token0[tile]);
  const int prow = a.pos[t];
  const unsigned hd = static_cast<unsigned>(a.head_dim), nh = static_cast<unsigned>(a.n_heads);
  const unsigned parts = static_cast<unsigned>(prow) / attention_partition + 1;
  if (part >= parts) return;
  const unsigned window = static_cast<unsigned>(a.sliding_window), bs = static_cast<unsigned>(a.block_size);
  const unsigned lo = window_begin(prow, window);
  const unsigned kvh = head / static_cast<unsigned>(a.n_heads / a.n_kv_heads);
  const int32_t* bt = a.block_tables + a.bt_offset[t];
  const unsigned kv_row = static_cast<unsigned>(a.n_kv_heads) * hd;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x & 31u;
  for (unsigned d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = a.q[(static_cast<size_t>(t) * nh + head) * hd + d];
  __syncthreads();

  const unsigned p = part * attention_partition + warp * key_tile + lane;
  const bool valid = p >= lo && static_cast<int>(p) <= prow;
  const size_t base = valid ? static_cast<size_t>(slot_of(bt, p, bs)) * kv_row + kvh * hd : 0;
  const float* krow = a.k_cache + base;
  float sc = 0.0f;
  if (valid) {
    sc = hd % 4 == 0 ? score_of4(qs, krow, hd, a.scale)
                     : score_of(qs, [krow](unsigned d) { return __ldg(krow + d); }, hd, a.scale);
  }
  const float* vcache = a.v_cache;
  state<D> ts = tile_state<D>(
      sc, valid, [vcache, base](unsigned kj) -> const float* { return vcache + __shfl_sync(0xffffffffu, base, kj); },
      hd);
  if (lane == 0) {
    ms[warp] = ts.m;
    ls[warp] = ts.l;
  }
  // Warp w's accumulators are per lane: share them through shared memory lane by lane.
  __shared__ float accs[warps][32 * D];
#pragma unroll
  for (unsigned i = 0; i < D; ++i) accs[warp][lane + 32 * i] = ts.acc[i];
  __syncthreads();
  if (warp != 0) return;
  state<D> ps;
  clear(ps);
  for (unsigned w = 0; w < warps; ++w) {
    state<D> b;
    b.m = ms[w];
    b.l = ls[w];
#pragma unroll
    for (unsigned i = 0; i < D; ++i) b.acc[i] = accs[w][lane + 32 * i];
    fold(ps, b);
  }
  if (parts == 1) {
    state<D> rs;
    clear(rs);
    fold(rs, ps);  // the row's fold over its one partition (an exact copy)
    store_out(a.out + (static_cast<size_t>(t) * nh + head) * hd, rs, hd);
    return;
  }
  float* pt = a.partials + ((static_cast<size_t>(a.tile_partial[tile]) * nh + head) * a.max_partitions + part) * (hd + 2);
#pragma unroll
  for (unsigned i = 0; i < D; ++i) {
    const unsigned d = lane + 32 * i;
    if (d < hd) pt[d] = ps.acc[i];
  }
  if (lane == 0) {
    pt[hd] = ps.m;
    pt[hd + 1] = ps.l;
  }
}

/// One-row tiles spanning several partitions: fold them in order. Grid (tile, head), one warp.
template <unsigned D>
__global__ void combine_kernel(attention_args a) {
  const unsigned tile = blockIdx.x, head = blockIdx.y, lane = threadIdx.x;
  if (a.tile_rows[tile] != 1) return;
  const unsigned t = static_cast<unsigned>(a.tile_token0[tile]);
  const int prow = a.pos[t];
  const unsigned parts = static_cast<unsigned>(prow) / attention_partition + 1;
  if (parts == 1) return;  // written directly
  const unsigned hd = static_cast<unsigned>(a.head_dim), nh = static_cast<unsigned>(a.n_heads);
  const unsigned first = window_begin(prow, static_cast<unsigned>(a.sliding_window)) / attention_partition;
  const float* base = a.partials + (static_cast<size_t>(a.tile_partial[tile]) * nh + head) * a.max_partitions * (hd + 2);
  state<D> rs;
  clear(rs);
  for (unsigned p = first; p < parts; ++p) {
    const float* pt = base + static_cast<size_t>(p) * (hd + 2);
    state<D> b;
    b.m = pt[hd];
    b.l = pt[hd + 1];
#pragma unroll
    for (unsigned i = 0; i < D; ++i) {
      const unsigned d = lane + 32 * i;
      b.acc[i] = d < hd ? pt[d] : 0.0f;
    }
    fold(rs, b);
  }
  store_out(a.out + (static_cast<size_t>(t) * nh + head) * hd, rs, hd);
}

template <unsigned D>
status launch(const attention_args& a, stream_t s) {
  static const bool raised = [] {
    return cudaFuncSetAttribute(prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(prefill_shared_bytes(32 * D))) == cudaSuccess;
  }();
  if (!raised) return make_error(errc::internal, "cuda attention: cannot raise the shared-memory limit");
  const unsigned tiles = static_cast<unsigned>(a.n_tiles), heads = static_cast<unsigned>(a.n_heads);
  prefill_kernel<D><<<dim3(tiles, heads), warps * 32, prefill_shared_bytes(a.head_dim), s>>>(a);
  LLMESH_TRY(detail::launched("attention (multi-row tiles)"));
  decode_kernel<D><<<dim3(tiles, heads, static_cast<unsigned>(a.max_partitions)), warps * 32, 0, s>>>(a);
  LLMESH_TRY(detail::launched("attention (one-row tiles)"));
  if (a.max_partitions > 1) {
    combine_kernel<D><<<dim3(tiles, heads), 32, 0, s>>>(a);
    LLMESH_TRY(detail::launched("attention combine"));
  }
  return ok_status();
}

}  // namespace

size_t attention_partials_floats(size_t partial_slots, size_t n_heads, size_t head_dim, size_t max_partitions) {
  return max_partitions > 1 ? partial_slots * n_heads * max_partitions * (head_dim + 2) : 0;
}

status attention(const attention_args& a, stream_t s) {
  if (a.n_tiles == 0 || a.n_tokens == 0) return ok_status();
  if (a.head_dim == 0 || a.head_dim > 32 * max_dims_per_lane) {
    return make_error(errc::invalid_request, "cuda attention: head_dim must be 1..256");
  }
  if (a.n_kv_heads == 0 || a.n_heads % a.n_kv_heads != 0) {
    return make_error(errc::invalid_request, "cuda attention: heads do not group evenly over kv heads");
  }
  if (a.max_partitions > 1 && (a.partials == nullptr || a.tile_partial == nullptr)) {
    return make_error(errc::internal, "cuda attention: rows over several partitions need the partials scratch");
  }
  const unsigned hd = static_cast<unsigned>(a.head_dim);
  if (hd <= 32) return launch<1>(a, s);
  if (hd <= 64) return launch<2>(a, s);
  if (hd <= 128) return launch<4>(a, s);
  return launch<8>(a, s);
  return ok_status();
}

}  // namespace llmesh::kernels::cuda
