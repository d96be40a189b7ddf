// Private: the register-tiled matmul micro-kernel, written once over a 16-lane vector type V
// and instantiated by each instruction-set translation unit (matmul_avx512.cpp,
// matmul_avx2.cpp), which is compiled with that set's flags.
//
// A tile computes MR rows of x against NR rows of w, with one 16-lane accumulator per output
// (inner-product form). Both operands are read along k, which is how HF stores weights
// ([out, in]) and activations, so no packing copy is needed and each output keeps the
// canonical reduction order of matmul.hpp whatever MR, NR or the thread split are.
//
// V is one native vector of V::width lanes (16 for AVX-512, 8 for AVX2); a canonical 16-lane
// accumulator is P = 16 / width registers ("parts"), each holding lanes [p·width, (p+1)·width).
// Per 16-wide step of k the tile walks the parts one at a time: load NR weight parts, then
// for each x row load one x part and issue NR fused multiply-adds. Registers in use:
// MR·NR·P accumulators + NR weights + 1 x, which sizes the tiles (4×6 on AVX-512, 3×2 on AVX2).
//
// V must provide: using reg; width; zero(); load_x(const float*); store(float*, reg);
// load_w<dtype>(const void* w, size_t chunk_start, int part) for f32/f16/bf16;
// load_q8(const uint8_t* block, size_t at): width int8 values from block + at, dequantized as
// float(q) * the block's scale (its first 4 bytes), so the products are those of the
// dequantized weights; load_fp8(const uint8_t* block, size_t at): likewise for width e4m3
// bytes (fp8_value's floats: the code widened exactly to float16 bits, times 2^8·scale — the
// same product, rounded once); load_q4(const uint8_t* block, size_t e): width elements from e of a q4
// block, decoded to q4_value's floats (q·f − m in one fused multiply-subtract); load_mxfp4 likewise
// for an mxfp4 block (mxfp4_value's floats); load_k<dtype>(const uint8_t* block, size_t e, float f, float m) for
// q2_k ... q6_k and iq4_xs: width elements from e of a K-quant super-block, given its sub-block's
// (or group's) factors (k_factors below), decoded to k_quant_value's floats (dtype.hpp);
// optionally (a V with k_lut) k_table<q4_k or iq4_xs>(f, m, float* t) writing a sub-block's 16
// possible values and load_k_lut<same>(block, e, const float* t) picking them by quant (index);
// fma(reg a, reg b, reg c) =
// a*b+c; pos(q): where element q of a 16-chunk sits in V's register layout (q for the
// natural layout); fold(const reg* parts) -> float in the canonical fold order.
// A V with a permuted layout expects x already permuted the same way (matmul_cpu.cpp packs it).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include <immintrin.h>
#include <vector>

#include "matmul/matmul_isa.hpp"

