// AVX-512 matmul and dot: 16 lanes in one zmm register. Compiled with -mavx512f -mavx512bw
// -mavx512vl -mfma -mf16c; only called when active_isa() says the CPU has them.
// Tile 4 × 6: 24 accumulators + 6 weight vectors + 1 x vector fit the 32 zmm registers.
// g++ 12's own avx512fintrin.h trips -Wuninitialized (its _mm512_undefined_* placeholders).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <array>
#include <cstring>
#include <utility>

#include "matmul/matmul_tile.hpp"

namespace llmesh::kernels::detail {
namespace {

struct v512 {
  using reg = __m512;
  static constexpr int width = 16;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg load_x(const float* p) { return _mm512_loadu_ps(p); }
  static constexpr size_t pos(size_t q) { return q; }
  template <dtype T>
  static reg load_w(const void* base, size_t i, int /*part: one per 16 lanes*/) {
    if constexpr (T == dtype::f32) {
      return _mm512_loadu_ps(static_cast<const float*>(base) + i);
    } else {
      __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
      if constexpr (T == dtype::f16) return _mm512_cvtph_ps(h);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
  static reg load_q8(const uint8_t* block, size_t at) {
    float scale;
    std::memcpy(&scale, block, 4);
    __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + at)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(scale));
  }
  // e4m3 S.EEEE.MMM as float16 S.0EEEE.MMM0000000: the code's value times 2^-8, subnormals
  // included (exact), so times 2^8·scale it is the code times the scale, rounded once. The
  // code sign-extended to 16 bits and shifted left by 7 is S.S.EEEE.MMM0000000; clearing bit 14
  // leaves the float16 (three operations and the convert: 1.2x the decode rate of two masks, two shifts and an or).
  static reg load_fp8(const uint8_t* block, size_t at) {
    float scale;
    std::memcpy(&scale, block, 4);
    const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + at)));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(static_cast<short>(0xbfff)));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(scale * 256.0f));
  }
  static reg load_q4(const uint8_t* block, size_t e) {  // e: 0 or 16
    float f, m;
    std::memcpy(&f, block, 4);
    std::memcpy(&m, block + 4, 4);
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 8));
    if (e >= 16) b = _mm_srli_epi16(b, 4);
    const __m512i q = _mm512_and_si512(_mm512_cvtepu8_epi32(b), _mm512_set1_epi32(0xF));
    return _mm512_fmsub_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(f), _mm512_set1_ps(m));
  }
  // MXFP4 through a table: the block's 16 values mxfp4_values[i] · s (exact), picked by each
  // lane's nibble with one permute instead of a convert and a multiply per step; the table is
  // the same for the block's two halves (the compiler computes it once).
  static reg load_mxfp4(const uint8_t* block, size_t e) {  // e: 0 or 16
    float s;
    std::memcpy(&s, block, 4);
    const __m512 values = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mxfp4_values))));
    const __m512 table = _mm512_mul_ps(values, _mm512_set1_ps(s));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 4));
    if (e >= 16) b = _mm_srli_epi16(b, 4);
    b = _mm_and_si128(b, _mm_set1_epi8(0xF));
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(b), table);
  }
  // f·q is exact (k_factors), so the fused multiply-subtract rounds as q·f − m does; Q6_K's
  // and Q3_K's signed quants are one multiply (−0 where the definition has it, too).
  template <dtype T>
  static reg load_k(const uint8_t* block, size_t e, float f, float m) {
    const __m128i b = k_quant_bytes<T, 16>(block, e);
    if constexpr (k_quant_signed(T)) return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), _mm512_set1_ps(f));
    return _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), _mm512_set1_ps(f), _mm512_set1_ps(m));
  }
  // Q4_K through a table: a sub-block's 16 possible values q·f − m (the fmsub of load_k, so
  // the same bits), picked by each lane's quant with one permute instead of a convert and a
  // multiply-subtract per step (18.9 against 16.4 G weights/s on one Zen 4 core; Q5_K's
  // 32-entry two-register permute measured slower than its load_k, 10.0 against 13.2).
  static constexpr bool k_lut = true;
  // IQ4_XS likewise: a sub-block's 16 values f·iq4nl_values[i] (load_k's multiply) picked by
  // index.
  template <dtype T>
  static void k_table(float f, float m, float* t) {
    static_assert(T == dtype::q4_k || T == dtype::iq4_xs);
    if constexpr (T == dtype::iq4_xs) {
      const __m512 values = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(iq4nl_values))));
      _mm512_store_ps(t, _mm512_mul_ps(values, _mm512_set1_ps(f)));
    } else {
      const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      _mm512_store_ps(t, _mm512_fmsub_ps(iota, _mm512_set1_ps(f), _mm512_set1_ps(m)));
    }
  }
  template <dtype T>
  static reg load_k_lut(const uint8_t* block, size_t e, const float* t) {
    static_assert(T == dtype::q4_k || T == dtype::iq4_xs);
    const __m128i index = T == dtype::iq4_xs ? iq4_xs_indices<16>(block, e) : k_quant_bytes<T, 16>(block, e);
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(index), _mm512_load_ps(t));
  }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static float fold(const reg* parts) {
    __m512 x = parts[0];
    __m256 lo = _mm512_castps512_ps256(x);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
    __m256 a = _mm256_add_ps(lo, hi);                                               // i + 8
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  // i + 4
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                  // i + 2
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));                                   // i + 1
    return _mm_cvtss_f32(d);
  }
};

float dot_avx512(const float* a, const float* b, size_t n) {
  __m512 acc = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  if (i < n) {
    __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a + i), _mm512_maskz_loadu_ps(mask, b + i), acc);
  }
  return v512::fold(&acc);
}

}  // namespace

isa_kernels avx512_kernels() { return {gemm_block<v512, v512, 4, 6>, dot_avx512, 6, 4, nullptr}; }

}  // namespace llmesh::kernels::detail
