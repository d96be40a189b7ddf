// Disaggregated prefill in the in-process mesh (mesh_options::prefill_replicas): a prompt of which
// more than max_local_prefill tokens are not cached on its replica is computed on a prefill
// replica, its whole blocks move to the request's replica, which finds them in its prefix cache
// (the first token's cached_tokens says so) and decodes — each request's tokens exactly those it gets alone. A prefill replica that
// dies mid-prompt costs the request nothing but the work: its replica computes the prompt.
#include <thread>

#include "llmesh/actors/local_mesh.hpp"
#include "llmesh/actors/serving_metrics.hpp"
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

using testing::collector;

class Disaggregated : public testing::replica_test_base {
 protected:
  std::unique_ptr<local_mesh> mesh(int replicas, int prefill_replicas, int tp = 1) {
    mesh_options o;
    o.replicas = replicas;
    o.prefill_replicas = prefill_replicas;
    o.max_local_prefill = 16;
    o.engine.tp = tp;
    o.engine.threads = 2;
    o.engine.kv_tokens = 2048;  // imported blocks are not evicted before their request comes
    o.engine.block_size = 8;
    o.sched.max_batch_tokens = 48;
    auto m = local_mesh::create(model_, o, &metrics_);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
    return m.ok() ? std::move(*m) : nullptr;
  }

  /// The collector's sink, also keeping each request's first cached_tokens.
  token_sink sink(collector& c) {
    auto inner = c.sink();
    return [this, inner](const token_msg& t) {
      {
        std::lock_guard lock(mu_);
        if (!t.failed && !cached_.count(t.id)) cached_[t.id] = t.cached_tokens;
      }
      inner(t);
    };
  }

  /// Every request with its alone tokens; returns how many had a prompt long enough to move.
  size_t expect_alone_tokens(local_mesh& m, const std::vector<replica_request>& reqs, bool moved) {
    auto want = alone(reqs, 1);
    collector c;
    for (const auto& r : reqs) m.submit(r, sink(c));
    EXPECT_TRUE(c.wait_ends(reqs.size())) << c.describe();
    size_t longs = 0;
    for (const auto& r : reqs) {
      EXPECT_FALSE(c.ends[r.id].failed) << c.ends[r.id].err.message;
      EXPECT_EQ(c.tokens[r.id], want[r.id]) << "request " << r.id;
      if (r.prompt.size() <= 16) continue;
      ++longs;
      std::lock_guard lock(mu_);
      // Moved: every whole block but the last token's came from the prefill replica.
      if (moved) {
        EXPECT_EQ(cached_[r.id], static_cast<int32_t>((r.prompt.size() - 1) / 8 * 8)) << "request " << r.id;
      }
    }
    EXPECT_EQ(m.inflight(), 0u);
    return longs;
  }

  double counter(const char* name, label_values labels = {}) {
    auto* c = metrics_.get_counter(name, labels);
    return c ? c->value() : 0.0;
  }

  metrics_registry metrics_;
  std::mutex mu_;
  std::map<uint64_t, int32_t> cached_;
};

TEST_F(Disaggregated, LongPromptsArePrefilledElsewhereAndKeepTheirTokens) {
  auto m = mesh(2, 1);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->replica_count(), 3u);
  EXPECT_EQ(m->ready_replicas(), 2u);  // the prefill replica does not serve alone
  auto reqs = requests(12);
  const size_t longs = expect_alone_tokens(*m, reqs, true);
  ASSERT_GT(longs, 3u);
  EXPECT_EQ(counter(metric::kv_transfers, {"moved"}), static_cast<double>(longs));
  EXPECT_EQ(counter(metric::kv_transfers, {"fallback"}), 0.0);
  EXPECT_GT(counter(metric::kv_transfer_bytes), 0.0);
  EXPECT_EQ(counter(metric::routed, {"2"}), static_cast<double>(longs));  // the prefill replica's count
}

// Conditional disaggregation: a conversation's next turn goes to the replica that holds its
// history (its blocks moved there with the first turn), whose uncached part is short: computed
// there, nothing moved — and its tokens are still those it gets alone.
TEST_F(Disaggregated, ANextTurnIsComputedWhereItsHistoryIsCached) {
  auto m = mesh(1, 1);
  ASSERT_TRUE(m);
  replica_request first;
  first.id = 1;
  for (int i = 0; i < 120; ++i) first.prompt.push_back((i * 13) % 300);
  first.max_tokens = 6;
  expect_alone_tokens(*m, {first}, true);
  EXPECT_EQ(counter(metric::kv_transfers, {"moved"}), 1.0);
  replica_request next = first;  // the history, then 10 new tokens: 10 of 130 not cached
  next.id = 2;
  for (int i = 0; i < 10; ++i) next.prompt.push_back(200 + i);
  auto want = alone({next}, 1);
  collector c;
  m->submit(next, sink(c));
  ASSERT_TRUE(c.wait_ends(1)) << c.describe();
  EXPECT_FALSE(c.ends[2].failed) << c.ends[2].err.message;
  EXPECT_EQ(c.tokens[2], want[2]);
  EXPECT_EQ(counter(metric::kv_transfers, {"moved"}), 1.0);  // not prefilled elsewhere
  EXPECT_EQ(counter(metric::prefill_local, {"cached"}), 1.0);
  {
    // The first turn's whole blocks: 14 moved, the 15th computed and cached by its replica.
    std::lock_guard lock(mu_);
    EXPECT_EQ(cached_[2], 120);
  }
  // Another conversation is prefilled elsewhere again.
  replica_request other = first;
  other.id = 3;
  other.prompt[0] = 299;
  expect_alone_tokens(*m, {other}, true);
  EXPECT_EQ(counter(metric::kv_transfers, {"moved"}), 2.0);
}

