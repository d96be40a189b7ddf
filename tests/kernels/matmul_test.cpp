// Tests of matmul() and dot(): accuracy against a double-precision reference, bit-exactness
// against dot_reference() (the scalar oracle of the canonical reduction order) on every
// instruction set the CPU supports, batch- and thread-count invariance, and argument checks.
//
// The instruction set is chosen once per process from LLMESH_ISA, so
// Matmul.MatchesDotReferenceBitwiseOnEverySupportedIsa re-runs this binary's Matmul/Dot tests
// once per supported level with LLMESH_ISA set (LLMESH_KERNELS_TEST_CHILD marks those runs).
#include "k_quant_blocks.hpp"
#include "test_seed.hpp"
#include "llmesh/kernels/matmul.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "llmesh/kernels/cpu_features.hpp"

namespace llmesh::kernels {
namespace {

constexpr float poison = std::numeric_limits<float>::quiet_NaN();
constexpr uint16_t f16_nan = 0x7e00;
constexpr uint16_t bf16_nan = 0x7fc0;

constexpr dtype all_dtypes[] = {dtype::f32,  dtype::f16,  dtype::bf16, dtype::q8,   dtype::fp8,  dtype::q4,
                                 dtype::mxfp4, dtype::q2_k, dtype::q3_k, dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::iq4_xs};
constexpr size_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
constexpr size_t ns[] = {1, 5, 7, 13, 37};

bool k_quant(dtype t) { return dtype_block(t) == k_block; }

/// Row lengths to test: K-quant rows are whole super-blocks of 256.
std::vector<size_t> ks_for(dtype t, std::initializer_list<size_t> plain) {
  if (k_quant(t)) return {256, 512, 768};
  return plain;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

/// A value in ±[2^-6, 2^6): mixed magnitudes, so a different summation order changes the bits.
float random_value(std::mt19937& rng) {
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp2(-6, 6);
  return std::ldexp(mant(rng), exp2(rng));
}

/// Activations [m][ldx]; columns >= k are poisoned with NaN.
std::vector<float> make_activations(size_t m, size_t k, size_t ldx, std::mt19937& rng) {
  std::vector<float> x(m * ldx, poison);
  for (size_t i = 0; i < m; ++i)
    for (size_t q = 0; q < k; ++q) x[i * ldx + q] = random_value(rng);
  return x;
}

/// Weights [n][ldw] of one dtype; columns >= k are poisoned with that dtype's NaN (q8: with
/// the value 127, fp8 with the code of 448, q4 with the nibble 15, which change any sum that reads them, since a block's
/// scale is shared; q4's blocks wholly past k a NaN factor; the K-quants: a NaN scale d in each
/// padding super-block).
struct weight_matrix {
  dtype type = dtype::f32;
  size_t n = 0, k = 0, ldw = 0;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  std::vector<uint8_t> q8;

  const void* data() const {
    if (is_quantized(type)) return q8.data();
    return type == dtype::f32 ? static_cast<const void*>(f32.data()) : static_cast<const void*>(half.data());
  }
  const void* row(size_t j) const { return static_cast<const uint8_t*>(data()) + dtype_offset(type, j * ldw); }
  float at(size_t j, size_t q) const { return load_as_f32(data(), type, j * ldw + q); }
};

/// Block-type rows are whole blocks: the tight ldw is k rounded up to a block, the padded one a
/// block more.
size_t weight_ld(dtype t, size_t k, bool padded) {
  const size_t b = dtype_block(t);
  if (b > 1) return (k + b - 1) / b * b + (padded ? b : 0);
  return padded ? k + 5 : k;
}

/// Random K-quant super-blocks: every quant, scale and min byte random, d and dmin random
/// float16 values of mixed magnitude (NaN in the blocks past k).
void fill_k_quant(weight_matrix& w, std::mt19937& rng) {
  const dtype t = w.type;
  w.q8.resize(dtype_bytes(t, w.n * w.ldw));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : w.q8) b = static_cast<uint8_t>(byte(rng));
  for (size_t j = 0; j < w.n; ++j) {
    for (size_t b = 0; b < w.ldw / k_block; ++b) {
      uint8_t* block = w.q8.data() + dtype_offset(t, j * w.ldw + b * k_block);
      const bool pad = b * k_block >= w.k;
      for (size_t at : testing::k_quant_halves(t)) {
        const uint16_t d = pad ? f16_nan : f32_to_f16(random_value(rng) / 256.0f);
        std::memcpy(block + at, &d, 2);
      }
    }
  }
}

weight_matrix make_weights(dtype t, size_t n, size_t k, size_t ldw, std::mt19937& rng) {
  weight_matrix w{t, n, k, ldw, {}, {}, {}};
  if (k_quant(t)) {
    fill_k_quant(w, rng);
    return w;
  }
  if (t == dtype::q8) {  // every int8 value (-128 too, which quantize_q8 never makes) and random scales
    w.q8.assign(dtype_bytes(t, n * ldw), 127);
    std::uniform_int_distribution<int> value(-128, 127);
    for (size_t j = 0; j < n; ++j) {
      for (size_t b = 0; b < ldw / q8_block; ++b) {
        uint8_t* block = w.q8.data() + dtype_offset(t, j * ldw + b * q8_block);
        const float scale = random_value(rng) / 64.0f;
        std::memcpy(block, &scale, 4);
        for (size_t q = 0; q < q8_block && b * q8_block + q < k; ++q) block[4 + q] = static_cast<uint8_t>(value(rng));
      }
    }
    return w;
  }
  if (t == dtype::fp8) {  // every code but NaN's (subnormals, ±0 and ±448 too) and random scales of mixed size
    w.q8.assign(dtype_bytes(t, n * ldw), 0x7e);
    std::uniform_int_distribution<int> code(0, 253);
    for (size_t j = 0; j < n; ++j) {
      for (size_t b = 0; b < ldw / q8_block; ++b) {
        uint8_t* block = w.q8.data() + dtype_offset(t, j * ldw + b * q8_block);
        const float scale = random_value(rng) / 64.0f;
        std::memcpy(block, &scale, 4);
        for (size_t q = 0; q < q8_block && b * q8_block + q < k; ++q) {
          const int c = code(rng);
          block[4 + q] = static_cast<uint8_t>(c < 127 ? c : c + 1);  // 0..0x7e, 0x80..0xfe: skips 0x7f and 0xff
        }
      }
    }
    return w;
  }
  if (t == dtype::q4) {  // every nibble, random factors and offsets (not multiples of each other)
    w.q8.assign(dtype_bytes(t, n * ldw), 0xFF);
    std::uniform_int_distribution<int> nibble(0, 15);
    for (size_t j = 0; j < n; ++j) {
      for (size_t b = 0; b < ldw / q4_block; ++b) {
        uint8_t* block = w.q8.data() + dtype_offset(t, j * ldw + b * q4_block);
        const float f = b * q4_block < k ? random_value(rng) / 64.0f : poison, m = random_value(rng) / 8.0f;
        std::memcpy(block, &f, 4);
        std::memcpy(block + 4, &m, 4);
        for (size_t q = 0; q < q4_block && b * q4_block + q < k; ++q) {
          const int shift = q < 16 ? 0 : 4;
          block[8 + q % 16] = static_cast<uint8_t>((block[8 + q % 16] & ~(0xF << shift)) | (nibble(rng) << shift));
        }
      }
    }
    return w;
  }
  if (t == dtype::mxfp4) {  // every nibble, power-of-two scales from 2^-128 (a subnormal) up
    w.q8.assign(dtype_bytes(t, n * ldw), 0xFF);
    std::uniform_int_distribution<int> nibble(0, 15), exponent(-8, 2);
    for (size_t j = 0; j < n; ++j) {
      for (size_t b = 0; b < ldw / mxfp4_block; ++b) {
        uint8_t* block = w.q8.data() + dtype_offset(t, j * ldw + b * mxfp4_block);
        const float s = b * mxfp4_block >= k ? poison : (j + b) % 7 == 3 ? std::ldexp(1.0f, -128) : std::ldexp(1.0f, exponent(rng));
        std::memcpy(block, &s, 4);
        for (size_t q = 0; q < mxfp4_block && b * mxfp4_block + q < k; ++q) {
          const int shift = q < 16 ? 0 : 4;
          block[4 + q % 16] = static_cast<uint8_t>((block[4 + q % 16] & ~(0xF << shift)) | (nibble(rng) << shift));
        }
      }
    }
    return w;
  }
  if (t == dtype::f32) {
    w.f32.assign(n * ldw, poison);
  } else {
    w.half.assign(n * ldw, t == dtype::f16 ? f16_nan : bf16_nan);
  }
  for (size_t j = 0; j < n; ++j) {
    for (size_t q = 0; q < k; ++q) {
      float v = random_value(rng);
      if (t == dtype::f32) w.f32[j * ldw + q] = v;
      else if (t == dtype::f16) w.half[j * ldw + q] = f32_to_f16(v);
      else w.half[j * ldw + q] = f32_to_bf16(v);
    }
  }
  return w;
}

/// One matmul problem with poisoned padding everywhere and an output with one spare row.
struct problem {
  size_t m, n, k, ldx, ldw, ldy;
  std::vector<float> x;
  weight_matrix w;
  std::vector<float> bias;  // empty: no bias
  std::vector<float> y;     // [(m + 1)][ldy], NaN before the call

