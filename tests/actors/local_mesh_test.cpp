// The in-process mesh end to end (router, replicas, request actors): every request's tokens
// equal generate() alone, whatever the concurrency and the replica count; a replica killed
// mid-stream is invisible in the tokens; cancellation ends a stream and frees its replica.
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "llmesh/actors/local_mesh.hpp"
#include "llmesh/actors/serving_metrics.hpp"
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

using testing::collector;

class LocalMesh : public testing::replica_test_base {
 protected:
  std::unique_ptr<local_mesh> mesh(int replicas, int tp, size_t kv_tokens = 1024, size_t max_migrations = 3) {
    mesh_options o;
    o.replicas = replicas;
    o.engine.tp = tp;
    o.engine.threads = 2;
    o.engine.kv_tokens = kv_tokens;
    o.engine.block_size = 8;
    o.sched.max_batch_tokens = 48;
    o.max_migrations = max_migrations;
    auto m = local_mesh::create(model_, o, &metrics_);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
    return std::move(*m);
  }
  metrics_registry metrics_;
};

TEST_F(LocalMesh, EveryRequestGetsItsAloneTokensAtAnyReplicaCount) {
  auto reqs = requests(12);
  auto want = alone(reqs, 1);
  for (int replicas : {1, 3}) {
    auto m = mesh(replicas, 1);
    collector c;
    for (const auto& r : reqs) m->submit(r, c.sink());
    ASSERT_TRUE(c.wait_ends(reqs.size()));
    for (const auto& r : reqs) {
      EXPECT_FALSE(c.ends[r.id].failed) << c.ends[r.id].err.message;
      EXPECT_EQ(c.tokens[r.id], want[r.id]) << "request " << r.id << " with " << replicas << " replicas";
    }
    EXPECT_EQ(m->inflight(), 0u);
  }
}