namespace llmesh::kernels::detail {
// Internal linkage: each instruction-set unit compiles its own copy of every function here
// with its own flags; one shared (ODR-merged) copy of, say, k_factors could be the AVX-512
// unit's and fault on an AVX2-only CPU wherever the compiler did not inline it.
namespace {

/// The factors of one K-quant super-block, k_quant_factor's for each group
/// (k_quant_group): q4_k and q5_k, d·sc into f and dmin·m into m for each of its 8 sub-blocks
/// of 32; q2_k, d·(s & 15) and dmin·(s >> 4) for each of its 16 groups of 16; q3_k and q6_k,
/// d·scale into f for each of 16 groups, iq4_xs for each of 8 sub-blocks of 32 (m unused). Each is exact in float32, and so is its
/// product with a quant (dtype.hpp).
/// Vector code (both instruction-set units have AVX2 and F16C): a tile calls this for each of
/// its rows at every super-block, so it must cost a few instructions, not a scalar loop.
template <dtype WT>
inline void k_factors(const uint8_t* b, float* f, float* m) {
  uint16_t h;
  if constexpr (WT == dtype::q4_k || WT == dtype::q5_k) {
    // The 12 scale bytes rearranged into 8 scales then 8 mins, one byte each (q4_k_scale_min
    // for every j at once, on 32-bit words).
    uint32_t u[4];
    std::memcpy(u, b + 4, 12);
    constexpr uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    u[3] = ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4);
    const uint32_t mins_low = u[1] & low6;
    u[1] = (u[2] & low4) | (((u[0] >> 6) & low2) << 4);
    u[2] = mins_low;
    u[0] &= low6;
    std::memcpy(&h, b, 2);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
    std::memcpy(&h, b + 2, 2);
    const __m256 dmin = _mm256_set1_ps(_cvtsh_ss(h));
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    _mm256_storeu_ps(f, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm)), d));
    _mm256_storeu_ps(m, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))), dmin));
  } else if constexpr (WT == dtype::iq4_xs) {
    // Sub-block s's scale: bits 4s-4s+3 of scales_l (as one 32-bit word) and bits 2s, 2s+1 of
    // scales_h, shifted per lane.
    uint32_t sl;
    std::memcpy(&sl, b + 4, 4);
    std::memcpy(&h, b + 2, 2);
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(sl)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                        _mm256_set1_epi32(15));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                        _mm256_set1_epi32(3));
    const __m256i sc = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    std::memcpy(&h, b, 2);
    _mm256_storeu_ps(f, _mm256_mul_ps(_mm256_cvtepi32_ps(sc), _mm256_set1_ps(_cvtsh_ss(h))));
    _mm256_storeu_ps(m, _mm256_setzero_ps());  // no min: never used, but defined
  } else if constexpr (WT == dtype::q2_k) {
    std::memcpy(&h, b + 80, 2);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
    std::memcpy(&h, b + 82, 2);
    const __m256 dmin = _mm256_set1_ps(_cvtsh_ss(h));
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    const __m128i low4 = _mm_set1_epi8(15);
    const __m128i sc = _mm_and_si128(s, low4), mn = _mm_and_si128(_mm_srli_epi16(s, 4), low4);
    _mm256_storeu_ps(f, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)), d));
    _mm256_storeu_ps(f + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sc, 8))), d));
    _mm256_storeu_ps(m, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)), dmin));
    _mm256_storeu_ps(m + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mn, 8))), dmin));
  } else {
    // q3_k: its 12 scale bytes unpacked to 16 bytes as ggml does (q3_k_scale for every g at
    // once), less 32; q6_k: 16 int8 scales as stored.
    __m128i sc;
    if constexpr (WT == dtype::q3_k) {
      uint32_t u[4];
      std::memcpy(u, b + 96, 12);
      constexpr uint32_t low4 = 0x0f0f0f0f, low2 = 0x03030303;
      const uint32_t t = u[2];
      u[2] = ((u[0] >> 4) & low4) | (((t >> 4) & low2) << 4);
      u[3] = ((u[1] >> 4) & low4) | (((t >> 6) & low2) << 4);
      u[0] = (u[0] & low4) | ((t & low2) << 4);
      u[1] = (u[1] & low4) | (((t >> 2) & low2) << 4);
      sc = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)), _mm_set1_epi8(32));
      std::memcpy(&h, b + 108, 2);
    } else {
      sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
      std::memcpy(&h, b + 208, 2);
    }
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
    _mm256_storeu_ps(f, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d));
    _mm256_storeu_ps(f + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))), d));
    _mm256_storeu_ps(m, _mm256_setzero_ps());  // no min: never used, but defined
    _mm256_storeu_ps(m + 8, _mm256_setzero_ps());
  }
}

/// N bytes (8 or 16) from p into an xmm register; only N are read.
template <int N>
inline __m128i load_bytes(const uint8_t* p) {
  if constexpr (N == 16) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
}

/// IQ4_XS's 4-bit indices of elements [e, e + N) (the nibbles of qs[16s + i % 16]), as bytes.
template <int N>
inline __m128i iq4_xs_indices(const uint8_t* b, size_t e) {
  __m128i q = load_bytes<N>(b + 8 + 16 * (e / 32) + e % 16);
  if (e % 32 >= 16) q = _mm_srli_epi16(q, 4);
  return _mm_and_si128(q, _mm_set1_epi8(15));
}

