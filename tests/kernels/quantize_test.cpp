// Tests of quantize_q8: the block format, rounding (nearest, ties to even), the error bound of
// every dequantized weight, padding, sources of every type giving the same bytes, and refusals.
#include "llmesh/kernels/quantize.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "k_quant_blocks.hpp"
#include "test_seed.hpp"

namespace llmesh::kernels {
namespace {

float scale_of(const std::vector<uint8_t>& q, size_t block) {
  float s;
  std::memcpy(&s, q.data() + block * q8_block_bytes, 4);
  return s;
}

int8_t value_of(const std::vector<uint8_t>& q, size_t block, size_t i) {
  return static_cast<int8_t>(q[block * q8_block_bytes + 4 + i]);
}

std::vector<uint8_t> quantize(const std::vector<float>& w, size_t rows, size_t cols) {
  std::vector<uint8_t> out(dtype_bytes(dtype::q8, rows * q8_row_elements(cols)), 0xAA);
  auto s = quantize_q8(w.data(), dtype::f32, rows, cols, out.data());
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.err().message);
  return out;
}

TEST(Quantize, BlockFormatAndRoundingToNearestEven) {
  // max |w| = 127: scale 1, so each value is w rounded; .5 goes to the even neighbour.
  std::vector<float> w(32, 0.0f);
  const float in[] = {127.0f, -63.5f, 0.5f, 1.5f, 2.5f, -2.5f, 3.49f, -126.6f};
  const int8_t want[] = {127, -64, 0, 2, 2, -2, 3, -127};
  for (size_t i = 0; i < std::size(in); ++i) w[i] = in[i];
  auto q = quantize(w, 1, 32);
  ASSERT_EQ(q.size(), q8_block_bytes);
  EXPECT_EQ(scale_of(q, 0), 1.0f);
  for (size_t i = 0; i < std::size(in); ++i) EXPECT_EQ(value_of(q, 0, i), want[i]) << "w = " << in[i];
  for (size_t i = std::size(in); i < 32; ++i) EXPECT_EQ(value_of(q, 0, i), 0);
  EXPECT_EQ(load_as_f32(q.data(), dtype::q8, 1), -64.0f);
}

TEST(Quantize, EveryWeightIsWithinHalfAStepAndTheLargestIsExact) {
  std::mt19937 rng(testing::test_seed(17));
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp2(-12, 4);
  for (size_t cols : {1, 31, 32, 33, 100, 4096}) {
    const size_t rows = 3;
    std::vector<float> w(rows * cols);
    for (auto& v : w) v = std::ldexp(mant(rng), exp2(rng));
    auto q = quantize(w, rows, cols);
    const size_t ld = q8_row_elements(cols);
    ASSERT_EQ(q.size(), rows * ld / q8_block * q8_block_bytes);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t b = 0; b < ld / q8_block; ++b) {
        const size_t block = (r * ld) / q8_block + b;
        float amax = 0.0f;
        for (size_t i = b * q8_block; i < std::min(cols, (b + 1) * q8_block); ++i) amax = std::max(amax, std::fabs(w[r * cols + i]));
        const float scale = scale_of(q, block);
        EXPECT_EQ(scale, amax / 127.0f);
        bool has_max = false;
        for (size_t i = 0; i < q8_block; ++i) {
          const size_t c = b * q8_block + i;
          const float got = load_as_f32(q.data(), dtype::q8, r * ld + c);
          if (c >= cols) {
            EXPECT_EQ(value_of(q, block, i), 0) << "padding of row " << r;
            continue;
          }
          const float orig = w[r * cols + c];
          // Half a step, plus the rounding of w / scale and of q * scale.
          EXPECT_LE(std::fabs(got - orig), scale * (0.5f + 1e-4f) + 1e-30f) << "row " << r << " col " << c;
          has_max = has_max || std::abs(value_of(q, block, i)) == 127;
        }
        EXPECT_TRUE(has_max) << "block " << block << ": its largest weight must map to ±127";
      }
    }
  }
}

TEST(Quantize, AZeroBlockHasScaleZero) {
  std::vector<float> w(64, 0.0f);
  w[40] = -2.0f;
  auto q = quantize(w, 1, 64);
  EXPECT_EQ(scale_of(q, 0), 0.0f);
  for (size_t i = 0; i < 32; ++i) EXPECT_EQ(value_of(q, 0, i), 0);
  EXPECT_EQ(value_of(q, 1, 8), -127);
  EXPECT_EQ(load_as_f32(q.data(), dtype::q8, 40), -2.0f);
}

