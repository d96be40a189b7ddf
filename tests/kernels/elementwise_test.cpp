// Tests of the row-wise ops in elementwise.hpp: exp_det against std::exp, rmsnorm and swiglu
// against double-precision references, and add_inplace.
#include "llmesh/kernels/elementwise.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

namespace llmesh::kernels {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

double relative_error(float got, double want) { return std::fabs(static_cast<double>(got) - want) / std::fabs(want); }

TEST(ExpDet, StaysWithinRelativeErrorOfStdExpOverItsRange) {
  // A dense sweep of [-87, 88] (step 2^-12, about 717,000 points), plus random floats.
  double worst = 0.0;
  float worst_x = 0.0f;
  auto check = [&](float x) {
    double err = relative_error(exp_det(x), std::exp(static_cast<double>(x)));
    if (err > worst) {
      worst = err;
      worst_x = x;
    }
  };
  for (int i = -87 * 4096; i <= 88 * 4096; ++i) check(static_cast<float>(i) / 4096.0f);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> any(-87.0f, 88.0f);
  for (int i = 0; i < 200000; ++i) check(any(rng));
  for (float x : {-87.0f, -86.99999f, -1e-7f, 1e-7f, 0.5f, 88.0f, 87.99999f}) check(x);
  EXPECT_LT(worst, 4e-7) << "at x = " << worst_x;
}

TEST(ExpDet, IsExactlyOneAtZero) {
  EXPECT_EQ(exp_det(0.0f), 1.0f);
  EXPECT_EQ(exp_det(-0.0f), 1.0f);
}

TEST(ExpDet, IsExactlyZeroBelowTheCutoff) {
  for (float x : {-87.31f, -87.5f, -88.0f, -100.0f, -1e30f, -std::numeric_limits<float>::max(),
                  -std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(bits_of(exp_det(x)), 0u) << "x = " << x;
  }
  EXPECT_GT(exp_det(-87.29f), 0.0f);
}

TEST(ExpDet, ClampsAboveTheTopOfTheRange) {
  const float top = exp_det(88.3f);
  EXPECT_TRUE(std::isfinite(top));
  EXPECT_LT(relative_error(top, std::exp(static_cast<double>(88.3f))), 4e-7);
  for (float x : {88.31f, 89.0f, 100.0f, 1e30f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(bits_of(exp_det(x)), bits_of(top)) << "x = " << x;
  }
}

TEST(ExpDet, IsMonotonicOnAFineGrid) {
  float prev = exp_det(-87.0f);
  for (int i = -87 * 1024 + 1; i <= 88 * 1024; ++i) {
    float x = static_cast<float>(i) / 1024.0f;
    float y = exp_det(x);
    ASSERT_GE(y, prev) << "x = " << x;
    prev = y;
  }
}

/// HF LlamaRMSNorm in double: x / sqrt(mean(x²) + eps) * weight.
std::vector<double> rmsnorm_reference(const std::vector<float>& x, const std::vector<float>& w, double eps) {
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * scale * w[i];
  return out;
}

TEST(Rmsnorm, MatchesDoublePrecisionReference) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> val(-3.0f, 3.0f);
  for (size_t n : {1, 7, 16, 17, 100, 4096}) {
    for (float eps : {1e-5f, 1e-6f}) {
      for (float magnitude : {1e-3f, 1.0f, 1e3f}) {
        std::vector<float> x(n), w(n);
        for (size_t i = 0; i < n; ++i) {
          x[i] = val(rng) * magnitude;
          w[i] = val(rng);
        }
        std::vector<float> out(n + 1, std::numeric_limits<float>::quiet_NaN());
        rmsnorm(x.data(), w.data(), out.data(), n, eps);
        std::vector<double> ref = rmsnorm_reference(x, w, eps);
        for (size_t i = 0; i < n; ++i) {
          // Each output is a product of a few correctly rounded terms: a few ulp of the output.
          ASSERT_NEAR(out[i], ref[i], 1e-5 * std::fabs(ref[i]) + 1e-30)
              << "n=" << n << " eps=" << eps << " magnitude=" << magnitude << " i=" << i;
        }
        EXPECT_TRUE(std::isnan(out[n])) << "wrote past the row, n=" << n;
      }
    }
  }
}

TEST(Rmsnorm, EpsilonDominatesATinyRow) {
  // mean(x²) = 1e-12 is far below eps = 1e-5: the scale is ~1/sqrt(eps), not 1/rms.
  std::vector<float> x = {1e-6f, -1e-6f, 1e-6f, -1e-6f};
  std::vector<float> w = {1.0f, 1.0f, 2.0f, 0.5f};
  std::vector<float> out(4);
  rmsnorm(x.data(), w.data(), out.data(), 4, 1e-5f);
  std::vector<double> ref = rmsnorm_reference(x, w, 1e-5);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(out[i], ref[i], 1e-5 * std::fabs(ref[i]));
  EXPECT_NEAR(out[0], 1e-6 / std::sqrt(1e-5), 1e-9);
}

TEST(Rmsnorm, GivesTheSameBitsInPlace) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> val(-2.0f, 2.0f);
  const size_t n = 333;
  std::vector<float> x(n), w(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = val(rng);
    w[i] = val(rng);
  }
  std::vector<float> out(n);
  rmsnorm(x.data(), w.data(), out.data(), n, 1e-6f);
  rmsnorm(x.data(), w.data(), x.data(), n, 1e-6f);
  EXPECT_EQ(std::memcmp(out.data(), x.data(), n * sizeof(float)), 0);
}

TEST(Swiglu, MatchesDoublePrecisionReference) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> gate_val(-20.0f, 20.0f), up_val(-4.0f, 4.0f);
  const size_t n = 5000;
  std::vector<float> gate(n), up(n);
  for (size_t i = 0; i < n; ++i) {
    gate[i] = gate_val(rng);
    up[i] = up_val(rng);
  }
  // Hand-picked gates: zero, the saturated ends, and values where exp(-g) over/underflows.
  const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 50.0f, -50.0f, 87.0f, -80.0f, 100.0f};
  for (size_t i = 0; i < std::size(special); ++i) gate[i] = special[i];
  std::vector<float> out(n + 1, std::numeric_limits<float>::quiet_NaN());
  swiglu(gate.data(), up.data(), out.data(), n);
  for (size_t i = 0; i < n; ++i) {
    double g = gate[i];
    double ref = g / (1.0 + std::exp(-g)) * up[i];
    ASSERT_NEAR(out[i], ref, 2e-6 * std::fabs(ref) + 1e-30) << "gate " << gate[i] << " up " << up[i];
  }
  EXPECT_TRUE(std::isnan(out[n]));
}

