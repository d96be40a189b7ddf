// Element types of weights and their exact conversions to and from float32.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>

namespace llmesh::kernels {

/// Storage type of a weight tensor. Activations are always float32.
/// q8 is weight-only int8 made at load time (`--quantization int8`), never read from a file:
/// each row is cut into blocks of q8_block consecutive elements, each stored as a float32
/// scale followed by q8_block int8 values (like llama.cpp's Q8_0, whose scale is float16);
/// element value = float(q) * scale, one IEEE multiply. Rows are padded to whole blocks.
/// q2_k, q3_k, q4_k, q5_k and q6_k are llama.cpp's K-quants and iq4_xs its IQ4_XS, super-blocks
/// of 256 elements read in place from a GGUF file (layouts at k_quant_value below; "K-quant"
/// below includes iq4_xs); a row is whole super-blocks. Every element decodes to one float32
/// exactly as ggml's dequantize_row_q2_K ... _q6_K / _iq4_xs computes it, and the kernels
/// multiply those floats in the canonical order, so block types keep every invariance of the
/// plain ones. q4 holds 4-bit checkpoints (AWQ, GPTQ, compressed-tensors W4A16, GGUF Q4_0 and
/// Q4_1) exactly: blocks of q4_block elements, each a float32 factor f, a float32 offset m and
/// 16 bytes of nibbles (element e < 16 the low nibble of byte e, element e ≥ 16 the high nibble
/// of byte e − 16, as ggml's Q4_0); element value = q·f − m with one rounding (a fused
/// multiply-subtract). A checkpoint's zero points are stored only where m = f·z is exact, so
/// the value is f·(q − z) rounded once: the value an int8 block of q − z with scale f gives (but
/// +0 where that gives −0: a matmul, whose sums start at +0, cannot tell); GGUF Q4_1's m is
/// −min (ggml's q·d + min). Rows are padded to whole blocks. f8_e4m3 and f8_e5m2 are the OCP
/// 8-bit floats (e4m3fn: bias 7, no infinities, NaN S.1111.111, largest 448; e5m2: bias 15,
/// IEEE-like, largest 57344), held by KV caches only (`--kv-cache-dtype fp8`), never weights.
/// fp8 holds FP8 checkpoints' weights (quant_method fp8, compressed-tensors float-quantized;
/// `--quantization fp8`): q8's layout — blocks of q8_block, each a float32 scale followed by
/// q8_block e4m3fn bytes — with element value = e4m3(q) · scale, one IEEE multiply (exact where
/// the scale has at most 20 significant bits: bfloat16 and float16 scales). Never the NaN code
/// (the loader refuses one). Rows are padded to whole blocks (code 0).
/// mxfp4 holds OCP MXFP4 weights (GPT-OSS's experts: 4-bit e2m1 values, ±{0, 0.5, 1, 1.5, 2,
/// 3, 4, 6}, sharing an 8-bit power-of-two exponent per 32): blocks of mxfp4_block elements, each
/// a float32 scale s = 2^(e − 128) followed by q4's 16 bytes of nibbles (same order); element
/// value = mxfp4_values[q] · s, one exact multiply (mxfp4_values are the e2m1 values doubled,
/// as ggml's kvalues_mxfp4) — the checkpoint's value 2^(e − 127) · e2m1 exactly (e = 255, the
/// format's NaN, and e > 252, whose largest values float32 cannot hold, are refused at load).
/// Rows are padded to whole blocks.
/// (Types are appended: the values are stable.)
enum class dtype : uint8_t { f32, f16, bf16, q8, q4_k, q5_k, q6_k, q2_k, q3_k, iq4_xs, q4, f8_e4m3, f8_e5m2, fp8, mxfp4 };

inline constexpr size_t q8_block = 32;                      ///< elements per q8 block
inline constexpr size_t q8_block_bytes = 4 + q8_block;      ///< scale + values
inline constexpr size_t q4_block = 32;                      ///< elements per q4 block
inline constexpr size_t q4_block_bytes = 8 + q4_block / 2;  ///< factor, offset, nibbles
inline constexpr size_t k_block = 256;                      ///< elements per K-quant super-block
inline constexpr size_t q4_k_block_bytes = 144;             ///< d, dmin (f16), 12 scale bytes, 128 nibble bytes
inline constexpr size_t q5_k_block_bytes = 176;             ///< Q4_K's, with 32 bytes of fifth bits before the nibbles
inline constexpr size_t q6_k_block_bytes = 210;             ///< 128 low-nibble, 64 high-bit, 16 scale bytes, d
inline constexpr size_t q2_k_block_bytes = 84;              ///< 16 scale/min bytes, 64 quant bytes, d, dmin
inline constexpr size_t q3_k_block_bytes = 110;             ///< 32 high-bit, 64 quant bytes, 12 scale bytes, d
inline constexpr size_t iq4_xs_block_bytes = 136;           ///< d, 2 + 4 scale bytes, 128 index nibble bytes
inline constexpr size_t mxfp4_block = 32;                   ///< elements per mxfp4 block
inline constexpr size_t mxfp4_block_bytes = 4 + mxfp4_block / 2;  ///< scale, nibbles

/// The e2m1 values of MXFP4's 4-bit codes, doubled (so integers; −0 as 0): the mxfp4 type's quants.
inline constexpr int8_t mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/// ggml's kvalues_iq4nl: the 16 values an IQ4_NL / IQ4_XS 4-bit index stands for.
inline constexpr int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/// Elements per block: 1 for the plain types.
constexpr size_t dtype_block(dtype t) {
  switch (t) {
    case dtype::f32: case dtype::f16: case dtype::bf16: case dtype::f8_e4m3: case dtype::f8_e5m2: return 1;
    case dtype::q8: case dtype::fp8: return q8_block;
    case dtype::q4: return q4_block;
    case dtype::mxfp4: return mxfp4_block;
    case dtype::q2_k: case dtype::q3_k: case dtype::q4_k: case dtype::q5_k: case dtype::q6_k: case dtype::iq4_xs:
      return k_block;
  }
  return 1;
}

/// Bytes per block (per element for the plain types).
constexpr size_t dtype_block_bytes(dtype t) {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f16: case dtype::bf16: return 2;
    case dtype::f8_e4m3: case dtype::f8_e5m2: return 1;
    case dtype::q8: case dtype::fp8: return q8_block_bytes;
    case dtype::q4: return q4_block_bytes;
    case dtype::mxfp4: return mxfp4_block_bytes;
    case dtype::q4_k: return q4_k_block_bytes;
    case dtype::q5_k: return q5_k_block_bytes;
    case dtype::q6_k: return q6_k_block_bytes;
    case dtype::q2_k: return q2_k_block_bytes;
    case dtype::q3_k: return q3_k_block_bytes;
    case dtype::iq4_xs: return iq4_xs_block_bytes;
  }
  return 0;
}

