// Tests of token sampling: argmax and greedy, the (seed, position) keyed RNG, top-k and top-p
// support, and empirical frequencies against softmax probabilities.
#include "llmesh/kernels/sampling.hpp"

#include "llmesh/kernels/elementwise.hpp"
#include "llmesh/kernels/thread_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
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

/// kernels::sample's definition written the plain way: every mass, one full sort, the prefix,
/// the draw in id order with 128-bit arithmetic. The kernel's partial sorts, bisection and
/// early exits must give exactly this token.
int32_t reference_sample(const std::vector<float>& logits, const sampling_params& p, uint64_t position) {
  const int32_t best = argmax(logits);
  if (!(p.temperature > 0.0f) || p.top_k == 1) return best;
  const float max = logits[best], inv_t = 1.0f / p.temperature;
  if (!std::isfinite(max) || !std::isfinite(inv_t)) return best;
  const size_t n = logits.size();
  int need = 0;
  while ((uint64_t{1} << need) < n + 1) ++need;
  const int bits = std::min(40, 62 - need);
  std::vector<std::pair<uint64_t, int32_t>> order;  // (mass, id)
  // min_p: masses below floor(min_p · 2^32) · 2^bits / 2^32 count as none.
  const uint64_t min_mass =
      p.min_p > 0.0f ? static_cast<uint64_t>((static_cast<unsigned __int128>(static_cast<uint64_t>(std::min(p.min_p, 1.0f) * 4294967296.0f)) << bits) >> 32)
                     : 0;
  for (size_t i = 0; i < n; ++i) {
    const float scaled = exp_det((logits[i] - max) * inv_t) * static_cast<float>(uint64_t{1} << bits);
    const auto m = static_cast<uint64_t>(scaled);
    order.push_back({m >= min_mass ? m : 0, static_cast<int32_t>(i)});
  }
  std::sort(order.begin(), order.end(), [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  size_t keep = n;
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) keep = static_cast<size_t>(p.top_k);
  if (p.top_p < 1.0f) {
    unsigned __int128 mass = 0;
    for (size_t i = 0; i < keep; ++i) mass += order[i].first;
    const float tp = p.top_p > 0.0f ? p.top_p : 0.0f;
    uint64_t target = static_cast<uint64_t>((mass * static_cast<uint64_t>(tp * 4294967296.0f)) >> 32);
    target = std::max<uint64_t>(target, 1);
    uint64_t acc = 0;
    size_t m = 0;
    while (m < keep && acc < target) acc += order[m++].first;
    keep = m;
  }
  std::vector<std::pair<uint64_t, int32_t>> kept(order.begin(), order.begin() + static_cast<ptrdiff_t>(keep));
  std::sort(kept.begin(), kept.end(), [](auto a, auto b) { return a.second < b.second; });
  unsigned __int128 total = 0;
  for (auto& k : kept) total += k.first;
  // The same 64 bits the kernel draws: the 53 high ones are sampling_uniform's.
  const double u01 = sampling_uniform(p.seed, position);
  (void)u01;
  uint64_t x = position ^ 0x5851f42d4c957f2dull;
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const uint64_t h = mix(p.seed ^ mix(x));
  EXPECT_EQ(static_cast<double>(h >> 11) * 0x1.0p-53, u01);
  const uint64_t u = static_cast<uint64_t>((static_cast<unsigned __int128>(h) * total) >> 64);
  uint64_t acc = 0;
  for (auto& k : kept) {
    acc += k.first;
    if (u < acc) return k.second;
  }
  ADD_FAILURE() << "the draw ran past the kept mass";
  return -1;
}

TEST(Sample, EqualsThePlainDefinitionOnRandomCases) {
  std::mt19937 rng(2026);
  struct shape {
    size_t vocab;
    float spread;
  };
  // Small and large vocabularies; flat ones (top-p's bisection path) and peaked ones; few
  // distinct values (ties at every threshold).
  const shape shapes[] = {{7, 3.0f}, {60, 2.0f}, {1000, 0.5f}, {5000, 0.05f}, {20000, 0.2f}, {20000, 8.0f}, {128256, 4.0f}};
  const float temps[] = {0.3f, 1.0f, 1.7f};
  const int ks[] = {0, 2, 50, 4999};
  const float ps[] = {1.0f, 0.95f, 0.5f, 0.0f, 0.999f};
  size_t cases = 0;
  for (const auto& sh : shapes) {
    std::vector<float> logits = random_logits(sh.vocab, sh.spread, rng);
    if (sh.vocab == 20000 && sh.spread < 1.0f) {
      for (float& x : logits) x = std::round(x * 10.0f) / 10.0f;  // 5 distinct values: wide ties
    }
    for (float t : temps) {
      for (int k : ks) {
        for (float p : ps) {
          if (sh.vocab > 10000 && (t != 1.0f || (k != 0 && k != 50))) continue;  // keep the plain sorts cheap
          for (uint64_t pos = 0; pos < (sh.vocab > 10000 ? 2u : 12u); ++pos) {
            const sampling_params prm = params(t, k, p, 7 + cases);
            ASSERT_EQ(sample(logits, prm, pos), reference_sample(logits, prm, pos))
                << "vocab " << sh.vocab << " spread " << sh.spread << " T " << t << " k " << k << " p " << p << " pos " << pos;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 1500u);
  // min_p, alone and before top-k / top-p.
  for (const auto& sh : shapes) {
    if (sh.vocab > 20000) continue;
    std::vector<float> logits = random_logits(sh.vocab, sh.spread, rng);
    for (float mp : {0.01f, 0.1f, 0.5f, 0.999f, 1.0f}) {
      for (auto [k, p] : {std::pair{0, 1.0f}, std::pair{50, 0.9f}, std::pair{2, 0.5f}}) {
        for (uint64_t pos = 0; pos < 6; ++pos) {
          sampling_params prm = params(1.0f, k, p, 11 + cases++);
          prm.min_p = mp;
          ASSERT_EQ(sample(logits, prm, pos), reference_sample(logits, prm, pos))
              << "vocab " << sh.vocab << " min_p " << mp << " k " << k << " p " << p << " pos " << pos;
        }
      }
    }
  }
}

TEST(Sample, MinPDrawsOnlyTokensAtLeastThatLikely) {
  // Logits 0, -1, -2, ...: p_i / p_max = e^-i. min_p 0.2 keeps i <= 1 (e^-1 = 0.37, e^-2 = 0.14).
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = -static_cast<float>(i);
  sampling_params p{1.0f, 0, 1.0f, 3};
  p.min_p = 0.2f;
  std::set<int32_t> drawn;
  for (uint64_t pos = 0; pos < 2000; ++pos) drawn.insert(sample(logits, p, pos));
  EXPECT_EQ(drawn, (std::set<int32_t>{0, 1}));
  p.min_p = 1.0f;  // only the most likely
  for (uint64_t pos = 0; pos < 50; ++pos) EXPECT_EQ(sample(logits, p, pos), 0);
  p.min_p = 0.0f;
  drawn.clear();
  for (uint64_t pos = 0; pos < 2000; ++pos) drawn.insert(sample(logits, p, pos));
  EXPECT_GT(drawn.size(), 4u);
}

TEST(Sample, TiesAtTheNucleusEdgeKeepTheLowerIdsExactly) {
  // 10000 equal logits: every mass is 2^40, so top-p 0.5 keeps exactly ids 0..4999 and top-k
  // 300 exactly ids 0..299, and the draws spread over all of them.
  const std::vector<float> flat(10000, 1.5f);
  int32_t lowest = 10000, highest = -1;
  for (uint64_t pos = 0; pos < 2000; ++pos) {
    const int32_t t = sample(flat, params(1.0f, 0, 0.5f, 3), pos);
    ASSERT_LT(t, 5000) << "position " << pos;
    lowest = std::min(lowest, t);
    highest = std::max(highest, t);
    ASSERT_LT(sample(flat, params(1.0f, 300, 1.0f, 3), pos), 300) << "position " << pos;
  }
  // P(all 2000 uniform draws below 4900) = 0.98^2000 < 1e-17.
  EXPECT_GT(highest, 4900);
  EXPECT_LT(lowest, 100);
}

TEST(Sample, NonFiniteInputsFallBackToGreedyAndMinusInfinityIsNeverDrawn) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> with_inf = {0.0f, inf, 1.0f};
  const std::vector<float> with_nan_first = {nan, 3.0f, 1.0f};
  const std::vector<float> masked = {-inf, 0.0f, -inf, 0.1f, -inf};
  for (uint64_t pos = 0; pos < 200; ++pos) {
    EXPECT_EQ(sample(with_inf, params(1.0f, 0, 1.0f, 1), pos), 1);           // +inf: argmax
    EXPECT_EQ(sample(with_nan_first, params(1.0f, 0, 1.0f, 1), pos), 0);     // argmax's rule
    EXPECT_EQ(sample(masked, params(1.0f, 0, 1.0f, 1), pos) % 2, 1) << pos;  // only ids 1 and 3
    EXPECT_EQ(sample(masked, params(nan, 0, 1.0f, 1), pos), 3);              // NaN temperature: greedy
    EXPECT_EQ(sample(masked, params(1e-45f, 0, 1.0f, 1), pos), 3);           // 1/T overflows: greedy
    EXPECT_EQ(sample(masked, params(1.0f, 0, nan, 1), pos) % 2, 1) << pos;  // NaN top-p: no filter
  }
}

TEST(SampleRows, DrawsEachRowWithItsOwnParametersAndPosition) {
  std::mt19937 rng(8);
  const size_t vocab = 300;
  std::vector<float> logits = random_logits(3 * vocab, 2.0f, rng);
  const std::vector<sample_row> rows = {{params(0.0f, 0, 1.0f, 1), 5}, {params(1.0f, 10, 0.9f, 2), 6}, {params(0.7f, 0, 1.0f, 3), 9}};
  const auto got = sample_rows(logits, vocab, rows);
  ASSERT_EQ(got.size(), 3u);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(got[r], sample(std::span<const float>(logits).subspan(r * vocab, vocab), rows[r].params, rows[r].position)) << r;
  }
  EXPECT_TRUE(is_greedy(rows[0].params));
  EXPECT_FALSE(is_greedy(rows[1].params));
  EXPECT_TRUE(is_greedy(params(0.5f, 1, 1.0f, 0)));
}

TEST(ArgmaxParts, MergedCandidatesOfAnySplitEqualTheWholeRowsArgmax) {
  std::mt19937 rng(31);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::uniform_int_distribution<int> pick(0, 9);
  for (int trial = 0; trial < 3000; ++trial) {
    const size_t n = 1 + rng() % 40;
    std::vector<float> row(n);
    for (float& x : row) {
      const int k = pick(rng);
      x = k == 0 ? nan : k == 1 ? inf : k == 2 ? -inf : static_cast<float>(rng() % 5);  // many ties
    }
    if (trial % 7 == 0) row[0] = nan;
    if (trial % 11 == 0) std::fill(row.begin(), row.end(), nan);
    // Random slice boundaries: 1 to 4 ranks, possibly empty slices.
    const int ranks = 1 + static_cast<int>(rng() % 4);
    std::vector<size_t> cut{0};
    for (int r = 1; r < ranks; ++r) cut.push_back(rng() % (n + 1));
    cut.push_back(n);
    std::sort(cut.begin(), cut.end());
    std::vector<argmax_candidate> parts;
    for (size_t r = 0; r + 1 < cut.size(); ++r) {
      parts.push_back(argmax_part(std::span<const float>(row).subspan(cut[r], cut[r + 1] - cut[r]), static_cast<int32_t>(cut[r])));
    }
    std::string shown;
    for (float x : row) shown += std::to_string(x) + " ";
    ASSERT_EQ(argmax_merge(parts), argmax(row)) << "row " << shown << "ranks " << ranks;
  }
}

TEST(SampleRows, APoolDrawsTheSameTokensAsOneThread) {
  std::mt19937 rng(12);
  const size_t vocab = 2000, n = 9;
  std::vector<float> logits = random_logits(n * vocab, 3.0f, rng);
  std::vector<sample_row> rows;
  for (size_t r = 0; r < n; ++r) rows.push_back({params(r % 3 == 0 ? 0.0f : 0.9f, r % 2 ? 40 : 0, r % 4 ? 0.9f : 1.0f, r), 7 + r});
  thread_pool pool(3);
  EXPECT_EQ(sample_rows(logits, vocab, rows, &pool), sample_rows(logits, vocab, rows));
  // Every row is checked, each against sample() itself.
  const auto got = sample_rows(logits, vocab, rows, &pool);
  for (size_t r = 0; r < n; ++r) {
    EXPECT_EQ(got[r], sample(std::span<const float>(logits).subspan(r * vocab, vocab), rows[r].params, rows[r].position)) << r;
  }
}

}  // namespace
}  // namespace llmesh::kernels

namespace llmesh::kernels {
namespace {

TEST(Logprobs, AreTheLogSoftmaxWithTheTopInOrderAndTiesByLowerId) {
  const std::vector<float> logits{1.0f, 3.0f, -2.0f, 3.0f, 0.5f, -std::numeric_limits<float>::infinity()};
  long double z = 0;
  for (float l : logits) z += std::exp(static_cast<long double>(l));
  auto ref = [&](size_t i) { return static_cast<double>(static_cast<long double>(logits[i]) - std::log(z)); };
  auto lp = compute_logprobs(logits, 4, 3);
  EXPECT_NEAR(lp.logprob, ref(4), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].id, 1);  // 3.0 twice: the lower id first
  EXPECT_EQ(lp.top[1].id, 3);
  EXPECT_EQ(lp.top[2].id, 0);
  for (const auto& t : lp.top) EXPECT_NEAR(t.logprob, ref(static_cast<size_t>(t.id)), 1e-6);
  // Probabilities sum to one; a masked token has -inf.
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) total += std::exp(compute_logprobs(logits, static_cast<int32_t>(i), 0).logprob);
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_EQ(compute_logprobs(logits, 5, 0).logprob, -std::numeric_limits<float>::infinity());
  // n beyond the vocabulary: every token, the masked one last.
  auto all = compute_logprobs(logits, 0, 50);
  ASSERT_EQ(all.top.size(), logits.size());
  EXPECT_EQ(all.top.back().id, 5);
  EXPECT_TRUE(compute_logprobs(logits, 0, 0).top.empty());
  // Ranks (vLLM's): the tokens at least as likely, itself included (a tie takes the worse
  // rank); outside the row 0.
  EXPECT_EQ(lp.rank, 4);  // 0.5: below 3.0, 3.0 and 1.0
  EXPECT_EQ(compute_logprobs(logits, 1, 0).rank, 2);
  EXPECT_EQ(compute_logprobs(logits, 3, 0).rank, 2);
  EXPECT_EQ(compute_logprobs(logits, 0, 0).rank, 3);
  EXPECT_EQ(compute_logprobs(logits, 5, 0).rank, 6);  // masked: last
  EXPECT_EQ(compute_logprobs(logits, 6, 0).rank, 0);
  EXPECT_EQ(compute_logprobs(logits, -1, 0).rank, 0);
  const std::vector<float> with_nan{1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  EXPECT_EQ(compute_logprobs(with_nan, 1, 0).rank, 0);
  EXPECT_EQ(compute_logprobs(with_nan, 0, 0).rank, 2);
}

TEST(Logprobs, TopEqualsAFullSortOnRandomRows) {
  std::mt19937 rng(11);
  for (int c = 0; c < 200; ++c) {
    const size_t vocab = 1 + rng() % 3000;
    std::vector<float> row(vocab);
    std::uniform_int_distribution<int> coarse(-8, 8);  // many ties
    for (auto& x : row) x = static_cast<float>(coarse(rng)) * 0.5f;
    if (c % 4 == 0) {  // NaN entries (a broken row): after every number, by id
      for (size_t i = 0; i < vocab; i += 1 + rng() % 7) row[i] = std::numeric_limits<float>::quiet_NaN();
    }
    const int n = static_cast<int>(rng() % 25);
    std::vector<int32_t> ids(vocab);
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      if (std::isnan(row[a]) != std::isnan(row[b])) return !std::isnan(row[a]);
      return row[a] > row[b];
    });
    auto lp = compute_logprobs(row, 0, n);
    ASSERT_EQ(lp.top.size(), std::min<size_t>(static_cast<size_t>(n), vocab));
    for (size_t i = 0; i < lp.top.size(); ++i) ASSERT_EQ(lp.top[i].id, ids[i]) << "case " << c << " rank " << i;
  }
}

