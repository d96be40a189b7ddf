// The batch scheduler against a fake model whose next token hashes every token it reads back
// through the block table from a simulated paged KV cache (so lost, stale or wrongly shared
// blocks change the output): outputs
// are what a single-sequence run produces whatever the batching, chunking, preemption or
// prefix caching; plans respect the token budget and block limits; requests finish on
// max_tokens and EOS; cancellation frees blocks.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>

#include "llmesh/actors/batch_scheduler.hpp"

namespace llmesh::actors {
namespace {

/// The fake model: a hash of the whole context.
int32_t fake_next(std::span<const int32_t> context) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : context) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
  return static_cast<int32_t>(h % 1000);
}

/// What one request alone would generate.
std::vector<int32_t> reference(const request_spec& r) {
  std::vector<int32_t> ctx = r.prompt, out;
  while (out.size() < r.max_tokens) {
    const int32_t t = fake_next(ctx);
    ctx.push_back(t);
    out.push_back(t);
    if (std::find(r.eos_ids.begin(), r.eos_ids.end(), t) != r.eos_ids.end()) break;
  }
  return out;
}

/// The simulated KV cache: one token id per slot.
struct fake_cache {
  size_t bs;
  std::vector<int32_t> slots;
  fake_cache(const block_manager& m) : bs(m.block_size()), slots(m.total_blocks() * m.block_size(), -1) {}
  /// Writes the step's tokens, then returns the sampled token if the sequence wants one.
  int32_t run(const scheduled_seq& q) {
    auto slot = [&](size_t p) { return static_cast<size_t>(q.block_table[p / bs]) * bs + p % bs; };
    for (size_t i = 0; i < q.tokens.size(); ++i) slots[slot(q.pos0 + i)] = q.tokens[i];
    std::vector<int32_t> ctx;
    for (size_t p = 0; p < q.pos0 + q.tokens.size(); ++p) ctx.push_back(slots[slot(p)]);
    return fake_next(ctx);
  }
};

/// Runs the scheduler to completion; checks every plan; returns each request's output.
std::map<uint64_t, std::vector<int32_t>> run_all(batch_scheduler& s, block_manager& m, const scheduler_config& cfg,
                                                 size_t* steps = nullptr) {
  std::map<uint64_t, std::vector<int32_t>> out;
  fake_cache cache(m);
  size_t n_steps = 0;
  while (s.waiting() + s.running() > 0) {
    auto plan = s.schedule();
    EXPECT_FALSE(plan.seqs.empty()) << "stalled with " << s.waiting() << " waiting";
    if (plan.seqs.empty()) break;
    EXPECT_LE(plan.n_tokens, cfg.max_batch_tokens);
    EXPECT_LE(plan.seqs.size(), cfg.max_seqs);
    std::vector<int32_t> sampled;
    for (const auto& q : plan.seqs) {
      EXPECT_GE(q.block_table.size() * m.block_size(), q.pos0 + q.tokens.size());
      const int32_t t = cache.run(q);
      if (q.want_logits) sampled.push_back(t);
    }
    for (const auto& e : s.complete(plan, sampled)) out[e.id].push_back(e.token);
    EXPECT_TRUE(m.check_invariants().ok());
    ++n_steps;
  }
  if (steps) *steps = n_steps;
  return out;
}

request_spec make_request(uint64_t id, size_t prompt_len, size_t max_tokens, int32_t salt = 0) {
  request_spec r;
  r.id = id;
  r.prompt.resize(prompt_len);
  for (size_t i = 0; i < prompt_len; ++i) r.prompt[i] = static_cast<int32_t>((i * 13 + id * 101 + salt) % 1000);
  r.max_tokens = max_tokens;
  return r;
}

TEST(BatchScheduler, OneRequestPrefillsThenDecodes) {
  block_manager m(64, 16);
  scheduler_config cfg;
  batch_scheduler s(cfg, m);
  auto r = make_request(1, 20, 5);
  ASSERT_TRUE(s.add(r).ok());
  size_t steps = 0;
  auto out = run_all(s, m, cfg, &steps);
  EXPECT_EQ(steps, 5u);  // the prompt with the first token, then one step per token
  EXPECT_EQ(out[1], reference(r));
  EXPECT_EQ(m.free_blocks(), 64u);
}