/// Whether t is a block type (q8, fp8, q4 or a K-quant): weights only, CPU only.
constexpr bool is_quantized(dtype t) { return dtype_block(t) > 1; }

/// Whether t is one of the K-quants (q2_k ... q6_k, iq4_xs): 256-element super-blocks.
constexpr bool is_k_quant(dtype t) { return dtype_block(t) == k_block; }

/// Elements per K-quant group sharing one factor (and min): 32 for q4_k, q5_k and iq4_xs, 16
/// for the others.
constexpr size_t k_quant_group(dtype t) { return t == dtype::q4_k || t == dtype::q5_k || t == dtype::iq4_xs ? 32 : 16; }

/// Whether a K-quant's quants are signed and it has no min (q3_k, q6_k, iq4_xs: value = f·q);
/// the others' are unsigned with a min (value = f·q − m).
constexpr bool k_quant_signed(dtype t) { return t == dtype::q3_k || t == dtype::q6_k || t == dtype::iq4_xs; }

/// Whether t is one of the 8-bit floats (KV caches only).
constexpr bool is_f8(dtype t) { return t == dtype::f8_e4m3 || t == dtype::f8_e5m2; }

/// Bytes per element of the plain types; for q8, the int8 value only (its block's scale is
/// extra); 1 for q4 and the K-quants (a bound: they hold fewer): sizes and offsets of block data
/// go through dtype_bytes.
constexpr size_t dtype_size(dtype t) { return t == dtype::f32 ? 4 : (is_quantized(t) || is_f8(t) ? 1 : 2); }