  matmul_args args() {
    matmul_args a;
    a.x = x.data();
    a.ldx = ldx;
    a.w = w.data();
    a.ldw = ldw;
    a.w_type = w.type;
    a.bias = bias.empty() ? nullptr : bias.data();
    a.y = y.data();
    a.ldy = ldy;
    a.m = m;
    a.n = n;
    a.k = k;
    return a;
  }
};

problem make_problem(dtype t, size_t m, size_t n, size_t k, bool padded, bool with_bias, std::mt19937& rng) {
  problem p{m, n, k, padded ? k + 3 : k, weight_ld(t, k, padded), padded ? n + 2 : n, {}, {}, {}, {}};
  p.x = make_activations(m, k, p.ldx, rng);
  p.w = make_weights(t, n, k, p.ldw, rng);
  if (with_bias)
    for (size_t j = 0; j < n; ++j) p.bias.push_back(random_value(rng));
  p.y.assign((m + 1) * p.ldy, poison);
  return p;
}

std::string describe(const problem& p) {
  return std::string(dtype_name(p.w.type)) + " m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) +
         " k=" + std::to_string(p.k) + " ldx=" + std::to_string(p.ldx) + " ldw=" + std::to_string(p.ldw) +
         " ldy=" + std::to_string(p.ldy) + (p.bias.empty() ? " no bias" : " bias") + " isa=" +
         std::string(isa_name(active_isa()));
}

/// Every element outside [0, m) × [0, n) of y (row padding and the spare row) is still NaN.
void expect_untouched_outside(const problem& p) {
  for (size_t i = 0; i <= p.m; ++i) {
    for (size_t j = (i < p.m ? p.n : 0); j < p.ldy; ++j) {
      ASSERT_TRUE(std::isnan(p.y[i * p.ldy + j])) << describe(p) << " wrote y[" << i << "][" << j << "]";
    }
  }
}

/// (padded, with bias) combinations: tight without bias, padded with and without. Bias and
/// padding are independent paths, and three of the four combinations keep the run short.
constexpr std::pair<bool, bool> layouts[] = {{false, false}, {true, true}, {true, false}};

/// Calls fn(problem&) for every dtype, shape and layout, after the matmul.
template <class Fn>
void for_each_problem(thread_pool& pool, Fn fn) {
  std::mt19937 rng(testing::test_seed(1234));
  for (dtype t : all_dtypes)
    for (size_t m : ms)
      for (size_t n : ns)
        for (size_t k : ks_for(t, {1, 15, 16, 17, 40, 200}))
          for (auto [padded, with_bias] : layouts) {
            problem p = make_problem(t, m, n, k, padded, with_bias, rng);
            ASSERT_TRUE(matmul(p.args(), pool).ok()) << describe(p);
            fn(p);
            if (::testing::Test::HasFatalFailure()) return;
          }
}

TEST(Matmul, MatchesDoublePrecisionReference) {
  thread_pool pool(2);
  for_each_problem(pool, [](const problem& p) {
    for (size_t i = 0; i < p.m; ++i) {
      for (size_t j = 0; j < p.n; ++j) {
        double ref = 0.0, magnitude = 0.0;
        for (size_t q = 0; q < p.k; ++q) {
          double term = static_cast<double>(p.x[i * p.ldx + q]) * static_cast<double>(p.w.at(j, q));
          ref += term;
          magnitude += std::fabs(term);
        }
        if (!p.bias.empty()) {
          ref += p.bias[j];
          magnitude += std::fabs(p.bias[j]);
        }
        // Relative to the sum of |terms|: the float result may not be relatively close to a
        // sum that cancels, but it is always within a few ulp of the largest partial sums.
        double got = p.y[i * p.ldy + j];
        ASSERT_LE(std::fabs(got - ref), 1e-5 * magnitude + 1e-30)
            << describe(p) << " y[" << i << "][" << j << "] = " << got << ", reference " << ref;
      }
    }
    expect_untouched_outside(p);
  });
}

TEST(Matmul, MatchesDotReferenceBitwise) {
  thread_pool pool(2);
  for_each_problem(pool, [](const problem& p) {
    for (size_t i = 0; i < p.m; ++i) {
      for (size_t j = 0; j < p.n; ++j) {
        float want = dot_reference(p.x.data() + i * p.ldx, p.w.row(j), p.w.type, p.k);
        if (!p.bias.empty()) want = want + p.bias[j];
        float got = p.y[i * p.ldy + j];
        ASSERT_EQ(bits_of(got), bits_of(want))
            << describe(p) << " y[" << i << "][" << j << "] = " << got << ", dot_reference " << want;
      }
    }
    expect_untouched_outside(p);
  });
}

TEST(Matmul, UsesTheIsaNamedInLlmeshIsa) {
  const char* env = std::getenv("LLMESH_ISA");
  isa best = best_supported_isa();
  if (env == nullptr) {
    EXPECT_EQ(active_isa(), best);
    return;
  }
  std::string want(env);
  isa asked = want == "portable" ? isa::portable : (want == "avx2" ? isa::avx2 : isa::avx512);
  isa expected = static_cast<int>(asked) < static_cast<int>(best) ? asked : best;
  EXPECT_EQ(isa_name(active_isa()), isa_name(expected));
}

TEST(Matmul, MatchesDotReferenceBitwiseOnEverySupportedIsa) {
  if (std::getenv("LLMESH_KERNELS_TEST_CHILD") != nullptr) GTEST_SKIP() << "already a per-isa child run";
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) GTEST_SKIP() << "cannot find this binary to re-run it";
  exe[len] = '\0';
  const int best = static_cast<int>(best_supported_isa());
  // The double-precision check is left out: bitwise equality with dot_reference implies it.
  for (isa level : {isa::portable, isa::avx2, isa::avx512}) {
    if (static_cast<int>(level) > best) continue;
    std::string name(isa_name(level));
    // Sharding or XML output settings of this run must not leak into the child.
    std::string cmd =
        "env -u GTEST_OUTPUT -u GTEST_SHARD_INDEX -u GTEST_TOTAL_SHARDS -u GTEST_SHARD_STATUS_FILE"
        " LLMESH_KERNELS_TEST_CHILD=1 LLMESH_ISA=" + name + " '" + exe + "'"
        " --gtest_filter='Matmul.*:Dot.*:DotReference.*-Matmul.MatchesDoublePrecisionReference' 2>&1";
    FILE* child = popen(cmd.c_str(), "r");
    ASSERT_NE(child, nullptr) << cmd;
    std::string output;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof(buf), child)) > 0) output.append(buf, got);
    int rc = pclose(child);
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "isa " << name << " failed:\n" << output;
    EXPECT_NE(output.find("[       OK ] Matmul.MatchesDotReferenceBitwise ("), std::string::npos)
        << "isa " << name << " did not run the bitwise test:\n" << output;
  }
}