TEST(Quantize, F16AndBf16SourcesGiveTheBytesOfTheirFloat32Values) {
  std::mt19937 rng(testing::test_seed(5));
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  const size_t rows = 2, cols = 70;
  std::vector<uint16_t> h(rows * cols), b(rows * cols);
  std::vector<float> hf(rows * cols), bf(rows * cols);
  for (size_t i = 0; i < h.size(); ++i) {
    h[i] = f32_to_f16(d(rng));
    hf[i] = f16_to_f32(h[i]);
    b[i] = f32_to_bf16(d(rng));
    bf[i] = bf16_to_f32(b[i]);
  }
  const size_t bytes = dtype_bytes(dtype::q8, rows * q8_row_elements(cols));
  std::vector<uint8_t> qh(bytes), qb(bytes);
  ASSERT_TRUE(quantize_q8(h.data(), dtype::f16, rows, cols, qh.data()).ok());
  ASSERT_TRUE(quantize_q8(b.data(), dtype::bf16, rows, cols, qb.data()).ok());
  EXPECT_EQ(qh, quantize(hf, rows, cols));
  EXPECT_EQ(qb, quantize(bf, rows, cols));
}

TEST(Quantize, RefusesNonFiniteWeightsAndQuantizedSources) {
  std::vector<float> w(2 * 40, 1.0f);
  w[40 + 7] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> out(dtype_bytes(dtype::q8, 2 * q8_row_elements(40)));
  auto s = quantize_q8(w.data(), dtype::f32, 2, 40, out.data());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::invalid_request);
  EXPECT_NE(s.err().message.find("row 1"), std::string::npos) << s.err().message;
  s = quantize_q8(w.data(), dtype::f32, 2, 40, out.data(), 300);  // rows counted from the caller's first
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("row 301"), std::string::npos) << s.err().message;
  w[40 + 7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(quantize_q8(w.data(), dtype::f32, 2, 40, out.data()).ok());
  EXPECT_FALSE(quantize_q8(out.data(), dtype::q8, 1, 32, out.data()).ok());
}

TEST(DequantizeRow, KQuantRowsAreLoadAsF32sValuesBitForBit) {
  // Random super-blocks (negative scales and mins too): the row decoder that --quantization
  // int8 and a rank's int8 slice start from gives the definition's floats, zeros' signs too.
  std::mt19937 rng(testing::test_seed(5));
  std::uniform_int_distribution<int> byte(0, 255), exponent(-14, 3);
  for (dtype t : testing::k_quant_types) {
    const size_t bb = dtype_block_bytes(t), cols = 3 * k_block;
    std::vector<uint8_t> row(3 * bb);
    for (int trial = 0; trial < 100; ++trial) {
      for (auto& b : row) b = static_cast<uint8_t>(byte(rng));
      for (size_t blk = 0; blk < 3; ++blk) {
        for (size_t at : testing::k_quant_halves(t)) {
          const float v = std::ldexp(byte(rng) < 128 ? -1.0f : 1.0f, exponent(rng));
          const uint16_t d = f32_to_f16(v);
          std::memcpy(row.data() + blk * bb + at, &d, 2);
        }
      }
      std::vector<float> out(cols);
      dequantize_row(row.data(), t, cols, out.data());
      for (size_t i = 0; i < cols; ++i) {
        const float want = load_as_f32(row.data(), t, i);
        uint32_t a, b;
        std::memcpy(&a, &out[i], 4);
        std::memcpy(&b, &want, 4);
        ASSERT_EQ(a, b) << dtype_name(t) << " element " << i << ": " << out[i] << " vs " << want;
      }
    }
  }
}

