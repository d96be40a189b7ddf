// Weight-only int8 quantization (dtype::q8, see dtype.hpp), and casts between the float
// kinds (vLLM's --dtype): made once at load time from the checkpoint's F32/F16/BF16 weights. Activations stay float32 and every output keeps the
// canonical reduction order of matmul.hpp over the dequantized weights, so a quantized model
// is as batch- and chunk-invariant as an unquantized one, on every instruction set.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/dtype.hpp"

namespace llmesh::kernels {

/// Byte offsets of a K-quant super-block's float16 fields (d, and dmin where it has one; the
/// layouts at dtype.hpp's k_quant_value): what a maker of random blocks (tests, benchmarks)
/// must keep finite. Empty for other types.
inline std::vector<size_t> k_quant_halves(dtype t) {
  switch (t) {
    case dtype::q2_k: return {80, 82};
    case dtype::q3_k: return {108};
    case dtype::q4_k: case dtype::q5_k: return {0, 2};
    case dtype::q6_k: return {208};
    case dtype::iq4_xs: return {0};
    default: return {};
  }
}

/// An MXFP4 block's E8M0 exponent byte e as the mxfp4 type's scale 2^(e − 128) (dtype.hpp),
/// exact for e ≤ mxfp4_max_exponent: 255 is E8M0's NaN, and above 252 the largest e2m1 values
/// overflow float32 — loaders refuse those.
inline constexpr uint8_t mxfp4_max_exponent = 252;
inline float mxfp4_scale(uint8_t e) { return std::ldexp(1.0f, static_cast<int>(e) - 128); }

/// Elements per q8 row of `cols` weights (whole blocks): the ldw a q8 matmul takes.
constexpr size_t q8_row_elements(size_t cols) { return (cols + q8_block - 1) / q8_block * q8_block; }

/// Quantizes `rows` rows of `cols` weights (row-major, src_type F32/F16/BF16, or a K-quant's
/// whole super-blocks, decoded first: `--quantization int8` on a Q4_K_M GGUF; or q4 rows of
/// q8_row_elements(cols), each block whose offset is a whole multiple z (−112 ... 127) of its factor
/// taken exactly as q − z with the factor as scale, any other decoded; or fp8 rows of
/// q8_row_elements(cols), decoded: `--quantization int8` on an FP8 checkpoint) into dst, which
/// holds dtype_bytes(q8, rows * q8_row_elements(cols)) bytes. Per block of 32: scale =
/// max|w| / 127 (float32), q = w / scale rounded to nearest (ties to even) and clamped to
/// [-127, 127]; a block whose scale is 0 (all zero, or max|w| below ~1.8e-43, where the
/// division underflows) is all zero. The padding of a row's last block is 0.
/// Deterministic: the same weights give the same bytes in every process.
/// Fails with invalid_request on a non-finite weight (the row is named, counted from
/// `first_row`: the caller's index of src's first row), or a q8 source.
[[nodiscard]] status quantize_q8(const void* src, dtype src_type, size_t rows, size_t cols, uint8_t* dst,
                                 size_t first_row = 0);

/// The largest |w| of `rows` rows of `cols` weights (row-major, F32/F16/BF16): an online FP8
/// tensor's scale is it / 448. With `through` F16 or BF16, each weight is first rounded to it
/// (vLLM quantizes the weights as --dtype holds them). Fails with invalid_request on a
/// non-finite weight (the row named, counted from `first_row`), one beyond float16's range
/// through F16, or another type.
[[nodiscard]] result<float> max_abs(const void* src, dtype src_type, size_t rows, size_t cols, size_t first_row = 0,
                                    dtype through = dtype::f32);

/// vLLM's online FP8 (`--quantization fp8` on an unquantized checkpoint): `rows` rows of `cols`
/// weights (row-major, F32/F16/BF16) into fp8 rows of q8_row_elements(cols) (dst holds
/// dtype_bytes(fp8, rows * q8_row_elements(cols)) bytes), every block with the tensor's
/// `scale` (max|w| / 448); code = e4m3(w · (1 / scale)) rounded to nearest even, saturating at
/// ±448 (vLLM's kernel multiplies by the reciprocal and clamps); scale 0 (an all-zero tensor)
/// gives zero codes, and a scale without a finite reciprocal zero codes for zeros and ±448 for
/// the rest. The padding of a row's last block is code 0. Fails with invalid_request on
/// a non-finite weight, a scale that is negative or not finite, or another type.
/// `through` as for max_abs.
[[nodiscard]] status quantize_fp8(const void* src, dtype src_type, size_t rows, size_t cols, float scale, uint8_t* dst,
                                  size_t first_row = 0, dtype through = dtype::f32);

/// Writes `rows` rows of `cols` weights (row-major, src_type F32/F16/BF16) to dst as dst_type
/// (F32/F16/BF16): widening is exact, narrowing rounds to nearest even (dtype.hpp's
/// f32_to_bf16 / f32_to_f16). Deterministic. Fails with invalid_request on a non-finite weight,
/// on a finite one that float16 cannot hold (|w| above 65504 would become infinite; the row is
/// named, counted from `first_row`), or on a q8 type.
[[nodiscard]] status convert_rows(const void* src, dtype src_type, size_t rows, size_t cols, void* dst, dtype dst_type,
                                  size_t first_row = 0);

/// One row of `cols` weights of type t (a q8, q4 or K-quant row starting on a block) as float32:
/// load_as_f32's values, a K-quant super-block's factors decoded once for its 256 elements.
void dequantize_row(const void* src, dtype t, size_t cols, float* out);

}  // namespace llmesh::kernels
