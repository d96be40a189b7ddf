// Widening a KV cache's 8-bit floats into float32 rows, per instruction set: the portable loop
// (dtype.hpp's conversions, one element at a time), the AVX2 + F16C one (sixteen at a time
// through the half-precision converter) and the AVX-512 one (thirty-two), which give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "llmesh/kernels/dtype.hpp"

namespace llmesh::kernels::detail {

/// n rows of `width` elements of t (f8_e4m3 or f8_e5m2), `stride` bytes apart, widened into n
/// contiguous float rows at dst.
void widen_f8_rows_portable(dtype t, const uint8_t* src, size_t stride, size_t n, size_t width, float* dst);
void widen_f8_rows_avx2(dtype t, const uint8_t* src, size_t stride, size_t n, size_t width, float* dst);
void widen_f8_rows_avx512(dtype t, const uint8_t* src, size_t stride, size_t n, size_t width, float* dst);

}  // namespace llmesh::kernels::detail
