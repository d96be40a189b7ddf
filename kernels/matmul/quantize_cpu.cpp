// quantize_q8: float32 weights -> int8 blocks with a float32 scale; convert_rows: casts between
// F32, F16 and BF16 (see quantize.hpp).
#include "llmesh/kernels/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
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

/// q4 rows -> q8 rows: a block whose offset is a whole multiple z (−112 ... 127) of its factor
/// (AWQ, GPTQ, compressed-tensors, Q4_0: m = f·z; a Q4_1 block whose min is one) becomes q − z
/// with scale f, exactly (the same values); any other block (most Q4_1 mins) goes through the
/// rule over its decoded values.
status quantize_q4_rows(const uint8_t* src, size_t rows, size_t cols, uint8_t* dst, size_t first_row) {
  const size_t per_row = q8_row_elements(cols) / q8_block;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t b = 0; b < per_row; ++b) {
      const uint8_t* in = src + (r * per_row + b) * q4_block_bytes;
      uint8_t* out = dst + (r * per_row + b) * q8_block_bytes;
      float f, m;
      std::memcpy(&f, in, 4);
      std::memcpy(&m, in + 4, 4);
      const float z = f != 0.0f && std::isfinite(f) ? std::nearbyint(m / f) : 1000.0f;
      const size_t n = std::min(q8_block, cols - b * q8_block);  // the block's weights (a row's last may be short)
      if (z >= -112.0f && z <= 127.0f && std::fma(f, z, -m) == 0.0f) {  // q − z within ±127
        std::memcpy(out, &f, 4);
        for (size_t e = 0; e < q8_block; ++e) {
          const int q = (e < 16 ? in[8 + e] & 0xF : in[8 + e - 16] >> 4) - static_cast<int>(z);
          out[4 + e] = static_cast<uint8_t>(static_cast<int8_t>(e < n ? q : 0));
        }
        continue;
      }
      LLMESH_TRY(quantize_rows(1, n, out, first_row + r, [in](size_t i) { return q4_value(in, i); }));
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
    case dtype::q2_k: case dtype::q3_k: case dtype::q4_k: case dtype::q5_k: case dtype::q6_k: case dtype::iq4_xs: {
      const auto* s = static_cast<const uint8_t*>(src);
      std::vector<float> row(cols);
      for (size_t r = 0; r < rows; ++r) {
        dequantize_row(s + dtype_offset(src_type, r * cols), src_type, cols, row.data());
        LLMESH_TRY(quantize_rows(1, cols, dst + r * dtype_bytes(dtype::q8, q8_row_elements(cols)), first_row + r,
                                 [&row](size_t i) { return row[i]; }));
      }
      return ok_status();
    }
    case dtype::q4: return quantize_q4_rows(static_cast<const uint8_t*>(src), rows, cols, dst, first_row);
    case dtype::fp8: case dtype::mxfp4: {  // rows of whole blocks of 32, decoded (fp8_value, mxfp4_value), then quantized
      const auto* s = static_cast<const uint8_t*>(src);
      const size_t row_bytes = dtype_bytes(src_type, q8_row_elements(cols));
      return quantize_rows(rows, cols, dst, first_row, [s, cols, row_bytes, src_type](size_t i) {
        return load_as_f32(s + (i / cols) * row_bytes, src_type, i % cols);
      });
    }
    case dtype::q8: break;
    case dtype::f8_e4m3: case dtype::f8_e5m2:
      return make_error(errc::invalid_request, "quantize_q8: 8-bit floats are a KV cache type, not a weight type");
  }
  return make_error(errc::invalid_request, "quantize_q8: the weights are int8 already");
}

namespace {

status plain_source(dtype t, const char* what) {
  if (t == dtype::f32 || t == dtype::f16 || t == dtype::bf16) return ok_status();
  return make_error(errc::invalid_request, std::string(what) + ": the weights must be F32, F16 or BF16, not " + std::string(dtype_name(t)));
}

error non_finite(size_t row) {
  return make_error(errc::invalid_request, "weight row " + std::to_string(row) + " holds a non-finite value; it cannot be quantized");
}

/// w rounded to `through` (F16 / BF16; else as is); nullopt beyond float16's range.
std::optional<float> rounded(float w, dtype through) {
  if (through == dtype::bf16) return bf16_to_f32(f32_to_bf16(w));
  if (through != dtype::f16) return w;
  if (std::fabs(w) > 65504.0f) return std::nullopt;
  return f16_to_f32(f32_to_f16(w));
}

error beyond_f16(size_t row, float w) {
  return make_error(errc::invalid_request, "weight row " + std::to_string(row) + " holds " + std::to_string(w) +
                                               ", beyond float16's range (65504)");
}

}  // namespace

