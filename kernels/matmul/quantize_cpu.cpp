// quantize_q8: float32 weights -> int8 blocks with a float32 scale; convert_rows: casts between
// F32, F16 and BF16 (see quantize.hpp).
#include "llmesh/kernels/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace llmesh::kernels {
namespace {

template <class Load>
status quantize_rows(size_t rows, size_t cols, uint8_t* dst, size_t first_row, Load load) {
  const size_t per_row = q8_row_elements(cols) / q8_block;
  float w[q8_block];
  for (size_t r = 0; r < rows; ++r) {
    for (size_t b = 0; b < per_row; ++b) {
      const size_t c0 = b * q8_block, n = std::min(q8_block, cols - c0);
      float amax = 0.0f;
      bool finite = true;
      for (size_t i = 0; i < n; ++i) {
        w[i] = load(r * cols + c0 + i);
        finite = finite && std::isfinite(w[i]);  // std::max would skip a NaN
        amax = std::max(amax, std::fabs(w[i]));
      }
      if (!finite) {
        return make_error(errc::invalid_request, "weight row " + std::to_string(first_row + r) + " holds a non-finite value; it cannot be quantized");
      }
      for (size_t i = n; i < q8_block; ++i) w[i] = 0.0f;
      uint8_t* block = dst + (r * per_row + b) * q8_block_bytes;
      const float scale = amax / 127.0f;
      std::memcpy(block, &scale, 4);
      for (size_t i = 0; i < q8_block; ++i) {
        float q = scale == 0.0f ? 0.0f : std::nearbyint(w[i] / scale);
        q = std::clamp(q, -127.0f, 127.0f);
        block[4 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
      }
    }
  }
  return ok_status();
}

}  // namespace

status quantize_q8(const void* src, dtype src_type, size_t rows, size_t cols, uint8_t* dst, size_t first_row) {
  switch (src_type) {
    case dtype::f32: {
      const auto* s = static_cast<const float*>(src);
      return quantize_rows(rows, cols, dst, first_row, [s](size_t i) { return s[i]; });
    }
    case dtype::f16: {
      const auto* s = static_cast<const uint16_t*>(src);
      return quantize_rows(rows, cols, dst, first_row, [s](size_t i) { return f16_to_f32(s[i]); });
    }
    case dtype::bf16: {
      const auto* s = static_cast<const uint16_t*>(src);
      return quantize_rows(rows, cols, dst, first_row, [s](size_t i) { return bf16_to_f32(s[i]); });
    }
    case dtype::q4_k: case dtype::q5_k: case dtype::q6_k: {
      const auto* s = static_cast<const uint8_t*>(src);
      std::vector<float> row(cols);
      for (size_t r = 0; r < rows; ++r) {
        dequantize_row(s + dtype_offset(src_type, r * cols), src_type, cols, row.data());
        LLMESH_TRY(quantize_rows(1, cols, dst + r * dtype_bytes(dtype::q8, q8_row_elements(cols)), first_row + r,
                                 [&row](size_t i) { return row[i]; }));
      }
      return ok_status();
    }
    case dtype::q8: break;
  }
  return make_error(errc::invalid_request, "quantize_q8: the weights are int8 already");
}

status convert_rows(const void* src, dtype src_type, size_t rows, size_t cols, void* dst, dtype dst_type,
                    size_t first_row) {
  if (is_quantized(src_type) || is_quantized(dst_type)) {
    return make_error(errc::invalid_request, "convert_rows: quantized weights are not converted");
  }
  const size_t n = rows * cols;
  auto each = [&](auto store) -> status {
    for (size_t i = 0; i < n; ++i) {
      const float w = load_as_f32(src, src_type, i);
      if (!std::isfinite(w)) {
        return make_error(errc::invalid_request, "weight row " + std::to_string(first_row + i / cols) + " holds a non-finite value");
      }
      LLMESH_TRY(store(i, w));
    }
    return ok_status();
  };
  switch (dst_type) {
    case dtype::f32:
      return each([d = static_cast<float*>(dst)](size_t i, float w) { d[i] = w; return ok_status(); });
    case dtype::bf16:
      return each([d = static_cast<uint16_t*>(dst)](size_t i, float w) { d[i] = f32_to_bf16(w); return ok_status(); });
    case dtype::f16:
      return each([&, d = static_cast<uint16_t*>(dst)](size_t i, float w) -> status {
        if (std::fabs(w) > 65504.0f) {  // float16's largest; above it rounds to infinity
          return make_error(errc::invalid_request, "weight row " + std::to_string(first_row + i / cols) + " holds " +
                                                       std::to_string(w) + ", beyond float16's range (65504)");
        }
        d[i] = f32_to_f16(w);
        return ok_status();
      });
    case dtype::q8: case dtype::q4_k: case dtype::q5_k: case dtype::q6_k: break;
  }
  return ok_status();
}

void dequantize_row(const void* src, dtype t, size_t cols, float* out) {
  if (!is_k_quant(t)) {
    for (size_t i = 0; i < cols; ++i) out[i] = load_as_f32(src, t, i);
    return;
  }
  const auto* row = static_cast<const uint8_t*>(src);
  for (size_t b = 0; b < cols / k_block; ++b) {
    const uint8_t* blk = row + b * dtype_block_bytes(t);
    if (t == dtype::q6_k) {  // the factor d·scale per 16; k_quant_value's arithmetic
      uint16_t h;
      std::memcpy(&h, blk + 208, 2);
      const float d = f16_to_f32(h);
      for (size_t e = 0; e < k_block; ++e) {
        const size_t half = e / 128, s = (e % 128) / 32, l = e % 32;
        const uint8_t lo = blk[64 * half + 32 * (s % 2) + l];
        const int q = ((s < 2 ? lo & 0xF : lo >> 4) | (((blk[128 + 32 * half + l] >> (2 * s)) & 3) << 4)) - 32;
        out[b * k_block + e] = d * static_cast<float>(static_cast<int8_t>(blk[192 + e / 16])) * static_cast<float>(q);
      }
      continue;
    }
    // Q4_K / Q5_K: d·sc and dmin·m once per sub-block of 32; value (d·sc)·q − dmin·m, as
    // k_quant_value computes it.
    uint16_t h;
    std::memcpy(&h, blk, 2);
    const float d = f16_to_f32(h);
    std::memcpy(&h, blk + 2, 2);
    const float dmin = f16_to_f32(h);
    const bool five = t == dtype::q5_k;
    for (size_t j = 0; j < 8; ++j) {
      uint8_t sc, m;
      q4_k_scale_min(j, blk + 4, sc, m);
      const float f = d * static_cast<float>(sc), mm = dmin * static_cast<float>(m);
      for (size_t e = 32 * j; e < 32 * j + 32; ++e) {
        const uint8_t byte = blk[(five ? 48 : 16) + (e / 64) * 32 + e % 32];
        int q = e % 64 < 32 ? (byte & 0xF) : (byte >> 4);
        if (five) q |= ((blk[16 + e % 32] >> (2 * (e / 64) + (e % 64 < 32 ? 0 : 1))) & 1) << 4;
        out[b * k_block + e] = f * static_cast<float>(q) - mm;
      }
    }
  }
}

}  // namespace llmesh::kernels
