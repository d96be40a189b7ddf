// The batch scheduler against a fake model whose next token hashes every token it reads back
// through the block table from a simulated paged KV cache (so lost, stale or wrongly shared
// blocks change the output): outputs
// are what a single-sequence run produces whatever the batching, chunking, preemption or
// prefix caching; plans respect the token budget and block limits; requests finish on
// max_tokens and EOS; cancellation frees blocks.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "llmesh/actors/batch_scheduler.hpp"

namespace llmesh::actors {
namespace {

/// The fake model: a hash of the whole context.
int32_t fake_next(std::span<const int32_t> context) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : context) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
  return static_cast<int32_t>(h % 1000);
}

/// A fake model that mostly copies (the token 7 back), with a fresh token wherever the hash
/// says so (one context in 4): prompt lookup guesses it right often, never always.
int32_t copying_next(std::span<const int32_t> context) {
  const int32_t h = fake_next(context);
  const uint32_t mixed = static_cast<uint32_t>(h) * 2654435761u;  // fake_next's low bits repeat
  if (context.size() < 7 || (mixed >> 16) % 4 == 0) return h;
  return context[context.size() - 7];
}

using next_fn = int32_t (*)(std::span<const int32_t>);

/// What one request alone would generate.
std::vector<int32_t> reference(const request_spec& r, next_fn next = fake_next) {
  std::vector<int32_t> ctx = r.prompt, out;
  while (out.size() < r.max_tokens) {
    const int32_t t = next(ctx);
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
    auto t = run_rows(q, fake_next);
    return t.empty() ? -1 : t.back();
  }
  /// Writes the step's tokens, then returns the token drawn from each of its drawn rows (the
  /// last q.draws positions, when it wants logits), each from the context up to its position.
  std::vector<int32_t> run_rows(const scheduled_seq& q, next_fn next) {
    auto slot = [&](size_t p) { return static_cast<size_t>(q.block_table[p / bs]) * bs + p % bs; };
    for (size_t i = 0; i < q.tokens.size(); ++i) slots[slot(q.pos0 + i)] = q.tokens[i];
    std::vector<int32_t> ctx, drawn;
    for (size_t p = 0; p < q.pos0 + q.tokens.size(); ++p) ctx.push_back(slots[slot(p)]);
    for (size_t r = q.want_logits ? q.draws : 0; r > 0; --r) drawn.push_back(next(std::span<const int32_t>(ctx).first(ctx.size() - r + 1)));
    return drawn;
  }
};