TEST(Quantize, Fp8RowsBecomeTheInt8BlocksOfTheirDecodedValues) {
  // --quantization int8 on an FP8 checkpoint: the fp8 rows (padded to whole blocks) give the
  // bytes their decoded float32 values give.
  std::mt19937 rng(testing::test_seed(77));
  std::uniform_int_distribution<int> code(0, 126);
  std::uniform_real_distribution<float> scale(0.001f, 0.1f);
  const size_t rows = 3, cols = 40, ld = q8_row_elements(cols);
  std::vector<uint8_t> fp8(dtype_bytes(dtype::fp8, rows * ld), 0);
  std::vector<float> decoded(rows * cols);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t b = 0; b < ld / q8_block; ++b) {
      uint8_t* block = fp8.data() + dtype_offset(dtype::fp8, r * ld + b * q8_block);
      const float s = scale(rng);
      std::memcpy(block, &s, 4);
      for (size_t e = 0; e < q8_block && b * q8_block + e < cols; ++e) {
        block[4 + e] = static_cast<uint8_t>(code(rng) | (e % 3 == 0 ? 0x80 : 0));
        decoded[r * cols + b * q8_block + e] = load_as_f32(block, dtype::fp8, e);
      }
    }
  }
  std::vector<uint8_t> from_fp8(dtype_bytes(dtype::q8, rows * ld)), from_f32(from_fp8.size());
  ASSERT_TRUE(quantize_q8(fp8.data(), dtype::fp8, rows, cols, from_fp8.data()).ok());
  ASSERT_TRUE(quantize_q8(decoded.data(), dtype::f32, rows, cols, from_f32.data()).ok());
  EXPECT_EQ(from_fp8, from_f32);
  EXPECT_NE(decoded[0], 0.0f);
}

TEST(QuantizeFp8, OneScalePerTensorReciprocalMultiplyAndSaturation) {
  // vLLM's online FP8: scale = max|w| / 448; code = e4m3(w · (1 / scale)), ties to even,
  // saturating; every block carries the scale; a short row's padding is code 0.
  const size_t rows = 2, cols = 40;
  std::vector<float> w(rows * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = (static_cast<float>(i % 17) - 8.0f) * 0.37f;
  w[5] = -3.5f;  // the largest magnitude: code −448
  auto amax = max_abs(w.data(), dtype::f32, rows, cols);
  ASSERT_TRUE(amax.ok());
  EXPECT_EQ(*amax, 3.5f);
  const float scale = *amax / 448.0f;
  std::vector<uint8_t> dst(dtype_bytes(dtype::fp8, rows * q8_row_elements(cols)), 0xaa);
  ASSERT_TRUE(quantize_fp8(w.data(), dtype::f32, rows, cols, scale, dst.data()).ok());
  const float inverse = 1.0f / scale;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < q8_row_elements(cols); ++c) {
      const uint8_t* block = dst.data() + dtype_offset(dtype::fp8, r * q8_row_elements(cols) + c / 32 * 32);
      float s;
      std::memcpy(&s, block, 4);
      EXPECT_EQ(s, scale);
      const uint8_t code = block[4 + c % 32];
      if (c >= cols) {
        EXPECT_EQ(code, 0) << c;
        continue;
      }
      EXPECT_EQ(code, f32_to_f8_e4m3(w[r * cols + c] * inverse)) << r << " " << c;
      // Within half an e4m3 step of the weight: the relative step is at most 2^-4 (normals).
      const float back = load_as_f32(block, dtype::fp8, c % 32);
      EXPECT_LE(std::fabs(back - w[r * cols + c]), std::fabs(w[r * cols + c]) / 16.0f + scale * 0x1p-9f) << r << " " << c;
    }
  }
  EXPECT_EQ(dst[4 + 5], 0xfe);  // −448
  // Past the scale's range saturates at ±448; a zero scale (an all-zero tensor) gives zeros.
  const float big[2] = {1000.0f, -1000.0f};
  std::vector<uint8_t> one(dtype_bytes(dtype::fp8, 32));
  ASSERT_TRUE(quantize_fp8(big, dtype::f32, 1, 2, 1.0f, one.data()).ok());
  EXPECT_EQ(one[4], 0x7e);
  EXPECT_EQ(one[5], 0xfe);
  const float zeros[2] = {0.0f, 0.0f};
  ASSERT_TRUE(quantize_fp8(zeros, dtype::f32, 1, 2, 0.0f, one.data()).ok());
  EXPECT_EQ(one[4], 0);
  EXPECT_EQ(load_as_f32(one.data(), dtype::fp8, 1), 0.0f);
  // A scale whose reciprocal overflows (weights near 1e-37): zeros stay zero, the rest saturate.
  const float tiny[3] = {0.0f, 1e-37f, -2e-37f};
  ASSERT_TRUE(quantize_fp8(tiny, dtype::f32, 1, 3, 2e-37f / 448.0f, one.data()).ok());
  EXPECT_EQ(one[4], 0);
  EXPECT_EQ(one[5], 0x7e);
  EXPECT_EQ(one[6], 0xfe);
  // Bad input: a non-finite weight (its row named), a bad scale, a quantized source.
  float nan_row[4] = {1.0f, 2.0f, NAN, 3.0f};
  std::vector<uint8_t> two(dtype_bytes(dtype::fp8, 64));
  auto bad = quantize_fp8(nan_row, dtype::f32, 2, 2, 1.0f, two.data(), 7);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("weight row 8"), std::string::npos) << bad.err().message;
  EXPECT_FALSE(max_abs(nan_row, dtype::f32, 2, 2).ok());
  EXPECT_FALSE(quantize_fp8(big, dtype::f32, 1, 2, -1.0f, one.data()).ok());
  EXPECT_FALSE(quantize_fp8(big, dtype::f32, 1, 2, INFINITY, one.data()).ok());
  EXPECT_FALSE(quantize_fp8(two.data(), dtype::q8, 1, 2, 1.0f, one.data()).ok());
}

