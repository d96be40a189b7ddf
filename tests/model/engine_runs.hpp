// Engine test helpers shared by the model tests (kv_cache_dtype, kv_scales, rope_scaling, fp8_weights): a prompt of
// the tests' 300-id vocabulary, a sequence run whole, in chunks or beside neighbours, and logit comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/engine.hpp"

namespace llmesh::model::testing {

/// n ids below 300, different for each salt.
inline std::vector<int32_t> prompt_of(size_t n, uint32_t salt) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((i * 37 + salt * 101 + 11) % 300);
  return p;
}

/// The last prompt token's logits, then 5 greedy steps'; `neighbours` other sequences (prompts
/// of their own, then decoding) share every step.
inline std::vector<std::vector<float>> run(engine& e, const std::vector<int32_t>& prompt, size_t chunk, int neighbours = 0) {
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  const size_t v = e.config().vocab;
  std::vector<int> others;
  std::vector<std::vector<int32_t>> other_prompts;
  for (int i = 0; i < neighbours; ++i) {
    others.push_back(e.open_sequence());
    other_prompts.push_back(prompt_of(7 + 3 * i, 40 + i));
  }
  std::vector<int32_t> other_next(neighbours, 3);
  const int seq = e.open_sequence();
  auto step = [&](std::span<const int32_t> tokens, bool want) {
    std::vector<step_item> items;
    for (int i = 0; i < neighbours; ++i) {  // neighbours first: the target's row is the last
      if (!other_prompts[i].empty()) {
        items.push_back({others[i], other_prompts[i], true});
      } else {
        items.push_back({others[i], std::span(&other_next[i], 1), true});
      }
    }
    items.push_back({seq, tokens, want});
    EXPECT_TRUE(e.step(items, logits).ok());
    for (auto& p : other_prompts) p.clear();
    for (int i = 0; i < neighbours; ++i) other_next[i] = kernels::argmax(std::span(&logits[i * v], v));
    if (!want) return std::vector<float>();
    return std::vector<float>(logits.end() - static_cast<std::ptrdiff_t>(v), logits.end());
  };
  std::vector<float> last;
  for (size_t at = 0; at < prompt.size(); at += chunk) {
    const size_t n = std::min(chunk, prompt.size() - at);
    last = step(std::span(prompt).subspan(at, n), at + n == prompt.size());
  }
  out.push_back(last);
  for (int i = 0; i < 5; ++i) {
    const int32_t next = kernels::argmax(out.back());
    out.push_back(step(std::span(&next, 1), true));
  }
  e.close_sequence(seq);
  for (int s : others) e.close_sequence(s);
  return out;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// A CPU engine of `tp` ranks (2 threads, blocks of 4, 2048 positions) whose KV cache holds `kv`.
inline std::unique_ptr<engine> engine_with(std::shared_ptr<const model> m, kernels::dtype kv, int tp = 1) {
  engine_options o;
  o.tp = tp;
  o.threads = 2;
  o.kv_tokens = 2048;
  o.block_size = 4;
  o.kv_type = kv;
  o.device = backend::cpu;
  auto e = engine::create(std::move(m), o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
  return e.ok() ? std::move(*e) : nullptr;
}

/// max |a − b| / max |a|: how far logits b are from a, relative to a's largest.
inline float relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(a[i]));
    max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
  }
  return max_diff / max_abs;
}

/// Every row of a run the same bits as the other's.
inline bool same_rows(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!same_bits(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace llmesh::model::testing