TEST(Matmul, RowsAreBitwiseIndependentOfBatchSize) {
  thread_pool pool(2);
  std::mt19937 rng(99);
  for (dtype t : all_dtypes) {
    for (size_t k : ks_for(t, {1, 15, 16, 17, 40, 200})) {
      // m = 70 crosses the 64-row cache block; 8 and 3 end mid-tile on every instruction set.
      for (size_t m : {3, 8, 70}) {
        problem batch = make_problem(t, m, 37, k, true, true, rng);
        ASSERT_TRUE(matmul(batch.args(), pool).ok());
        for (size_t i = 0; i < m; ++i) {
          problem one = batch;
          one.m = 1;
          one.x.assign(batch.x.begin() + i * batch.ldx, batch.x.begin() + (i + 1) * batch.ldx);
          one.y.assign(2 * one.ldy, poison);
          ASSERT_TRUE(matmul(one.args(), pool).ok());
          ASSERT_EQ(std::memcmp(one.y.data(), batch.y.data() + i * batch.ldy, batch.n * sizeof(float)), 0)
              << describe(batch) << " row " << i << " differs when computed alone";
        }
      }
    }
  }
}

TEST(Matmul, LargeShapesCrossCacheBlocksBitExactly) {
  // Long rows make the kernels split the weight rows (and batches of x rows) into cache-sized
  // blocks; a block boundary must not change any element.
  thread_pool pool(2);
  std::mt19937 rng(testing::test_seed(31));
  // m = 6 splits k into blocks with the x rows in one or two tiles (K-quants: their direct
  // tile, parking lanes between k blocks); m = 70 also splits the x rows (K-quants: weights
  // decoded once per block).
  for (dtype t : all_dtypes) {
    const size_t k = k_quant(t) ? 4096 : 4099;
    for (size_t m : {6, 70}) {
      problem p = make_problem(t, m, 37, k, true, true, rng);
      ASSERT_TRUE(matmul(p.args(), pool).ok());
      for (size_t i = 0; i < p.m; ++i) {
        for (size_t j = 0; j < p.n; ++j) {
          float want = dot_reference(p.x.data() + i * p.ldx, p.w.row(j), t, k) + p.bias[j];
          ASSERT_EQ(bits_of(p.y[i * p.ldy + j]), bits_of(want)) << describe(p) << " y[" << i << "][" << j << "]";
        }
      }
      expect_untouched_outside(p);
      problem one = p;
      one.m = 1;
      for (size_t i : {size_t{0}, m / 2, m - 1}) {
        one.x.assign(p.x.begin() + i * p.ldx, p.x.begin() + (i + 1) * p.ldx);
        one.y.assign(2 * one.ldy, poison);
        ASSERT_TRUE(matmul(one.args(), pool).ok());
        ASSERT_EQ(std::memcmp(one.y.data(), p.y.data() + i * p.ldy, p.n * sizeof(float)), 0)
            << describe(p) << " row " << i << " differs when computed alone";
      }
    }
  }
}

