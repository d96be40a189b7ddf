// Tests of token sampling: argmax and greedy, the (seed, position) keyed RNG, top-k and top-p
// support, and empirical frequencies against softmax probabilities.
#include "llmesh/kernels/sampling.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

namespace llmesh::kernels {
namespace {

std::vector<float> random_logits(size_t vocab, float spread, std::mt19937& rng) {
  std::uniform_real_distribution<float> val(-spread, spread);
  std::vector<float> l(vocab);
  for (float& x : l) x = val(rng);
  return l;
}

sampling_params params(float temperature, int top_k, float top_p, uint64_t seed) {
  sampling_params p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

/// Token ids ordered by logit descending, index ascending on ties.
std::vector<int32_t> ranked(const std::vector<float>& logits) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  return ids;
}

/// softmax(logits / temperature) in double.
std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) sum += (p[i] = std::exp((logits[i] - max) / temperature));
  for (double& x : p) x /= sum;
  return p;
}

TEST(Argmax, PicksTheLargestAndTheLowestIndexOnTies) {
  EXPECT_EQ(argmax(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}), 1);
  EXPECT_EQ(argmax(std::vector<float>{5.0f, 5.0f}), 0);
  EXPECT_EQ(argmax(std::vector<float>{7.0f}), 0);
  EXPECT_EQ(argmax(std::vector<float>{-3.0f, -1.0f, -1.0f, -2.0f}), 1);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(argmax(std::vector<float>{-inf, -inf, 0.0f, -inf}), 2);
  EXPECT_EQ(argmax(std::vector<float>{1.0f, inf, 2.0f, inf}), 1);
  std::vector<float> last(1000, 0.5f);
  last[999] = 0.6f;
  EXPECT_EQ(argmax(last), 999);
}

TEST(Sample, IsGreedyWithoutTemperatureOrWithTopKOne) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits = random_logits(50, 3.0f, rng);
    logits[trial % 50] = logits[(trial + 7) % 50];  // a tie now and then
    const int32_t best = argmax(logits);
    for (uint64_t pos = 0; pos < 5; ++pos) {
      EXPECT_EQ(sample(logits, params(0.0f, 0, 1.0f, trial), pos), best);
      EXPECT_EQ(sample(logits, params(-1.0f, 0, 0.5f, trial), pos), best);
      EXPECT_EQ(sample(logits, params(1.0f, 1, 1.0f, trial), pos), best);
      EXPECT_EQ(sample(logits, params(5.0f, 1, 0.9f, trial), pos), best);
    }
  }
}

TEST(Sample, SameSeedAndPositionGiveTheSameToken) {
  std::mt19937 rng(2);
  std::vector<float> logits = random_logits(300, 1.0f, rng);
  for (uint64_t pos = 0; pos < 500; ++pos) {
    for (const sampling_params& p : {params(1.0f, 0, 1.0f, 42), params(0.7f, 40, 0.9f, 43)}) {
      int32_t a = sample(logits, p, pos);
      std::vector<float> copy = logits;  // a fresh buffer: no hidden state in the call
      EXPECT_EQ(sample(copy, p, pos), a) << "position " << pos;
    }
  }
}

TEST(Sample, DifferentSeedsGiveDifferentDraws) {
  std::vector<float> flat(100, 0.0f);
  int same = 0;
  const int n = 2000;
  for (uint64_t pos = 0; pos < n; ++pos) {
    same += sample(flat, params(1.0f, 0, 1.0f, 1), pos) == sample(flat, params(1.0f, 0, 1.0f, 2), pos);
  }
  // Independent draws from 100 equally likely tokens agree 1% of the time (20 of 2000).
  EXPECT_LT(same, 60);
  // And positions of one seed differ from each other too.
  std::set<int32_t> seen;
  for (uint64_t pos = 0; pos < 500; ++pos) seen.insert(sample(flat, params(1.0f, 0, 1.0f, 1), pos));
  EXPECT_GT(seen.size(), 90u);
}

TEST(SamplingUniform, IsInUnitIntervalAndRoughlyUniform) {
  const int buckets = 20;
  std::vector<int> count(buckets, 0);
  double sum = 0.0;
  int n = 0;
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, ~uint64_t{0}}) {
    for (uint64_t pos = 0; pos < 50000; ++pos) {
      for (uint64_t p : {pos, ~uint64_t{0} - pos}) {
        double u = sampling_uniform(seed, p);
        ASSERT_GE(u, 0.0) << "seed " << seed << " position " << p;
        ASSERT_LT(u, 1.0) << "seed " << seed << " position " << p;
        ASSERT_EQ(u, sampling_uniform(seed, p));
        ++count[static_cast<int>(u * buckets)];
        sum += u;
        ++n;
      }
    }
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  for (int b = 0; b < buckets; ++b) EXPECT_NEAR(count[b], n / buckets, 0.05 * n / buckets) << "bucket " << b;
  EXPECT_NE(sampling_uniform(1, 7), sampling_uniform(2, 7));
  EXPECT_NE(sampling_uniform(1, 7), sampling_uniform(1, 8));
}

