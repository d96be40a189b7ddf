// Sampling on CPU. Candidates are ordered by (probability desc, index asc) so equal
// probabilities never make the choice depend on sort stability.
#include <algorithm>
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
  for (size_t i = 0; i < vocab; ++i) {
    c[i] = {exp_det((logits[i] - max_logit) * inv_t), static_cast<int32_t>(i)};
  }
  double total = 0.0;
  for (const auto& x : c) total += x.p;

  // Only the head of the distribution is ever needed: sort a growing prefix (exact, and
  // usually a few hundred candidates instead of the whole vocabulary).
  size_t keep = vocab;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab) keep = params.top_k;
  const bool use_top_p = params.top_p > 0.0f && params.top_p < 1.0f;
  size_t sorted = std::min(keep, use_top_p ? size_t{256} : keep);
  while (true) {
    std::partial_sort(c.begin(), c.begin() + sorted, c.end(), before);
    if (!use_top_p || sorted == keep) break;
    double mass = 0.0;
    for (size_t i = 0; i < sorted; ++i) mass += c[i].p;
    double base = keep < vocab ? -1.0 : total;  // with top-k, the top-k mass is needed first
    if (base > 0.0 && mass >= params.top_p * base) break;
    sorted = std::min(keep, sorted * 4);
  }
  if (keep < vocab) {
    total = 0.0;
    for (size_t i = 0; i < keep; ++i) total += c[i].p;
  }
  if (use_top_p) {
    double target = params.top_p * total, mass = 0.0;
    size_t n = 0;
    while (n < keep) {
      mass += c[n].p;
      ++n;
      if (mass >= target) break;
    }
    keep = n;
    total = mass;
  }
  double u = sampling_uniform(params.seed, position) * total;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += c[i].p;
    if (u < acc) return c[i].id;
  }
  return c[keep - 1].id;
}

}  // namespace llmesh::kernels