/// Bytes from the start of a buffer (a row or block boundary) to element n: for q8 and fp8, whole
/// blocks plus the scale and n % q8_block values of the block n falls in; for q4 and the
/// K-quants, the start of the block n falls in (n is a multiple of the block wherever an
/// offset is taken: rows and row-parallel slices start on one).
constexpr size_t dtype_offset(dtype t, size_t n) {
  if (t == dtype::q8 || t == dtype::fp8) return (n / q8_block) * q8_block_bytes + (n % q8_block == 0 ? 0 : 4 + n % q8_block);
  if (is_quantized(t)) return (n / dtype_block(t)) * dtype_block_bytes(t);
  return n * dtype_size(t);
}

/// Bytes that hold n elements (for block types, n rounded up to whole blocks).
constexpr size_t dtype_bytes(dtype t, size_t n) {
  const size_t b = dtype_block(t);
  return (n + b - 1) / b * dtype_block_bytes(t);
}

/// Safetensors spelling ("F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"); "Q8", "Q4" and "FP8" for
/// q8, q4 and fp8, which no file holds; ggml's "Q2_K" ... "Q6_K", "IQ4_XS".
constexpr std::string_view dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::q8: return "Q8";
    case dtype::q4: return "Q4";
    case dtype::q4_k: return "Q4_K";
    case dtype::q5_k: return "Q5_K";
    case dtype::q6_k: return "Q6_K";
    case dtype::q2_k: return "Q2_K";
    case dtype::q3_k: return "Q3_K";
    case dtype::iq4_xs: return "IQ4_XS";
    case dtype::f8_e4m3: return "F8_E4M3";
    case dtype::f8_e5m2: return "F8_E5M2";
    case dtype::fp8: return "FP8";
    case dtype::mxfp4: return "MXFP4";
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

/// OCP e4m3fn bits -> float32 (exact): bias 7, subnormals m·2^-9, S.1111.111 NaN, no infinity.
/// Branch-free (selects only), so the kernels' loops over a row vectorise it.
inline float f8_e4m3_to_f32(uint8_t byte) {
  const uint32_t b = byte, sign = (b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
  const uint32_t normal = sign | ((e + 120u) << 23) | (m << 20);
  uint32_t sub;  // m·2^-9: exact, never a float32 subnormal
  const float scaled = static_cast<float>(m) * 0x1p-9f;
  std::memcpy(&sub, &scaled, 4);
  uint32_t bits = e == 0 ? (sign | sub) : normal;
  bits = (b & 0x7fu) == 0x7fu ? (sign | 0x7ff00000u) : bits;  // a quiet NaN (the kernels' half 0x7f80 widened)
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

namespace detail {
/// float32 -> the bits of an 8-bit float with M mantissa bits, exponent bias Bias and largest
/// finite code MaxCode: round to nearest even, saturating at the largest finite value (CUDA's
/// __NV_SATFINITE, vLLM's KV cache conversion; infinity too); NaN stays NaN (S.1111.111).
template <unsigned M, unsigned Bias, uint8_t MaxCode>
inline uint8_t f32_to_f8_bits(float f) {
  constexpr uint32_t shift = 23 - M;
  constexpr uint32_t largest = ((uint32_t{MaxCode} >> M) - Bias + 127u) << 23 | (uint32_t{MaxCode} & ((1u << M) - 1u)) << shift;
  constexpr uint32_t smallest_normal = (1u - Bias + 127u) << 23;      // 2^(1-Bias)
  constexpr float subnormal_steps = static_cast<float>(1u << (Bias - 1 + M));  // 1 / the subnormal step
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;
  if (abs >= largest) return sign | MaxCode;
  if (abs < smallest_normal) {  // a subnormal (or the smallest normal): exact scaling, then ties to even
    float a;
    std::memcpy(&a, &abs, 4);
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * subnormal_steps)));
  }
  const uint32_t rounded = (abs + ((1u << (shift - 1)) - 1u) + ((abs >> shift) & 1u)) >> shift;  // exponent and M bits
  return static_cast<uint8_t>(sign | (rounded - ((127u - Bias) << M)));
}
}  // namespace detail