TEST(Matmul, ResultIsBitwiseIndependentOfThreadCount) {
  thread_pool pool1(1), pool2(2), pool3(3);
  std::mt19937 rng(7);
  for (dtype t : all_dtypes) {
    for (size_t n : {1, 5, 7, 13, 37}) {
      for (size_t k : ks_for(t, {17, 200})) {
        problem p = make_problem(t, 9, n, k, true, true, rng);
        ASSERT_TRUE(matmul(p.args(), pool1).ok());
        std::vector<float> y1 = p.y;
        for (thread_pool* pool : {&pool2, &pool3}) {
          std::fill(p.y.begin(), p.y.end(), poison);
          ASSERT_TRUE(matmul(p.args(), *pool).ok());
          for (size_t i = 0; i < p.m; ++i) {
            ASSERT_EQ(std::memcmp(p.y.data() + i * p.ldy, y1.data() + i * p.ldy, p.n * sizeof(float)), 0)
                << describe(p) << " row " << i << " with " << pool->size() << " threads";
          }
          expect_untouched_outside(p);
        }
      }
    }
  }
}

TEST(Matmul, RunsSeveralJobsInOneRegionLikeSeparateCalls) {
  thread_pool pool(3);
  std::mt19937 rng(5);
  // q, k and v projections of one activation, each with its own dtype and shape.
  problem q = make_problem(dtype::bf16, 6, 37, 40, true, false, rng);
  problem k = make_problem(dtype::f16, 6, 13, 40, true, true, rng);
  problem v = make_problem(dtype::f32, 6, 5, 40, true, false, rng);
  problem i8 = make_problem(dtype::q8, 6, 11, 40, true, true, rng);
  problem i4 = make_problem(dtype::q4, 6, 14, 40, true, false, rng);
  problem q4 = make_problem(dtype::q4_k, 6, 9, 256, false, true, rng);
  problem q5 = make_problem(dtype::q5_k, 6, 8, 256, true, true, rng);
  problem q6 = make_problem(dtype::q6_k, 6, 7, 256, true, false, rng);
  problem q2 = make_problem(dtype::q2_k, 5, 6, 512, true, true, rng);
  problem q3 = make_problem(dtype::q3_k, 6, 10, 256, false, false, rng);
  problem iq4 = make_problem(dtype::iq4_xs, 6, 12, 512, true, false, rng);
  k.x = q.x;
  v.x = q.x;
  i8.x = q.x;
  i4.x = q.x;
  std::vector<problem*> all = {&q, &k, &v, &i8, &i4, &q4, &q5, &q6, &q2, &q3, &iq4};
  std::vector<matmul_args> jobs;
  for (problem* p : all) jobs.push_back(p->args());
  ASSERT_TRUE(matmul(std::span<const matmul_args>(jobs), pool).ok());
  for (problem* p : all) {
    std::vector<float> together = p->y;
    std::fill(p->y.begin(), p->y.end(), poison);
    ASSERT_TRUE(matmul(p->args(), pool).ok());
    for (size_t i = 0; i < p->m; ++i) {
      ASSERT_EQ(std::memcmp(together.data() + i * p->ldy, p->y.data() + i * p->ldy, p->n * sizeof(float)), 0)
          << describe(*p) << " row " << i;
    }
    expect_untouched_outside(*p);
  }
}

