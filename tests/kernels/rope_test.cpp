// Tests of rotary position embedding: inverse frequencies (default, llama3-, yarn- and
// longrope-scaled), the per-position angles and their scale, and the rotate_half application
// (over the whole head or its first part).
#include "llmesh/kernels/rope.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

namespace llmesh::kernels {
namespace {

constexpr double two_pi = 2.0 * std::numbers::pi;

/// Llama 3.1's rope_scaling: theta 500000, factor 8, low 1, high 4, original context 8192.
rope_config llama31_config() {
  rope_config cfg;
  cfg.head_dim = 128;
  cfg.theta = 500000.0;
  cfg.llama3 = true;
  cfg.factor = 8.0;
  cfg.low_freq_factor = 1.0;
  cfg.high_freq_factor = 4.0;
  cfg.original_max_position = 8192.0;
  return cfg;
}

TEST(RopeInvFreq, DefaultMatchesTheFormula) {
  for (double theta : {10000.0, 500000.0, 1000000.0}) {
    for (size_t head_dim : {2, 8, 64, 128}) {
      rope_config cfg;
      cfg.head_dim = head_dim;
      cfg.theta = theta;
      std::vector<double> inv = rope_inv_freq(cfg);
      ASSERT_EQ(inv.size(), head_dim / 2);
      for (size_t i = 0; i < inv.size(); ++i) {
        double want = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
        EXPECT_NEAR(inv[i], want, 1e-14 * want) << "theta " << theta << " d " << head_dim << " i " << i;
      }
      EXPECT_EQ(inv[0], 1.0);
    }
  }
}

TEST(RopeInvFreq, LinearScalingDividesEveryFrequency) {
  rope_config plain;
  plain.head_dim = 64;
  plain.theta = 1e6;
  rope_config linear = plain;
  linear.linear_factor = 8.0;
  const auto a = rope_inv_freq(plain), b = rope_inv_freq(linear);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_DOUBLE_EQ(b[i], a[i] / 8.0) << i;
}

TEST(RopeInvFreq, Llama3ScalesEachBandByItsRule) {
  rope_config plain = llama31_config();
  plain.llama3 = false;
  const std::vector<double> base = rope_inv_freq(plain);
  const std::vector<double> scaled = rope_inv_freq(llama31_config());
  ASSERT_EQ(scaled.size(), 64u);
  const double high_wavelen = 8192.0 / 4.0, low_wavelen = 8192.0 / 1.0;
  int n_high = 0, n_low = 0, n_mid = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    double wavelen = two_pi / base[i];
    if (wavelen < high_wavelen) {  // high frequencies: unchanged
      EXPECT_EQ(scaled[i], base[i]) << "i " << i;
      ++n_high;
    } else if (wavelen > low_wavelen) {  // low frequencies: divided by the factor
      EXPECT_NEAR(scaled[i], base[i] / 8.0, 1e-15 * base[i]) << "i " << i;
      ++n_low;
    } else {  // in between: interpolated, and strictly between the two
      double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      EXPECT_NEAR(scaled[i], (1.0 - smooth) * base[i] / 8.0 + smooth * base[i], 1e-14 * base[i]) << "i " << i;
      EXPECT_GT(scaled[i], base[i] / 8.0) << "i " << i;
      EXPECT_LT(scaled[i], base[i]) << "i " << i;
      ++n_mid;
    }
  }
  // With these settings indices 0-28 are high, 29-34 in the band, 35-63 low.
  EXPECT_EQ(n_high, 29);
  EXPECT_EQ(n_mid, 6);
  EXPECT_EQ(n_low, 29);
}

TEST(RopeInvFreq, Llama3SmoothBandMatchesAHandComputedValue) {
  // i = 32 of head_dim 128, theta 500000: f = 500000^(-1/2) = 1/707.10678... = 0.0014142135623730950
  // wavelength 2π/f = 4442.882938...; smooth = (8192/4442.882938 - 1) / 3 = 0.2812826051632510
  // scaled = f · ((1 - smooth)/8 + smooth) = 0.00052484616099295...
  const std::vector<double> scaled = rope_inv_freq(llama31_config());
  EXPECT_NEAR(scaled[32], 5.248461609929547e-4, 1e-15);
  // The last index of the band (i = 34) and the first low one (i = 35), from the same formulas.
  EXPECT_NEAR(scaled[34], 1.7850781276799638e-4, 1e-16);
  EXPECT_NEAR(scaled[35], 7.644969883171747e-4 / 8.0, 1e-17);
}

TEST(RopeAngles, AreCosAndSinOfPositionTimesFrequencyRoundedOnce) {
  rope_config cfg;
  cfg.head_dim = 64;
  cfg.theta = 10000.0;
  std::vector<double> inv = rope_inv_freq(cfg);
  std::vector<float> c(32), s(32);
  for (size_t pos : {0, 1, 2, 17, 1000, 131071}) {
    rope_angles(inv, pos, c.data(), s.data());
    for (size_t i = 0; i < 32; ++i) {
      double a = static_cast<double>(pos) * inv[i];
      EXPECT_EQ(c[i], static_cast<float>(std::cos(a))) << "pos " << pos << " i " << i;
      EXPECT_EQ(s[i], static_cast<float>(std::sin(a))) << "pos " << pos << " i " << i;
    }
  }
  rope_angles(inv, 0, c.data(), s.data());
  for (size_t i = 0; i < 32; ++i) {
    EXPECT_EQ(c[i], 1.0f);
    EXPECT_EQ(s[i], 0.0f);
  }
}

TEST(RopeApply, RotatesPairsHalfADimensionApart) {
  // head_dim 4: pairs are (v[0], v[2]) and (v[1], v[3]) — rotate_half, not interleaved.
  // Pair 0 turns by 90° (cos 0, sin 1), pair 1 by atan2(0.8, 0.6).
  const float cos[] = {0.0f, 0.6f};
  const float sin[] = {1.0f, 0.8f};
  float v[] = {1.0f, 2.0f, 3.0f, 4.0f,     // head 0
               -1.0f, 0.5f, 2.0f, -3.0f};  // head 1: same angles, its own values
  rope_apply(v, 2, 4, 4, cos, sin);
  // v[0] = a·cos − b·sin, v[2] = b·cos + a·sin with (a, b) = (v[0], v[2]).
  EXPECT_FLOAT_EQ(v[0], 1 * 0.0f - 3 * 1.0f);  // -3
  EXPECT_FLOAT_EQ(v[2], 3 * 0.0f + 1 * 1.0f);  // 1
  EXPECT_FLOAT_EQ(v[1], 2 * 0.6f - 4 * 0.8f);  // -2
  EXPECT_FLOAT_EQ(v[3], 4 * 0.6f + 2 * 0.8f);  // 4
  EXPECT_FLOAT_EQ(v[4], -1 * 0.0f - 2 * 1.0f);     // -2
  EXPECT_FLOAT_EQ(v[6], 2 * 0.0f + -1 * 1.0f);     // -1
  EXPECT_FLOAT_EQ(v[5], 0.5f * 0.6f - -3 * 0.8f);  // 2.7
  EXPECT_FLOAT_EQ(v[7], -3 * 0.6f + 0.5f * 0.8f);  // -1.4
}

TEST(RopeApply, IdentityAngleLeavesVectorUnchanged) {
  std::vector<float> c(8, 1.0f), s(8, 0.0f);
  std::vector<float> v(3 * 16);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.37f - 5.0f;
  std::vector<float> before = v;
  rope_apply(v.data(), 3, 16, 16, c.data(), s.data());
  EXPECT_EQ(v, before);
}

TEST(RopeApply, PreservesTheNormOfEveryPair) {
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> val(-4.0f, 4.0f);
  for (bool llama3 : {false, true}) {
    rope_config cfg = llama31_config();
    cfg.llama3 = llama3;
    std::vector<double> inv = rope_inv_freq(cfg);
    std::vector<float> c(64), s(64);
    const size_t n_heads = 4;
    for (size_t pos : {1, 7, 100, 4096, 100000}) {
      rope_angles(inv, pos, c.data(), s.data());
      std::vector<float> v(n_heads * 128);
      for (float& x : v) x = val(rng);
      std::vector<float> before = v;
      rope_apply(v.data(), n_heads, 128, 128, c.data(), s.data());
      for (size_t h = 0; h < n_heads; ++h) {
        for (size_t i = 0; i < 64; ++i) {
          const float* b = before.data() + h * 128;
          const float* a = v.data() + h * 128;
          double n0 = std::hypot(static_cast<double>(b[i]), static_cast<double>(b[i + 64]));
          double n1 = std::hypot(static_cast<double>(a[i]), static_cast<double>(a[i + 64]));
          ASSERT_NEAR(n1, n0, 1e-6 * n0 + 1e-6) << "pos " << pos << " head " << h << " pair " << i;
          // And the pair really turned by the angle: compare with a double rotation.
          double ang = static_cast<double>(pos) * inv[i];
          double want_lo = b[i] * std::cos(ang) - b[i + 64] * std::sin(ang);
          double want_hi = b[i + 64] * std::cos(ang) + b[i] * std::sin(ang);
          ASSERT_NEAR(a[i], want_lo, 2e-6 * n0 + 1e-6) << "pos " << pos << " head " << h << " pair " << i;
          ASSERT_NEAR(a[i + 64], want_hi, 2e-6 * n0 + 1e-6) << "pos " << pos << " head " << h << " pair " << i;
        }
      }
    }
  }
}

/// Qwen3's YaRN recipe (theta 1e6, factor 4 over 32768 positions, head_dim 128): the frequencies
/// turning more than 32 times over 32768 positions (i <= 23, by hand: 128·ln(32768 / 64π) /
/// (2·ln 1e6) = 23.6, rounded down) keep their value, those turning less than once (i >= 40:
/// 39.65 rounded up) are divided by 4, and a linear ramp over i joins them.
TEST(RopeInvFreq, YarnKeepsFastFrequenciesStretchesSlowOnesAndRampsBetween) {
  rope_config plain;
  plain.head_dim = 128;
  plain.theta = 1e6;
  rope_config yarn = plain;
  yarn.yarn = true;
  yarn.factor = 4.0;
  yarn.original_max_position = 32768;
  const auto a = rope_inv_freq(plain), b = rope_inv_freq(yarn);
  ASSERT_EQ(b.size(), 64u);
  for (size_t i = 0; i < 64; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - 23.0) / 17.0, 0.0, 1.0);
    EXPECT_NEAR(b[i], a[i] * (1.0 - ramp) + a[i] / 4.0 * ramp, 1e-15 * a[i]) << i;
  }
  EXPECT_EQ(b[23], a[23]);
  EXPECT_EQ(b[63], a[63] / 4.0);
  EXPECT_DOUBLE_EQ(rope_scale(yarn), 1.0);  // the parser sets attention_factor; 1 until then
  yarn.attention_factor = 1.25;
  EXPECT_DOUBLE_EQ(rope_scale(yarn), 1.25);
  EXPECT_DOUBLE_EQ(rope_scale(plain), 1.0);
  yarn.yarn_truncate = false;  // gpt-oss: the ends unrounded (23.6 .. 39.65)
  const auto c = rope_inv_freq(yarn);
  EXPECT_EQ(c[23], a[23]);  // still before the ramp
  EXPECT_GT(c[24], b[24]);  // 0.025 of the way down at 24 (0.4 / 16.05), not 1/17
  EXPECT_LT(c[24], a[24]);
}

