// The replica's work loop on the real CPU engine: every request's tokens equal what
// model::generate produces for it alone — greedy and sampled, at 16 concurrent requests, with
// a small token budget (chunked prefill beside decodes), a KV pool small enough to force
// preemption, prefix-cache hits, and at --tp 2. Exact equality: the kernels are batch- and
// chunk-invariant and sampling is keyed by (seed, position).
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

class ReplicaCore : public testing::replica_test_base {};

std::map<uint64_t, std::vector<int32_t>> serve(replica_core& rc, const std::vector<replica_request>& reqs) {
  std::map<uint64_t, std::vector<int32_t>> out;
  for (const auto& r : reqs) EXPECT_TRUE(rc.submit(r).ok());
  for (int guard = 0; !rc.idle() && guard < 10000; ++guard) {
    auto ev = rc.step();
    EXPECT_TRUE(ev.ok()) << (ev.ok() ? "" : ev.err().message);
    if (!ev.ok()) break;
    for (const auto& e : *ev) out[e.id].push_back(e.token);
  }
  EXPECT_TRUE(rc.idle());
  return out;
}

TEST_F(ReplicaCore, ConcurrentRequestsMatchGenerateAlone) {
  auto reqs = requests(16);
  auto want = alone(reqs, 1);
  auto e = engine(1, 1024);
  scheduler_config cfg;
  cfg.max_batch_tokens = 48;  // prompts arrive in chunks beside other requests' decodes
  replica_core rc(*e, cfg);
  auto got = serve(rc, reqs);
  for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id;
  EXPECT_GT(rc.blocks().hit_tokens(), 0u);  // the shared system prompt came from the cache
  EXPECT_EQ(rc.blocks().free_blocks(), rc.blocks().total_blocks());
}

TEST_F(ReplicaCore, PreemptionUnderATightCacheChangesNoToken) {
  auto reqs = requests(16);
  auto want = alone(reqs, 1);
  auto e = engine(1, 160);  // 20 blocks of 8: a few requests at a time
  scheduler_config cfg;
  cfg.max_batch_tokens = 64;
  replica_core rc(*e, cfg);
  auto got = serve(rc, reqs);
  for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id;
  EXPECT_GT(rc.scheduler().preemptions(), 0u);
}

TEST_F(ReplicaCore, TensorParallelReplicaMatchesGenerate) {
  auto reqs = requests(8);
  auto want = alone(reqs, 2);
  auto e = engine(2, 1024);
  replica_core rc(*e, scheduler_config{});
  auto got = serve(rc, reqs);
  for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id;
}

TEST_F(ReplicaCore, CancelAndBadRequests) {
  auto e = engine(1, 256);
  replica_core rc(*e, scheduler_config{});
  replica_request r;
  r.id = 1;
  r.prompt = {1, 2, 3};
  r.max_tokens = 100;
  ASSERT_TRUE(rc.submit(r).ok());
  ASSERT_TRUE(rc.step().ok());
  EXPECT_TRUE(rc.cancel(1));
  EXPECT_TRUE(rc.idle());
  EXPECT_EQ(rc.blocks().free_blocks(), rc.blocks().total_blocks());
  r.id = 2;
  r.prompt = {1, 400};  // outside the vocabulary
  EXPECT_FALSE(rc.submit(r).ok());
  r.prompt = {1};
  r.max_tokens = 600;  // beyond the context
  EXPECT_FALSE(rc.submit(r).ok());
  r.max_tokens = 300;  // fits the context, not this replica's 256-token cache
  EXPECT_FALSE(rc.submit(r).ok());
}

}  // namespace
}  // namespace llmesh::actors