TEST(Logprobs, AVocabularySizedRowIsWithinAFloatOfTheExactLogSoftmax) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 4.0f);
  std::vector<float> row(128256);
  for (auto& x : row) x = d(rng);
  row[77] = -std::numeric_limits<float>::infinity();  // masked
  long double mx = -1e30L, z = 0;
  for (float l : row) mx = std::max<long double>(mx, l);
  for (float l : row) z += std::exp(static_cast<long double>(l) - mx);
  const long double lse = mx + std::log(z);
  for (int32_t id : {0, 5, 9999, 128255}) {
    const auto lp = compute_logprobs(row, id, 20);
    EXPECT_NEAR(lp.logprob, static_cast<double>(row[static_cast<size_t>(id)] - lse), 2e-6) << id;
    ASSERT_EQ(lp.top.size(), 20u);
    for (const auto& t : lp.top) EXPECT_NEAR(t.logprob, static_cast<double>(row[static_cast<size_t>(t.id)] - lse), 2e-6);
  }
  EXPECT_EQ(compute_logprobs(row, 77, 0).logprob, -std::numeric_limits<float>::infinity());
}

TEST(Logprobs, RowsAskOneByOneAndDoNotChangeTheDraw) {
  const size_t vocab = 40;
  std::vector<float> logits(3 * vocab);
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  for (auto& x : logits) x = d(rng);
  sample_row asks{{0.8f, 0, 1.0f, 7, 2}, 5}, silent{{0.8f, 0, 1.0f, 7, -1}, 5};
  EXPECT_TRUE(argmax_only(std::vector<sample_row>{sample_row{}}));
  EXPECT_FALSE(argmax_only(std::vector<sample_row>{sample_row{{0.0f, 0, 1.0f, 0, 0}, 0}}));  // greedy but asks
  const std::vector<sample_row> rows{asks, silent, asks};
  auto tokens = sample_rows(logits, vocab, rows);
  EXPECT_EQ(tokens[0], sample(std::span(logits).first(vocab), silent.params, 5));
  auto lps = logprobs_rows(logits, vocab, rows, tokens);
  ASSERT_EQ(lps.size(), 3u);
  EXPECT_EQ(lps[0], compute_logprobs(std::span(logits).first(vocab), tokens[0], 2));
  EXPECT_FALSE(lps[1].has_value());
  EXPECT_EQ(lps[2], compute_logprobs(std::span(logits).subspan(2 * vocab, vocab), tokens[2], 2));
  EXPECT_TRUE(logprobs_rows(logits, vocab, std::vector<sample_row>(3, silent), tokens).empty());
}

}  // namespace
}  // namespace llmesh::kernels