TEST(Swiglu, GivesTheSameBitsInPlace) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> val(-8.0f, 8.0f);
  const size_t n = 257;
  std::vector<float> gate(n), up(n);
  for (size_t i = 0; i < n; ++i) {
    gate[i] = val(rng);
    up[i] = val(rng);
  }
  std::vector<float> out(n);
  swiglu(gate.data(), up.data(), out.data(), n);
  swiglu(gate.data(), up.data(), gate.data(), n);
  EXPECT_EQ(std::memcmp(out.data(), gate.data(), n * sizeof(float)), 0);
}

TEST(TanhDet, StaysWithinRelativeErrorOfStdTanh) {
  // Dense over the branch point (0.125), the polynomial's range and the saturated ends.
  double worst = 0.0;
  for (float x = -12.0f; x <= 12.0f; x += 0.000731f) {
    const double want = std::tanh(static_cast<double>(x));
    const double got = tanh_det(x);
    if (want != 0.0) worst = std::max(worst, std::fabs(got - want) / std::fabs(want));
  }
  EXPECT_LT(worst, 1e-6);
  for (float x : {1e-30f, 1e-8f, 0.1249999f, 0.125f, 40.0f, 100.0f, 1e30f}) {
    EXPECT_NEAR(tanh_det(x), std::tanh(static_cast<double>(x)), 1e-6 * std::tanh(static_cast<double>(x))) << x;
    EXPECT_EQ(bits_of(tanh_det(-x)), bits_of(-tanh_det(x))) << "odd at " << x;
  }
  EXPECT_EQ(tanh_det(0.0f), 0.0f);
  EXPECT_EQ(tanh_det(1e30f), 1.0f);
}

TEST(Softcap, IsCapTimesTanhOfTheQuotient) {
  std::vector<float> x = {0.0f, 1.0f, -3.0f, 29.0f, 30.0f, 1000.0f, -1e6f};
  const std::vector<float> in = x;
  softcap_inplace(x.data(), x.size(), 30.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = 30.0 * std::tanh(static_cast<double>(in[i]) / 30.0);
    EXPECT_NEAR(x[i], want, 2e-6 * std::fabs(want) + 1e-30) << in[i];
    EXPECT_LE(std::fabs(x[i]), 30.0f);
  }
}

