// Sampling on CPU. The filters decide *which* tokens may be drawn (ranked by probability,
// ties broken by the lower id); the draw then walks the kept tokens in increasing id order,
// so the token a given (seed, position) picks depends only on the logits and the parameters.
// Cost: O(vocab) without filters; top-k is a partial sort; top-p sorts a growing prefix and,
// for flat distributions where the prefix would grow past 4096, finds the probability
// threshold by bisection instead (O(vocab · 32)).
#include <algorithm>
#include <cstring>
#include <vector>

#include "llmesh/kernels/elementwise.hpp"
#include "llmesh/kernels/sampling.hpp"

namespace llmesh::kernels {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct candidate {
  float p;
  int32_t id;
};

bool before(const candidate& a, const candidate& b) { return a.p > b.p || (a.p == b.p && a.id < b.id); }

double mass_of(const candidate* c, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; ++i) m += c[i].p;
  return m;
}

/// Reorders c so that its first n entries are the smallest most-likely set (in `before`
/// order) whose mass reaches `target`; returns n (at least 1). c[0..size) is unsorted.
size_t nucleus(std::vector<candidate>& c, size_t size, double target) {
  for (size_t prefix = std::min<size_t>(size, 256);; prefix = std::min(size, prefix * 4)) {
    if (prefix > 4096 && prefix < size) break;  // flat distribution: bisection below
    std::partial_sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(prefix), c.begin() + static_cast<ptrdiff_t>(size), before);
    double mass = 0.0;
    for (size_t n = 0; n < prefix; ++n) {
      mass += c[n].p;
      if (mass >= target) return n + 1;
    }
    if (prefix == size) return size;
  }
  // Largest threshold t (over float bit patterns, monotonic for p >= 0) with mass(p >= t) >= target.
  auto mass_at_least = [&](uint32_t bits) {
    float t;
    std::memcpy(&t, &bits, 4);
    double m = 0.0;
    for (size_t i = 0; i < size; ++i) m += c[i].p >= t ? c[i].p : 0.0f;
    return m;
  };
  uint32_t lo = 0, hi = 0x3f800001u;  // p <= 1
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (mass_at_least(mid) >= target) lo = mid; else hi = mid;
  }
  float t;
  std::memcpy(&t, &lo, 4);
  auto mid = std::partition(c.begin(), c.begin() + static_cast<ptrdiff_t>(size), [t](const candidate& x) { return x.p > t; });
  auto eq_end = std::partition(mid, c.begin() + static_cast<ptrdiff_t>(size), [t](const candidate& x) { return x.p == t; });
  std::sort(mid, eq_end, before);  // ties at the threshold: lower ids first
  size_t n = static_cast<size_t>(mid - c.begin());
  double mass = mass_of(c.data(), n);
  while (mass < target && n < static_cast<size_t>(eq_end - c.begin())) mass += c[n++].p;
  return std::max<size_t>(n, 1);
}

}  // namespace

double sampling_uniform(uint64_t seed, uint64_t position) {
  uint64_t h = splitmix64(seed ^ splitmix64(position ^ 0x5851f42d4c957f2dull));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

int32_t sample(std::span<const float> logits, const sampling_params& params, uint64_t position) {
  if (logits.empty()) return 0;
  if (params.temperature <= 0.0f || params.top_k == 1) return argmax(logits);
  const size_t vocab = logits.size();
  const float max_logit = logits[argmax(logits)];
  const float inv_t = 1.0f / params.temperature;
  std::vector<candidate> c(vocab);
  for (size_t i = 0; i < vocab; ++i) c[i] = {exp_det((logits[i] - max_logit) * inv_t), static_cast<int32_t>(i)};

  size_t keep = vocab;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab) {
    keep = static_cast<size_t>(params.top_k);
    std::partial_sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(keep), c.end(), before);
  }
  if (params.top_p < 1.0f) {
    double target = static_cast<double>(std::max(params.top_p, 0.0f)) * mass_of(c.data(), keep);
    keep = nucleus(c, keep, target);
  }
  // Draw: walk the kept tokens in id order.
  if (keep < vocab) {
    std::sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(keep),
              [](const candidate& a, const candidate& b) { return a.id < b.id; });
  }
  double total = mass_of(c.data(), keep);
  double u = sampling_uniform(params.seed, position) * total;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += c[i].p;
    if (u < acc) return c[i].id;
  }
  return c[keep - 1].id;  // rounding put u at the very top: the last kept token
}

}  // namespace llmesh::kernels
