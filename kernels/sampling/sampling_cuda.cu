// Sampling on the device, one block per row: greedy (argmax) and kernels::sample's temperature
// / top-k / top-p draw, giving the CPU's token for the same logits and (seed, position).
// Both sides turn probabilities into the same integer masses (exp_det, then
// sampling_fixed.hpp), so the block's parallel sums equal the CPU's sequential ones.
// The filters are thresholds found by radix selection over the masses (6 passes of 7 bits
// cover the 41 bits a mass can use): top-k's by count, top-p's by mass. The draw is one pass
// over per-thread contiguous chunks of ids and two block scans.
// Layout: logits [rows][vocab] float32; rows' parameters in device memory.
#include <climits>
#include <cmath>
#include <cstdint>

#include "device/cuda_common.cuh"
#include "llmesh/kernels/cuda_ops.hpp"
#include "sampling/sampling_fixed.hpp"

namespace llmesh::kernels::cuda {
namespace {

namespace fx = sampling_detail;

constexpr unsigned threads = 1024;
constexpr unsigned warps = threads / 32;
constexpr int digit_bits = 7;
constexpr int digits = 6;  // 42 bits: a mass is at most 2^40
constexpr unsigned buckets = 1u << digit_bits;

__device__ __forceinline__ bool better(float v, int32_t i, float bv, int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

struct block_shared {
  float sv[warps];
  int32_t si[warps];
  unsigned long long scan[warps];
  unsigned int count[buckets];
  unsigned long long mass[buckets];
  unsigned long long prefix, count_above, mass_above;
  int32_t best;
};

/// kernels::argmax of one row, for thread 0: the first largest value. A NaN at index 0 wins
/// (the CPU's running maximum starts there and no comparison with NaN succeeds); other NaNs
/// never do.
__device__ int32_t row_argmax(const float* row, size_t vocab, block_shared& sh) {
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
    int32_t j = __shfl_down_sync(0xffffffffu, best_i, off);
    if (better(v, j, best, best_i)) { best = v; best_i = j; }
  }
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x & 31u;
  if (lane == 0) { sh.sv[warp] = best; sh.si[warp] = best_i; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < warps; ++w) {
      if (better(sh.sv[w], sh.si[w], best, best_i)) { best = sh.sv[w]; best_i = sh.si[w]; }
    }
    if (best_i == INT32_MAX || isnan(row[0])) best_i = 0;
  }
  __syncthreads();  // sv / si may be reused
  return best_i;
}

__global__ void argmax_kernel(const float* logits, size_t vocab, int32_t* out) {
  __shared__ block_shared sh;
  const int32_t best = row_argmax(logits + blockIdx.x * vocab, vocab, sh);
  if (threadIdx.x == 0) out[blockIdx.x] = best;
}

/// Exclusive prefix sum of v over the block's threads; *total gets the block's sum.
__device__ uint64_t block_exclusive_scan(uint64_t v, block_shared& sh, uint64_t* total) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32;
  uint64_t x = v;
  for (unsigned off = 1; off < 32; off *= 2) {
    uint64_t y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  if (lane == 31) sh.scan[warp] = x;
  __syncthreads();
  if (warp == 0) {
    uint64_t w = sh.scan[lane];
    for (unsigned off = 1; off < 32; off *= 2) {
      uint64_t y = __shfl_up_sync(0xffffffffu, w, off);
      if (lane >= off) w += y;
    }
    sh.scan[lane] = w;
  }
  __syncthreads();
  const uint64_t before = warp == 0 ? 0 : sh.scan[warp - 1];
  *total = sh.scan[warps - 1];
  __syncthreads();  // scan may be reused
  return before + x - v;
}

/// One row's masses: exp_det((l - max) · inv_t) as sampling_fixed.hpp integers; below
/// min_mass (min_p's threshold), 0.
struct row_masses {
  const float* row;
  float max_logit, inv_t;
  int bits;
  uint64_t min_mass;
  __device__ __forceinline__ uint64_t operator()(size_t i) const {
    const uint64_t m = fx::mass_of(detail::exp_det((row[i] - max_logit) * inv_t), bits);
    return m >= min_mass ? m : 0;
  }
};

/// The largest t with (count or mass of tokens with mass >= t) >= need; also the count and
/// mass strictly above t. REQUIRES: the whole row's count or mass reaches need.
struct threshold {
  uint64_t t, count_above, mass_above;
};

__device__ threshold radix_threshold(const row_masses& mass, size_t vocab, bool by_mass, uint64_t need, block_shared& sh) {
  if (threadIdx.x == 0) sh.prefix = sh.count_above = sh.mass_above = 0;
  for (int level = digits - 1; level >= 0; --level) {
    const int shift = level * digit_bits;
    if (threadIdx.x < buckets) {
      sh.count[threadIdx.x] = 0;
      sh.mass[threadIdx.x] = 0;
    }
    __syncthreads();
    const uint64_t prefix = sh.prefix;
    for (size_t i = threadIdx.x; i < vocab; i += threads) {
      const uint64_t m = mass(i);
      if ((m >> shift) >> digit_bits == prefix) {
        const unsigned d = static_cast<unsigned>(m >> shift) & (buckets - 1);
        atomicAdd(&sh.count[d], 1u);
        atomicAdd(&sh.mass[d], static_cast<unsigned long long>(m));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t ca = sh.count_above, ma = sh.mass_above;
      unsigned chosen = 0;
      for (int d = buckets - 1; d >= 0; --d) {
        if ((by_mass ? ma + sh.mass[d] : ca + sh.count[d]) >= need) {
          chosen = static_cast<unsigned>(d);
          break;
        }
        ca += sh.count[d];
        ma += sh.mass[d];
      }
      sh.prefix = prefix * buckets + chosen;
      sh.count_above = ca;
      sh.mass_above = ma;
    }
    __syncthreads();
  }
  threshold r{sh.prefix, sh.count_above, sh.mass_above};
  __syncthreads();  // the next call resets them
  return r;
}

__global__ void sample_kernel(const float* logits, size_t vocab, const device_sample_row* args, int32_t* out) {
  __shared__ block_shared sh;
  const float* row = logits + blockIdx.x * vocab;
  const device_sample_row a = args[blockIdx.x];
  const int32_t best_local = row_argmax(row, vocab, sh);
  if (threadIdx.x == 0) sh.best = best_local;
  __syncthreads();
  const int32_t best = sh.best;
  const float inv_t = 1.0f / a.temperature;
  if (!(a.temperature > 0.0f) || a.top_k == 1 || !isfinite(row[best]) || !isfinite(inv_t)) {
    if (threadIdx.x == 0) out[blockIdx.x] = best;
    return;
  }
  const int bits = fx::mass_bits(vocab);
  const row_masses mass{row, row[best], inv_t, bits, fx::min_mass(a.min_p, bits)};

  // The kept tokens: mass > t, and the first `ties` ids (in id order) whose mass is t.
  uint64_t t = 0, ties = 0;
  uint64_t kept_mass = 0;  // mass of the top-k (0: not computed)
  const bool top_k = a.top_k > 0 && static_cast<uint64_t>(a.top_k) < vocab;
  if (top_k) {
    const threshold k = radix_threshold(mass, vocab, false, static_cast<uint64_t>(a.top_k), sh);
    if (k.t > 0) {
      t = k.t;
      ties = static_cast<uint64_t>(a.top_k) - k.count_above;
      kept_mass = k.mass_above + ties * t;
    }  // else fewer than k tokens have mass: all of them stay
  }
  if (a.top_p < 1.0f) {
    if (kept_mass == 0) {  // the mass of every token
      uint64_t local = 0;
      for (size_t i = threadIdx.x; i < vocab; i += threads) local += mass(i);
      block_exclusive_scan(local, sh, &kept_mass);
    }
    const uint64_t target = fx::nucleus_target(kept_mass, a.top_p);
    // The shortest prefix (by mass, then id) reaching the target lies within the top-k: its
    // threshold is the largest t with mass(>= t) >= target, over the whole row.
    const threshold p = radix_threshold(mass, vocab, true, target, sh);
    t = p.t;
    ties = fx::ties_needed(target, p.mass_above, p.t);
  }

  // Draw: each thread owns a contiguous chunk of ids; scans give every chunk the ties and the
  // kept mass before it.
  const size_t per = (vocab + threads - 1) / threads;
  const size_t lo = min(vocab, threadIdx.x * per), hi = min(vocab, lo + per);
  uint64_t chunk_ties = 0, chunk_above = 0;
  for (size_t i = lo; i < hi; ++i) {
    const uint64_t m = mass(i);
    if (m > t) chunk_above += m;
    else if (m == t && t > 0) ++chunk_ties;
  }
  uint64_t all_ties = 0, total = 0;
  const uint64_t ties_before = block_exclusive_scan(chunk_ties, sh, &all_ties);
  const uint64_t kept_ties = ties_before >= ties ? 0 : min(chunk_ties, ties - ties_before);
  const uint64_t chunk = chunk_above + kept_ties * t;
  const uint64_t base = block_exclusive_scan(chunk, sh, &total);
  const uint64_t u = fx::mulhi(fx::draw_bits(a.seed, a.position), total);
  if (chunk > 0 && base <= u && u < base + chunk) {
    uint64_t acc = base, seen = ties_before;
    for (size_t i = lo; i < hi; ++i) {
      const uint64_t m = mass(i);
      const bool kept = m > t || (m == t && t > 0 && seen++ < ties);
      if (!kept) continue;
      acc += m;
      if (u < acc) {
        out[blockIdx.x] = static_cast<int32_t>(i);
        return;
      }
    }
  }
}

__global__ void adjust_kernel(float* logits, size_t vocab, const device_adjust* entries, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const device_adjust e = entries[i];
  if (e.id < 0 || static_cast<size_t>(e.id) >= vocab) return;
  float* x = logits + static_cast<size_t>(e.row) * vocab + static_cast<size_t>(e.id);
  if (e.kind == 1) {
    *x = -INFINITY;
    return;
  }
  if (e.kind == 2) {
    *x += e.presence;
    return;
  }
  float l = *x;
  if (e.repetition != 1.0f) l = l > 0.0f ? l / e.repetition : l * e.repetition;  // IEEE division, as on the CPU
  if (e.count > 0) {
    const float by_count = e.frequency * static_cast<float>(e.count);
    l -= by_count + e.presence;
  }
  *x = l;
}

__global__ void mask_kernel(float* logits, size_t vocab, const uint32_t* masks, const uint32_t* rows) {
  const size_t id = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= vocab) return;
  const size_t m = blockIdx.y;
  const uint32_t word = masks[m * ((vocab + 31) / 32) + (id >> 5)];
  if (!((word >> (id & 31)) & 1u)) logits[static_cast<size_t>(rows[m]) * vocab + id] = -INFINITY;
}

}  // namespace