/// The quants of elements [e, e + N) of a K-quant super-block as N bytes of an xmm register
/// (N = 8 or 16, e a multiple of N; only N bytes are read): q2_k 0-3, q4_k 0-15, q5_k 0-31
/// (unsigned), q3_k −4-3, q6_k −32-31, iq4_xs −127-113 (signed), k_quant_q's values. Picked and
/// assembled in bytes, with 128-bit operations, before any widening.
template <dtype T, int N>
inline __m128i k_quant_bytes(const uint8_t* b, size_t e) {
  auto load = [](const uint8_t* p) { return load_bytes<N>(p); };
  const __m128i low4 = _mm_set1_epi8(15);
  if constexpr (T == dtype::iq4_xs) {  // the indices looked up in bytes
    return _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(iq4nl_values)), iq4_xs_indices<N>(b, e));
  } else if constexpr (T == dtype::q2_k || T == dtype::q3_k) {
    // Two bits 2j, 2j+1 of qs[32n + l]; q3_k: less 4 where bit 4n + j of hmask[l] is clear.
    const size_t n = e / 128, j = e % 128 / 32, l = e % 32;
    constexpr size_t qs = T == dtype::q2_k ? 16 : 32;
    const __m128i q = _mm_and_si128(_mm_srl_epi16(load(b + qs + 32 * n + l), _mm_cvtsi32_si128(static_cast<int>(2 * j))),
                                    _mm_set1_epi8(3));
    if constexpr (T == dtype::q2_k) {
      return q;
    } else {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
      if constexpr (N == 16) {  // one test into a mask and a masked subtract
        const __mmask16 clear = _mm_testn_epi8_mask(load(b + l), _mm_set1_epi8(static_cast<char>(1 << (4 * n + j))));
        return _mm_mask_sub_epi8(q, clear, q, _mm_set1_epi8(4));
      }
#endif
      const __m128i h = _mm_and_si128(_mm_srl_epi16(load(b + l), _mm_cvtsi32_si128(static_cast<int>(4 * n + j))), _mm_set1_epi8(1));
      return _mm_sub_epi8(_mm_or_si128(q, _mm_slli_epi16(h, 2)), _mm_set1_epi8(4));
    }
  } else if constexpr (T == dtype::q6_k) {
    const size_t half = e / 128, s = e % 128 / 32, l = e % 32;
    __m128i lo = load(b + 64 * half + 32 * (s % 2) + l);
    if (s >= 2) lo = _mm_srli_epi16(lo, 4);
    const __m128i hi = load(b + 128 + 32 * half + l);
    const __m128i hbits = _mm_and_si128(_mm_srl_epi16(hi, _mm_cvtsi32_si128(static_cast<int>(2 * s))), _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(_mm_and_si128(lo, low4), _mm_slli_epi16(hbits, 4)), _mm_set1_epi8(32));
  } else {
    constexpr size_t qs = T == dtype::q5_k ? 48 : 16;
    const bool high = e % 64 >= 32;
    __m128i q = load(b + qs + e / 64 * 32 + e % 32);
    if (high) q = _mm_srli_epi16(q, 4);
    q = _mm_and_si128(q, low4);
    if constexpr (T == dtype::q5_k) {
      const int bit = static_cast<int>(2 * (e / 64)) + (high ? 1 : 0);
      const __m128i h = _mm_and_si128(_mm_srl_epi16(load(b + 16 + e % 32), _mm_cvtsi32_si128(bit)), _mm_set1_epi8(1));
      q = _mm_or_si128(q, _mm_slli_epi16(h, 4));
    }
    return q;
  }
}

