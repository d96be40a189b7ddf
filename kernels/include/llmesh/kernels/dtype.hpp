// Element types of weights and their exact conversions to and from float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace llmesh::kernels {

/// Storage type of a weight tensor. Activations are always float32.
/// q8 is weight-only int8 made at load time (`--quantization int8`), never read from a file:
/// each row is cut into blocks of q8_block consecutive elements, each stored as a float32
/// scale followed by q8_block int8 values (like llama.cpp's Q8_0, whose scale is float16);
/// element value = float(q) * scale, one IEEE multiply. Rows are padded to whole blocks.
enum class dtype : uint8_t { f32, f16, bf16, q8 };

inline constexpr size_t q8_block = 32;                      ///< elements per q8 block
inline constexpr size_t q8_block_bytes = 4 + q8_block;      ///< scale + values

/// Bytes per element of the plain types; for q8, the int8 value only (its block's scale is
/// extra): sizes and offsets of q8 data go through dtype_bytes.
constexpr size_t dtype_size(dtype t) { return t == dtype::f32 ? 4 : (t == dtype::q8 ? 1 : 2); }

/// Bytes from the start of a buffer (a row or block boundary) to element n: for q8, whole
/// blocks plus the scale and n % q8_block values of the block n falls in.
constexpr size_t dtype_offset(dtype t, size_t n) {
  if (t != dtype::q8) return n * dtype_size(t);
  return (n / q8_block) * q8_block_bytes + (n % q8_block == 0 ? 0 : 4 + n % q8_block);
}

/// Bytes that hold n elements (for q8, n rounded up to whole blocks).
constexpr size_t dtype_bytes(dtype t, size_t n) {
  return t == dtype::q8 ? (n + q8_block - 1) / q8_block * q8_block_bytes : n * dtype_size(t);
}

/// Safetensors spelling ("F32", "F16", "BF16"); "Q8" for q8, which no file holds.
constexpr std::string_view dtype_name(dtype t) {
  return t == dtype::f32 ? "F32" : (t == dtype::f16 ? "F16" : (t == dtype::bf16 ? "BF16" : "Q8"));
}

/// bfloat16 bits -> float32 (exact).
inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// float32 -> bfloat16 bits, round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

/// IEEE half bits -> float32 (exact, subnormals included).
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// float32 -> IEEE half bits, round to nearest even, overflow to infinity.
inline uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 + (113 - e)
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

/// Converts element i of a weight buffer of type t to float32.
inline float load_as_f32(const void* data, dtype t, size_t i) {
  switch (t) {
    case dtype::f32: return static_cast<const float*>(data)[i];
    case dtype::f16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case dtype::bf16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case dtype::q8: {
      const auto* block = static_cast<const uint8_t*>(data) + (i / q8_block) * q8_block_bytes;
      float scale;
      std::memcpy(&scale, block, 4);
      return static_cast<float>(static_cast<int8_t>(block[4 + i % q8_block])) * scale;
    }
  }
  return 0.0f;
}

}  // namespace llmesh::kernels
