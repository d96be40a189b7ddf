// Tests of the float32 <-> f16 / bf16 conversions in dtype.hpp: exhaustive round trips over
// every 16-bit pattern, an independent round-to-nearest-even reference over a strided sweep of
// float32 patterns, and hand-picked ties, subnormals and overflows; the K-quant blocks' decoding
// (Q4_K, Q5_K, Q6_K) against ggml's own loops.
#include "llmesh/kernels/dtype.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "k_quant_blocks.hpp"
#include "test_seed.hpp"

namespace llmesh::kernels {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

bool is_f16_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool is_bf16_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

/// The value a 16-bit float encodes, computed with ldexp (independent of the bit tricks under test).
/// mant_bits: 10 for f16, 7 for bf16; bias: 15 or 127; exp_bits: 5 or 8.
double decode_ref(uint16_t h, int mant_bits, int exp_bits, int bias) {
  int sign = h >> 15;
  int e = (h >> mant_bits) & ((1 << exp_bits) - 1);
  int m = h & ((1 << mant_bits) - 1);
  double v;
  if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - mant_bits);
  } else if (e == (1 << exp_bits) - 1) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(static_cast<double>(m + (1 << mant_bits)), e - bias - mant_bits);
  }
  return sign ? -v : v;
}

/// Rounds a finite float to the 16-bit format to nearest, ties to even, with std::nearbyint
/// (the default rounding mode is round-to-nearest-even); overflow gives infinity.
uint16_t encode_ref(float f, int mant_bits, int exp_bits, int bias) {
  uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
  double a = std::fabs(static_cast<double>(f));
  const int max_e = (1 << exp_bits) - 1;
  const int min_normal_exp = 1 - bias;
  uint32_t q;
  int biased;
  if (a < std::ldexp(1.0, min_normal_exp)) {
    // Subnormal range: the unit is 2^(min_normal_exp - mant_bits). q may round up to the first
    // normal (q == 2^mant_bits), which is exactly its encoding.
    q = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, mant_bits - min_normal_exp)));
    return static_cast<uint16_t>(sign | q);
  }
  int ex;
  std::frexp(a, &ex);  // a = fr * 2^ex, fr in [0.5, 1)
  int e = ex - 1;
  q = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, mant_bits - e)));  // in [2^mb, 2^(mb+1)]
  if (q == (1u << (mant_bits + 1))) {
    q >>= 1;
    ++e;
  }
  biased = e + bias;
  if (biased >= max_e) return static_cast<uint16_t>(sign | (max_e << mant_bits));
  return static_cast<uint16_t>(sign | (biased << mant_bits) | (q - (1u << mant_bits)));
}

uint16_t f16_ref(float f) { return encode_ref(f, 10, 5, 15); }
uint16_t bf16_ref(float f) { return encode_ref(f, 7, 8, 127); }

TEST(Dtype, SizesAndNames) {
  EXPECT_EQ(dtype_size(dtype::f32), 4u);
  EXPECT_EQ(dtype_size(dtype::f16), 2u);
  EXPECT_EQ(dtype_size(dtype::bf16), 2u);
  EXPECT_EQ(dtype_name(dtype::f32), "F32");
  EXPECT_EQ(dtype_name(dtype::f16), "F16");
  EXPECT_EQ(dtype_name(dtype::bf16), "BF16");
}

TEST(F16ToF32, DecodesEveryBitPatternExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    auto bits = static_cast<uint16_t>(h);
    float f = f16_to_f32(bits);
    double want = decode_ref(bits, 10, 5, 15);
    if (is_f16_nan(bits)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;
    }
  }
}

TEST(F16ToF32, RoundTripsEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    auto bits = static_cast<uint16_t>(h);
    uint16_t back = f32_to_f16(f16_to_f32(bits));
    if (is_f16_nan(bits)) {
      ASSERT_TRUE(is_f16_nan(back)) << std::hex << h << " -> " << back;
    } else {
      ASSERT_EQ(back, bits) << std::hex << h;
    }
  }
}

TEST(Bf16ToF32, DecodesEveryBitPatternExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    auto bits = static_cast<uint16_t>(h);
    float f = bf16_to_f32(bits);
    if (is_bf16_nan(bits)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), decode_ref(bits, 7, 8, 127)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;
    }
  }
}