TEST(Matmul, RejectsInvalidArguments) {
  thread_pool pool(2);
  std::mt19937 rng(3);
  problem p = make_problem(dtype::f32, 3, 5, 16, true, false, rng);
  auto expect_invalid = [&](matmul_args a, const char* what) {
    status s = matmul(a, pool);
    ASSERT_FALSE(s.ok()) << what;
    EXPECT_EQ(s.err().code, errc::invalid_request) << what;
  };
  matmul_args a = p.args();
  a.x = nullptr;
  expect_invalid(a, "null x");
  a = p.args();
  a.w = nullptr;
  expect_invalid(a, "null w");
  a = p.args();
  a.y = nullptr;
  expect_invalid(a, "null y");
  a = p.args();
  a.ldx = a.k - 1;
  expect_invalid(a, "ldx < k");
  a = p.args();
  a.ldw = a.k - 1;
  expect_invalid(a, "ldw < k");
  a = p.args();
  a.ldy = a.n - 1;
  expect_invalid(a, "ldy < n");
  a = p.args();
  a.k = 0;
  expect_invalid(a, "k == 0");
  // q8 rows must be whole blocks.
  problem q = make_problem(dtype::q8, 3, 5, 40, false, false, rng);
  ASSERT_TRUE(matmul(q.args(), pool).ok());
  a = q.args();
  a.ldw = 48;
  expect_invalid(a, "q8 ldw not a multiple of the block");
  // K-quant rows are whole super-blocks, and so is k (their rows hold no zero padding).
  for (dtype t : testing::k_quant_types) {
    problem kq = make_problem(t, 3, 5, 256, true, false, rng);
    ASSERT_TRUE(matmul(kq.args(), pool).ok());
    a = kq.args();
    a.ldw = 384;
    expect_invalid(a, "K-quant ldw not a multiple of 256");
    a = kq.args();
    a.k = 240;
    expect_invalid(a, "K-quant k not a multiple of 256");
  }
  // One bad job among good ones fails the whole call.
  std::vector<matmul_args> jobs = {p.args(), p.args()};
  jobs[1].ldx = 2;
  expect_invalid(jobs[1], "second job");
  EXPECT_FALSE(matmul(std::span<const matmul_args>(jobs), pool).ok());
}