TEST(GegluTanh, MatchesDoublePrecisionReference) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> gate_val(-12.0f, 12.0f), up_val(-4.0f, 4.0f);
  const size_t n = 5000;
  std::vector<float> gate(n), up(n);
  for (size_t i = 0; i < n; ++i) {
    gate[i] = gate_val(rng);
    up[i] = up_val(rng);
  }
  const float special[] = {0.0f, 1.0f, -1.0f, 0.01f, -0.01f, 50.0f, -50.0f, 1e4f, -1e4f};
  for (size_t i = 0; i < std::size(special); ++i) gate[i] = special[i];
  std::vector<float> out(n + 1, std::numeric_limits<float>::quiet_NaN());
  geglu_tanh(gate.data(), up.data(), out.data(), n);
  for (size_t i = 0; i < n; ++i) {  // PyTorch's gelu(approximate="tanh") times up, in double
    const double g = gate[i];
    const double ref = 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (g + 0.044715 * g * g * g))) * up[i];
    // Where tanh nears -1 (g << 0), 1 + tanh cancels: a float tanh's absolute error (~6e-8),
    // times |g·up| / 2, bounds the error there (as in PyTorch's float32 kernel).
    ASSERT_NEAR(out[i], ref, 4e-6 * std::fabs(ref) + 2e-7 * std::fabs(g * up[i])) << "gate " << gate[i];
  }
  EXPECT_TRUE(std::isnan(out[n]));
  std::vector<float> in_place = gate;
  geglu_tanh(in_place.data(), up.data(), in_place.data(), n);
  EXPECT_EQ(std::memcmp(out.data(), in_place.data(), n * sizeof(float)), 0);
}

TEST(GptOssGlu, ClampsThenMatchesDoublePrecisionReference) {
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> val(-12.0f, 12.0f);
  const size_t n = 5000;
  const float limit = 7.0f;
  std::vector<float> gate(n), up(n);
  for (size_t i = 0; i < n; ++i) {
    gate[i] = val(rng);
    up[i] = val(rng);
  }
  const float special[] = {0.0f, 7.0f, -7.0f, 7.5f, -7.5f, 1e4f, -1e4f, -50.0f, 0.01f};
  for (size_t i = 0; i < std::size(special); ++i) gate[i] = up[std::size(special) - 1 - i] = special[i];
  std::vector<float> out(n + 1, std::numeric_limits<float>::quiet_NaN());
  gpt_oss_glu(gate.data(), up.data(), out.data(), n, limit);
  for (size_t i = 0; i < n; ++i) {  // HF GptOssExperts, in double
    const double g = std::min<double>(gate[i], limit), u = std::clamp<double>(up[i], -limit, limit);
    const double ref = (u + 1.0) * (g / (1.0 + std::exp(-1.702 * g)));
    ASSERT_NEAR(out[i], ref, 4e-6 * std::fabs(ref) + 1e-30) << "gate " << gate[i] << " up " << up[i];
  }
  // A gate of 1e4 acts as the limit: the same output as a gate of 7 with the same up.
  const float big = 1e4f, seven = 7.0f, u = 2.5f;
  float a, b;
  gpt_oss_glu(&big, &u, &a, 1, limit);
  gpt_oss_glu(&seven, &u, &b, 1, limit);
  EXPECT_EQ(a, b);
  EXPECT_GT(a, 20.0f);
  EXPECT_TRUE(std::isnan(out[n]));
  std::vector<float> in_place = gate;
  gpt_oss_glu(in_place.data(), up.data(), in_place.data(), n, limit);
  EXPECT_EQ(std::memcmp(out.data(), in_place.data(), n * sizeof(float)), 0);
}

TEST(AddInplace, AddsElementwiseInFloat) {
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> val(-1e4f, 1e4f);
  for (size_t n : {0, 1, 7, 16, 33, 1000}) {
    std::vector<float> x(n + 1), delta(n + 1);
    for (size_t i = 0; i <= n; ++i) {
      x[i] = val(rng);
      delta[i] = val(rng) * 1e-4f;
    }
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = x[i] + delta[i];
    const float after_end = x[n];
    add_inplace(x.data(), delta.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(x[i]), bits_of(want[i])) << "n=" << n << " i=" << i;
    EXPECT_EQ(bits_of(x[n]), bits_of(after_end)) << "wrote past the row, n=" << n;
  }
}

}  // namespace
}  // namespace llmesh::kernels
