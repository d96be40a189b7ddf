// AVX2 matmul and dot: the 16 canonical lanes live in two ymm registers (lanes 0-7, 8-15).
// Compiled with -mavx2 -mfma -mf16c. Tile 3 × 2: 12 accumulator registers + 2 weight parts +
// 1 x part fit the 16 ymm registers.
#include <immintrin.h>

#include <array>
#include <utility>

#include "matmul/matmul_tile.hpp"

namespace llmesh::kernels::detail {
namespace {

struct v256 {
  using reg = __m256;
  static constexpr int width = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load_x(const float* p) { return _mm256_loadu_ps(p); }
  template <dtype T>
  static reg load_w(const void* base, size_t i) {
    if constexpr (T == dtype::f32) {
      return _mm256_loadu_ps(static_cast<const float*>(base) + i);
    } else {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
      if constexpr (T == dtype::f16) return _mm256_cvtph_ps(h);
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
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

isa_kernels avx2_kernels() { return {gemm_block<v256, 3, 2>, dot_avx2, 2, 3}; }

}  // namespace llmesh::kernels::detail