/// Runs the scheduler to completion; checks every plan; returns each request's output.
std::map<uint64_t, std::vector<int32_t>> run_all(batch_scheduler& s, block_manager& m, const scheduler_config& cfg,
                                                 size_t* steps = nullptr, next_fn next = fake_next) {
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
      EXPECT_TRUE(q.draws == 1 || (q.want_logits && q.draws <= q.tokens.size()));
      for (int32_t t : cache.run_rows(q, next)) sampled.push_back(t);
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

/// Steps until each request drew its first token, stepping the scheduler to the end (`widest`:
/// the most tokens one sequence ran in a step).
std::map<uint64_t, size_t> first_token_steps(batch_scheduler& s, fake_cache& cache, const scheduler_config& cfg,
                                             std::map<uint64_t, std::vector<int32_t>>& out, next_fn next = fake_next,
                                             size_t* widest = nullptr) {
  std::map<uint64_t, size_t> first;
  for (size_t step = 1; s.waiting() + s.running() > 0; ++step) {
    auto plan = s.schedule();
    EXPECT_FALSE(plan.seqs.empty());
    if (plan.seqs.empty()) break;
    EXPECT_LE(plan.n_tokens, cfg.max_batch_tokens);
    std::vector<int32_t> sampled;
    for (const auto& q : plan.seqs) {
      if (cfg.long_prefill_threshold > 0) EXPECT_LE(q.tokens.size(), cfg.long_prefill_threshold);
      if (widest) *widest = std::max(*widest, q.tokens.size());
      for (int32_t t : cache.run_rows(q, next)) sampled.push_back(t);
    }
    for (const auto& e : s.complete(plan, sampled)) {
      first.emplace(e.id, step);
      out[e.id].push_back(e.token);
    }
  }
  return first;
}

// vLLM's --long-prefill-token-threshold: a long prompt runs at most that many tokens a step, so
// a short request behind it is admitted at once instead of after the whole long prompt; the
// outputs stay the single-sequence ones.
TEST(BatchScheduler, ALongPrefillThresholdLetsShortPromptsPassALongOne) {
  const auto long_one = make_request(1, 400, 3), short_one = make_request(2, 6, 3);
  std::map<size_t, std::map<uint64_t, size_t>> first;  // by threshold
  for (size_t threshold : {0, 32}) {
    block_manager m(128, 16);
    scheduler_config cfg;
    cfg.max_batch_tokens = 64;
    cfg.long_prefill_threshold = threshold;
    batch_scheduler s(cfg, m);
    ASSERT_TRUE(s.add(long_one).ok());
    ASSERT_TRUE(s.add(short_one).ok());
    std::map<uint64_t, std::vector<int32_t>> out;
    fake_cache cache(m);
    first[threshold] = first_token_steps(s, cache, cfg, out);
    EXPECT_EQ(out[1], reference(long_one)) << threshold;
    EXPECT_EQ(out[2], reference(short_one)) << threshold;
  }
  EXPECT_EQ(first[0][1], 7u);  // 400 tokens at 64 a step
  EXPECT_EQ(first[0][2], 7u);  // behind it: the budget was all the long prompt's
  EXPECT_EQ(first[32][2], 1u);  // beside its first chunk of 32
  EXPECT_EQ(first[32][1], 13u);  // 400 at 32 a step
}

// vLLM's --max-num-partial-prefills / --max-long-partial-prefills: at most N prompts computed
// at once, at most M of them long; a long prompt past M waits while short ones behind it pass.
TEST(BatchScheduler, PartialPrefillLimitsLetShortPromptsJumpLongOnes) {
  block_manager m(256, 16);
  scheduler_config cfg;
  cfg.max_batch_tokens = 64;
  cfg.long_prefill_threshold = 16;
  cfg.max_partial_prefills = 2;
  cfg.max_long_partial_prefills = 1;
  batch_scheduler s(cfg, m);
  const std::vector<request_spec> reqs = {make_request(1, 200, 2), make_request(2, 150, 2), make_request(3, 10, 2),
                                          make_request(4, 12, 2), make_request(5, 8, 2)};
  for (const auto& r : reqs) ASSERT_TRUE(s.add(r).ok());
  auto plan = s.schedule();
  std::vector<uint64_t> ids;
  for (const auto& q : plan.seqs) ids.push_back(q.id);
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 3}));  // 2 is long past the limit, 3 passes it; then 2 prompts at once
  std::vector<int32_t> sampled;
  fake_cache cache(m);
  for (const auto& q : plan.seqs) {
    const int32_t t = cache.run(q);
    if (q.want_logits) sampled.push_back(t);
  }
  (void)s.complete(plan, sampled);
  std::map<uint64_t, std::vector<int32_t>> out;
  auto first = first_token_steps(s, cache, cfg, out);
  for (uint64_t id : {4u, 5u}) EXPECT_LT(first[id], first[1]) << id;  // the short ones before the long ones
  EXPECT_LT(first[1], first[2]);
  for (const auto& r : reqs) {
    if (r.id != 3) EXPECT_EQ(out[r.id], reference(r)) << r.id;
  }
  EXPECT_EQ(m.free_blocks(), 256u);
}