/// Accumulates k in [k0, k1) (k0 a multiple of 16) for an MR × NR tile at rows i0, columns j0.
/// `part` carries the 16-lane accumulators between k blocks (MR·NR·16 floats): loaded when
/// k0 > 0, stored when k1 < k; the last block folds and writes y. With one block, part is
/// unused. Splitting k this way keeps every lane's sum sequential in k: same bits.
template <class V, int MR, int NR, dtype WT>
void matmul_tile(const matmul_args& a, size_t i0, size_t j0, size_t k0, size_t k1, float* part) {
  using reg = typename V::reg;
  constexpr int W = V::width;
  constexpr int P = 16 / W;
  const float* x = a.x + i0 * a.ldx;
  const size_t w_row0 = j0 * a.ldw;
  reg acc[MR][NR][P];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n)
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) acc[m][n][p] = k0 > 0 ? V::load_x(part + ((m * NR + n) * P + p) * W) : V::zero();

  // Block types: each row starts on a block (ldw is whole blocks), and a 16-chunk never leaves
  // its block, so one byte offset per step serves every row: no address arithmetic per load.
  constexpr bool blocked = is_quantized(WT);
  constexpr bool kq = is_k_quant(WT);
  [[maybe_unused]] const uint8_t* q8_row[NR] = {};
  [[maybe_unused]] size_t q8_next = 0;  // bytes from a row to the same row of the next tile
  // K-quants: the factors of each row's current super-block.
  [[maybe_unused]] alignas(64) float kq_f[kq ? NR : 1][16];
  [[maybe_unused]] alignas(64) float kq_m[kq ? NR : 1][16];
  constexpr bool lut = (WT == dtype::q4_k || WT == dtype::iq4_xs) && requires { V::k_lut; };
  [[maybe_unused]] alignas(64) float kq_lut[lut ? NR : 1][lut ? 8 : 1][16];  // per row, per sub-block
  if constexpr (blocked) {
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) q8_row[n] = static_cast<const uint8_t*>(a.w) + dtype_offset(WT, w_row0 + n * a.ldw);
    q8_next = dtype_offset(WT, NR * a.ldw);
  }
  size_t kk = k0;
  if constexpr (kq) {
    // Whole super-blocks (k blocks are multiples of 256: k_block_len): one super-block per
    // iteration, its 16 steps unrolled, so every step's byte offsets, nibble choice and factor
    // are constants — the generic loop below works them out per step.
    constexpr size_t BB = dtype_block_bytes(WT);
    for (; kk % k_block == 0 && kk + k_block <= k1; kk += k_block) {
      const size_t at = kk / k_block * BB;
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n) {
        k_factors<WT>(q8_row[n] + at, kq_f[n], kq_m[n]);
        if constexpr (lut) {
          for (int j = 0; j < 8; ++j) V::template k_table<WT>(kq_f[n][j], kq_m[n][j], kq_lut[n][j]);
        }
        if (MR == 1 || i0 == 0) {  // the next tile's rows (see the generic loop's prefetch)
          const uintptr_t next = reinterpret_cast<uintptr_t>(q8_row[n]) + q8_next + at;
          for (size_t line = 0; line < BB; line += 64) __builtin_prefetch(reinterpret_cast<const void*>(next + line), 0, 3);
        }
      }
      // The factors stay in memory, each step broadcasting its own from there: kept in
      // registers (NR·16 floats for the 16-group types), the compiler spills them and extracts
      // and shuffles lanes per step.
      asm volatile("" : : "r"(kq_f), "r"(kq_m) : "memory");
#pragma GCC unroll 16
      for (size_t c = 0; c < k_block / 16; ++c) {
#pragma GCC unroll 2
        for (int p = 0; p < P; ++p) {
          const size_t e = c * 16 + static_cast<size_t>(p) * W;
          reg wv[NR];
#pragma GCC unroll 8
          for (int n = 0; n < NR; ++n) {
            if constexpr (lut) {
              wv[n] = V::template load_k_lut<WT>(q8_row[n] + at, e, kq_lut[n][e / 32]);
            } else {
              const size_t g = e / k_quant_group(WT);  // the factors' group
              wv[n] = V::template load_k<WT>(q8_row[n] + at, e, kq_f[n][g], kq_m[n][g]);
            }
            asm("" : "+x"(wv[n]));
          }
#pragma GCC unroll 8
          for (int m = 0; m < MR; ++m) {
            reg xv = V::load_x(x + m * a.ldx + kk + e);
            asm("" : "+x"(xv));
#pragma GCC unroll 8
            for (int n = 0; n < NR; ++n) acc[m][n][p] = V::fma(xv, wv[n], acc[m][n][p]);
          }
        }
      }
    }
  }
  if constexpr ((WT == dtype::q4 || WT == dtype::q8 || WT == dtype::fp8 || WT == dtype::mxfp4) && MR <= 2) {
    // Decode (one or two x rows), whole blocks of 32: one block per iteration, its two steps
    // unrolled, so every load's byte offset (and an int4 load's nibble half) is a constant
    // (the generic loop below works them out per step).
    static_assert(q4_block == 32 && q8_block == 32 && mxfp4_block == 32);
    for (; kk % 32 == 0 && kk + 32 <= k1; kk += 32) {
      const size_t at = kk / 32 * dtype_block_bytes(WT);
      if (MR == 1 || i0 == 0) {  // the next tile's rows (see the generic loop's prefetch)
        const size_t ahead = q8_next + at;
#pragma GCC unroll 8
        for (int n = 0; n < NR; ++n) __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(q8_row[n]) + ahead), 0, 3);
      }