status mask_logits(float* logits, size_t vocab, const uint32_t* masks, const uint32_t* rows, size_t n_masks, stream_t s) {
  if (n_masks == 0 || vocab == 0) return ok_status();
  if (n_masks > 65535) return make_error(errc::invalid_request, "mask_logits: at most 65535 masked rows a launch");
  constexpr unsigned block = 256;
  const dim3 grid(static_cast<unsigned>((vocab + block - 1) / block), static_cast<unsigned>(n_masks));
  mask_kernel<<<grid, block, 0, s>>>(logits, vocab, masks, rows);
  return detail::launched("mask_logits");
}

status adjust_logits(float* logits, size_t vocab, const device_adjust* entries, size_t n, stream_t s) {
  if (n == 0) return ok_status();
  constexpr unsigned block = 256;
  adjust_kernel<<<static_cast<unsigned>((n + block - 1) / block), block, 0, s>>>(logits, vocab, entries, n);
  return detail::launched("adjust_logits");
}

status argmax(const float* logits, size_t rows, size_t vocab, int32_t* out, stream_t s) {
  if (rows == 0 || vocab == 0) return ok_status();
  argmax_kernel<<<static_cast<unsigned>(rows), threads, 0, s>>>(logits, vocab, out);
  return detail::launched("argmax");
}

status sample(const float* logits, size_t rows, size_t vocab, const device_sample_row* args, int32_t* out, stream_t s) {
  if (rows == 0 || vocab == 0) return ok_status();
  if (vocab > static_cast<size_t>(INT32_MAX)) return make_error(errc::invalid_request, "sample: vocabulary too large");
  sample_kernel<<<static_cast<unsigned>(rows), threads, 0, s>>>(logits, vocab, args, out);
  return detail::launched("sample");
}

}  // namespace llmesh::kernels::cuda
