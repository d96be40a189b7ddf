// Sampling on CPU, the oracle of sampling_cuda.cu. Probabilities become integer masses once
// (sampling_fixed.hpp); the filters keep a prefix of the vocabulary ordered by mass (ties: the
// lower id first); the draw walks the kept tokens in increasing id order. With integer masses
// no sum depends on its order, so the device's parallel sums pick the same token.
// Cost: one exp per token, then each filter is a threshold found by radix selection (one
// histogram pass over every token, then passes over ever fewer), and one walk: no sorting.
#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <vector>

#include "llmesh/kernels/elementwise.hpp"
#include "llmesh/kernels/sampling.hpp"
#include "llmesh/kernels/thread_pool.hpp"
#include "sampling/sampling_fixed.hpp"

namespace llmesh::kernels {
namespace {

namespace fx = sampling_detail;

struct candidate {
  uint64_t m;  ///< integer mass
  int32_t id;
};

uint64_t mass_of(const candidate* c, size_t n) {
  uint64_t m = 0;
  for (size_t i = 0; i < n; ++i) m += c[i].m;
  return m;
}

/// The largest t with (count, or mass, of candidates whose mass is >= t) >= need, and the
/// count and mass strictly above it. REQUIRES: the candidates' whole count or mass reaches
/// need. Radix selection, 8 bits a level from bit 47 down (masses are at most 2^40): each
/// level histograms only the candidates that match the digits chosen so far.
struct threshold {
  uint64_t t = 0, count_above = 0, mass_above = 0;
};

threshold find_threshold(const std::vector<candidate>& c, bool by_mass, uint64_t need, std::vector<uint64_t>& cur) {
  cur.clear();
  for (const auto& x : c) cur.push_back(x.m);
  threshold r;
  for (int level = 5; level >= 0; --level) {
    const int shift = level * 8;
    uint64_t count[256] = {}, mass[256] = {};
    for (uint64_t m : cur) {
      const size_t d = (m >> shift) & 255;
      ++count[d];
      mass[d] += m;
    }
    size_t chosen = 0;
    for (size_t d = 256; d-- > 0;) {
      if ((by_mass ? r.mass_above + mass[d] : r.count_above + count[d]) >= need) {
        chosen = d;
        break;
      }
      r.count_above += count[d];
      r.mass_above += mass[d];
    }
    r.t = (r.t << 8) | chosen;
    size_t w = 0;
    for (uint64_t m : cur) {
      if (((m >> shift) & 255) == chosen) cur[w++] = m;
    }
    cur.resize(w);
  }
  return r;
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

bool all_greedy(std::span<const sample_row> rows) {
  return std::all_of(rows.begin(), rows.end(), [](const sample_row& r) { return is_greedy(r.params); });
}

bool any_logprobs(std::span<const sample_row> rows) {
  return std::any_of(rows.begin(), rows.end(), [](const sample_row& r) { return r.params.logprobs >= 0; });
}

bool has_penalties(const sampling_params& p) {
  return p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || p.repetition_penalty != 1.0f;
}

bool has_adjustments(const sampling_params& p) {
  return has_penalties(p) || p.min_tokens > 0 || p.logit_bias || p.constrained || p.bad_words;
}

bool argmax_only(std::span<const sample_row> rows) {
  return std::all_of(rows.begin(), rows.end(), [](const sample_row& r) {
    return is_greedy(r.params) && r.params.logprobs < 0 && !has_adjustments(r.params);
  });
}

void apply_adjust(std::span<float> logits, const sampling_params& p, const logits_adjust& a) {
  const size_t vocab = logits.size();
  for (const auto& b : a.bias) {
    if (b.id >= 0 && static_cast<size_t>(b.id) < vocab) logits[static_cast<size_t>(b.id)] += b.bias;
  }
  const bool repeat = p.repetition_penalty != 1.0f;
  for (const auto& s : has_penalties(p) ? a.seen : std::span<const seen_token>()) {
    if (s.id < 0 || static_cast<size_t>(s.id) >= vocab) continue;
    float l = logits[static_cast<size_t>(s.id)];
    if (repeat) l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    if (s.count > 0) {  // two roundings, no fused multiply-add: the device kernel does the same
      const float by_count = p.frequency_penalty * static_cast<float>(s.count);
      l -= by_count + p.presence_penalty;
    }
    logits[static_cast<size_t>(s.id)] = l;
  }
  for (int32_t id : a.banned) {
    if (id >= 0 && static_cast<size_t>(id) < vocab) logits[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
  }
  if (!a.allowed.empty()) {  // ids past the mask's words are not allowed either
    for (size_t id = 0; id < vocab; ++id) {
      const size_t w = id >> 5;
      if (w >= a.allowed.size() || !((a.allowed[w] >> (id & 31)) & 1u)) logits[id] = -std::numeric_limits<float>::infinity();
    }
  }
}

bool row_adjusts(const sample_row& r) {
  if (r.adjust == nullptr) return false;
  return (has_penalties(r.params) && !r.adjust->seen.empty()) || !r.adjust->banned.empty() || !r.adjust->bias.empty() ||
         !r.adjust->allowed.empty();
}

namespace {
int32_t draw_row(std::span<const float> row, const sample_row& r, std::vector<float>& scratch) {
  if (!row_adjusts(r)) return sample(row, r.params, r.position);
  scratch.assign(row.begin(), row.end());
  apply_adjust(scratch, r.params, *r.adjust);
  return sample(scratch, r.params, r.position);
}
}  // namespace

token_logprobs compute_logprobs(std::span<const float> logits, int32_t chosen, int n) {
  token_logprobs out;
  if (logits.empty()) return out;
  // log-softmax: l - (max + log(sum exp(l - max))). Each term is exp_det's float (a relative
  // error near 1e-7, far below what a float log-probability shows); the sum runs in eight
  // double lanes (lane j takes the ids ≡ j mod 8, in id order) added in a fixed order at the
  // end: one definition on every ISA, and a loop the compiler vectorizes. Prompt scoring runs
  // this once per prompt position, over the whole vocabulary.
  float mx = -std::numeric_limits<float>::infinity();
  for (float l : logits) mx = std::max(mx, l);  // NaN never wins: a NaN row gives NaN below
  thread_local std::vector<float> terms;  // the terms first: an elementwise loop vectorizes
  terms.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) terms[i] = exp_det(logits[i] - mx);
  constexpr size_t lanes = 8;
  double lane[lanes] = {};
  const size_t whole = terms.size() / lanes * lanes;
  for (size_t i = 0; i < whole; i += lanes) {
    for (size_t j = 0; j < lanes; ++j) lane[j] += static_cast<double>(terms[i + j]);
  }
  for (size_t i = whole; i < terms.size(); ++i) lane[i - whole] += static_cast<double>(terms[i]);
  const double sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  const double lse = static_cast<double>(mx) + std::log(sum);
  auto lp = [&](size_t i) { return static_cast<float>(static_cast<double>(logits[i]) - lse); };
  if (chosen >= 0 && static_cast<size_t>(chosen) < logits.size()) {
    out.logprob = lp(static_cast<size_t>(chosen));
    const float c = logits[static_cast<size_t>(chosen)];
    int32_t at_least = 0;  // vLLM's (x >= chosen).sum(): NaN compares false either way
    for (float l : logits) at_least += l >= c ? 1 : 0;
    out.rank = at_least;
  }
  const size_t k = std::min(static_cast<size_t>(std::max(n, 0)), logits.size());
  if (k == 0) return out;
  // The k largest by (logit descending, id ascending): a bounded insertion list (k <= 20 in
  // practice), NaN logits last.
  auto before = [&](size_t a, size_t b) {
    const float x = logits[a], y = logits[b];
    if (std::isnan(x) != std::isnan(y)) return !std::isnan(x);
    if (x != y) return x > y;
    return a < b;
  };
  std::vector<size_t> best;
  best.reserve(k + 1);
  auto consider = [&](size_t i) {
    if (best.size() == k && !before(i, best.back())) return;
    auto at = std::upper_bound(best.begin(), best.end(), i, [&](size_t a, size_t b) { return before(a, b); });
    best.insert(at, i);
    if (best.size() > k) best.pop_back();
  };
  // Once the list is full, a block whose largest logit does not beat the list's last (a later
  // id loses a tie; NaN beats nothing) holds no entry: one vectorized max skips it.
  constexpr size_t block = 64;
  for (size_t i = 0; i < logits.size();) {
    const float last = best.size() == k ? logits[best.back()] : std::numeric_limits<float>::quiet_NaN();
    if (std::isnan(last)) {
      consider(i++);
      continue;
    }
    const size_t end = std::min(i + block, logits.size());
    float top = -std::numeric_limits<float>::infinity();
    for (size_t j = i; j < end; ++j) top = logits[j] > top ? logits[j] : top;
    if (top > last) {
      for (; i < end; ++i) consider(i);
    } else {
      i = end;
    }
  }
  for (size_t i : best) out.top.push_back({static_cast<int32_t>(i), lp(i)});
  return out;
}

row_logprobs logprobs_rows(std::span<const float> logits, size_t vocab, std::span<const sample_row> rows,
                           std::span<const int32_t> tokens) {
  row_logprobs out;
  if (!any_logprobs(rows)) return out;
  out.resize(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].params.logprobs < 0) continue;
    const auto row = logits.subspan(r * vocab, vocab);
    if (rows[r].params.processed_logprobs && row_adjusts(rows[r])) {
      thread_local std::vector<float> adjusted;  // the logits the draw saw (draw_row's copy)
      adjusted.assign(row.begin(), row.end());
      apply_adjust(adjusted, rows[r].params, *rows[r].adjust);
      out[r] = compute_logprobs(adjusted, tokens[r], rows[r].params.logprobs);
      continue;
    }
    out[r] = compute_logprobs(row, tokens[r], rows[r].params.logprobs);
  }
  return out;
}

int32_t sample(std::span<const float> logits, const sampling_params& params, uint64_t position) {
  if (logits.empty()) return 0;
  const int32_t best = argmax(logits);
  if (is_greedy(params)) return best;
  const float max_logit = logits[best];
  const float inv_t = 1.0f / params.temperature;
  if (!std::isfinite(max_logit) || !std::isfinite(inv_t)) return best;
  const size_t vocab = logits.size();
  const int bits = fx::mass_bits(vocab);
  const uint64_t floor_mass = std::max<uint64_t>(fx::min_mass(params.min_p, bits), 1);
  std::vector<candidate> c;
  c.reserve(vocab);
  for (size_t i = 0; i < vocab; ++i) {
    const uint64_t m = fx::mass_of(exp_det((logits[i] - max_logit) * inv_t), bits);
    if (m >= floor_mass) c.push_back({m, static_cast<int32_t>(i)});  // massless (or below min_p): never drawn
  }
  // The kept tokens: mass > t, and the first `ties` (in id order) whose mass is t. No filter:
  // t = 0, every token with mass. (The most likely token has mass 2^bits: never empty.)
  uint64_t t = 0, ties = 0, kept = 0;
  std::vector<uint64_t> scratch;
  scratch.reserve(c.size());
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < c.size()) {
    const threshold k = find_threshold(c, false, static_cast<uint64_t>(params.top_k), scratch);
    t = k.t;
    ties = static_cast<uint64_t>(params.top_k) - k.count_above;
    kept = k.mass_above + ties * t;
  } else {
    kept = mass_of(c.data(), c.size());
  }
  if (params.top_p < 1.0f) {
    // The shortest prefix (by mass, then id) reaching the target lies within the top-k, so its
    // threshold can be found over every token.
    const uint64_t target = fx::nucleus_target(kept, params.top_p);
    const threshold p = find_threshold(c, true, target, scratch);
    t = p.t;
    ties = fx::ties_needed(target, p.mass_above, p.t);
    kept = p.mass_above + ties * t;
  }
  // Draw: walk the kept tokens in id order (c is in id order).
  const uint64_t u = fx::mulhi(fx::draw_bits(params.seed, position), kept);
  uint64_t acc = 0, seen = 0;
  int32_t last = c.front().id;
  for (const auto& x : c) {
    if (!(x.m > t || (x.m == t && t > 0 && seen++ < ties))) continue;
    acc += x.m;
    last = x.id;
    if (u < acc) return x.id;
  }
  return last;  // unreachable: u < kept
}

std::vector<int32_t> sample_rows(std::span<const float> logits, size_t vocab, std::span<const sample_row> rows,
                                 thread_pool* pool) {
  std::vector<int32_t> out(rows.size());
  auto draw = [&](size_t begin, size_t end) {
    std::vector<float> scratch;
    for (size_t r = begin; r < end; ++r) out[r] = draw_row(logits.subspan(r * vocab, vocab), rows[r], scratch);
  };
  if (pool == nullptr || pool->size() < 2 || rows.size() < 2 || argmax_only(rows)) {
    draw(0, rows.size());
    return out;
  }
  // Rows are independent: split them over the pool. A worker's exception (out of memory) is
  // rethrown here, on the caller's thread.
  std::vector<std::exception_ptr> failed(static_cast<size_t>(pool->size()));
  pool->run([&](int t, int n) {
    try {
      const auto [begin, end] = thread_pool::split(rows.size(), t, n);
      draw(begin, end);
    } catch (...) {
      failed[static_cast<size_t>(t)] = std::current_exception();
    }
  });
  for (auto& e : failed) {
    if (e) std::rethrow_exception(e);
  }
  return out;
}

}  // namespace llmesh::kernels