TEST(RopeInvFreq, LongropeDividesEachFrequencyByItsFactor) {
  rope_config cfg;
  cfg.head_dim = 8;
  cfg.longrope = true;
  cfg.short_factor = {1.0, 2.0, 3.0, 4.0};
  cfg.long_factor = {5.0, 6.0, 7.0, 8.0};
  cfg.short_mscale = 1.1;
  cfg.long_mscale = 1.2;
  rope_config plain;
  plain.head_dim = 8;
  const auto base = rope_inv_freq(plain);
  auto s = rope_inv_freq(cfg);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(s[i], base[i] / static_cast<double>(i + 1));
  EXPECT_DOUBLE_EQ(rope_scale(cfg), 1.1);
  cfg.use_long = true;
  s = rope_inv_freq(cfg);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(s[i], base[i] / static_cast<double>(i + 5));
  EXPECT_DOUBLE_EQ(rope_scale(cfg), 1.2);
}

TEST(RopeAngles, AScaleMultipliesCosAndSin) {
  const std::vector<double> inv = {1.0, 0.25, 1e-3};
  float c[3], s[3], cs[3], ss[3];
  rope_angles(inv, 37, c, s);
  rope_angles(inv, 37, cs, ss, 1.19);
  for (size_t i = 0; i < 3; ++i) {
    const double a = 37.0 * inv[i];
    EXPECT_EQ(c[i], static_cast<float>(std::cos(a)));
    EXPECT_EQ(cs[i], static_cast<float>(std::cos(a) * 1.19));
    EXPECT_EQ(ss[i], static_cast<float>(std::sin(a) * 1.19));
  }
}

TEST(RopeApply, APartialRotaryTurnsTheHeadsFirstDimsAndLeavesTheRest) {
  // head_dim 10, rotary_dim 6: pairs (0, 3), (1, 4), (2, 5) turn; 6..9 pass.
  const float cos[] = {0.0f, 0.6f, 1.0f};
  const float sin[] = {1.0f, 0.8f, 0.0f};
  std::vector<float> v(2 * 10);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) - 7.5f;
  std::vector<float> want = v;
  for (size_t h = 0; h < 2; ++h) rope_apply(&want[h * 10], 1, 6, 6, cos, sin);  // the first 6 as a head of their own
  rope_apply(v.data(), 2, 10, 6, cos, sin);
  EXPECT_EQ(v, want);
  EXPECT_EQ(v[6], -1.5f);  // untouched
  EXPECT_EQ(v[19], 11.5f);
  EXPECT_NE(v[0], -7.5f);
}

}  // namespace
}  // namespace llmesh::kernels