TEST_F(Disaggregated, TensorParallelReplicasTakeTheSameBlocks) {
  auto m = mesh(1, 1, 2);
  ASSERT_TRUE(m);
  expect_alone_tokens(*m, requests(6), true);
  EXPECT_GT(counter(metric::kv_transfers, {"moved"}), 0.0);
}

TEST_F(Disaggregated, APrefillReplicaThatDiesCostsOnlyItsWork) {
  auto m = mesh(1, 1);
  ASSERT_TRUE(m);
  m->kill_replica(1, 2);  // the prefill replica crashes at its second step: mid-prompt (48 tokens a step)
  replica_request r;
  r.id = 1;
  for (int i = 0; i < 400; ++i) r.prompt.push_back((i * 7) % 300);
  r.max_tokens = 8;
  expect_alone_tokens(*m, {r}, false);
  EXPECT_EQ(counter(metric::kv_transfers, {"fallback"}), 1.0);  // the prompt went back to its replica
  EXPECT_EQ(counter(metric::kv_transfers, {"moved"}), 0.0);
  EXPECT_EQ(counter(metric::migrations), 0.0);  // not a failover: the request's replica is fine
  // Gone for good: later long prompts are computed where they are served.
  auto more = requests(8);
  for (auto& q : more) q.id += 100;
  expect_alone_tokens(*m, more, false);
  EXPECT_EQ(counter(metric::kv_transfers, {"moved"}), 0.0);
}

TEST_F(Disaggregated, ACancelledRequestIsDroppedOnItsPrefillReplica) {
  auto m = mesh(1, 1);
  ASSERT_TRUE(m);
  replica_request r;
  r.id = 7;
  for (int i = 0; i < 400; ++i) r.prompt.push_back(i % 300);
  r.max_tokens = 50;
  collector c;
  m->submit(r, sink(c));
  for (int i = 0; i < 500 && counter(metric::routed, {"1"}) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(counter(metric::routed, {"1"}), 1.0);  // on its prefill replica (or just past it)
  m->cancel(7);
  for (int i = 0; i < 200 && m->inflight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(m->inflight(), 0u);
  // Neither replica holds it for long (the router's gauges, from their status reports).
  auto held = [&](const char* replica) {
    auto* run = metrics_.get_gauge(metric::running, {replica});
    auto* wait = metrics_.get_gauge(metric::waiting, {replica});
    return (run ? run->value() : 0.0) + (wait ? wait->value() : 0.0);
  };
  for (int i = 0; i < 200 && held("0") + held("1") > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(held("0") + held("1"), 0.0);
  // Both replicas still serve.
  auto reqs = requests(4);
  expect_alone_tokens(*m, reqs, true);
}

// Blocks that do not come within prefill_timeout (a frame the mesh dropped, a prefill replica
// stuck behind others) are not waited for: the request's replica computes the prompt, and the
// prefill replica's late answer is dropped.
TEST_F(Disaggregated, BlocksThatComeTooLateAreNotWaitedFor) {
  mesh_options o;
  o.replicas = 1;
  o.prefill_replicas = 1;
  o.max_local_prefill = 16;
  o.prefill_timeout = std::chrono::milliseconds(1);
  o.engine.threads = 2;
  o.engine.kv_tokens = 2048;
  o.engine.block_size = 8;
  o.sched.max_batch_tokens = 8;  // a prefill of several steps: most answers come after 1 ms
  auto m = local_mesh::create(model_, o, &metrics_);
  ASSERT_TRUE(m.ok()) << m.err().message;
  auto reqs = requests(12);
  const size_t longs = expect_alone_tokens(**m, reqs, false);
  EXPECT_GT(counter(metric::kv_transfers, {"fallback"}), 0.0);
  EXPECT_EQ(counter(metric::kv_transfers, {"fallback"}) + counter(metric::kv_transfers, {"moved"}), static_cast<double>(longs));
}

// A request that scores its prompt computes it whole where it runs (no prefix-cache hit): it
// does not go through a prefill replica, whose work would be lost.
TEST_F(Disaggregated, APromptToScoreIsNotPrefilledElsewhere) {
  auto m = mesh(1, 1);
  ASSERT_TRUE(m);
  replica_request r;
  r.id = 1;
  for (int i = 0; i < 60; ++i) r.prompt.push_back((i * 5) % 300);
  r.max_tokens = 3;
  r.sampling.prompt_logprobs = 1;
  collector c;
  m->submit(r, sink(c));
  ASSERT_TRUE(c.wait_ends(1));
  EXPECT_FALSE(c.ends[1].failed) << c.ends[1].err.message;
  EXPECT_EQ(c.tokens[1].size(), 3u);
  EXPECT_EQ(counter(metric::kv_transfers, {"moved"}) + counter(metric::kv_transfers, {"fallback"}), 0.0);
  EXPECT_EQ(counter(metric::routed, {"1"}), 0.0);  // nothing reached the prefill replica
}

TEST_F(Disaggregated, PrefillReplicasNeedPrefixCaching) {
  mesh_options o;
  o.prefill_replicas = 1;
  o.sched.prefix_caching = false;
  auto m = local_mesh::create(model_, o, nullptr);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.err().message.find("prefix caching"), std::string::npos) << m.err().message;
  o.sched.prefix_caching = true;
  o.prefill_replicas = -1;
  EXPECT_FALSE(local_mesh::create(model_, o, nullptr).ok());
}

}  // namespace
}  // namespace llmesh::actors