#pragma GCC unroll 2
      for (size_t c = 0; c < 2; ++c) {
#pragma GCC unroll 2
        for (int p = 0; p < P; ++p) {
          const size_t e = c * 16 + static_cast<size_t>(p) * W;
          reg wv[NR];
#pragma GCC unroll 8
          for (int n = 0; n < NR; ++n) {
            if constexpr (WT == dtype::q4) wv[n] = V::load_q4(q8_row[n] + at, e);
            else if constexpr (WT == dtype::mxfp4) wv[n] = V::load_mxfp4(q8_row[n] + at, e);
            else if constexpr (WT == dtype::fp8) wv[n] = V::load_fp8(q8_row[n] + at, 4 + e);
            else wv[n] = V::load_q8(q8_row[n] + at, 4 + e);
            asm("" : "+x"(wv[n]));
          }
#pragma GCC unroll 8
          for (int m = 0; m < MR; ++m) {
            reg xv = V::load_x(x + m * a.ldx + kk + e);
            asm("" : "+x"(xv));
#pragma GCC unroll 8
            for (int n = 0; n < NR; ++n) acc[m][n][p] = V::fma(xv, wv[n], acc[m][n][p]);
          }
        }
      }
    }
  }
  for (; !kq && kk + 16 <= k1; kk += 16) {  // K-quants went whole super-blocks at a time above
    [[maybe_unused]] const size_t q8_block_at = kk / q8_block * dtype_block_bytes(WT);  // q8, fp8, q4: this step's block
    if (MR == 1 || i0 == 0) {
      // Decode streams weights from memory with no reuse, one page-sized row after another,
      // which the hardware prefetcher restarts at every page: prefetch the next tile's rows
      // (the next NR rows) at the pace this tile consumes its own. With more x rows, the first
      // x tile (i0 == 0: gemm_block starts every block there) streams the weight block from
      // memory and prefetches likewise; later tiles find it in cache (batches of 4-16 rows:
      // 10-25 % faster on AVX2 than without). Into every cache level
      // (T0): on a Xeon with AVX-512 the non-temporal hint left a 128 M-weight decode matmul
      // at 55-65 % of the read bandwidth, T0 reaches ~100 % (bf16 and q8, both ISAs).
      // The last tile's "next rows" lie past the weights: the addresses are formed as
      // integers (a prefetch never faults; a pointer past its array would be undefined).
      if constexpr (WT == dtype::q8 || WT == dtype::fp8 || WT == dtype::q4 || WT == dtype::mxfp4) {
        const size_t ahead = q8_next + q8_block_at;
#pragma GCC unroll 8
        for (int n = 0; n < NR; ++n) __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(q8_row[n]) + ahead), 0, 3);
      } else {
        const uintptr_t next = reinterpret_cast<uintptr_t>(a.w) + (w_row0 + NR * a.ldw) * dtype_size(WT);
#pragma GCC unroll 8
        for (int n = 0; n < NR; ++n) __builtin_prefetch(reinterpret_cast<const void*>(next + (n * a.ldw + kk) * dtype_size(WT)), 0, 3);
      }
    }
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) {
      reg wv[NR];
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n) {
        if constexpr (WT == dtype::q8) {
          wv[n] = V::load_q8(q8_row[n] + q8_block_at, 4 + kk % q8_block + static_cast<size_t>(p) * W);
        } else if constexpr (WT == dtype::fp8) {
          wv[n] = V::load_fp8(q8_row[n] + q8_block_at, 4 + kk % q8_block + static_cast<size_t>(p) * W);
        } else if constexpr (WT == dtype::q4) {
          wv[n] = V::load_q4(q8_row[n] + q8_block_at, kk % q4_block + static_cast<size_t>(p) * W);
        } else if constexpr (WT == dtype::mxfp4) {
          wv[n] = V::load_mxfp4(q8_row[n] + q8_block_at, kk % mxfp4_block + static_cast<size_t>(p) * W);
        } else {
          wv[n] = V::template load_w<WT>(a.w, w_row0 + n * a.ldw + kk, p);
        }
        asm("" : "+x"(wv[n]));  // same reason as for x below
      }
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        reg xv = V::load_x(x + m * a.ldx + kk + p * W);
        // Keep x in a register: otherwise GCC folds the load into each of the NR FMAs as a
        // memory operand, and the tile becomes load-bound instead of FMA-bound.
        asm("" : "+x"(xv));
