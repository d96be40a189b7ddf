// AVX2 matmul and dot: the 16 canonical lanes live in two ymm registers (lanes 0-7, 8-15).
// Compiled with -mavx2 -mfma -mf16c. Tile 3 × 2: 12 accumulator registers + 2 weight parts +
// 1 x part fit the 16 ymm registers.
#include <immintrin.h>

#include <array>
#include <cstring>
#include <utility>

#include "matmul/matmul_tile.hpp"

namespace llmesh::kernels::detail {
namespace {

struct v256 {
  using reg = __m256;
  static constexpr int width = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load_x(const float* p) { return _mm256_loadu_ps(p); }
  static constexpr size_t pos(size_t q) { return q; }
  template <dtype T>
  static reg load_w(const void* base, size_t chunk, int part) {
    const size_t i = chunk + static_cast<size_t>(part) * 8;
    if constexpr (T == dtype::f32) {
      return _mm256_loadu_ps(static_cast<const float*>(base) + i);
    } else {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
      if constexpr (T == dtype::f16) return _mm256_cvtph_ps(h);
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
  static reg load_q8(const uint8_t* block, size_t at) {
    float scale;
    std::memcpy(&scale, block, 4);
    __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + at)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(scale));
  }
  // As v512::load_fp8 (matmul_avx512.cpp), 8 codes at a time.
  static reg load_fp8(const uint8_t* block, size_t at) {
    float scale;
    std::memcpy(&scale, block, 4);
    const __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + at)));
    const __m128i h = _mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16(static_cast<short>(0xbfff)));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(scale * 256.0f));
  }
  static reg load_q4(const uint8_t* block, size_t e) {  // e: 0, 8, 16 or 24
    float f, m;
    std::memcpy(&f, block, 4);
    std::memcpy(&m, block + 4, 4);
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 8 + e % 16));
    if (e >= 16) b = _mm_srli_epi16(b, 4);
    const __m256i q = _mm256_and_si256(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(0xF));
    return _mm256_fmsub_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(f), _mm256_set1_ps(m));
  }
  // MXFP4: q4's nibbles looked up in mxfp4_values (bytes), times the block's power of two: exact.
  static reg load_mxfp4(const uint8_t* block, size_t e) {  // e: 0, 8, 16 or 24
    float s;
    std::memcpy(&s, block, 4);
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 4 + e % 16));
    if (e >= 16) b = _mm_srli_epi16(b, 4);
    b = _mm_and_si128(b, _mm_set1_epi8(0xF));
    const __m128i q = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mxfp4_values)), b);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(s));
  }
  // f·q is exact (k_factors), so the fused multiply-subtract rounds as q·f − m does; Q6_K's
  // and Q3_K's signed quants are one multiply (−0 where the definition has it, too).
  template <dtype T>
  static reg load_k(const uint8_t* block, size_t e, float f, float m) {
    const __m128i b = k_quant_bytes<T, 8>(block, e);
    if constexpr (k_quant_signed(T)) return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_set1_ps(f));
    return _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), _mm256_set1_ps(f), _mm256_set1_ps(m));
  }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static float fold(const reg* parts) {  // parts[0] = lanes 0-7, parts[1] = lanes 8-15
    __m256 a = _mm256_add_ps(parts[0], parts[1]);                                   // i + 8
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  // i + 4
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                  // i + 2
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));                                   // i + 1
    return _mm_cvtss_f32(d);
  }
};

/// bf16 weights in an even/odd layout: one 32-byte load holds 16 bf16 = 8 dwords; shifting
/// each dword left by 16 gives the even elements as float32, masking its high half gives the
/// odd ones — two cheap integer ops instead of two zero-extends and two shifts. Lane j of
/// part 0 holds chunk element 2j, of part 1 element 2j+1; x is packed to match
/// (pack_x_even_odd), and the fold below adds the lanes in the canonical order.
struct v256_bf16_even_odd {
  using reg = __m256;
  static constexpr int width = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load_x(const float* p) { return _mm256_loadu_ps(p); }
  static constexpr size_t pos(size_t q) { return (q % 2) * 8 + q / 2; }
  template <dtype T>
  static reg load_w(const void* base, size_t chunk, int part) {
    static_assert(T == dtype::bf16);
    __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + chunk));
    if (part == 0) return _mm256_castsi256_ps(_mm256_slli_epi32(d, 16));
    return _mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static float fold(const reg* parts) {
    // Canonical lanes r0..r15: parts[0] = r0 r2 .. r14, parts[1] = r1 r3 .. r15.
    __m128 e = _mm_add_ps(_mm256_castps256_ps128(parts[0]), _mm256_extractf128_ps(parts[0], 1));  // r2j + r2j+8
    __m128 o = _mm_add_ps(_mm256_castps256_ps128(parts[1]), _mm256_extractf128_ps(parts[1], 1));  // r2j+1 + r2j+9
    __m128 e2 = _mm_add_ps(e, _mm_movehl_ps(e, e));  // [s0, s2] with s_i = (i + 8 fold)[i] + [i + 4]
    __m128 o2 = _mm_add_ps(o, _mm_movehl_ps(o, o));  // [s1, s3]
    float t0 = _mm_cvtss_f32(e2) + _mm_cvtss_f32(_mm_movehdup_ps(e2));  // s0 + s2
    float t1 = _mm_cvtss_f32(o2) + _mm_cvtss_f32(_mm_movehdup_ps(o2));  // s1 + s3
    return t0 + t1;
  }
};

/// Packs rows of x into the even/odd layout: within each 16-chunk, elements 0,2,..,14 then
/// 1,3,..,15; rows padded with zeros to a multiple of 16 (ld_out = that length).
void pack_x_even_odd(const float* x, size_t ldx, size_t m, size_t k, float* out, size_t ld_out) {
  for (size_t r = 0; r < m; ++r) {
    const float* src = x + r * ldx;
    float* dst = out + r * ld_out;
    for (size_t c = 0; c < ld_out; c += 16) {
      for (size_t q = 0; q < 16; ++q) dst[c + v256_bf16_even_odd::pos(q)] = c + q < k ? src[c + q] : 0.0f;
    }
  }
}

float dot_avx2(const float* a, const float* b, size_t n) {
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc[1]);
  }
  if (i < n) {
    alignas(32) float ta[16] = {}, tb[16] = {};
    for (size_t q = 0; q < n - i; ++q) {
      ta[q] = a[i + q];
      tb[q] = b[i + q];
    }
    acc[0] = _mm256_fmadd_ps(_mm256_load_ps(ta), _mm256_load_ps(tb), acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_load_ps(ta + 8), _mm256_load_ps(tb + 8), acc[1]);
  }
  return v256::fold(acc);
}

}  // namespace

isa_kernels avx2_kernels() { return {gemm_block<v256, v256_bf16_even_odd, 3, 2>, dot_avx2, 2, 3, pack_x_even_odd}; }

}  // namespace llmesh::kernels::detail