TEST(Sample, TopKDrawsOnlyTheKMostLikely) {
  std::mt19937 rng(3);
  for (int k : {2, 5, 17}) {
    std::vector<float> logits = random_logits(60, 2.0f, rng);
    std::vector<int32_t> order = ranked(logits);
    std::set<int32_t> allowed(order.begin(), order.begin() + k);
    std::set<int32_t> drawn;
    for (uint64_t pos = 0; pos < 5000; ++pos) {
      int32_t t = sample(logits, params(2.0f, k, 1.0f, 9), pos);  // a high temperature flattens
      ASSERT_TRUE(allowed.count(t)) << "k " << k << " drew token " << t << " at position " << pos;
      drawn.insert(t);
    }
    EXPECT_EQ(drawn.size(), static_cast<size_t>(k)) << "every one of the top " << k << " appears";
  }
}

TEST(Sample, SmallTopPDrawsOnlyTheHead) {
  // softmax of {4,3,2,1,0} ≈ {0.636, 0.234, 0.086, 0.032, 0.012}.
  const std::vector<float> logits = {2.0f, 4.0f, 0.0f, 3.0f, 1.0f};  // token 1 first, then 3
  std::set<int32_t> drawn;
  for (uint64_t pos = 0; pos < 5000; ++pos) {
    ASSERT_EQ(sample(logits, params(1.0f, 0, 0.5f, 5), pos), 1) << "position " << pos;
    int32_t t = sample(logits, params(1.0f, 0, 0.8f, 5), pos);  // the head is {1, 3}: 0.870
    ASSERT_TRUE(t == 1 || t == 3) << "drew " << t << " at position " << pos;
    drawn.insert(t);
  }
  EXPECT_EQ(drawn.size(), 2u);
}

/// The nucleus: the smallest most-likely prefix (of the top-k, if set) with top_p of its mass.
std::set<int32_t> nucleus(const std::vector<float>& logits, double temperature, int top_k, double top_p) {
  std::vector<double> p = softmax(logits, temperature);
  std::vector<int32_t> order = ranked(logits);
  if (top_k > 0) order.resize(std::min<size_t>(order.size(), top_k));
  double total = 0.0;
  for (int32_t id : order) total += p[id];
  std::set<int32_t> head;
  double mass = 0.0;
  for (int32_t id : order) {
    head.insert(id);
    mass += p[id];
    if (mass >= top_p * total) break;
  }
  return head;
}

TEST(Sample, TopPOverALargeFlatVocabularyExcludesTheTail) {
  // The nucleus here spans well over the 256 candidates the kernel sorts first.
  std::mt19937 rng(4);
  // A broken filter would show within the 4000 draws: the tail holds 10% of the mass.
  std::vector<float> logits = random_logits(1000, 0.5f, rng);
  std::set<int32_t> head = nucleus(logits, 1.0, 0, 0.9);
  ASSERT_GT(head.size(), 500u);
  ASSERT_LT(head.size(), 980u);
  std::set<int32_t> drawn;
  for (uint64_t pos = 0; pos < 4000; ++pos) {
    int32_t t = sample(logits, params(1.0f, 0, 0.9f, 77), pos);
    ASSERT_TRUE(head.count(t)) << "drew token " << t << " outside the nucleus at position " << pos;
    drawn.insert(t);
  }
  EXPECT_GT(drawn.size(), head.size() / 2);
}

TEST(Sample, TopKThenTopPKeepsTheNucleusOfTheTopK) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<float> logits = random_logits(40, 2.0f, rng);
    std::set<int32_t> head = nucleus(logits, 1.5, 10, 0.6);
    for (uint64_t pos = 0; pos < 3000; ++pos) {
      int32_t t = sample(logits, params(1.5f, 10, 0.6f, trial), pos);
      ASSERT_TRUE(head.count(t)) << "trial " << trial << " drew " << t << " at position " << pos;
    }
  }
}

TEST(Sample, FrequenciesMatchSoftmaxProbabilities) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  const int n = 20000;
  for (float temperature : {1.0f, 0.5f, 2.0f}) {
    std::vector<double> p = softmax(logits, temperature);
    std::vector<int> count(5, 0);
    for (uint64_t pos = 0; pos < n; ++pos) ++count[sample(logits, params(temperature, 0, 1.0f, 2024), pos)];
    for (size_t i = 0; i < 5; ++i) {
      // One standard deviation of a frequency here is at most sqrt(0.25 / 20000) = 0.0035.
      EXPECT_NEAR(static_cast<double>(count[i]) / n, p[i], 0.015)
          << "temperature " << temperature << " token " << i;
    }
  }
}

}  // namespace
}  // namespace llmesh::kernels