result<float> max_abs(const void* src, dtype src_type, size_t rows, size_t cols, size_t first_row, dtype through) {
  LLMESH_TRY(plain_source(src_type, "max_abs"));
  float m = 0.0f;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      const float raw = load_as_f32(src, src_type, r * cols + c);
      if (!std::isfinite(raw)) return non_finite(first_row + r);
      const auto w = rounded(raw, through);
      if (!w) return beyond_f16(first_row + r, raw);
      if (!std::isfinite(*w)) return non_finite(first_row + r);  // a float32 beyond bfloat16's range
      m = std::max(m, std::fabs(*w));
    }
  }
  return m;
}

status quantize_fp8(const void* src, dtype src_type, size_t rows, size_t cols, float scale, uint8_t* dst, size_t first_row,
                    dtype through) {
  LLMESH_TRY(plain_source(src_type, "quantize_fp8"));
  if (!std::isfinite(scale) || scale < 0.0f) {
    return make_error(errc::invalid_request, "quantize_fp8: the scale " + std::to_string(scale) + " is not a finite non-negative number");
  }
  // A scale below ~2^-126 has no finite reciprocal: zeros stay zero, anything else saturates
  // (as vLLM's clamp does with its NaN or infinite products).
  const float inverse = scale == 0.0f ? 0.0f : 1.0f / scale;
  const bool overflow = !std::isfinite(inverse);
  const size_t per_row = q8_row_elements(cols) / q8_block;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t b = 0; b < per_row; ++b) {
      uint8_t* block = dst + (r * per_row + b) * q8_block_bytes;
      std::memcpy(block, &scale, 4);
      for (size_t i = 0; i < q8_block; ++i) {
        const size_t c = b * q8_block + i;
        if (c >= cols) {
          block[4 + i] = 0;
          continue;
        }
        const float raw = load_as_f32(src, src_type, r * cols + c);
        if (!std::isfinite(raw)) return non_finite(first_row + r);
        const auto rw = rounded(raw, through);
        if (!rw) return beyond_f16(first_row + r, raw);
        const float w = *rw;
        block[4 + i] = overflow ? (w == 0.0f ? uint8_t{0} : static_cast<uint8_t>(std::signbit(w) ? 0xfe : 0x7e)) : f32_to_f8_e4m3(w * inverse);
      }
    }
  }
  return ok_status();
}

status convert_rows(const void* src, dtype src_type, size_t rows, size_t cols, void* dst, dtype dst_type,
                    size_t first_row) {
  if (is_quantized(src_type) || is_quantized(dst_type) || is_f8(src_type) || is_f8(dst_type)) {
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
    case dtype::q8: case dtype::q4: case dtype::q2_k: case dtype::q3_k: case dtype::q4_k: case dtype::q5_k: case dtype::q6_k:
    case dtype::iq4_xs: case dtype::f8_e4m3: case dtype::f8_e5m2: case dtype::fp8: case dtype::mxfp4: break;
  }
  return ok_status();
}

void dequantize_row(const void* src, dtype t, size_t cols, float* out) {
  if (!is_k_quant(t)) {
    for (size_t i = 0; i < cols; ++i) out[i] = load_as_f32(src, t, i);
    return;
  }
  // Each group's factors once, then k_quant_value's arithmetic per element.
  const auto* row = static_cast<const uint8_t*>(src);
  const size_t group = k_quant_group(t);
  for (size_t b = 0; b < cols / k_block; ++b) {
    const uint8_t* blk = row + b * dtype_block_bytes(t);
    for (size_t g = 0; g < k_block / group; ++g) {
      float f, m;
      k_quant_factor(blk, t, g, f, m);
      for (size_t e = g * group; e < (g + 1) * group; ++e) {
        const float q = static_cast<float>(k_quant_q(blk, t, e));
        out[b * k_block + e] = k_quant_signed(t) ? f * q : f * q - m;
      }
    }
  }
}

}  // namespace llmesh::kernels