// A cache too small for every request at once: the replica preempts (the tokens stay each
// request's own) and /metrics counts it under the replica's name, vLLM's num_preemptions.
TEST_F(LocalMesh, PreemptionsAreCountedPerReplica) {
  auto reqs = requests(12);
  auto want = alone(reqs, 1);
  auto m = mesh(1, 1, /*kv_tokens=*/128);
  collector c;
  for (const auto& r : reqs) m->submit(r, c.sink());
  ASSERT_TRUE(c.wait_ends(reqs.size()));
  for (const auto& r : reqs) {
    EXPECT_FALSE(c.ends[r.id].failed) << c.ends[r.id].err.message;
    EXPECT_EQ(c.tokens[r.id], want[r.id]) << "request " << r.id;
  }
  // The router publishes a replica's count as its status reports come.
  double seen = 0;
  for (int i = 0; i < 200 && seen == 0; ++i) {
    if (auto* p = metrics_.get_counter(metric::preemptions, {"0"})) seen = p->value();
    if (seen == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GT(seen, 0.0) << metrics_.render();
}

TEST_F(LocalMesh, TensorParallelReplicasGiveTheSameTokens) {
  auto reqs = requests(6);
  auto want = alone(reqs, 1);
  auto m = mesh(2, 2);
  collector c;
  for (const auto& r : reqs) m->submit(r, c.sink());
  ASSERT_TRUE(c.wait_ends(reqs.size()));
  for (const auto& r : reqs) EXPECT_EQ(c.tokens[r.id], want[r.id]) << "request " << r.id;
}

TEST_F(LocalMesh, AKilledReplicaIsInvisibleInTheStream) {
  auto reqs = requests(8);
  for (auto& r : reqs) r.max_tokens = 40, r.eos_ids.clear();
  auto want = alone(reqs, 1);
  auto m = mesh(2, 1);
  collector c;
  m->kill_replica(0, 6);  // crashes mid-stream: its requests have up to 40 tokens to go
  for (const auto& r : reqs) m->submit(r, c.sink());
  ASSERT_TRUE(c.wait_ends(reqs.size()));
  for (const auto& r : reqs) {
    EXPECT_FALSE(c.ends[r.id].failed) << c.ends[r.id].err.message;
    EXPECT_EQ(c.tokens[r.id], want[r.id]) << "request " << r.id;
  }
  EXPECT_GE(metrics_.get_counter(metric::migrations)->value(), 1.0);
  // Only one replica is left, and the router knows it.
  for (int i = 0; i < 200 && m->ready_replicas() != 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(m->ready_replicas(), 1u);
}

TEST_F(LocalMesh, PenalizedRequestsContinueExactlyAfterTheirReplicaDies) {
  // The continuation knows which prompt tokens are output (penalties count them, min_tokens
  // has seen them): the stream is the uninterrupted one.
  auto reqs = requests(8);
  for (auto& r : reqs) {
    r.max_tokens = 40;
    r.sampling.repetition_penalty = 1.4f;
    r.sampling.frequency_penalty = 0.3f;
    r.sampling.min_tokens = 30;
    r.eos_ids = {7, 8, 9};
    r.logit_bias = {{11, 3.0f}};
  }
  auto want = alone(reqs, 1);
  auto m = mesh(2, 1);
  collector c;
  m->kill_replica(0, 6);
  for (const auto& r : reqs) m->submit(r, c.sink());
  ASSERT_TRUE(c.wait_ends(reqs.size()));
  for (const auto& r : reqs) {
    EXPECT_FALSE(c.ends[r.id].failed) << c.ends[r.id].err.message;
    EXPECT_EQ(c.tokens[r.id], want[r.id]) << "request " << r.id;
  }
  EXPECT_GE(metrics_.get_counter(metric::migrations)->value(), 1.0);
}

TEST_F(LocalMesh, LosingEveryReplicaFailsTheRequestClearly) {
  auto reqs = requests(2);
  for (auto& r : reqs) r.max_tokens = 200, r.eos_ids.clear();
  auto m = mesh(1, 1);
  collector c;
  m->kill_replica(0, 5);
  for (const auto& r : reqs) m->submit(r, c.sink());
  ASSERT_TRUE(c.wait_ends(reqs.size()));
  for (const auto& r : reqs) {
    EXPECT_TRUE(c.ends[r.id].failed);
    EXPECT_EQ(c.ends[r.id].err.code, errc::replica_unavailable) << c.ends[r.id].err.message;
    EXPECT_LE(c.tokens[r.id].size(), 5u);  // streamed before the crash, then the clear error
  }
  for (int i = 0; i < 200 && m->ready_replicas() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(m->ready_replicas(), 0u);
}

TEST_F(LocalMesh, CancelStopsTheStreamAndFreesTheReplica) {
  auto reqs = requests(3);
  for (auto& r : reqs) r.max_tokens = 400, r.eos_ids.clear();
  auto m = mesh(1, 1);
  collector c;
  for (const auto& r : reqs) m->submit(r, c.sink());
  for (int i = 0; i < 2000 && c.count(0) < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (const auto& r : reqs) m->cancel(r.id);
  EXPECT_EQ(m->inflight(), 0u);
  // The replica is free again: a short request runs to completion right away.
  auto more = requests(4);
  more[3].id = 77;
  more[3].max_tokens = 3;
  m->submit(more[3], c.sink());
  ASSERT_TRUE(c.wait_ends(1));
  EXPECT_EQ(c.ends.count(77), 1u);
  EXPECT_FALSE(c.ends[77].failed);
  EXPECT_EQ(c.ends.size(), 1u);  // the cancelled ones never got a final message
}

TEST_F(LocalMesh, ADrainedReplicaFinishesItsWorkAndGetsNoMore) {
  auto reqs = requests(8);
  for (auto& r : reqs) r.max_tokens = 60, r.eos_ids.clear();
  auto want = alone(reqs, 1);
  auto m = mesh(2, 1);
  collector c;
  for (size_t i = 0; i < 4; ++i) m->submit(reqs[i], c.sink());
  m->drain_replica(0);
  for (size_t i = 4; i < reqs.size(); ++i) m->submit(reqs[i], c.sink());
  ASSERT_TRUE(c.wait_ends(reqs.size()));
  for (const auto& r : reqs) {
    EXPECT_FALSE(c.ends[r.id].failed) << c.ends[r.id].err.message;
    EXPECT_EQ(c.tokens[r.id], want[r.id]) << "request " << r.id;
  }
  // The router has learnt it: replica 0 is no longer ready, and new work goes to replica 1.
  for (int i = 0; i < 200 && m->ready_replicas() != 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(m->ready_replicas(), 1u);
  auto more = requests(12);
  collector c2;
  for (size_t i = 8; i < 12; ++i) m->submit(more[i], c2.sink());
  ASSERT_TRUE(c2.wait_ends(4));
  for (size_t i = 8; i < 12; ++i) EXPECT_FALSE(c2.ends[more[i].id].failed);
  EXPECT_EQ(metrics_.get_counter(metric::migrations)->value(), 0.0);  // nothing had to move
}

// OpenAI's prompt_cache_key through the router (replica_request::route_key): three requests of
// one key in flight at once share a replica (least-load alone would spread them over three:
// Balancer.AnAffinityKeyKeepsItsRequestsOnOneReplica checks the policies' arithmetic).
TEST_F(LocalMesh, AnAffinityKeyKeepsItsRequestsOnOneReplica) {
  auto m = mesh(3, 1);
  auto reqs = requests(3);
  for (auto& r : reqs) r.max_tokens = 40, r.eos_ids.clear(), r.route_key = 0xfeed;
  collector c;
  for (const auto& r : reqs) m->submit(r, c.sink());
  ASSERT_TRUE(c.wait_ends(3));
  std::vector<double> routed;
  for (int r = 0; r < 3; ++r) routed.push_back(metrics_.get_counter(metric::routed, {std::to_string(r)})->value());
  std::sort(routed.begin(), routed.end());
  EXPECT_EQ(routed, (std::vector<double>{0.0, 0.0, 3.0})) << "every keyed request on one replica";
  for (const auto& r : reqs) EXPECT_FALSE(c.ends[r.id].failed) << c.ends[r.id].err.message;
}

TEST_F(LocalMesh, RefusedRequestsFailWithTheReplicasReason) {
  auto m = mesh(1, 1);
  collector c;
  replica_request r;
  r.id = 5;
  r.prompt = {1, 2, 3};
  r.max_tokens = 10000;  // beyond the model's 512 positions
  m->submit(r, c.sink());
  ASSERT_TRUE(c.wait_ends(1));
  EXPECT_TRUE(c.ends[5].failed);
  EXPECT_EQ(c.ends[5].err.code, errc::invalid_request);
}

// A request submitted from a thread that is not CAF's and outlives the mesh (an HTTP worker
// thread submits background responses) does not hold up the mesh's shutdown: CAF's spawn
// pins its logger to the spawning thread, which ~actor_system would wait for forever.
TEST_F(LocalMesh, ARequestFromALongLivedThreadDoesNotHoldUpShutdown) {
  auto reqs = requests(1);
  collector c;
  std::promise<void> release;
  std::shared_future<void> gone = release.get_future().share();
  std::thread worker;
  // The mesh is made and stopped on one thread (CAF lets the thread that stops a system go of
  // its logger), the request submitted from another that lives on.
  auto run = std::async(std::launch::async, [&] {
    auto m = mesh(1, 1);
    worker = std::thread([&] {
      m->submit(reqs[0], c.sink());
      gone.wait();
    });
    const bool ended = c.wait_ends(1);
    m.reset();
    return ended;
  });
  if (run.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "the mesh did not stop within 60 s while the submitting thread lived\n");
    std::_Exit(1);  // the hung destructor cannot be joined
  }
  EXPECT_TRUE(run.get());
  EXPECT_FALSE(c.ends[reqs[0].id].failed);
  release.set_value();
  worker.join();
}

}  // namespace
}  // namespace llmesh::actors