TEST(Bf16ToF32, RoundTripsEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    auto bits = static_cast<uint16_t>(h);
    uint16_t back = f32_to_bf16(bf16_to_f32(bits));
    if (is_bf16_nan(bits)) {
      ASSERT_TRUE(is_bf16_nan(back)) << std::hex << h << " -> " << back;
    } else {
      ASSERT_EQ(back, bits) << std::hex << h;
    }
  }
}

// A strided sweep over all 2^32 float patterns (about 16.7 million of them, every exponent and
// many mantissas) against the nearbyint reference.
constexpr uint32_t sweep_stride = 257;  // prime, so the low mantissa bits vary too

TEST(F32ToF16, MatchesNearestEvenReferenceOverStridedSweep) {
  for (uint64_t b = 0; b <= 0xffffffffull; b += sweep_stride) {
    float f = float_of(static_cast<uint32_t>(b));
    uint16_t got = f32_to_f16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(is_f16_nan(got)) << std::hex << b;
    } else {
      ASSERT_EQ(got, f16_ref(f)) << std::hex << "f32 bits " << b << " = " << f;
    }
  }
}

TEST(F32ToBf16, MatchesNearestEvenReferenceOverStridedSweep) {
  for (uint64_t b = 0; b <= 0xffffffffull; b += sweep_stride) {
    float f = float_of(static_cast<uint32_t>(b));
    uint16_t got = f32_to_bf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(is_bf16_nan(got)) << std::hex << b;
    } else {
      ASSERT_EQ(got, bf16_ref(f)) << std::hex << "f32 bits " << b << " = " << f;
    }
  }
}

TEST(F32ToF16, RoundsTiesToEven) {
  // 1 + 2^-11 is halfway between 1 (0x3c00, even) and 1 + 2^-10 (0x3c01).
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
  // 1 + 3·2^-11 is halfway between 0x3c01 and 0x3c02 (even).
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
  // Just above / below a tie go to the nearer neighbour.
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3c01);
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + 3 * 0x1p-11f, 0.0f)), 0x3c01);
  // 2049 lies between 2048 (0x6800) and 2050 (0x6801); 2051 between 0x6801 and 0x6802.
  EXPECT_EQ(f32_to_f16(2049.0f), 0x6800);
  EXPECT_EQ(f32_to_f16(2051.0f), 0x6802);
  EXPECT_EQ(f32_to_f16(-2049.0f), 0xe800);
  EXPECT_EQ(f32_to_f16(-2051.0f), 0xe802);
}

TEST(F32ToF16, HandlesSubnormals) {
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);                // smallest subnormal
  EXPECT_EQ(f32_to_f16(-0x1p-24f), 0x8001);
  EXPECT_EQ(f32_to_f16(1023 * 0x1p-24f), 0x03ff);         // largest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);                // smallest normal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);                // tie between 0 and 2^-24: even is 0
  EXPECT_EQ(f32_to_f16(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);            // tie between 1 and 2 units
  EXPECT_EQ(f32_to_f16(5 * 0x1p-25f), 0x0002);            // tie between 2 and 3 units
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);     // tie between 0x3ff and 0x400
  EXPECT_EQ(f32_to_f16(1e-10f), 0x0000);                  // underflows to zero
  EXPECT_EQ(f32_to_f16(-1e-10f), 0x8000);
  EXPECT_EQ(f32_to_f16(float_of(1)), 0x0000);             // float32 subnormal
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x8200), -512 * 0x1p-24f);
}

TEST(F32ToF16, OverflowsToInfinity) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);                          // largest half
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);    // below the tie
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                          // tie rounds to even: inf
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(is_f16_nan(f32_to_f16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_f16_nan(f32_to_f16(float_of(0x7f800001u))));  // signalling NaN, low payload
  EXPECT_TRUE(is_f16_nan(f32_to_f16(float_of(0xff800001u))));
}