namespace llmesh::kernels {
namespace {

TEST(Adjust, PenaltiesFollowVllmsFormulaAndBansWinLast) {
  sampling_params p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  std::vector<float> l{4.0f, -3.0f, 1.0f, 2.0f, 6.0f};
  const std::vector<seen_token> seen{{0, 0}, {1, 2}, {3, 1}, {4, 1}};
  const std::vector<int32_t> banned{4, 99};  // out of range: ignored
  apply_adjust(l, p, logits_adjust{seen, banned, {}});
  EXPECT_EQ(l[0], 2.0f);                       // prompt only: repetition alone (4 / 2)
  EXPECT_EQ(l[1], -6.0f - 1.0f - 0.25f);       // negative: times 2, then 2 · 0.5 + 0.25
  EXPECT_EQ(l[2], 1.0f);                       // never seen
  EXPECT_EQ(l[3], 1.0f - 0.5f - 0.25f);
  EXPECT_EQ(l[4], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(has_adjustments(p));
  EXPECT_FALSE(has_adjustments(sampling_params{}));
  sampling_params m;
  m.min_tokens = 2;
  EXPECT_TRUE(has_adjustments(m));
}

TEST(Adjust, SampleRowsDrawsFromTheAdjustedCopyAndLeavesTheLogits) {
  const size_t vocab = 64;
  std::vector<float> logits(2 * vocab);
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 2.0f);
  for (auto& x : logits) x = d(rng);
  const auto original = logits;
  sampling_params greedy;
  greedy.repetition_penalty = 5.0f;
  const int32_t top = argmax(std::span(logits).first(vocab));
  const std::vector<seen_token> seen{{top, 3}};
  const std::vector<int32_t> none;
  const logits_adjust a{seen, none, {}, {}};
  sampling_params warm{0.9f, 0, 1.0f, 4};
  warm.frequency_penalty = 1.5f;
  const std::vector<sample_row> rows{{greedy, 3, &a}, {warm, 4, &a}};
  EXPECT_FALSE(argmax_only(rows));
  EXPECT_TRUE(row_adjusts(rows[0]));
  auto tokens = sample_rows(logits, vocab, rows);
  EXPECT_EQ(logits, original);
  std::vector<float> r0(logits.begin(), logits.begin() + vocab), r1(logits.begin() + vocab, logits.end());
  apply_adjust(r0, greedy, a);
  apply_adjust(r1, warm, a);
  EXPECT_EQ(tokens[0], argmax(r0));
  EXPECT_EQ(tokens[1], sample(r1, warm, 4));
  // A penalty on nothing seen, or no adjust at all: the plain draw.
  const logits_adjust empty{};
  EXPECT_FALSE(row_adjusts(sample_row{greedy, 3, &empty}));
  EXPECT_FALSE(row_adjusts(sample_row{greedy, 3, nullptr}));
}

TEST(Adjust, AMaskLeavesOnlyItsTokensDrawableAfterTheBans) {
  const size_t vocab = 70;  // three mask words, the last one partly past the vocabulary
  std::vector<float> logits(vocab);
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.0f, 2.0f);
  for (auto& x : logits) x = d(rng);
  std::vector<uint32_t> mask(3, 0u);
  const std::vector<int32_t> allowed{3, 31, 32, 40, 69};
  for (int32_t id : allowed) mask[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
  mask[2] |= 0xffffffc0u;  // bits past the vocabulary change nothing
  const std::vector<int32_t> banned{40};
  const logits_adjust a{{}, banned, {}, mask};
  sampling_params p{1.0f, 0, 1.0f, 7};
  p.constrained = true;
  EXPECT_TRUE(has_adjustments(p));
  EXPECT_TRUE(row_adjusts(sample_row{p, 0, &a}));
  const std::vector<sample_row> one{{p, 0, &a}};
  EXPECT_FALSE(argmax_only(one));
  auto adjusted = logits;
  apply_adjust(adjusted, p, a);
  for (size_t id = 0; id < vocab; ++id) {
    const bool keep = id != 40 && std::count(allowed.begin(), allowed.end(), static_cast<int32_t>(id)) > 0;
    if (keep) EXPECT_EQ(adjusted[id], logits[id]) << id;
    else EXPECT_EQ(adjusted[id], -std::numeric_limits<float>::infinity()) << id;
  }
  std::set<int32_t> drawn;
  for (uint64_t pos = 0; pos < 400; ++pos) {
    const std::vector<sample_row> rows{{p, pos, &a}};
    drawn.insert(sample_rows(logits, vocab, rows)[0]);
  }
  EXPECT_EQ(drawn, (std::set<int32_t>{3, 31, 32, 69}));
  // A mask shorter than the vocabulary allows nothing past its words.
  const std::vector<uint32_t> short_mask{1u << 5};
  auto cut = logits;
  apply_adjust(cut, p, logits_adjust{{}, {}, {}, short_mask});
  for (size_t id = 0; id < vocab; ++id) EXPECT_EQ(std::isfinite(cut[id]), id == 5) << id;
}

// processed_logprobs: the row's log-probabilities are those of its adjusted logits (a bias
// moves them, a mask makes them -inf), exactly compute_logprobs of what apply_adjust gives;
// without the flag they stay the raw logits' whatever the adjustments.
TEST(Logprobs, ProcessedLogprobsAreThoseOfTheAdjustedLogits) {
  const size_t vocab = 64;
  std::vector<float> logits(vocab);
  std::mt19937 rng(9);
  std::normal_distribution<float> d;
  for (auto& x : logits) x = d(rng);
  const std::vector<token_bias> bias{{3, 2.5f}, {10, -100.0f}};
  std::vector<uint32_t> allowed(2, 0u);
  for (int id : {1, 3, 10, 20, 40}) allowed[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
  logits_adjust adj{{}, {}, bias, allowed};
  sampling_params p;
  p.logprobs = 4;
  p.logit_bias = true;
  p.constrained = true;
  p.processed_logprobs = true;
  const sample_row processed{p, 0, &adj};
  sampling_params raw_p = p;
  raw_p.processed_logprobs = false;
  const sample_row raw{raw_p, 0, &adj};
  const std::vector<int32_t> tokens{3};
  auto got = logprobs_rows(logits, vocab, std::vector<sample_row>{processed}, tokens);
  std::vector<float> adjusted = logits;
  apply_adjust(adjusted, p, adj);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], compute_logprobs(adjusted, 3, 4));
  ASSERT_EQ(got[0]->top.size(), 4u);
  for (const auto& t : got[0]->top) {
    EXPECT_TRUE(t.id == 1 || t.id == 3 || t.id == 10 || t.id == 20 || t.id == 40) << t.id;
  }
  EXPECT_EQ(compute_logprobs(adjusted, 0, 0).logprob, -std::numeric_limits<float>::infinity());  // masked
  EXPECT_EQ(logprobs_rows(logits, vocab, std::vector<sample_row>{raw}, tokens)[0], compute_logprobs(logits, 3, 4));
}

}  // namespace
}  // namespace llmesh::kernels
