// AVX2 + F16C widening of 8-bit float KV rows (compiled with -mavx2 -mf16c; called only when
// active_isa() has them), sixteen at a time. e5m2 is float16's upper byte: shifted into a half
// and converted. An e4m3 byte's magnitude shifted left by 7 is a half (subnormal ones included)
// of its value times 2^-8: converted, then multiplied by 256 (exact). Every element's bits are
// dtype.hpp's f8_e4m3_to_f32 / f8_e5m2_to_f32 (tests/kernels/fp8_test.cpp).
#include <immintrin.h>

#include "attention/kv_widen.hpp"

namespace llmesh::kernels::detail {
namespace {

/// Sixteen 8-bit floats (zero-extended to 16-bit lanes) as halves: e5m2 is a half's upper
/// byte; an e4m3 byte shifted left by 7 (its sign to the half's) is a half of its value times
/// 2^-8, S.1111.111 made the half NaN 0x7f80 (float32 0x7ff00000, as f8_e4m3_to_f32's).
template <dtype T>
inline __m256i halves(__m256i w) {
  const __m256i up = _mm256_slli_epi16(w, 8);
  if constexpr (T == dtype::f8_e5m2) return up;
  const __m256i h = _mm256_and_si256(_mm256_srai_epi16(up, 1), _mm256_set1_epi16(static_cast<short>(0xbfff)));
  const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), _mm256_set1_epi16(0x7f));
  return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7e00)));
}

/// Eight halves as floats; e4m3's times 256 (exact; a NaN stays that NaN).
template <dtype T>
inline __m256 floats(__m128i h) {
  const __m256 f = _mm256_cvtph_ps(h);
  return T == dtype::f8_e4m3 ? _mm256_mul_ps(f, _mm256_set1_ps(256.0f)) : f;
}

template <dtype T>
void widen(const uint8_t* src, size_t stride, size_t n, size_t width, float* dst) {
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* row = src + i * stride;
    float* out = dst + i * width;
    size_t d = 0;
    for (; d + 16 <= width; d += 16) {
      const __m256i h = halves<T>(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d))));
      _mm256_storeu_ps(out + d, floats<T>(_mm256_castsi256_si128(h)));
      _mm256_storeu_ps(out + d + 8, floats<T>(_mm256_extracti128_si256(h, 1)));
    }
    // The tail through the portable loop: compiled without this file's flags, so no AVX2 copy
    // of dtype.hpp's inline conversions can stand in for theirs (matmul_isa.hpp's note).
    if (d < width) widen_f8_rows_portable(T, row + d, stride, 1, width - d, out + d);
  }
}

}  // namespace

void widen_f8_rows_avx2(dtype t, const uint8_t* src, size_t stride, size_t n, size_t width, float* dst) {
  if (t == dtype::f8_e4m3) {
    widen<dtype::f8_e4m3>(src, stride, n, width, dst);
  } else {
    widen<dtype::f8_e5m2>(src, stride, n, width, dst);
  }
}

}  // namespace llmesh::kernels::detail
