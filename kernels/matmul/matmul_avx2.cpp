// AVX2 matmul and dot: the 16 canonical lanes live in two ymm registers (lanes 0-7, 8-15).
// Compiled with -mavx2 -mfma -mf16c. Tile 2 × 2: 8 accumulator registers + 4 for x + 2 for w
// fit the 16 ymm registers.
#include <immintrin.h>

#include <array>
#include <utility>

#include "matmul/matmul_tile.hpp"

namespace llmesh::kernels::detail {
namespace {

struct v256x2 {
  __m256 lo, hi;
  static v256x2 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static v256x2 load_x(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static v256x2 load_x_tail(const float* p, size_t n) {
    alignas(32) float buf[16] = {};
    for (size_t i = 0; i < n; ++i) buf[i] = p[i];
    return load_x(buf);
  }
  static __m256 widen(__m128i h, dtype t) {
    if (t == dtype::f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  template <dtype T>
  static v256x2 load_w(const void* base, size_t i) {
    if constexpr (T == dtype::f32) {
      return load_x(static_cast<const float*>(base) + i);
    } else {
      const auto* p = reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i);
      return {widen(_mm_loadu_si128(p), T), widen(_mm_loadu_si128(p + 1), T)};
    }
  }
  template <dtype T>
  static v256x2 load_w_tail(const void* base, size_t i, size_t n) {
    alignas(32) float buf[16] = {};
    for (size_t q = 0; q < n; ++q) buf[q] = load_as_f32(base, T, i + q);
    return load_x(buf);
  }
  static v256x2 fma(v256x2 a, v256x2 b, v256x2 c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static float fold(v256x2 x) {
    __m256 a = _mm256_add_ps(x.lo, x.hi);                                      // i + 8
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  // i + 4
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                             // i + 2
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));                              // i + 1
    return _mm_cvtss_f32(d);
  }
};

float dot_avx2(const float* a, const float* b, size_t n) {
  v256x2 acc = v256x2::zero();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) acc = v256x2::fma(v256x2::load_x(a + i), v256x2::load_x(b + i), acc);
  if (i < n) {
    acc = v256x2::fma(v256x2::load_x_tail(a + i, n - i), v256x2::load_x_tail(b + i, n - i), acc);
  }
  return v256x2::fold(acc);
}

}  // namespace

isa_kernels avx2_kernels() { return {gemm_block<v256x2, 2, 2>, dot_avx2, 2}; }

}  // namespace llmesh::kernels::detail