/// A row-parallel tensor-parallel shard multiplies by columns [c0, c0 + k) of every row: the
/// weight pointer moves to c0's block and ldw stays the full row. Each slice against
/// dot_reference over the same bytes.
void expect_column_slices_in_place(dtype t, size_t row, std::initializer_list<size_t> c0s, std::initializer_list<size_t> ks,
                                   std::mt19937& rng) {
  thread_pool pool(2);
  problem full = make_problem(t, 5, 13, row, false, false, rng);
  for (size_t c0 : c0s) {
    for (size_t k : ks) {
      if (c0 + k > full.k) continue;
      std::vector<float> y(full.m * full.n, poison);
      matmul_args a = full.args();
      a.x = full.x.data() + c0;
      a.w = static_cast<const uint8_t*>(full.w.data()) + dtype_offset(t, c0);
      a.k = k;
      a.y = y.data();
      a.ldy = full.n;
      ASSERT_TRUE(matmul(a, pool).ok());
      for (size_t i = 0; i < full.m; ++i) {
        for (size_t j = 0; j < full.n; ++j) {
          const auto* w = static_cast<const uint8_t*>(full.w.row(j)) + dtype_offset(t, c0);
          float want = dot_reference(full.x.data() + i * full.ldx + c0, w, t, k);
          ASSERT_EQ(bits_of(y[i * full.n + j]), bits_of(want))
              << dtype_name(t) << " c0 " << c0 << " k " << k << " y[" << i << "][" << j << "]";
        }
      }
    }
  }
}

