// The replica's work loop on the real CPU engine: every request's tokens equal what
// model::generate produces for it alone — greedy and sampled, at 16 concurrent requests, with
// a small token budget (chunked prefill beside decodes), a KV pool small enough to force
// preemption, prefix-cache hits, and at --tp 2. Exact equality: the kernels are batch- and
// chunk-invariant and sampling is keyed by (seed, position).
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "../model/temp_dir.hpp"
#include "llmesh/actors/replica_core.hpp"
#include "llmesh/model/generate.hpp"
#include "llmesh/model/random_model.hpp"

namespace llmesh::actors {
namespace {

class ReplicaCore : public ::testing::Test {
 protected:
  void SetUp() override {
    model::random_model_spec spec;
    spec.hidden = 64;
    spec.intermediate = 128;
    spec.n_layers = 2;
    spec.n_heads = 4;
    spec.n_kv_heads = 2;
    spec.vocab = 300;
    spec.max_positions = 512;
    spec.seed = 5;
    ASSERT_TRUE(model::write_random_model(spec, dir_.path()).ok());
    auto m = model::model::load(dir_.path());
    ASSERT_TRUE(m.ok());
    model_ = *m;
  }

  std::unique_ptr<model::engine> engine(int tp, size_t kv_tokens) {
    model::engine_options o;
    o.tp = tp;
    o.threads = 2;
    o.kv_tokens = kv_tokens;
    o.block_size = 8;
    auto e = model::engine::create(model_, o);
    EXPECT_TRUE(e.ok());
    return std::move(*e);
  }

  std::vector<replica_request> requests(size_t n) {
    std::mt19937 rng(99);
    std::vector<int32_t> shared(24);  // a system prompt several requests share (prefix cache)
    for (auto& t : shared) t = static_cast<int32_t>(rng() % 300);
    std::vector<replica_request> out;
    for (uint64_t id = 0; id < n; ++id) {
      replica_request r;
      r.id = id;
      if (id % 3 == 0) r.prompt = shared;
      const size_t extra = 1 + rng() % 40;
      for (size_t i = 0; i < extra; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % 300));
      r.max_tokens = 1 + rng() % 24;
      if (id % 2 == 1) {  // sampled requests
        r.sampling.temperature = 0.9f;
        r.sampling.top_k = 20;
        r.sampling.top_p = 0.95f;
      }
      r.sampling.seed = 1000 + id;
      if (id % 5 == 4) r.eos_ids = {7, 8, 9, 10, 11, 12, 13, 14};
      out.push_back(r);
    }
    return out;
  }

  /// What generate() produces for each request alone, on a fresh engine.
  std::map<uint64_t, std::vector<int32_t>> alone(const std::vector<replica_request>& reqs, int tp) {
    auto e = engine(tp, 512);
    std::map<uint64_t, std::vector<int32_t>> out;
    for (const auto& r : reqs) {
      model::generate_request g;
      g.prompt = r.prompt;
      g.max_tokens = r.max_tokens;
      g.sampling = r.sampling;
      g.stop_ids = r.eos_ids;
      auto res = model::generate(*e, g);
      EXPECT_TRUE(res.ok());
      out[r.id] = res->tokens;
    }
    return out;
  }

  model::testing::temp_dir dir_;
  std::shared_ptr<const model::model> model_;
};

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
