// Private: the integer arithmetic of sampling, shared by sampling_cpu.cpp and sampling_cuda.cu
// (host and device compile the same lines). Every probability becomes a fixed-point integer
// mass once (exp_det, then an exact scaling and truncation); all sums after that are integer
// sums, which do not depend on their order. That is what lets a GPU block, which sums in
// parallel, pick exactly the token the CPU picks walking the vocabulary in order.
#pragma once

#include <bit>
#include <cstdint>

#ifdef __CUDACC__
#define LLMESH_HD __host__ __device__ __forceinline__
#else
#define LLMESH_HD inline
#endif

namespace llmesh::kernels::sampling_detail {

LLMESH_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// 64 uniform bits keyed by (seed, position).
LLMESH_HD uint64_t draw_bits(uint64_t seed, uint64_t position) { return splitmix64(seed ^ splitmix64(position ^ 0x5851f42d4c957f2dull)); }

/// High 64 bits of a · b.
LLMESH_HD uint64_t mulhi(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

/// Fixed-point bits of a probability: the largest (p = 1) is 2^bits, and a whole vocabulary's
/// mass (<= vocab · 2^bits) stays below 2^62. 40 bits up to 4M tokens (fewer beyond); a token
/// whose probability relative to the most likely is below 2^-40 (~1e-12) gets no mass.
LLMESH_HD int mass_bits(uint64_t vocab) {
  int need = 0;
  while (need < 64 && (uint64_t{1} << need) < vocab + 1) ++need;  // vocab + 1 <= 2^need
  int bits = 62 - need;
  return bits < 40 ? bits : 40;
}

/// p in [0, 1] (an exp_det result) -> its integer mass: exact scaling by 2^bits, truncated.
LLMESH_HD uint64_t mass_of(float p, int bits) {
  const float scaled = p * static_cast<float>(uint64_t{1} << bits);  // a power of two: exact
  return static_cast<uint64_t>(scaled);
}

/// min_p's mass threshold: floor(floor(min_p · 2^32) · 2^bits / 2^32) (0 for min_p <= 0 or
/// NaN; 2^bits, the most likely token's mass, for min_p >= 1). A token with less is dropped.
LLMESH_HD uint64_t min_mass(float min_p, int bits) {
  if (!(min_p > 0.0f)) return 0;
  if (min_p >= 1.0f) return uint64_t{1} << bits;
  const uint64_t p32 = static_cast<uint64_t>(min_p * 4294967296.0f);  // exact scaling, truncated
  return bits >= 32 ? p32 << (bits - 32) : p32 >> (32 - bits);  // floor(p32 · 2^bits / 2^32)
}

/// The nucleus target: floor(mass · top_p), at least 1 (the most likely token always stays).
/// REQUIRES: top_p < 1 (then top_p * 2^32 is exact and below 2^32); below 0 or NaN counts as 0.
LLMESH_HD uint64_t nucleus_target(uint64_t mass, float top_p) {
  top_p = top_p > 0.0f ? top_p : 0.0f;
  const uint64_t p32 = static_cast<uint64_t>(top_p * 4294967296.0f);
  const uint64_t t = mulhi(mass, p32 << 32);
  return t == 0 ? 1 : t;
}

/// Ties at the threshold a nucleus needs: ceil((target - above) / threshold), where `above`
/// is the mass strictly above the threshold. REQUIRES: threshold > 0, above < target.
LLMESH_HD uint64_t ties_needed(uint64_t target, uint64_t above, uint64_t threshold) {
  return (target - above + threshold - 1) / threshold;
}

}  // namespace llmesh::kernels::sampling_detail