TEST(Matmul, Q8ColumnSliceFromABlockBoundaryIsUsedInPlace) {
  std::mt19937 rng(testing::test_seed(8));
  expect_column_slices_in_place(dtype::q8, 200, {0, 32, 64, 96}, {17, 32, 64, 96}, rng);
}

TEST(Matmul, Fp8ColumnSliceFromABlockBoundaryIsUsedInPlace) {
  std::mt19937 rng(testing::test_seed(32));
  expect_column_slices_in_place(dtype::fp8, 200, {0, 32, 64, 96}, {17, 32, 64, 96}, rng);
}

TEST(Matmul, Q4ColumnSliceFromABlockBoundaryIsUsedInPlace) {
  std::mt19937 rng(testing::test_seed(10));
  expect_column_slices_in_place(dtype::q4, 200, {0, 32, 64, 96}, {17, 32, 48, 64, 96}, rng);
}

TEST(Matmul, KQuantColumnSliceFromASuperBlockBoundaryIsUsedInPlace) {
  std::mt19937 rng(testing::test_seed(9));
  for (dtype t : testing::k_quant_types) {
    expect_column_slices_in_place(t, 1024, {0, 256, 512}, {256, 512}, rng);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(Matmul, EmptyOutputSucceedsWithoutWriting) {
  thread_pool pool(2);
  std::mt19937 rng(4);
  problem p = make_problem(dtype::f16, 2, 5, 16, true, true, rng);
  matmul_args a = p.args();
  a.m = 0;
  EXPECT_TRUE(matmul(a, pool).ok());
  a = p.args();
  a.n = 0;
  EXPECT_TRUE(matmul(a, pool).ok());
  for (float v : p.y) ASSERT_TRUE(std::isnan(v));
  EXPECT_TRUE(matmul(std::span<const matmul_args>(), pool).ok());
}

TEST(Dot, MatchesDotReferenceBitwise) {
  std::mt19937 rng(11);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 100; ++n) lengths.push_back(n);
  for (size_t n : {127, 128, 129, 200, 1000, 4099}) lengths.push_back(n);
  for (size_t n : lengths) {
    // Poisoned past n: a read beyond the end would turn the result into NaN.
    std::vector<float> a(n + 16, poison), b(n + 16, poison);
    for (size_t i = 0; i < n; ++i) {
      a[i] = random_value(rng);
      b[i] = random_value(rng);
    }
    float got = dot(a.data(), b.data(), n);
    float want = dot_reference(a.data(), b.data(), dtype::f32, n);
    ASSERT_EQ(bits_of(got), bits_of(want)) << "n=" << n << " isa=" << isa_name(active_isa());
  }
}

/// The order documented in matmul.hpp, written independently of the library.
float documented_order_dot(const float* x, const float* w, size_t k) {
  float lane[16] = {};
  for (size_t q = 0; q < k; ++q) lane[q % 16] = std::fma(x[q], w[q], lane[q % 16]);
  for (size_t half = 8; half >= 1; half /= 2)
    for (size_t i = 0; i < half; ++i) lane[i] = lane[i] + lane[i + half];
  return lane[0];
}

TEST(DotReference, FollowsTheDocumentedReductionOrder) {
  std::mt19937 rng(12);
  int differs_from_sequential = 0;
  for (dtype t : all_dtypes) {
    for (size_t k : {1, 2, 15, 16, 17, 31, 33, 40, 200, 1001}) {
      std::vector<float> x = make_activations(1, k, k, rng);
      weight_matrix w = make_weights(t, 1, k, weight_ld(t, k, false), rng);  // block types: whole blocks
      std::vector<float> wf(k);
      for (size_t q = 0; q < k; ++q) wf[q] = w.at(0, q);
      float want = documented_order_dot(x.data(), wf.data(), k);
      ASSERT_FALSE(std::isnan(want)) << dtype_name(t) << " k=" << k << ": the weights must be finite to compare bits";
      float got = dot_reference(x.data(), w.data(), t, k);
      ASSERT_EQ(bits_of(got), bits_of(want)) << dtype_name(t) << " k=" << k;
      float sequential = 0.0f;
      for (size_t q = 0; q < k; ++q) sequential = sequential + x[q] * wf[q];
      differs_from_sequential += bits_of(sequential) != bits_of(want);
    }
  }
  // The inputs are order-sensitive enough for the bitwise checks above to mean something.
  EXPECT_GT(differs_from_sequential, 5);
}

}  // namespace
}  // namespace llmesh::kernels
