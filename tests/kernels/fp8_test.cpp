// Tests of the 8-bit float conversions in dtype.hpp (the KV cache's fp8_e4m3 and fp8_e5m2):
// every bit pattern decoded against the OCP definition computed in double, every pattern round
// tripped, and float32 -> 8 bits against a brute-force reference (the nearest finite value of
// all 256, ties to the even pattern, beyond the largest: the largest) over a strided sweep of
// float32 patterns, every midpoint between neighbours and the floats beside each midpoint; the
// attention kernel's widening of every pattern at each instruction set.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "llmesh/kernels/attention.hpp"
#include "llmesh/kernels/cpu_features.hpp"
#include "llmesh/kernels/dtype.hpp"

namespace llmesh::kernels {
namespace {

struct format {
  dtype type;
  int exp_bits, mant_bits, bias;
  double largest;
  const char* name;
};

const format e4m3{dtype::f8_e4m3, 4, 3, 7, 448.0, "e4m3"};
const format e5m2{dtype::f8_e5m2, 5, 2, 15, 57344.0, "e5m2"};

/// The OCP definition: NaN, ±infinity (e5m2 only) or the value, in double.
double definition(const format& f, uint8_t b) {
  const int e = (b >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = b & ((1 << f.mant_bits) - 1);
  const int top = (1 << f.exp_bits) - 1;
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  if (f.type == dtype::f8_e4m3 && e == top && m == (1 << f.mant_bits) - 1) return std::nan("");
  if (f.type == dtype::f8_e5m2 && e == top) return m == 0 ? sign * INFINITY : std::nan("");
  if (e == 0) return sign * std::ldexp(m, 1 - f.bias - f.mant_bits);
  return sign * std::ldexp((1 << f.mant_bits) + m, e - f.bias - f.mant_bits);
}

/// Brute force: the finite pattern nearest x (ties: the one with an even last bit), the largest
/// of x's sign beyond it; NaN → a NaN.
uint8_t reference(const format& f, float x) {
  if (std::isnan(x)) return 0x7f;
  if (std::fabs(x) >= f.largest) return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | (f.type == dtype::f8_e4m3 ? 0x7e : 0x7b));
  int best = -1;
  double best_gap = INFINITY;
  for (int b = 0; b < 256; ++b) {
    const double v = definition(f, static_cast<uint8_t>(b));
    if (!std::isfinite(v) || std::signbit(v) != std::signbit(x)) continue;
    const double gap = std::fabs(v - static_cast<double>(x));
    if (gap < best_gap || (gap == best_gap && (b & 1) == 0)) {
      best = b;
      best_gap = gap;
    }
  }
  return static_cast<uint8_t>(best);
}

class Fp8 : public ::testing::TestWithParam<format> {};

TEST_P(Fp8, DecodesEveryPatternAsTheDefinition) {
  const format& f = GetParam();
  for (int b = 0; b < 256; ++b) {
    const double want = definition(f, static_cast<uint8_t>(b));
    const float got = f8_to_f32(f.type, static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << f.name << " " << b;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << f.name << " " << b;
      EXPECT_EQ(std::signbit(got), (b & 0x80) != 0) << f.name << " " << b;  // -0 too
    }
  }
  EXPECT_EQ(f8_to_f32(f.type, f.type == dtype::f8_e4m3 ? 0x7e : 0x7b), static_cast<float>(f.largest));
}

TEST_P(Fp8, RoundTripsEveryFinitePattern) {
  const format& f = GetParam();
  for (int b = 0; b < 256; ++b) {
    const float v = f8_to_f32(f.type, static_cast<uint8_t>(b));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(f8_to_f32(f.type, f32_to_f8(f.type, v)))) << f.name << " " << b;
    } else if (std::isinf(v)) {  // e5m2's infinities saturate
      EXPECT_EQ(f32_to_f8(f.type, v), (b & 0x80) | 0x7b) << f.name << " " << b;
    } else {
      EXPECT_EQ(f32_to_f8(f.type, v), b) << f.name << " " << b;
    }
  }
}

