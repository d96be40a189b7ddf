// Sampling on CPU, the oracle of sampling_cuda.cu. Probabilities become integer masses once
// (sampling_fixed.hpp); the filters keep a prefix of the vocabulary ordered by mass (ties: the
// lower id first); the draw walks the kept tokens in increasing id order. With integer masses
// no sum depends on its order, so the device's parallel sums pick the same token.
// Cost: O(vocab) without filters; top-k is a partial sort; top-p sorts a growing prefix and,
// for flat distributions where the prefix would grow past 4096, finds the mass threshold by
// bisection instead (O(vocab · 41)).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "llmesh/kernels/elementwise.hpp"
#include "llmesh/kernels/sampling.hpp"
#include "sampling/sampling_fixed.hpp"

namespace llmesh::kernels {
namespace {

namespace fx = sampling_detail;

struct candidate {
  uint64_t m;  ///< integer mass
  int32_t id;
};

bool before(const candidate& a, const candidate& b) { return a.m > b.m || (a.m == b.m && a.id < b.id); }

uint64_t mass_of(const candidate* c, size_t n) {
  uint64_t m = 0;
  for (size_t i = 0; i < n; ++i) m += c[i].m;
  return m;
}

/// Reorders c so that its first n entries are the shortest prefix (in `before` order) whose
/// mass reaches `target` (>= 1, <= the mass of all `size`); returns n. c[0..size) is unsorted.
size_t nucleus(std::vector<candidate>& c, size_t size, uint64_t target) {
  for (size_t prefix = std::min<size_t>(size, 256);; prefix = std::min(size, prefix * 4)) {
    if (prefix > 4096 && prefix < size) break;  // flat distribution: bisection below
    std::partial_sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(prefix), c.begin() + static_cast<ptrdiff_t>(size), before);
    uint64_t mass = 0;
    for (size_t n = 0; n < prefix; ++n) {
      mass += c[n].m;
      if (mass >= target) return n + 1;
    }
    if (prefix == size) return size;
  }
  // The largest threshold t with mass(m >= t) >= target; then everything above t and, in id
  // order, as many ties at t as the target needs.
  auto mass_at_least = [&](uint64_t t) {
    uint64_t m = 0;
    for (size_t i = 0; i < size; ++i) m += c[i].m >= t ? c[i].m : 0;
    return m;
  };
  uint64_t lo = 1, hi = 0;  // mass_at_least(lo) >= target > mass_at_least(hi)
  for (size_t i = 0; i < size; ++i) hi = std::max(hi, c[i].m);
  ++hi;
  while (hi - lo > 1) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (mass_at_least(mid) >= target) lo = mid; else hi = mid;
  }
  const uint64_t t = lo;
  auto mid = std::partition(c.begin(), c.begin() + static_cast<ptrdiff_t>(size), [t](const candidate& x) { return x.m > t; });
  auto eq_end = std::partition(mid, c.begin() + static_cast<ptrdiff_t>(size), [t](const candidate& x) { return x.m == t; });
  std::sort(mid, eq_end, before);  // ties at the threshold: lower ids first
  const size_t above = static_cast<size_t>(mid - c.begin());
  return above + static_cast<size_t>(fx::ties_needed(target, mass_of(c.data(), above), t));
}

}  // namespace

double sampling_uniform(uint64_t seed, uint64_t position) {
  return static_cast<double>(fx::draw_bits(seed, position) >> 11) * 0x1.0p-53;
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

argmax_candidate argmax_part(std::span<const float> slice, int32_t first_id) {
  if (first_id == 0 && !slice.empty() && std::isnan(slice[0])) return {std::numeric_limits<float>::infinity(), 0};
  argmax_candidate best;
  for (size_t i = 0; i < slice.size(); ++i) {
    if (std::isnan(slice[i])) continue;
    if (best.id < 0 || slice[i] > best.value) best = {slice[i], first_id + static_cast<int32_t>(i)};
  }
  return best;
}

int32_t argmax_merge(std::span<const argmax_candidate> parts) {
  argmax_candidate best;
  for (const auto& p : parts) {
    if (p.id >= 0 && (best.id < 0 || p.value > best.value)) best = p;  // ties: the earlier slice
  }
  return best.id < 0 ? 0 : best.id;  // all NaN: index 0, as argmax
}

bool is_greedy(const sampling_params& params) { return !(params.temperature > 0.0f) || params.top_k == 1; }

int32_t sample(std::span<const float> logits, const sampling_params& params, uint64_t position) {
  if (logits.empty()) return 0;
  const int32_t best = argmax(logits);
  if (is_greedy(params)) return best;
  const float max_logit = logits[best];
  const float inv_t = 1.0f / params.temperature;
  if (!std::isfinite(max_logit) || !std::isfinite(inv_t)) return best;
  const size_t vocab = logits.size();
  const int bits = fx::mass_bits(vocab);
  std::vector<candidate> c;
  c.reserve(vocab);
  for (size_t i = 0; i < vocab; ++i) {
    const uint64_t m = fx::mass_of(exp_det((logits[i] - max_logit) * inv_t), bits);
    if (m != 0) c.push_back({m, static_cast<int32_t>(i)});  // massless tokens can never be drawn
  }
  size_t keep = c.size();  // >= 1: the most likely token has mass 2^bits
  bool reordered = false;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < keep) {
    keep = static_cast<size_t>(params.top_k);
    std::partial_sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(keep), c.end(), before);
    reordered = true;
  }
  if (params.top_p < 1.0f) {
    keep = nucleus(c, keep, fx::nucleus_target(mass_of(c.data(), keep), params.top_p));
    reordered = true;
  }
  // Draw: walk the kept tokens in id order (c was built in id order; the filters reorder it,
  // even when they keep every token).
  if (reordered) {
    std::sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(keep),
              [](const candidate& a, const candidate& b) { return a.id < b.id; });
  }
  const uint64_t u = fx::mulhi(fx::draw_bits(params.seed, position), mass_of(c.data(), keep));
  uint64_t acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += c[i].m;
    if (u < acc) return c[i].id;
  }
  return c[keep - 1].id;  // unreachable: u < total
}

std::vector<int32_t> sample_rows(std::span<const float> logits, size_t vocab, std::span<const sample_row> rows) {
  std::vector<int32_t> out;
  out.reserve(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    out.push_back(sample(logits.subspan(r * vocab, vocab), rows[r].params, rows[r].position));
  }
  return out;
}

}  // namespace llmesh::kernels
