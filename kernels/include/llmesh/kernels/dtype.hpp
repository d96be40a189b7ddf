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
/// q4_k, q5_k and q6_k are llama.cpp's Q4_K, Q5_K and Q6_K super-blocks of 256 elements, read
/// in place from a GGUF file (layouts at k_quant_value below); a row is whole super-blocks.
/// Every element decodes to one float32 exactly as ggml's dequantize_row_q4_K / _q5_K / _q6_K
/// computes it,
/// and the kernels multiply those floats in the canonical order, so block types keep every
/// invariance of the plain ones.
enum class dtype : uint8_t { f32, f16, bf16, q8, q4_k, q5_k, q6_k };

inline constexpr size_t q8_block = 32;                      ///< elements per q8 block
inline constexpr size_t q8_block_bytes = 4 + q8_block;      ///< scale + values
inline constexpr size_t k_block = 256;                      ///< elements per K-quant super-block
inline constexpr size_t q4_k_block_bytes = 144;             ///< d, dmin (f16), 12 scale bytes, 128 nibble bytes
inline constexpr size_t q5_k_block_bytes = 176;             ///< Q4_K's, with 32 bytes of fifth bits before the nibbles
inline constexpr size_t q6_k_block_bytes = 210;             ///< 128 low-nibble, 64 high-bit, 16 scale bytes, d

/// Elements per block: 1 for the plain types.
constexpr size_t dtype_block(dtype t) {
  return t == dtype::q8 ? q8_block : (t == dtype::q4_k || t == dtype::q5_k || t == dtype::q6_k ? k_block : 1);
}

/// Bytes per block (per element for the plain types).
constexpr size_t dtype_block_bytes(dtype t) {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f16: case dtype::bf16: return 2;
    case dtype::q8: return q8_block_bytes;
    case dtype::q4_k: return q4_k_block_bytes;
    case dtype::q5_k: return q5_k_block_bytes;
    case dtype::q6_k: return q6_k_block_bytes;
  }
  return 0;
}

/// Whether t is a block type (q8, q4_k, q5_k, q6_k): weights only, CPU only.
constexpr bool is_quantized(dtype t) { return dtype_block(t) > 1; }

/// Whether t is one of the K-quants (q4_k, q5_k, q6_k): 256-element super-blocks.
constexpr bool is_k_quant(dtype t) { return dtype_block(t) == k_block; }

/// Bytes per element of the plain types; for q8, the int8 value only (its block's scale is
/// extra); 1 for the K-quants (a bound: they hold fewer): sizes and offsets of block data go
/// through dtype_bytes.
constexpr size_t dtype_size(dtype t) { return t == dtype::f32 ? 4 : (is_quantized(t) ? 1 : 2); }

/// Bytes from the start of a buffer (a row or block boundary) to element n: for q8, whole
/// blocks plus the scale and n % q8_block values of the block n falls in; for the K-quants,
/// the start of the super-block n falls in (n is a multiple of k_block wherever an offset is
/// taken: rows and row-parallel slices start on one).
constexpr size_t dtype_offset(dtype t, size_t n) {
  if (t == dtype::q8) return (n / q8_block) * q8_block_bytes + (n % q8_block == 0 ? 0 : 4 + n % q8_block);
  if (is_quantized(t)) return (n / k_block) * dtype_block_bytes(t);
  return n * dtype_size(t);
}

/// Bytes that hold n elements (for block types, n rounded up to whole blocks).
constexpr size_t dtype_bytes(dtype t, size_t n) {
  const size_t b = dtype_block(t);
  return (n + b - 1) / b * dtype_block_bytes(t);
}

/// Safetensors spelling ("F32", "F16", "BF16"); "Q8" for q8, which no file holds; ggml's
/// "Q4_K", "Q5_K" and "Q6_K".
constexpr std::string_view dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::q8: return "Q8";
    case dtype::q4_k: return "Q4_K";
    case dtype::q5_k: return "Q5_K";
    case dtype::q6_k: return "Q6_K";
  }
  return "?";
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

/// The 6-bit scale and min of sub-block j (of 32 elements) of a Q4_K or Q5_K super-block's 12
/// scale bytes (ggml's get_scale_min_k4).
inline void q4_k_scale_min(size_t j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/// Element e (< 256) of one K-quant super-block, as ggml decodes it.
/// Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of
/// 32, then 128 bytes: each 64 elements take 32 bytes, the first 32 elements their low
/// nibbles, the next 32 their high nibbles. Value = d·sc·q − dmin·m: (d·sc)·q is exact in
/// float32 (11 + 6 + 4 significant bits), so the one rounding is the subtraction's.
/// Q5_K (176 bytes): Q4_K's d, dmin and scales, then qh[32], then Q4_K's 128 nibble bytes;
/// element e's fifth bit (value 16) is bit 2·(e / 64) + (e % 64 ≥ 32) of qh[e % 32]; value as
/// Q4_K's with q < 32 (11 + 6 + 5 bits: (d·sc)·q still exact).
/// Q6_K (210 bytes): ql[128], qh[64], int8 scales[16] (one per 16 elements: scale index e/16),
/// f16 d. In each half of 128 elements, element 32·s + l (s < 4, l < 32) takes the low (s < 2)
/// or high (s ≥ 2) nibble of ql[64·half + 32·(s % 2) + l] and bits 2s, 2s+1 of qh[32·half + l]
/// as its bits 4-5; value = (d·scale)·(q − 32), d·scale exact, the product rounded once.
inline float k_quant_value(const uint8_t* b, dtype t, size_t e) {
  if (t == dtype::q4_k || t == dtype::q5_k) {
    uint8_t sc, m;
    q4_k_scale_min(e / 32, b + 4, sc, m);
    uint16_t d, dmin;
    std::memcpy(&d, b, 2);
    std::memcpy(&dmin, b + 2, 2);
    const bool five = t == dtype::q5_k;
    const uint8_t byte = b[(five ? 48 : 16) + (e / 64) * 32 + e % 32];
    int q = e % 64 < 32 ? (byte & 0xF) : (byte >> 4);
    if (five) q |= ((b[16 + e % 32] >> (2 * (e / 64) + (e % 64 < 32 ? 0 : 1))) & 1) << 4;
    return f16_to_f32(d) * static_cast<float>(sc) * static_cast<float>(q) - f16_to_f32(dmin) * static_cast<float>(m);
  }
  const size_t half = e / 128, s = (e % 128) / 32, l = e % 32;
  const uint8_t lo = b[64 * half + 32 * (s % 2) + l];
  const int q = ((s < 2 ? lo & 0xF : lo >> 4) | (((b[128 + 32 * half + l] >> (2 * s)) & 3) << 4)) - 32;
  uint16_t d;
  std::memcpy(&d, b + 208, 2);
  return f16_to_f32(d) * static_cast<float>(static_cast<int8_t>(b[192 + e / 16])) * static_cast<float>(q);
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
    case dtype::q4_k: case dtype::q5_k: case dtype::q6_k:
      return k_quant_value(static_cast<const uint8_t*>(data) + (i / k_block) * dtype_block_bytes(t), t, i % k_block);
  }
  return 0.0f;
}

}  // namespace llmesh::kernels