TEST(F32ToBf16, RoundsTiesToEven) {
  EXPECT_EQ(f32_to_bf16(float_of(0x3f808000u)), 0x3f80);  // tie, 0x3f80 is even
  EXPECT_EQ(f32_to_bf16(float_of(0x3f818000u)), 0x3f82);  // tie, 0x3f82 is even
  EXPECT_EQ(f32_to_bf16(float_of(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(f32_to_bf16(float_of(0x3f807fffu)), 0x3f80);  // below the tie
  EXPECT_EQ(f32_to_bf16(float_of(0xbf818000u)), 0xbf82);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
}

TEST(F32ToBf16, HandlesSubnormalsAndOverflow) {
  EXPECT_EQ(f32_to_bf16(float_of(0x00010000u)), 0x0001);  // smallest bf16 subnormal
  EXPECT_EQ(f32_to_bf16(float_of(0x00008000u)), 0x0000);  // tie between 0 and 1: even
  EXPECT_EQ(f32_to_bf16(float_of(0x00018000u)), 0x0002);  // tie between 1 and 2: even
  EXPECT_EQ(f32_to_bf16(float_of(0x00008001u)), 0x0001);
  EXPECT_EQ(f32_to_bf16(float_of(0x007fffffu)), 0x0080);  // largest subnormal rounds to normal
  EXPECT_EQ(bf16_to_f32(0x0001), float_of(0x00010000u));
  EXPECT_EQ(f32_to_bf16(float_of(0x7f7f0000u)), 0x7f7f);  // largest bf16
  EXPECT_EQ(f32_to_bf16(float_of(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(float_of(0x7f7f8000u)), 0x7f80);  // tie, odd: rounds up to inf
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
}

TEST(F32ToBf16, KeepsNanANan) {
  // Payloads in the low 16 bits only: plain truncation would turn these into infinities.
  for (uint32_t b : {0x7f800001u, 0xff800001u, 0x7f80ffffu, 0x7fc00000u, 0xffffffffu}) {
    uint16_t h = f32_to_bf16(float_of(b));
    EXPECT_TRUE(is_bf16_nan(h)) << std::hex << b << " -> " << h;
    EXPECT_EQ(h & 0x8000u, (b >> 16) & 0x8000u) << std::hex << b;
  }
}

TEST(LoadAsF32, ConvertsEachDtype) {
  const float f[] = {1.5f, -2.25f};
  const uint16_t h[] = {0x3e00, 0xc080};   // f16: 1.5, -2.25
  const uint16_t b[] = {0x3fc0, 0xc010};   // bf16: 1.5, -2.25
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(load_as_f32(f, dtype::f32, i), f[i]);
    EXPECT_EQ(load_as_f32(h, dtype::f16, i), f[i]);
    EXPECT_EQ(load_as_f32(b, dtype::bf16, i), f[i]);
  }
  EXPECT_EQ(bits_of(load_as_f32(b, dtype::bf16, 1)), 0xc0100000u);
}

/// ggml's get_scale_min_k4.
void ggml_scale_min(int j, const uint8_t* scales, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = scales[j] & 63;
    m = scales[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j - 0] >> 6) << 4));
  }
}