#pragma GCC unroll 8
        for (int n = 0; n < NR; ++n) acc[m][n][p] = V::fma(xv, wv[n], acc[m][n][p]);
      }
    }
  }
  if (k1 < a.k) {  // more k blocks follow: park the lanes
    for (int m = 0; m < MR; ++m)
      for (int n = 0; n < NR; ++n)
        for (int p = 0; p < P; ++p) V::store(part + ((m * NR + n) * P + p) * W, acc[m][n][p]);
    return;
  }
  if (kk < a.k) {  // tail: zero-padded copies, i.e. fma(0, 0, acc) in the missing lanes
    const size_t rest = a.k - kk;
    alignas(64) float xt[MR][16] = {};
    alignas(64) float wt[NR][16] = {};
    for (int m = 0; m < MR; ++m)
      for (size_t q = 0; q < rest; ++q) xt[m][V::pos(q)] = x[m * a.ldx + kk + V::pos(q)];
    for (int n = 0; n < NR; ++n)
      for (size_t q = 0; q < rest; ++q) wt[n][V::pos(q)] = weight_as_f32(a.w, WT, w_row0 + n * a.ldw + kk + q);
    for (int p = 0; p < P; ++p) {
      for (int m = 0; m < MR; ++m) {
        reg xv = V::load_x(&xt[m][p * W]);
        for (int n = 0; n < NR; ++n) acc[m][n][p] = V::fma(xv, V::load_x(&wt[n][p * W]), acc[m][n][p]);
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
    float* y = a.y + (i0 + m) * a.ldy + j0;
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      float v = V::fold(acc[m][n]);
      y[n] = a.bias ? v + a.bias[j0 + n] : v;
    }
  }
}

using tile_fn = void (*)(const matmul_args&, size_t, size_t, size_t, size_t, float*);

template <class V, dtype WT, int MR, int... Ns>
constexpr void fill_row(tile_fn* row, std::integer_sequence<int, Ns...>) {
  ((row[Ns] = &matmul_tile<V, MR, Ns + 1, WT>), ...);
}

template <class V, dtype WT, int MRMax, int NRMax, int... Ms>
constexpr auto make_table(std::integer_sequence<int, Ms...>) {
  std::array<std::array<tile_fn, NRMax>, MRMax> t{};
  ((fill_row<V, WT, Ms + 1>(t[Ms].data(), std::make_integer_sequence<int, NRMax>{})), ...);
  return t;
}