// However many long prompts wait past the long limit, a short one behind them is reached; and a
// speculating decode runs at most the threshold's tokens, drafts included (vLLM V1's cap).
TEST(BatchScheduler, ShortPromptsPassAnyNumberOfWaitingLongOnesAndDraftsKeepTheCap) {
  block_manager m(4096, 16);
  scheduler_config cfg;
  cfg.max_batch_tokens = 64;
  cfg.long_prefill_threshold = 8;
  cfg.max_partial_prefills = 2;
  cfg.max_long_partial_prefills = 1;
  batch_scheduler s(cfg, m);
  for (uint64_t id = 1; id <= 100; ++id) ASSERT_TRUE(s.add(make_request(id, 40, 1)).ok());
  ASSERT_TRUE(s.add(make_request(101, 5, 1)).ok());
  auto plan = s.schedule();
  ASSERT_EQ(plan.seqs.size(), 2u);
  EXPECT_EQ(plan.seqs[0].id, 1u);
  EXPECT_EQ(plan.seqs[0].tokens.size(), 8u);
  EXPECT_EQ(plan.seqs[1].id, 101u);

  block_manager m2(256, 16);
  scheduler_config spec_cfg;
  spec_cfg.long_prefill_threshold = 3;
  spec_cfg.speculation.tokens = 5;
  batch_scheduler s2(spec_cfg, m2);
  auto r = make_request(1, 30, 40);
  for (size_t i = 0; i < r.prompt.size(); ++i) r.prompt[i] = static_cast<int32_t>(i % 4);  // repeats: lookups find drafts
  r.speculate = true;
  ASSERT_TRUE(s2.add(r).ok());
  size_t widest = 0;
  fake_cache cache(m2);
  std::map<uint64_t, std::vector<int32_t>> out;
  first_token_steps(s2, cache, spec_cfg, out, copying_next, &widest);
  EXPECT_EQ(widest, 3u);  // prompt chunks of 3, and decodes of 1 + at most 2 drafts
  EXPECT_GT(s2.drafted(), 0u);
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

/// Runs steps with the fake model until no request is left, each event to `on`; each step's
/// "forward" takes `step_time`.
void run_until_idle(batch_scheduler& s, fake_cache& cache, const std::function<void(const token_event&)>& on,
                    std::chrono::milliseconds step_time = std::chrono::milliseconds(0)) {
  while (s.waiting() + s.running() > 0) {
    auto plan = s.schedule();
    ASSERT_FALSE(plan.seqs.empty());
    std::vector<int32_t> sampled;
    for (const auto& q : plan.seqs) {
      for (int32_t t : cache.run_rows(q, fake_next)) sampled.push_back(t);
    }
    std::this_thread::sleep_for(step_time);
    for (const auto& e : s.complete(plan, sampled)) on(e);
  }
}

// The client's cached_tokens: a request's first token says how many of its tokens the prefix
// cache held when it was first admitted; its other tokens say nothing (-1).
TEST(BatchScheduler, TheFirstTokenCarriesThePrefixCacheHit) {
  block_manager m(64, 16);
  scheduler_config cfg;
  batch_scheduler s(cfg, m);
  auto a = make_request(1, 40, 3);
  ASSERT_TRUE(s.add(a).ok());
  auto b = make_request(3, 20, 2, /*salt=*/7);  // a prompt nothing else shares
  ASSERT_TRUE(s.add(b).ok());
  std::map<uint64_t, std::vector<int32_t>> reported;
  fake_cache cache(m);
  auto drive = [&] { run_until_idle(s, cache, [&](const token_event& e) { reported[e.id].push_back(e.cached_tokens); }); };
  drive();
  EXPECT_EQ(reported[1], (std::vector<int32_t>{0, -1, -1}));  // nothing was cached yet
  EXPECT_EQ(reported[3], (std::vector<int32_t>{0, -1}));
  auto again = a;
  again.id = 2;
  ASSERT_TRUE(s.add(again).ok());
  drive();
  EXPECT_EQ(reported[2], (std::vector<int32_t>{32, -1, -1}));  // two whole blocks of its 40
}

// A request's time on the replica: its first token says how long it waited and how long its
// prefill took, its last token adds the whole inference; the tokens between say nothing. A
// request that waited for another (one sequence at a time) reports that wait.
TEST(BatchScheduler, FirstAndLastTokensCarryTheRequestsTimes) {
  block_manager m(64, 16);
  scheduler_config cfg;
  cfg.max_seqs = 1;
  batch_scheduler s(cfg, m);
  ASSERT_TRUE(s.add(make_request(1, 20, 3)).ok());
  ASSERT_TRUE(s.add(make_request(2, 20, 1, /*salt=*/5)).ok());
  std::map<uint64_t, std::vector<replica_times>> reported;
  fake_cache cache(m);
  run_until_idle(s, cache, [&](const token_event& e) { reported[e.id].push_back(e.times); }, std::chrono::milliseconds(5));
  const auto& a = reported[1];
  ASSERT_EQ(a.size(), 3u);
  EXPECT_GE(a[0].queued_us, 0);
  EXPECT_GE(a[0].prefill_us, 5000);  // admitted, then one step to its first token
  EXPECT_EQ(a[0].inference_us, -1);
  EXPECT_EQ(a[1], replica_times{});
  EXPECT_EQ(a[2].queued_us, a[0].queued_us);
  EXPECT_EQ(a[2].prefill_us, a[0].prefill_us);
  EXPECT_GE(a[2].inference_us, a[2].prefill_us + 2 * 5000);  // two more steps
  // Request 2 waited for request 1's three steps; its one token is first and last at once.
  const auto& b = reported[2];
  ASSERT_EQ(b.size(), 1u);
  EXPECT_GE(b[0].queued_us, 3 * 5000);
  EXPECT_GE(b[0].prefill_us, 5000);
  EXPECT_GE(b[0].inference_us, b[0].prefill_us);
}

// A response's replica times are one generation's, its slowest: never a mix of two.
TEST(BatchScheduler, ReplicaTimesKeepTheSlowerGenerationWhole) {
  replica_times t;
  t.keep_slower({5, 200'000, 210'000});   // long prefill, short decode
  t.keep_slower({1, 10'000, 500'000});    // the longer inference
  EXPECT_EQ(t, (replica_times{1, 10'000, 500'000}));
  t.keep_slower({9, 300'000, -1});        // no inference (a stop string ended it): not slower
  EXPECT_EQ(t, (replica_times{1, 10'000, 500'000}));
  replica_times u;
  u.keep_slower({9, 300'000, -1});
  u.keep_slower({3, 100, -1});
  EXPECT_EQ(u, (replica_times{9, 300'000, -1}));
  u.keep_slower({});                      // nothing known: changes nothing
  EXPECT_EQ(u, (replica_times{9, 300'000, -1}));
}

// vLLM's priority policy: waiting requests are admitted lowest value first (arrival order
// within one), and blocks come from the lowest-priority running request, never from a more
// urgent one; the outputs stay those of each request alone.
TEST(BatchScheduler, PriorityOrdersAdmissionAndChoosesWhomToPreempt) {
  {
    block_manager m(64, 16);
    scheduler_config cfg;
    cfg.max_seqs = 1;  // one at a time: the admission order shows
    batch_scheduler s(cfg, m);
    const std::vector<std::pair<uint64_t, int32_t>> arrivals{{1, 5}, {2, 0}, {3, 5}, {4, -1}, {5, 0}};
    for (auto [id, prio] : arrivals) {
      auto r = make_request(id, 5, 2);
      r.priority = prio;
      ASSERT_TRUE(s.add(r).ok());
    }
    std::vector<uint64_t> order;
    fake_cache cache(m);
    while (s.waiting() + s.running() > 0) {
      auto plan = s.schedule();
      ASSERT_EQ(plan.seqs.size(), 1u);
      if (std::find(order.begin(), order.end(), plan.seqs[0].id) == order.end()) order.push_back(plan.seqs[0].id);
      std::vector<int32_t> sampled;
      for (const auto& q : plan.seqs) sampled.push_back(cache.run(q));
      s.complete(plan, sampled);
    }
    EXPECT_EQ(order, (std::vector<uint64_t>{4, 2, 5, 1, 3}));
  }
  for (const bool low_first : {true, false}) {
    SCOPED_TRACE(low_first ? "the less urgent one admitted first" : "all of one priority");
    block_manager m(6, 16, /*prefix_caching=*/false);  // 96 positions: two requests of 30 + 40 do not fit
    scheduler_config cfg;
    batch_scheduler s(cfg, m);
    auto older = make_request(1, 30, 40);
    older.priority = low_first ? 1 : 0;
    auto newer = make_request(2, 30, 40);
    ASSERT_TRUE(s.add(older).ok());
    fake_cache cache(m);
    std::map<uint64_t, std::vector<int32_t>> out;
    std::vector<uint64_t> preempted;
    bool added = false;
    while (s.waiting() + s.running() > 0) {
      auto plan = s.schedule();
      ASSERT_FALSE(plan.seqs.empty());
      preempted.insert(preempted.end(), plan.preempted.begin(), plan.preempted.end());
      std::vector<int32_t> sampled;
      for (const auto& q : plan.seqs) sampled.push_back(cache.run(q));
      for (const auto& e : s.complete(plan, sampled)) out[e.id].push_back(e.token);
      if (!added) {
        ASSERT_TRUE(s.add(newer).ok());  // arrives once the older one runs
        added = true;
      }
    }
    ASSERT_FALSE(preempted.empty()) << "the pool was not short";
    // Priority: the less urgent older one gives way; one priority: the newest, as before.
    for (uint64_t id : preempted) EXPECT_EQ(id, low_first ? 1u : 2u);
    EXPECT_EQ(out[1], reference(older));
    EXPECT_EQ(out[2], reference(newer));
  }
}

// vLLM's cache_salt: cached blocks are shared only among requests of one salt; unsalted ones
// share among themselves as before. The outputs are the same either way.
TEST(BatchScheduler, ASaltedRequestHitsOnlyItsSaltsBlocks) {
  block_manager m(64, 16);
  scheduler_config cfg;
  batch_scheduler s(cfg, m);
  auto first_pos0 = [&](request_spec r) {
    EXPECT_TRUE(s.add(r).ok());
    auto plan = s.schedule();
    EXPECT_EQ(plan.seqs.size(), 1u);
    const size_t pos0 = plan.seqs.empty() ? 99 : plan.seqs[0].pos0;
    fake_cache cache(m);  // (the fake's slots need not persist: only the plan is looked at)
    std::vector<int32_t> sampled;
    for (const auto& q : plan.seqs) sampled.push_back(cache.run(q));
    s.complete(plan, sampled);
    while (s.waiting() + s.running() > 0) {
      auto next = s.schedule();
      std::vector<int32_t> more;
      for (const auto& q : next.seqs) more.push_back(cache.run(q));
      s.complete(next, more);
    }
    return pos0;
  };
  auto req = [](uint64_t id, uint64_t salt) {
    auto r = make_request(1, 40, 1);  // one prompt for all
    r.id = id;
    r.cache_salt = salt;
    return r;
  };
  EXPECT_EQ(first_pos0(req(1, 0xa)), 0u);   // nothing cached
  EXPECT_EQ(first_pos0(req(2, 0xa)), 32u);  // its salt's two blocks
  EXPECT_EQ(first_pos0(req(3, 0xb)), 0u);   // another salt finds none
  EXPECT_EQ(first_pos0(req(4, 0)), 0u);     // nor does no salt
  EXPECT_EQ(first_pos0(req(5, 0)), 32u);    // unsalted requests share among themselves
  EXPECT_EQ(first_pos0(req(6, 0xb)), 32u);
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

// --- speculative decoding (scheduler_config::speculation) ---

TEST(BatchScheduler, SpeculationKeepsTheDraftsTheModelDrawsAndChangesNoToken) {
  std::mt19937 rng(11);
  std::vector<request_spec> reqs;
  for (uint64_t id = 1; id <= 16; ++id) {
    auto r = make_request(id, 1 + rng() % 50, 1 + rng() % 60, static_cast<int32_t>(id));
    r.speculate = id % 4 != 0;  // some may not
    if (id % 5 == 0) r.eos_ids = {reference(r, copying_next)[r.max_tokens / 2]};
    reqs.push_back(r);
  }
  size_t plain_steps = 0;
  {
    block_manager m(512, 8);
    scheduler_config cfg;
    cfg.max_batch_tokens = 40;
    cfg.max_seqs = 6;
    batch_scheduler s(cfg, m);
    for (const auto& r : reqs) ASSERT_TRUE(s.add(r).ok());
    auto out = run_all(s, m, cfg, &plain_steps, copying_next);
    for (const auto& r : reqs) ASSERT_EQ(out[r.id], reference(r, copying_next)) << "request " << r.id;
    EXPECT_EQ(s.drafted(), 0u);
  }
  for (size_t blocks : {512, 16}) {  // roomy, and tight (preemption; drafts must not cause it)
    block_manager m(blocks, 8);
    scheduler_config cfg;
    cfg.max_batch_tokens = 40;
    cfg.max_seqs = 6;
    cfg.speculation = {4, 3, 1};
    batch_scheduler s(cfg, m);
    for (const auto& r : reqs) ASSERT_TRUE(s.add(r).ok());
    size_t steps = 0;
    auto out = run_all(s, m, cfg, &steps, copying_next);
    for (const auto& r : reqs) EXPECT_EQ(out[r.id], reference(r, copying_next)) << "request " << r.id << " blocks " << blocks;
    EXPECT_GT(s.drafted(), 0u);
    EXPECT_GT(s.accepted(), 0u);
    EXPECT_LT(s.accepted(), s.drafted());  // a fresh token now and then refuses a draft
    if (blocks == 512) {
      EXPECT_LT(steps, plain_steps);
    }
    EXPECT_EQ(m.free_blocks(), blocks);
  }
}

/// A model that repeats the prompt's period (3) forever: every draft is drawn as proposed.
int32_t period3_next(std::span<const int32_t> context) { return context[context.size() - 3]; }

TEST(BatchScheduler, SpeculationEndsAtMaxTokensAndAtAnEndIdAmongTheDrafts) {
  block_manager m(64, 4);
  scheduler_config cfg;
  cfg.speculation = {4, 3, 1};
  batch_scheduler s(cfg, m);
  request_spec r;
  r.id = 1;
  r.prompt = {10, 11, 12, 10, 11, 12};
  r.max_tokens = 7;
  r.speculate = true;
  ASSERT_TRUE(s.add(r).ok());
  fake_cache cache(m);
  auto step = [&](std::vector<token_event>& events) {
    auto plan = s.schedule();
    std::vector<int32_t> sampled;
    for (const auto& q : plan.seqs) {
      for (int32_t t : cache.run_rows(q, period3_next)) sampled.push_back(t);
    }
    auto ev = s.complete(plan, sampled);
    events.insert(events.end(), ev.begin(), ev.end());
    return plan;
  };
  std::vector<token_event> ev;
  step(ev);  // the prompt, and its first token
  ASSERT_EQ(ev.size(), 1u);
  auto plan = step(ev);  // the last token and 4 drafts: all kept, and the token after them
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].draws, 5u);
  EXPECT_EQ(plan.seqs[0].pos0, 6u);
  ASSERT_EQ(ev.size(), 6u);
  for (size_t i = 1; i < ev.size(); ++i) EXPECT_EQ(ev[i].row, i - 1);
  EXPECT_EQ(ev.back().finish, finish_reason::none);
  plan = step(ev);  // one token left: nothing to draft
  EXPECT_EQ(plan.seqs[0].draws, 1u);
  ASSERT_EQ(ev.size(), 7u);
  EXPECT_EQ(ev.back().finish, finish_reason::length);
  std::vector<int32_t> got;
  for (const auto& e : ev) got.push_back(e.token);
  EXPECT_EQ(got, reference(r, period3_next));
  EXPECT_EQ(s.accepted(), 4u);
  EXPECT_EQ(m.free_blocks(), 64u);

  // An end id among the kept drafts ends the request there.
  r.id = 2;
  r.max_tokens = 20;
  r.eos_ids = {12};
  ASSERT_TRUE(s.add(r).ok());
  ev.clear();
  step(ev);  // 10
  step(ev);  // 11, 12 (drafts 10 11 12 10 proposed; 12 ends it)
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[2].token, 12);
  EXPECT_EQ(ev[2].finish, finish_reason::eos);
  EXPECT_EQ(s.running() + s.waiting(), 0u);
  EXPECT_EQ(m.free_blocks(), 64u);
  EXPECT_TRUE(m.check_invariants().ok());
}

TEST(BatchScheduler, OnlyRequestsThatMaySpeculateGetDrafts) {
  block_manager m(64, 4);
  scheduler_config cfg;
  cfg.speculation = {4, 3, 1};
  batch_scheduler s(cfg, m);
  request_spec a;
  a.id = 1;
  a.prompt = {10, 11, 12, 10, 11, 12};
  a.max_tokens = 8;
  auto b = a;
  b.id = 2;
  b.speculate = true;
  b.prompt_logprobs = 0;  // scoring its prompt: its first step draws one row
  ASSERT_TRUE(s.add(a).ok());
  ASSERT_TRUE(s.add(b).ok());
  fake_cache cache(m);
  for (int i = 0; i < 3; ++i) {
    auto plan = s.schedule();
    std::vector<int32_t> sampled;
    for (const auto& q : plan.seqs) {
      if (q.id == 1) {
        EXPECT_EQ(q.draws, 1u);
      } else if (i == 0) {
        EXPECT_EQ(q.draws, 1u);
      } else {
        EXPECT_GT(q.draws, 1u);  // after its first token, it may
      }
      for (int32_t t : cache.run_rows(q, period3_next)) sampled.push_back(t);
    }
    s.complete(plan, sampled);
  }
}

TEST(BatchScheduler, SpeculationLeavesEveryRunningRequestItsTokenAndGivesBackUnkeptBlocks) {
  // A budget of 10 tokens for 6 decoding requests: drafts take only what their one-token
  // decodes leave; and after each step a request holds just the blocks its tokens need (those
  // of drafts not kept go back). No prefix caching, so blocks in use are exactly the requests'.
  const size_t bs = 4;
  block_manager m(200, bs, false);
  scheduler_config cfg;
  cfg.max_batch_tokens = 10;
  cfg.speculation = {4, 3, 1};
  batch_scheduler s(cfg, m);
  std::map<uint64_t, size_t> length;  // prompt + output so far, of requests that drew a token
  std::set<uint64_t> open;
  for (uint64_t id = 1; id <= 6; ++id) {
    auto r = make_request(id, 6, 40, static_cast<int32_t>(id));
    r.speculate = true;
    ASSERT_TRUE(s.add(r).ok());
    length[id] = r.prompt.size();
    open.insert(id);
  }
  fake_cache cache(m);
  std::set<uint64_t> started;
  size_t drafting_steps = 0;
  while (s.running() + s.waiting() > 0) {
    auto plan = s.schedule();
    ASSERT_FALSE(plan.seqs.empty());
    EXPECT_LE(plan.n_tokens, cfg.max_batch_tokens);
    const bool all_decoding = started.size() == open.size();  // every open request past its prompt
    size_t drafts = 0;
    std::vector<int32_t> sampled;
    for (const auto& q : plan.seqs) {
      drafts += q.draws - 1;
      for (int32_t t : cache.run_rows(q, copying_next)) sampled.push_back(t);
    }
    if (all_decoding) {
      EXPECT_EQ(plan.seqs.size(), open.size()) << "a running request got no token";
    }
    if (drafts > 0) ++drafting_steps;
    for (const auto& e : s.complete(plan, sampled)) {
      ++length[e.id];
      started.insert(e.id);
      if (e.finish != finish_reason::none) length.erase(e.id), open.erase(e.id), started.erase(e.id);
    }
    if (started.size() == open.size()) {
      size_t need = 0;
      for (uint64_t id : open) need += (length[id] - 1 + bs - 1) / bs;  // the last token is not computed yet
      EXPECT_EQ(m.total_blocks() - m.free_blocks(), need);
    }
  }
  EXPECT_GT(drafting_steps, 0u);
  EXPECT_GT(s.accepted(), 0u) << s.drafted() << " drafts in " << drafting_steps << " steps";
  EXPECT_LT(s.accepted(), s.drafted());
  EXPECT_EQ(m.free_blocks(), m.total_blocks());
}

/// A model whose continuations lookup cannot guess: a fresh token every time (prompts that
/// repeat themselves, so lookups find matches to propose).
int32_t unguessable_next(std::span<const int32_t> context) {
  const uint32_t mixed = static_cast<uint32_t>(fake_next(context)) * 2654435761u;
  return static_cast<int32_t>((mixed >> 8) % 20);  // few distinct tokens: lookups always find a match
}

TEST(BatchScheduler, SpeculationBacksOffWhenNoDraftIsKept) {
  std::vector<request_spec> reqs;
  for (uint64_t id = 1; id <= 8; ++id) {
    request_spec r;
    r.id = id;
    for (int rep = 0; rep < 4; ++rep) {
      for (int32_t t = 0; t < 5; ++t) r.prompt.push_back(static_cast<int32_t>(id * 10) + t);
    }
    r.max_tokens = 64;
    r.speculate = true;
    reqs.push_back(r);
  }
  block_manager m(512, 8);
  scheduler_config cfg;
  cfg.speculation = {8, 3, 1};
  batch_scheduler s(cfg, m);
  for (const auto& r : reqs) ASSERT_TRUE(s.add(r).ok());
  size_t steps = 0;
  auto out = run_all(s, m, cfg, &steps, unguessable_next);
  for (const auto& r : reqs) EXPECT_EQ(out[r.id], reference(r, unguessable_next)) << "request " << r.id;
  // Without backing off, every decode (8 requests × 63) would run 8 drafts, ~2500 here; the
  // first miss cuts a request to 1 draft and sits it out for longer and longer (~110).
  EXPECT_GT(s.drafted(), 0u);
  EXPECT_LT(s.drafted(), 8u * 63 / 2) << "drafted " << s.drafted() << " over " << steps << " steps";
}

TEST(BatchScheduler, NoDraftsWhileMoreRequestsRunThanTheLimit) {
  // Three requests over a model that repeats its period: with the limit at 2, no step drafts
  // while all three run; once one has ended, the other two draft again.
  block_manager m(64, 4);
  scheduler_config cfg;
  cfg.speculation = {4, 3, 1, 2};
  batch_scheduler s(cfg, m);
  for (uint64_t id = 1; id <= 3; ++id) {
    request_spec r;
    r.id = id;
    const auto a = static_cast<int32_t>(10 * id);  // distinct prompts: none waits for another's prefix
    r.prompt = {a, a + 1, a + 2, a, a + 1, a + 2};
    r.max_tokens = id == 1 ? 12 : 40;
    r.speculate = true;
    ASSERT_TRUE(s.add(r).ok());
  }
  fake_cache cache(m);
  size_t drafting_steps = 0, steps_with_three = 0;
  while (s.running() + s.waiting() > 0) {
    const size_t running = s.running();
    auto plan = s.schedule();
    std::vector<int32_t> sampled;
    size_t drafts = 0;
    for (const auto& q : plan.seqs) {
      drafts += q.draws - 1;
      for (int32_t t : cache.run_rows(q, period3_next)) sampled.push_back(t);
    }
    if (running == 3) {
      ++steps_with_three;
      EXPECT_EQ(drafts, 0u) << "drafts while 3 requests run";
    }
    drafting_steps += drafts > 0;
    s.complete(plan, sampled);
  }
  EXPECT_GT(steps_with_three, 2u);
  EXPECT_GT(drafting_steps, 0u);
}

}  // namespace
}  // namespace llmesh::actors