/// ggml's dequantize_row_q4_K over one super-block, in its own loop order (64 elements at a time).
void ggml_q4_k(const uint8_t* x, float* y) {
  const float d = f16_to_f32(static_cast<uint16_t>(x[0] | x[1] << 8));
  const float min = f16_to_f32(static_cast<uint16_t>(x[2] | x[3] << 8));
  const uint8_t* scales = x + 4;
  const uint8_t* q = x + 16;
  int is = 0;
  for (int j = 0; j < 256; j += 64) {
    uint8_t sc, m;
    ggml_scale_min(is + 0, scales, sc, m);
    const float d1 = d * sc, m1 = min * m;
    ggml_scale_min(is + 1, scales, sc, m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

/// ggml's dequantize_row_q5_K over one super-block.
void ggml_q5_k(const uint8_t* x, float* y) {
  const float d = f16_to_f32(static_cast<uint16_t>(x[0] | x[1] << 8));
  const float min = f16_to_f32(static_cast<uint16_t>(x[2] | x[3] << 8));
  const uint8_t* scales = x + 4;
  const uint8_t* qh = x + 16;
  const uint8_t* ql = x + 48;
  int is = 0;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < 256; j += 64) {
    uint8_t sc, m;
    ggml_scale_min(is, scales, sc, m);
    const float d1 = d * sc, m1 = min * m;
    ggml_scale_min(is + 1, scales, sc, m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    ql += 32;
    is += 2;
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}

/// ggml's dequantize_row_q6_K over one super-block.
void ggml_q6_k(const uint8_t* x, float* y) {
  const float d = f16_to_f32(static_cast<uint16_t>(x[208] | x[209] << 8));
  const uint8_t* ql = x;
  const uint8_t* qh = x + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(x + 192);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l + 0] = d * sc[is + 0] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

/// ggml's dequantize_row_q2_K over one super-block.
void ggml_q2_k(const uint8_t* x, float* y) {
  const float d = f16_to_f32(static_cast<uint16_t>(x[80] | x[81] << 8));
  const float min = f16_to_f32(static_cast<uint16_t>(x[82] | x[83] << 8));
  const uint8_t* q = x + 16;
  int is = 0;
  for (int n = 0; n < 256; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      uint8_t sc = x[is++];
      float dl = d * (sc & 0xF), ml = min * (sc >> 4);
      for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<int8_t>((q[l] >> shift) & 3) - ml;
      sc = x[is++];
      dl = d * (sc & 0xF);
      ml = min * (sc >> 4);
      for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<int8_t>((q[l + 16] >> shift) & 3) - ml;
      shift += 2;
    }
    q += 32;
  }
}

/// ggml's dequantize_row_q3_K over one super-block, its scales unpacked with its 32-bit masks.
void ggml_q3_k(const uint8_t* x, float* y) {
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  const float d_all = f16_to_f32(static_cast<uint16_t>(x[108] | x[109] << 8));
  const uint8_t* q = x + 32;
  const uint8_t* hm = x;
  uint8_t m = 1;
  uint32_t aux[4];
  std::memcpy(aux, x + 96, 12);
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  int8_t scales[16];
  std::memcpy(scales, aux, 16);
  int is = 0;
  for (int n = 0; n < 256; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      float dl = d_all * (scales[is++] - 32);
      for (int l = 0; l < 16; ++l) *y++ = dl * (static_cast<int8_t>((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
      dl = d_all * (scales[is++] - 32);
      for (int l = 0; l < 16; ++l) *y++ = dl * (static_cast<int8_t>((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
      shift += 2;
      m = static_cast<uint8_t>(m << 1);
    }
    q += 32;
  }
}

/// ggml's dequantize_row_iq4_xs over one super-block, with its own copy of kvalues_iq4nl.
void ggml_iq4_xs(const uint8_t* x, float* y) {
  static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  const float d = f16_to_f32(static_cast<uint16_t>(x[0] | x[1] << 8));
  const int scales_h = x[2] | x[3] << 8;
  const uint8_t* scales_l = x + 4;
  const uint8_t* qs = x + 8;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = ((scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((scales_h >> 2 * ib) & 3) << 4);
    const float dl = d * (ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j + 0] = dl * kvalues_iq4nl[qs[j] & 0xf];
      y[j + 16] = dl * kvalues_iq4nl[qs[j] >> 4];
    }
    y += 32;
    qs += 16;
  }
}

TEST(LoadAsF32, DecodesKQuantBlocksAsGgmlDoes) {
  std::mt19937 rng(testing::test_seed(21));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> exponent(-14, 2);
  for (dtype t : testing::k_quant_types) {
    const size_t bb = dtype_block_bytes(t);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<uint8_t> blocks(2 * bb);  // two super-blocks: element i of the second is 256 + i
      for (auto& b : blocks) b = static_cast<uint8_t>(byte(rng));
      for (size_t blk = 0; blk < 2; ++blk) {
        for (size_t at : testing::k_quant_halves(t)) {
          const float sign = byte(rng) < 64 ? -1.0f : 1.0f;  // negative scales and mins too
          const uint16_t d = f32_to_f16(sign * std::ldexp(1.0f + static_cast<float>(byte(rng)) / 256.0f, exponent(rng)));
          std::memcpy(blocks.data() + blk * bb + at, &d, 2);
        }
      }
      float want[512];
      for (size_t blk = 0; blk < 2; ++blk) {
        auto* decode = t == dtype::q2_k   ? ggml_q2_k
                       : t == dtype::q3_k ? ggml_q3_k
                       : t == dtype::q4_k ? ggml_q4_k
                       : t == dtype::q5_k ? ggml_q5_k
                       : t == dtype::q6_k ? ggml_q6_k
                                          : ggml_iq4_xs;
        decode(blocks.data() + blk * bb, want + 256 * blk);
      }
      for (size_t i = 0; i < 512; ++i) {
        ASSERT_EQ(bits_of(load_as_f32(blocks.data(), t, i)), bits_of(want[i])) << dtype_name(t) << " element " << i;
      }
    }
  }
}

TEST(LoadAsF32, DecodesAHandMadeQ4KBlock) {
  uint8_t b[144] = {};
  b[0] = 0x00; b[1] = 0x3c;  // d = 1
  b[2] = 0x00; b[3] = 0x38;  // dmin = 0.5
  b[4 + 0] = 3;               // sub-block 0: scale 3
  b[4 + 4] = 2;               // sub-block 0: min 2
  b[4 + 8] = 0x75;            // sub-block 4: scale 5 (low nibble), min 7 (high nibble)
  b[4 + 0] |= 0x40;           // sub-block 4's scale gains bit 4 (from byte 0's top bits): 21
  b[16 + 0] = 0xA4;           // element 0: low nibble 4; element 32: high nibble 10
  b[16 + 64] = 0x09;          // element 128 (sub-block 4): 9
  EXPECT_EQ(load_as_f32(b, dtype::q4_k, 0), 3.0f * 4 - 0.5f * 2);
  EXPECT_EQ(load_as_f32(b, dtype::q4_k, 1), -1.0f);  // quant 0: minus the min
  EXPECT_EQ(load_as_f32(b, dtype::q4_k, 32), 0.0f);  // sub-block 1: scale 0, min 0
  EXPECT_EQ(load_as_f32(b, dtype::q4_k, 128), 21.0f * 9 - 0.5f * 7);
}

TEST(KQuant, BlockSizesNamesAndGroups) {
  struct row {
    dtype t;
    const char* name;
    size_t block_bytes, group;
    bool is_signed;
  };
  for (const row& r : {row{dtype::q2_k, "Q2_K", 84, 16, false}, row{dtype::q3_k, "Q3_K", 110, 16, true},
                       row{dtype::q4_k, "Q4_K", 144, 32, false}, row{dtype::q5_k, "Q5_K", 176, 32, false},
                       row{dtype::q6_k, "Q6_K", 210, 16, true}, row{dtype::iq4_xs, "IQ4_XS", 136, 32, true}}) {
    SCOPED_TRACE(r.name);
    EXPECT_EQ(dtype_name(r.t), r.name);
    EXPECT_TRUE(is_quantized(r.t) && is_k_quant(r.t));
    EXPECT_EQ(dtype_bytes(r.t, 512), 2 * r.block_bytes);
    EXPECT_EQ(dtype_offset(r.t, 768), 3 * r.block_bytes);
    EXPECT_EQ(k_quant_group(r.t), r.group);
    EXPECT_EQ(k_quant_signed(r.t), r.is_signed);
  }
  EXPECT_FALSE(is_quantized(dtype::bf16));
  EXPECT_FALSE(is_k_quant(dtype::q8));
}

TEST(LoadAsF32, DecodesHandMadeQ2KAndQ3KBlocks) {
  uint8_t q2[84] = {};
  q2[80] = 0x00; q2[81] = 0x3c;  // d = 1
  q2[82] = 0x00; q2[83] = 0x38;  // dmin = 0.5
  q2[0] = 0x35;                  // group 0: scale 5, min 3
  q2[9] = 0x2F;                  // group 9 (elements 144-159): scale 15, min 2
  q2[16 + 0] = 0b11100100;        // element 0: 0; element 32: 1; element 64: 2; element 96: 3
  q2[16 + 32 + 16] = 0b00001100;  // element 128 + 16 = 144: bits 0-1 = 0; element 176: 3 (group 11)
  EXPECT_EQ(load_as_f32(q2, dtype::q2_k, 0), -1.5f);    // 5·0 − 0.5·3
  EXPECT_EQ(load_as_f32(q2, dtype::q2_k, 32), 0.0f);    // group 2: scale 0, min 0
  EXPECT_EQ(load_as_f32(q2, dtype::q2_k, 144), -1.0f);  // 15·0 − 0.5·2
  EXPECT_EQ(load_as_f32(q2, dtype::q2_k, 176), 0.0f);   // group 11: scale 0
  q2[11] = 0x07;                                        // group 11: scale 7, min 0
  EXPECT_EQ(load_as_f32(q2, dtype::q2_k, 176), 21.0f);  // 7·3
  uint8_t q3[110] = {};
  q3[108] = 0x00; q3[109] = 0x40;  // d = 2
  q3[96 + 0] = 0x0F;               // scale 0: low nibble 15
  q3[96 + 8] = 0x02;               // scale 0: high bits 2 → 32 + 15 = 47, factor 2·15 = 30
  q3[96 + 3] = 0x10;               // scale 11: low nibble 1 (byte 3's high nibble); high bits 0 → 1 − 32
  q3[32 + 0] = 0b00000011;         // element 0: 3
  q3[0] = 0x01;                    // element 0's high bit set (bit 0): 3, not 3 − 4
  EXPECT_EQ(load_as_f32(q3, dtype::q3_k, 0), 90.0f);    // 30·3
  EXPECT_EQ(load_as_f32(q3, dtype::q3_k, 1), -120.0f);  // quant 0, high bit clear: 30·(−4)
  EXPECT_EQ(load_as_f32(q3, dtype::q3_k, 176), 248.0f);  // group 11: 2·(1 − 32)·(0 − 4)
}

TEST(Q4, BlockLayoutAndHandMadeValues) {
  EXPECT_EQ(dtype_name(dtype::q4), "Q4");
  EXPECT_TRUE(is_quantized(dtype::q4));
  EXPECT_FALSE(is_k_quant(dtype::q4));
  EXPECT_EQ(dtype_block(dtype::q4), 32u);
  EXPECT_EQ(dtype_bytes(dtype::q4, 64), 48u);
  EXPECT_EQ(dtype_bytes(dtype::q4, 40), 48u);  // rows pad to whole blocks
  EXPECT_EQ(dtype_offset(dtype::q4, 96), 72u);
  // Two blocks: factor 0.5 and offset 4 (zero 8: Q4_0's), then factor 0.25 and offset −1.5
  // (Q4_1's min 1.5). Element e < 16 is byte e's low nibble, e ≥ 16 byte e − 16's high one.
  uint8_t b[48] = {};
  const float f0 = 0.5f, m0 = 4.0f, f1 = 0.25f, m1 = -1.5f;
  std::memcpy(b, &f0, 4);
  std::memcpy(b + 4, &m0, 4);
  std::memcpy(b + 24, &f1, 4);
  std::memcpy(b + 28, &m1, 4);
  for (int j = 0; j < 16; ++j) {
    b[8 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
    b[32 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  }
  for (size_t e = 0; e < 32; ++e) {
    const int q = e < 16 ? static_cast<int>(e) : 15 - static_cast<int>(e - 16);
    EXPECT_EQ(load_as_f32(b, dtype::q4, e), 0.5f * static_cast<float>(q - 8)) << e;
    EXPECT_EQ(load_as_f32(b, dtype::q4, 32 + e), 0.25f * static_cast<float>(q) + 1.5f) << e;
  }
}

TEST(Mxfp4, BlockLayoutAndEveryCodeAtEveryExponent) {
  EXPECT_EQ(dtype_name(dtype::mxfp4), "MXFP4");
  EXPECT_TRUE(is_quantized(dtype::mxfp4));
  EXPECT_FALSE(is_k_quant(dtype::mxfp4));
  EXPECT_EQ(dtype_block(dtype::mxfp4), 32u);
  EXPECT_EQ(dtype_bytes(dtype::mxfp4, 64), 40u);
  EXPECT_EQ(dtype_bytes(dtype::mxfp4, 40), 40u);  // rows pad to whole blocks
  EXPECT_EQ(dtype_offset(dtype::mxfp4, 96), 60u);
  // OCP MX's E2M1 codes (sign, 2 exponent bits, 1 mantissa bit) as HF's FP4_VALUES table has them.
  const float e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (int e8 = 0; e8 <= 252; ++e8) {  // every E8M0 exponent whose values fit float32: the block's scale is 2^(e8 − 128)
    uint8_t b[20] = {};
    const float s = std::ldexp(1.0f, e8 - 128);
    std::memcpy(b, &s, 4);
    for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
    for (size_t i = 0; i < 32; ++i) {
      const int q = i < 16 ? static_cast<int>(i) : 15 - static_cast<int>(i - 16);
      const double want = std::ldexp(static_cast<double>(e2m1[q]), e8 - 127);  // the checkpoint's value
      ASSERT_EQ(static_cast<double>(load_as_f32(b, dtype::mxfp4, i)), want) << "e8 " << e8 << " element " << i;
    }
  }
}

TEST(Fp8, BlockLayoutAndEveryCodeTimesItsScale) {
  EXPECT_EQ(dtype_name(dtype::fp8), "FP8");
  EXPECT_TRUE(is_quantized(dtype::fp8));
  EXPECT_FALSE(is_k_quant(dtype::fp8));
  EXPECT_FALSE(is_f8(dtype::fp8));  // a weight type, not a KV cache's
  EXPECT_EQ(dtype_block(dtype::fp8), 32u);
  EXPECT_EQ(dtype_bytes(dtype::fp8, 64), 72u);
  EXPECT_EQ(dtype_bytes(dtype::fp8, 40), 72u);  // rows pad to whole blocks
  EXPECT_EQ(dtype_offset(dtype::fp8, 96), 108u);
  EXPECT_EQ(dtype_offset(dtype::fp8, 33), 36u + 4u + 1u);  // as q8: within a block, past its scale
  // Eight blocks holding the 256 codes in order, each with its own scale; the value is the
  // code's (OCP e4m3fn: 2^(e−7)·(1 + m/8), subnormals 2^-6·m/8) times the scale, rounded once.
  std::vector<uint8_t> b(8 * q8_block_bytes);
  const float scales[8] = {1.0f, 0.5f, 3.0f, 1.0f + 0x1p-20f, 0x1p-40f, 1.0f / 3.0f, 2048.0f, 0x1p-130f};
  for (int c = 0; c < 256; ++c) {
    uint8_t* block = b.data() + (c / 32) * q8_block_bytes;
    std::memcpy(block, &scales[c / 32], 4);
    block[4 + c % 32] = static_cast<uint8_t>(c);
  }
  for (int c = 0; c < 256; ++c) {
    const int e = (c >> 3) & 15, m = c & 7;
    const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
    const double code = (c & 0x80) ? -mag : mag;
    const float got = load_as_f32(b.data(), dtype::fp8, static_cast<size_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(got)) << c;  // the loader never stores it
      continue;
    }
    EXPECT_EQ(got, static_cast<float>(code * static_cast<double>(scales[c / 32]))) << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
  }
  EXPECT_EQ(load_as_f32(b.data(), dtype::fp8, 0x7e), 448.0f * scales[3]);
}

TEST(Q4, RoundsOnceLikeAFusedMultiplySubtract) {
  // q·f − m is rounded once (a fused multiply-subtract), whatever m: with a factor of 24
  // significant bits q·f is not a float, so rounding it first would give other bits.
  const float f = 1.0f + 0x1.0p-22f + 0x1.0p-23f;
  for (int z = 0; z <= 15; z += 5) {
    uint8_t b[24] = {};
    const float m = f * static_cast<float>(z);
    std::memcpy(b, &f, 4);
    std::memcpy(b + 4, &m, 4);
    for (int j = 0; j < 16; ++j) b[8 + j] = static_cast<uint8_t>(j | j << 4);
    for (size_t e = 0; e < 32; ++e) {
      const int q = static_cast<int>(e % 16);
      const float want = static_cast<float>(std::fma(static_cast<double>(q), static_cast<double>(f), -static_cast<double>(m)));
      EXPECT_EQ(load_as_f32(b, dtype::q4, e), want) << "z " << z << " e " << e;
    }
  }
}

}  // namespace
}  // namespace llmesh::kernels