/// float32 -> e4m3fn bits, round to nearest even, saturating at ±448; NaN stays NaN.
inline uint8_t f32_to_f8_e4m3(float f) { return detail::f32_to_f8_bits<3, 7, 0x7e>(f); }

/// OCP e5m2 bits (float16's upper byte) -> float32 (exact): bias 15, subnormals m·2^-16,
/// exponent 31 infinity (m = 0) or a quiet NaN keeping m (as the F16C converter gives it).
/// Branch-free, as f8_e4m3_to_f32.
inline float f8_e5m2_to_f32(uint8_t byte) {
  const uint32_t b = byte, sign = (b & 0x80u) << 24, e = (b >> 2) & 0x1fu, m = b & 3u;
  uint32_t bits = sign | ((e == 31 ? 255u : e + 112u) << 23) | (m << 21) | (e == 31 && m != 0 ? 0x400000u : 0u);
  uint32_t sub;
  const float scaled = static_cast<float>(m) * 0x1p-16f;
  std::memcpy(&sub, &scaled, 4);
  bits = e == 0 ? (sign | sub) : bits;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// float32 -> e5m2 bits, round to nearest even, saturating at ±57344 (infinity too); NaN
/// stays NaN.
inline uint8_t f32_to_f8_e5m2(float f) { return detail::f32_to_f8_bits<2, 15, 0x7b>(f); }

/// An 8-bit float of type t (f8_e4m3 or f8_e5m2) to float32 and back.
inline float f8_to_f32(dtype t, uint8_t b) { return t == dtype::f8_e4m3 ? f8_e4m3_to_f32(b) : f8_e5m2_to_f32(b); }
inline uint8_t f32_to_f8(dtype t, float f) { return t == dtype::f8_e4m3 ? f32_to_f8_e4m3(f) : f32_to_f8_e5m2(f); }

// The layouts (ggml-common.h's block_q2_K ... block_q6_K). In each, element e of the 256 sits
// in half n = e / 128, chunk j = (e % 128) / 32, lane l = e % 32.
// Q2_K (84 bytes): scales[16] (low nibble: the factor's scale, high: the min's, one pair per
// 16 elements), qs[64], f16 d, f16 dmin; quant = bits 2j, 2j+1 of qs[32n + l] (0-3);
// factor d·(s & 15), min dmin·(s >> 4).
// Q3_K (110 bytes): hmask[32], qs[64], 12 bytes of 6-bit scales (one per 16 elements), f16 d;
// quant = bits 2j, 2j+1 of qs[32n + l], minus 4 where bit 4n + j of hmask[l] is clear (−4-3);
// factor d·(scale − 32).
// Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of
// 32, then 128 bytes: each 64 elements take 32 bytes, the first 32 elements their low
// nibbles, the next 32 their high nibbles; factor d·sc, min dmin·m.
// Q5_K (176 bytes): Q4_K's d, dmin and scales, then qh[32], then Q4_K's 128 nibble bytes;
// element e's fifth bit (value 16) is bit 2·(e / 64) + (e % 64 ≥ 32) of qh[e % 32].
// Q6_K (210 bytes): ql[128], qh[64], int8 scales[16] (one per 16 elements), f16 d; element
// 32j + l of half n takes the low (j < 2) or high (j ≥ 2) nibble of ql[64n + 32·(j % 2) + l]
// and bits 2j, 2j+1 of qh[32n + l] as its bits 4-5, minus 32 (−32-31); factor d·scale.
// IQ4_XS (136 bytes): f16 d, u16 scales_h, scales_l[4], qs[128]; sub-block s (of 32) has the
// 6-bit scale (low nibble s % 2 of scales_l[s / 2]) | (bits 2s, 2s+1 of scales_h) << 4 and
// factor d·(scale − 32); its element i takes the low (i < 16) or high nibble of
// qs[16s + i % 16] as an index into iq4nl_values (−127-113).
// Value = factor·quant − min (no min for the signed Q3_K, Q6_K and IQ4_XS: factor·quant). A
// float16 has 11 significant bits, a scale at most 7 (Q6_K's int8), a quant at most 5 (Q6_K's
// −32-31; powers of two count one), or IQ4_XS's scale at most 5 and value at most 7:
// factor·quant is exact in float32 (≤ 23 bits), so the one rounding is the subtraction's (none
// for the signed types), as in ggml's loops.

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

/// Scale g (< 16) of a Q3_K super-block's 12 scale bytes, 0-63 (ggml unpacks them with 32-bit
/// masks: low nibbles from bytes 0-7, high two bits from bytes 8-11).
inline int q3_k_scale(size_t g, const uint8_t* s) {
  const int low = g < 8 ? s[g] & 0xF : s[g - 8] >> 4;
  return low | (((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
}

/// The factor and min (0 for the signed types) of group g (elements [g·G, (g+1)·G) with
/// G = k_quant_group(t)) of the K-quant super-block at b.
inline void k_quant_factor(const uint8_t* b, dtype t, size_t g, float& f, float& m) {
  auto half = [b](size_t at) {
    uint16_t h;
    std::memcpy(&h, b + at, 2);
    return f16_to_f32(h);
  };
  m = 0.0f;
  switch (t) {
    case dtype::q2_k:
      f = half(80) * static_cast<float>(b[g] & 0xF);
      m = half(82) * static_cast<float>(b[g] >> 4);
      return;
    case dtype::q3_k: f = half(108) * static_cast<float>(q3_k_scale(g, b + 96) - 32); return;
    case dtype::q4_k: case dtype::q5_k: {
      uint8_t sc, mn;
      q4_k_scale_min(g, b + 4, sc, mn);
      f = half(0) * static_cast<float>(sc);
      m = half(2) * static_cast<float>(mn);
      return;
    }
    case dtype::q6_k: f = half(208) * static_cast<float>(static_cast<int8_t>(b[192 + g])); return;
    case dtype::iq4_xs: {
      const int scale = ((b[4 + g / 2] >> (4 * (g % 2))) & 0xF) | ((((b[2] | b[3] << 8) >> (2 * g)) & 3) << 4);
      f = half(0) * static_cast<float>(scale - 32);
      return;
    }
    default: f = 0.0f; return;
  }
}

/// The quant of element e (< 256) of the K-quant super-block at b (signed for q3_k and q6_k).
inline int k_quant_q(const uint8_t* b, dtype t, size_t e) {
  const size_t n = e / 128, j = (e % 128) / 32, l = e % 32;
  switch (t) {
    case dtype::q2_k: return (b[16 + 32 * n + l] >> (2 * j)) & 3;
    case dtype::q3_k: return ((b[32 + 32 * n + l] >> (2 * j)) & 3) - (((b[l] >> (4 * n + j)) & 1) ? 0 : 4);
    case dtype::q4_k: case dtype::q5_k: {
      const bool five = t == dtype::q5_k;
      const uint8_t byte = b[(five ? 48 : 16) + (e / 64) * 32 + l];
      int q = e % 64 < 32 ? (byte & 0xF) : (byte >> 4);
      if (five) q |= ((b[16 + l] >> (2 * (e / 64) + (e % 64 < 32 ? 0 : 1))) & 1) << 4;
      return q;
    }
    case dtype::q6_k: {
      const uint8_t lo = b[64 * n + 32 * (j % 2) + l];
      return ((j < 2 ? lo & 0xF : lo >> 4) | (((b[128 + 32 * n + l] >> (2 * j)) & 3) << 4)) - 32;
    }
    case dtype::iq4_xs: {
      const uint8_t byte = b[8 + 16 * (e / 32) + e % 16];
      return iq4nl_values[e % 32 < 16 ? byte & 0xF : byte >> 4];
    }
    default: return 0;
  }
}

/// Element e (< 256) of one K-quant super-block, as ggml decodes it: factor·quant − min.
inline float k_quant_value(const uint8_t* b, dtype t, size_t e) {
  float f, m;
  k_quant_factor(b, t, e / k_quant_group(t), f, m);
  const float q = static_cast<float>(k_quant_q(b, t, e));
  return k_quant_signed(t) ? f * q : f * q - m;
}

/// Element e (< q4_block) of the q4 block at b: q·f − m, rounded once.
inline float q4_value(const uint8_t* b, size_t e) {
  float f, m;
  std::memcpy(&f, b, 4);
  std::memcpy(&m, b + 4, 4);
  const uint8_t byte = b[8 + e % 16];
  return std::fma(static_cast<float>(e < 16 ? byte & 0xF : byte >> 4), f, -m);
}

/// Element e (< mxfp4_block) of the mxfp4 block at b: mxfp4_values[q] · s, exact.
inline float mxfp4_value(const uint8_t* b, size_t e) {
  float s;
  std::memcpy(&s, b, 4);
  const uint8_t byte = b[4 + e % 16];
  return static_cast<float>(mxfp4_values[e < 16 ? byte & 0xF : byte >> 4]) * s;
}

/// Element e (< q8_block) of the fp8 block at b: e4m3(q) · scale, rounded once.
inline float fp8_value(const uint8_t* b, size_t e) {
  float scale;
  std::memcpy(&scale, b, 4);
  return f8_e4m3_to_f32(b[4 + e]) * scale;
}

/// Converts element i of a weight buffer of type t to float32.
inline float load_as_f32(const void* data, dtype t, size_t i) {
  switch (t) {
    case dtype::f32: return static_cast<const float*>(data)[i];
    case dtype::f16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case dtype::bf16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case dtype::f8_e4m3: case dtype::f8_e5m2: return f8_to_f32(t, static_cast<const uint8_t*>(data)[i]);
    case dtype::q8: {
      const auto* block = static_cast<const uint8_t*>(data) + (i / q8_block) * q8_block_bytes;
      float scale;
      std::memcpy(&scale, block, 4);
      return static_cast<float>(static_cast<int8_t>(block[4 + i % q8_block])) * scale;
    }
    case dtype::q4: return q4_value(static_cast<const uint8_t*>(data) + (i / q4_block) * q4_block_bytes, i % q4_block);
    case dtype::fp8: return fp8_value(static_cast<const uint8_t*>(data) + (i / q8_block) * q8_block_bytes, i % q8_block);
    case dtype::mxfp4:
      return mxfp4_value(static_cast<const uint8_t*>(data) + (i / mxfp4_block) * mxfp4_block_bytes, i % mxfp4_block);
    case dtype::q2_k: case dtype::q3_k: case dtype::q4_k: case dtype::q5_k: case dtype::q6_k: case dtype::iq4_xs:
      return k_quant_value(static_cast<const uint8_t*>(data) + (i / k_block) * dtype_block_bytes(t), t, i % k_block);
  }
  return 0.0f;
}

}  // namespace llmesh::kernels