/// Weight rows [jb, jb_end) of `a` against x rows [m0, m1): every k block of kb, every x tile
/// over it, with `table`'s tiles (their column index shifted down by `shift`: a's weights may
/// start at row jb). `parts`: the lane buffer gemm_block sized, or null when kb covers k.
template <int MRMax, int NRMax, class Table>
void sweep(const Table& table, const matmul_args& a, size_t m0, size_t m1, size_t jb, size_t jb_end, size_t shift, size_t kb,
           float* parts) {
  constexpr size_t part_floats = static_cast<size_t>(MRMax) * NRMax * 16;
  for (size_t k0 = 0; k0 < a.k; k0 += kb) {
    const size_t k1 = std::min(a.k, k0 + kb);
    float* part = parts;
    for (size_t i = m0; i < m1; i += MRMax) {
      const size_t mr = std::min<size_t>(MRMax, m1 - i);
      for (size_t j = jb; j < jb_end; j += NRMax, part = part ? part + part_floats : nullptr) {
        table[mr - 1][std::min<size_t>(NRMax, jb_end - j) - 1](a, i, j - shift, k0, k1, part);
      }
    }
  }
}

/// Rows [j0, j0 + rows) of a K-quant job's weights decoded to float32 rows of a.k (ld a.k):
/// the values load_k gives the tile, so a float32 tile over them has its bits.
template <class V, dtype WT>
void dequantize_rows(const matmul_args& a, size_t j0, size_t rows, float* out) {
  constexpr int W = V::width;
  alignas(64) float f[16], m[16];
  for (size_t r = 0; r < rows; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(a.w) + dtype_offset(WT, (j0 + r) * a.ldw);
    for (size_t b = 0; b < a.k / k_block; ++b) {
      const uint8_t* blk = row + b * dtype_block_bytes(WT);
      k_factors<WT>(blk, f, m);
      float* o = out + r * a.k + b * k_block;
      for (size_t e = 0; e < k_block; e += W) {
        const size_t g = e / k_quant_group(WT);
        V::store(o + e, V::template load_k<WT>(blk, e, f[g], m[g]));
      }
    }
  }
}

/// gemm_block for K-quant weights and many x rows: each block of weight rows is decoded once
/// into float32 (sized to stay in L2) and every x tile runs the float32 tile over it, instead
/// of every x tile decoding the same blocks again. Same values, same order: same bits.
template <class V, int MRMax, int NRMax>
void gemm_block_dequantized(const matmul_args& a, size_t m0, size_t m1, size_t n0, size_t n1) {
  static const auto t32 = make_table<V, dtype::f32, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  const size_t kb = k_block_len(a.k, m1 - m0, MRMax);
  size_t nb = 192 * 1024 / (a.k * sizeof(float));
  nb = nb < static_cast<size_t>(NRMax) ? NRMax : nb - nb % NRMax;
  constexpr size_t part_floats = static_cast<size_t>(MRMax) * NRMax * 16;
  thread_local std::vector<float> weights, parts;
  weights.resize(nb * a.k);
  if (kb < a.k) parts.resize(((m1 - m0 + MRMax - 1) / MRMax) * ((nb + NRMax - 1) / NRMax) * part_floats);
  for (size_t jb = n0; jb < n1; jb += nb) {
    const size_t jb_end = std::min(n1, jb + nb);
    switch (a.w_type) {
      case dtype::q2_k: dequantize_rows<V, dtype::q2_k>(a, jb, jb_end - jb, weights.data()); break;
      case dtype::q3_k: dequantize_rows<V, dtype::q3_k>(a, jb, jb_end - jb, weights.data()); break;
      case dtype::q4_k: dequantize_rows<V, dtype::q4_k>(a, jb, jb_end - jb, weights.data()); break;
      case dtype::q5_k: dequantize_rows<V, dtype::q5_k>(a, jb, jb_end - jb, weights.data()); break;
      case dtype::iq4_xs: dequantize_rows<V, dtype::iq4_xs>(a, jb, jb_end - jb, weights.data()); break;
      default: dequantize_rows<V, dtype::q6_k>(a, jb, jb_end - jb, weights.data()); break;
    }
    matmul_args f = a;  // columns [jb, jb_end) as a float32 job of their own
    f.w = weights.data();
    f.ldw = a.k;
    f.w_type = dtype::f32;
    f.y = a.y + jb;
    f.bias = a.bias ? a.bias + jb : nullptr;
    sweep<MRMax, NRMax>(t32, f, m0, m1, jb, jb_end, jb, kb, kb < a.k ? parts.data() : nullptr);
  }
}