TEST_P(Fp8, RoundsAsTheBruteForceReference) {
  const format& f = GetParam();
  std::vector<float> xs;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 10007) {
    float x;
    const auto b32 = static_cast<uint32_t>(bits);
    std::memcpy(&x, &b32, 4);
    xs.push_back(x);
  }
  // Every midpoint between neighbouring finite values (a tie), and the floats beside it.
  std::vector<double> values;
  for (int b = 0; b < 128; ++b) {
    const double v = definition(f, static_cast<uint8_t>(b));
    if (std::isfinite(v)) values.push_back(v);
  }
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const auto mid = static_cast<float>((values[i] + values[i + 1]) / 2);  // exact: few bits
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, std::numeric_limits<float>::denorm_min(), 1e30f, -1e30f,
                  static_cast<float>(f.largest) + 1.0f, std::nextafter(static_cast<float>(f.largest), 0.0f)}) {
    xs.push_back(x);
  }
  size_t checked = 0;
  for (float x : xs) {
    const uint8_t got = f32_to_f8(f.type, x), want = reference(f, x);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(f8_to_f32(f.type, got))) << f.name << " " << x;
    } else {
      ASSERT_EQ(got, want) << f.name << " " << std::hexfloat << x;
      ++checked;
    }
  }
  EXPECT_GT(checked, 400000u);
}

TEST_P(Fp8, SizesNamesAndHandPickedValues) {
  const format& f = GetParam();
  EXPECT_EQ(dtype_size(f.type), 1u);
  EXPECT_EQ(dtype_block(f.type), 1u);
  EXPECT_EQ(dtype_bytes(f.type, 10), 10u);
  EXPECT_TRUE(is_f8(f.type));
  EXPECT_FALSE(is_quantized(f.type));
  const uint8_t row[256] = {0x00, 0x38};  // (sized for any type's block: the other cases of load_as_f32)
  EXPECT_EQ(load_as_f32(row, f.type, 1), f.type == dtype::f8_e4m3 ? 1.0f : 0.5f);
  // 1 + half a step ties to 1; 1 + 1.5 steps ties to 1 + 2 steps.
  const float step = std::ldexp(1.0f, -f.mant_bits);
  EXPECT_EQ(f8_to_f32(f.type, f32_to_f8(f.type, 1.0f + step / 2)), 1.0f);
  EXPECT_EQ(f8_to_f32(f.type, f32_to_f8(f.type, 1.0f + 1.5f * step)), 1.0f + 2 * step);
  EXPECT_EQ(f8_to_f32(f.type, f32_to_f8(f.type, -1000000.0f)), -static_cast<float>(f.largest));
}

// What attention reads: every pattern (rows of 40, so the vector loop and its scalar tail both
// run, at a stride) widened by each instruction set this CPU has gives the conversion's bits.
TEST_P(Fp8, TheKernelsWideningGivesTheConversionsBitsAtEveryLevel) {
  const format& f = GetParam();
  const size_t width = 40, stride = 48, rows = 256 / 8;
  std::vector<uint8_t> src(rows * stride, 0xaa);
  for (size_t i = 0; i < rows * width; ++i) src[(i / width) * stride + i % width] = static_cast<uint8_t>(i * 7 % 256);
  for (isa level : {isa::portable, isa::avx2, isa::avx512}) {
    if (level > best_supported_isa()) {
      std::printf("(%s: not on this CPU, not checked)\n", std::string(isa_name(level)).c_str());
      continue;
    }
    std::vector<float> out(rows * width + 1, -1.0f);
    widen_kv_rows(f.type, src.data(), stride, rows, width, out.data(), level);
    for (size_t i = 0; i < rows * width; ++i) {
      const float want = f8_to_f32(f.type, src[(i / width) * stride + i % width]);
      ASSERT_EQ(std::memcmp(&out[i], &want, 4), 0) << f.name << " " << isa_name(level) << " element " << i << " pattern "
                                                    << int(src[(i / width) * stride + i % width]);
    }
    EXPECT_EQ(out.back(), -1.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Both, Fp8, ::testing::Values(e4m3, e5m2), [](const auto& i) { return std::string(i.param.name); });

TEST(Fp8Formats, NamesAndEdges) {
  EXPECT_EQ(dtype_name(dtype::f8_e4m3), "F8_E4M3");
  EXPECT_EQ(dtype_name(dtype::f8_e5m2), "F8_E5M2");
  EXPECT_FALSE(is_f8(dtype::bf16));
  EXPECT_EQ(f32_to_f8_e4m3(0x1p-9f), 0x01);   // the smallest subnormal
  EXPECT_EQ(f32_to_f8_e4m3(0x1p-10f), 0x00);  // half of it: a tie, even is 0
  EXPECT_EQ(f32_to_f8_e4m3(7.5f * 0x1p-9f), 0x08);  // between the largest subnormal and the smallest normal: even
  EXPECT_EQ(f32_to_f8_e5m2(0x1p-16f), 0x01);
  EXPECT_EQ(f32_to_f8_e5m2(-0.0f), 0x80);
}

}  // namespace
}  // namespace llmesh::kernels
