// AVX-512 (F, BW) widening of 8-bit float KV rows, thirty-two at a time: kv_widen_avx2.cpp's
// method in registers twice as wide (compiled with -mavx512f -mavx512bw; called only when
// active_isa() is avx512). The same bits (tests/kernels/fp8_test.cpp).
#include <immintrin.h>

#include "attention/kv_widen.hpp"

namespace llmesh::kernels::detail {
namespace {

template <dtype T>
inline __m512i halves(__m512i w) {
  const __m512i up = _mm512_slli_epi16(w, 8);
  if constexpr (T == dtype::f8_e5m2) return up;
  const __m512i h = _mm512_and_si512(_mm512_srai_epi16(up, 1), _mm512_set1_epi16(static_cast<short>(0xbfff)));
  const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(w, _mm512_set1_epi16(0x7f)), _mm512_set1_epi16(0x7f));
  return _mm512_or_si512(h, _mm512_maskz_mov_epi16(nan, _mm512_set1_epi16(0x7e00)));
}

template <dtype T>
inline __m512 floats(__m256i h) {
  const __m512 f = _mm512_cvtph_ps(h);
  return T == dtype::f8_e4m3 ? _mm512_mul_ps(f, _mm512_set1_ps(256.0f)) : f;
}

template <dtype T>
void widen(const uint8_t* src, size_t stride, size_t n, size_t width, float* dst) {
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* row = src + i * stride;
    float* out = dst + i * width;
    size_t d = 0;
    for (; d + 32 <= width; d += 32) {
      const __m512i h = halves<T>(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d))));
      _mm512_storeu_ps(out + d, floats<T>(_mm512_castsi512_si256(h)));
      _mm512_storeu_ps(out + d + 16, floats<T>(_mm512_extracti64x4_epi64(h, 1)));
    }
    if (d < width) widen_f8_rows_avx2(T, row + d, stride, 1, width - d, out + d);  // the tail: sixteen, then one by one
  }
}

}  // namespace

void widen_f8_rows_avx512(dtype t, const uint8_t* src, size_t stride, size_t n, size_t width, float* dst) {
  if (t == dtype::f8_e4m3) {
    widen<dtype::f8_e4m3>(src, stride, n, width, dst);
  } else {
    widen<dtype::f8_e5m2>(src, stride, n, width, dst);
  }
}

}  // namespace llmesh::kernels::detail