/// Rows [m0, m1) × columns [n0, n1) with MRMax × NRMax tiles (smaller ones at the edges).
/// Blocking: a block of weight rows × a block of k sized to stay in L2 is read from memory
/// once; every x tile (MRMax rows × the k block, sized to stay in L1) passes over it. With
/// more than one k block, the tiles' lane accumulators wait in a per-thread buffer.
/// VB16 is the vector type used for bf16 weights (it may use a permuted layout).
template <class V, class VB16, int MRMax, int NRMax>
void gemm_block(const matmul_args& a, size_t m0, size_t m1, size_t n0, size_t n1) {
  // K-quant k blocks must be whole super-blocks: matmul_tile's K-quant loop steps by them.
  static_assert((24 * 1024 / (sizeof(float) * MRMax)) / 16 * 16 % k_block == 0, "see k_block_len");
  if (is_k_quant(a.w_type) && m1 - m0 > 2 * static_cast<size_t>(MRMax)) {
    gemm_block_dequantized<V, MRMax, NRMax>(a, m0, m1, n0, n1);
    return;
  }
  static const auto t32 = make_table<V, dtype::f32, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto t16 = make_table<V, dtype::f16, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tb16 = make_table<VB16, dtype::bf16, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tq8 = make_table<V, dtype::q8, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tq4 = make_table<V, dtype::q4, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tfp8 = make_table<V, dtype::fp8, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tmx4 = make_table<V, dtype::mxfp4, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tq4k = make_table<V, dtype::q4_k, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tq5k = make_table<V, dtype::q5_k, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tq6k = make_table<V, dtype::q6_k, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tq2k = make_table<V, dtype::q2_k, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tq3k = make_table<V, dtype::q3_k, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tiq4 = make_table<V, dtype::iq4_xs, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  const auto& table = a.w_type == dtype::f32    ? t32
                      : a.w_type == dtype::f16  ? t16
                      : a.w_type == dtype::q8   ? tq8
                      : a.w_type == dtype::q4   ? tq4
                      : a.w_type == dtype::fp8  ? tfp8
                      : a.w_type == dtype::mxfp4 ? tmx4
                      : a.w_type == dtype::q4_k ? tq4k
                      : a.w_type == dtype::q5_k ? tq5k
                      : a.w_type == dtype::q6_k ? tq6k
                      : a.w_type == dtype::q2_k ? tq2k
                      : a.w_type == dtype::q3_k ? tq3k
                      : a.w_type == dtype::iq4_xs ? tiq4
                                                : tb16;
  const size_t kb = k_block_len(a.k, m1 - m0, MRMax);
  const size_t nb = n_block_rows(kb, a.w_type, NRMax);
  constexpr size_t part_floats = static_cast<size_t>(MRMax) * NRMax * 16;
  thread_local std::vector<float> parts;
  if (kb < a.k) parts.resize(((m1 - m0 + MRMax - 1) / MRMax) * ((nb + NRMax - 1) / NRMax) * part_floats);
  for (size_t jb = n0; jb < n1; jb += nb) {
    sweep<MRMax, NRMax>(table, a, m0, m1, jb, std::min(n1, jb + nb), 0, kb, kb < a.k ? parts.data() : nullptr);
  }
}

}  // namespace
}  // namespace llmesh::kernels::detail