TEST(BatchScheduler, ChunkedPrefillRunsBesideDecodesWithinTheBudget) {
  block_manager m(64, 16);
  scheduler_config cfg;
  cfg.max_batch_tokens = 32;
  batch_scheduler s(cfg, m);
  auto a = make_request(1, 10, 30), b = make_request(2, 100, 4);
  ASSERT_TRUE(s.add(a).ok());
  fake_cache cache(m);
  std::vector<int32_t> out_a;
  auto step = [&]() {
    auto plan = s.schedule();
    std::vector<int32_t> sampled;
    for (const auto& q : plan.seqs) {
      const int32_t t = cache.run(q);
      if (q.want_logits) sampled.push_back(t);
    }
    for (const auto& e : s.complete(plan, sampled)) {
      if (e.id == 1) out_a.push_back(e.token);
    }
    return plan;
  };
  step();  // a's prompt
  ASSERT_TRUE(s.add(b).ok());
  auto mixed = step();  // a decodes (1 token) and b prefills 31 tokens, no logits yet
  ASSERT_EQ(mixed.seqs.size(), 2u);
  EXPECT_EQ(mixed.seqs[0].id, 1u);
  EXPECT_EQ(mixed.seqs[0].tokens.size(), 1u);
  EXPECT_EQ(mixed.seqs[1].tokens.size(), 31u);
  EXPECT_FALSE(mixed.seqs[1].want_logits);
  EXPECT_TRUE(mixed.seqs[0].want_logits);
  while (s.running() + s.waiting() > 0) {
    auto plan = step();
    EXPECT_LE(plan.n_tokens, 32u);
  }
  EXPECT_EQ(out_a, reference(a));
}

TEST(BatchScheduler, OutputsDoNotDependOnBatchingPreemptionOrCaching) {
  std::mt19937 rng(7);
  std::vector<request_spec> reqs;
  for (uint64_t id = 1; id <= 24; ++id) {
    auto r = make_request(id, 1 + rng() % 60, 1 + rng() % 40, id % 3 == 0 ? 0 : static_cast<int32_t>(id));
    if (id % 5 == 0) r.eos_ids = {reference(r)[r.max_tokens / 2]};  // some end early on EOS
    reqs.push_back(r);
  }
  // A roomy pool and a tight one (forces preemption), with and without prefix caching.
  for (size_t blocks : {512, 14}) {
    for (bool caching : {true, false}) {
      block_manager m(blocks, 8, caching);
      scheduler_config cfg;
      cfg.max_batch_tokens = 48;
      cfg.max_seqs = 6;
      batch_scheduler s(cfg, m);
      for (const auto& r : reqs) ASSERT_TRUE(s.add(r).ok());
      auto out = run_all(s, m, cfg);
      for (const auto& r : reqs) EXPECT_EQ(out[r.id], reference(r)) << "request " << r.id << " blocks " << blocks;
      if (blocks == 14) {
        EXPECT_GT(s.preemptions(), 0u);
      }
      EXPECT_EQ(m.free_blocks(), blocks);
    }
  }
}

TEST(BatchScheduler, PrefixCacheSkipsComputedPromptBlocks) {
  block_manager m(64, 16);
  scheduler_config cfg;
  batch_scheduler s(cfg, m);
  auto a = make_request(1, 40, 1);
  ASSERT_TRUE(s.add(a).ok());
  run_all(s, m, cfg);
  auto b = a;
  b.id = 2;
  ASSERT_TRUE(s.add(b).ok());
  auto plan = s.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].pos0, 32u);  // two cached blocks
  EXPECT_EQ(plan.seqs[0].tokens.size(), 8u);
}

TEST(BatchScheduler, AdmitsOnlyWhatTheBlocksHold) {
  block_manager m(4, 16);  // 64 positions
  scheduler_config cfg;
  batch_scheduler s(cfg, m);
  ASSERT_TRUE(s.add(make_request(1, 40, 10)).ok());
  ASSERT_TRUE(s.add(make_request(2, 40, 10)).ok());
  auto plan = s.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);  // the second needs 3 more blocks: it waits
  EXPECT_EQ(s.waiting(), 1u);
}

TEST(BatchScheduler, CancelFreesBlocksAndRefusesBadRequests) {
  block_manager m(8, 16);
  scheduler_config cfg;
  batch_scheduler s(cfg, m);
  ASSERT_TRUE(s.add(make_request(1, 30, 10)).ok());
  EXPECT_FALSE(s.add(make_request(1, 5, 1)).ok());  // duplicate id
  EXPECT_FALSE(s.add(make_request(2, 0, 1)).ok());  // empty prompt
  EXPECT_FALSE(s.add(make_request(3, 5, 0)).ok());  // nothing to generate
  auto plan = s.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_LT(m.free_blocks(), 8u);
  EXPECT_TRUE(s.cancel(1));
  EXPECT_FALSE(s.cancel(1));
  EXPECT_EQ(m.free_blocks(), 8u);
  EXPECT_TRUE(s.complete(plan, std::vector<int32_t>{5}).empty());  // results of a cancelled step are dropped
  EXPECT_EQ(s.running() + s.waiting(), 0u);
}

}  // namespace
}  // namespace llmesh::actors