TEST(Quantize, OffsetsAndSizesOfQ8Data) {
  EXPECT_EQ(dtype_bytes(dtype::q8, 32), 36u);
  EXPECT_EQ(dtype_bytes(dtype::q8, 33), 72u);
  EXPECT_EQ(dtype_offset(dtype::q8, 64), 72u);  // a block boundary: the block's scale
  EXPECT_EQ(dtype_offset(dtype::q8, 65), 72u + 4u + 1u);
  EXPECT_EQ(q8_row_elements(1), 32u);
  EXPECT_EQ(q8_row_elements(64), 64u);
  EXPECT_EQ(dtype_name(dtype::q8), "Q8");
}

TEST(Quantize, Q4BlocksWithWholeZerosBecomeInt8ExactlyOthersByTheRule) {
  // Row 0: two blocks f·(q − z) (z 8, then −3: a Q4_1 min of 3f): int8 values q − z with
  // scale f, the same values. Row 1: an offset that is no multiple of the factor (Q4_1's min): the rule over
  // the decoded values. cols 40: the second block is short, its padding 0.
  const size_t cols = 40, ld = 64;
  std::vector<uint8_t> q4(dtype_bytes(dtype::q4, 2 * ld));
  std::mt19937 rng(testing::test_seed(21));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : q4) b = static_cast<uint8_t>(byte(rng));
  auto set = [&](size_t block, float f, float m) {
    std::memcpy(q4.data() + block * q4_block_bytes, &f, 4);
    std::memcpy(q4.data() + block * q4_block_bytes + 4, &m, 4);
  };
  set(0, 0.0078125f, 8 * 0.0078125f);
  const float f = f16_to_f32(f32_to_f16(0.3f));  // a float16 scale: f·−3 is exact
  set(1, f, -3 * f);
  set(2, 0.25f, -1.3f);
  set(3, 0.5f, 0.1f);
  std::vector<uint8_t> out(dtype_bytes(dtype::q8, 2 * ld));
  ASSERT_TRUE(quantize_q8(q4.data(), dtype::q4, 2, cols, out.data()).ok());
  for (size_t c = 0; c < cols; ++c) {
    EXPECT_EQ(load_as_f32(out.data(), dtype::q8, c), load_as_f32(q4.data(), dtype::q4, c)) << c;
  }
  float scale;
  std::memcpy(&scale, out.data() + q8_block_bytes, 4);
  EXPECT_EQ(scale, f);
  for (size_t c = cols; c < ld; ++c) EXPECT_EQ(out[q8_block_bytes + 4 + c - 32], 0u) << "padding " << c;
  std::vector<float> row1(cols);
  for (size_t c = 0; c < cols; ++c) row1[c] = load_as_f32(q4.data() + dtype_offset(dtype::q4, ld), dtype::q4, c);
  std::vector<uint8_t> rule(dtype_bytes(dtype::q8, ld));
  ASSERT_TRUE(quantize_q8(row1.data(), dtype::f32, 1, cols, rule.data()).ok());
  EXPECT_EQ(std::memcmp(rule.data(), out.data() + dtype_offset(dtype::q8, ld), rule.size()), 0);
}

}  // namespace
}  // namespace llmesh::kernels
