// The router's disaggregated-prefill decision, Dynamo's conditional disaggregation: a long
// prompt goes to a prefill replica first unless the replica it is routed to already caches
// enough of it (as its KV events report, or as the router sent it there) or every prefill replica already has
// max_prefill_queue requests; each prompt left local is counted by reason. The replicas here
// are stand-ins that never report their load, so the router's own counts are its whole view of
// it; one reports KV events (what its prefix cache holds, whoever sent the prompts).
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <thread>

#include "llmesh/actors/block_manager.hpp"
#include "llmesh/actors/router_actor.hpp"
#include "llmesh/actors/serving_metrics.hpp"

namespace llmesh::actors {
namespace {

caf::behavior silent_replica(caf::event_based_actor*) {
  return {[](status_atom, const caf::actor&) {}, [](reset_atom, const caf::actor&) {},
          [](kv_events_atom, const caf::actor&, uint64_t) {}};
}

/// A stand-in replica whose prefix cache holds `cache` (its KV events from cursor 0); it tells
/// `watcher` the cursor once a router asks from where they end (the router has applied them).
caf::behavior reporting_replica(caf::event_based_actor* self, kv_events cache, caf::actor watcher) {
  return {[](status_atom, const caf::actor&) {}, [](reset_atom, const caf::actor&) {},
          [=](kv_events_atom, const caf::actor& router, uint64_t since) {
            if (since == cache.seq) return self->send(watcher, since);
            auto e = cache;
            e.replica = self->id();
            self->send(router, std::move(e));
          }};
}

class RouterPrefill : public ::testing::Test {
 protected:
  RouterPrefill() : sys_(cfg_) {}
  ~RouterPrefill() override {
    for (auto& a : actors_) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

  caf::actor spawn_router(size_t max_local, size_t max_queue, std::chrono::milliseconds poll = std::chrono::milliseconds(10000),
                          bool kv_events = true) {
    router_options ro;
    ro.block_size = 16;
    ro.metrics = &metrics_;
    ro.max_local_prefill = max_local;
    ro.max_prefill_queue = max_queue;
    ro.poll = poll;
    ro.kv_events = kv_events;
    return keep(sys_.spawn(router_actor, ro));
  }
  caf::actor keep(caf::actor a) {
    actors_.push_back(a);
    return a;
  }

  /// The route of `prompt`: whether it names a prefill replica.
  bool routed_with_prefill(const caf::actor& router, const std::vector<int32_t>& prompt, bool prefill_ok = true) {
    caf::scoped_actor self{sys_};
    bool prefill = false;
    self->request(router, std::chrono::seconds(10), route_atom::value, std::string("m"), prompt, uint64_t{0}, uint64_t{0},
                  prefill_ok)
        .receive(
            [&](const route_reply& r) {
              EXPECT_TRUE(r.replica) << r.err.message;
              prefill = static_cast<bool>(r.prefill);
              if (r.prefill) prefill_id_ = r.prefill.id();
            },
            [&](caf::error& e) { ADD_FAILURE() << sys_.render(e); });
    return prefill;
  }
  double local(const char* reason) { return metrics_.get_counter(metric::prefill_local, {reason})->value(); }

  caf::actor_system_config cfg_;
  caf::actor_system sys_;
  metrics_registry metrics_;
  std::vector<caf::actor> actors_;
  uint64_t prefill_id_ = 0;
};

std::vector<int32_t> tokens(int32_t first, size_t n) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = first + static_cast<int32_t>(i);
  return p;
}

TEST_F(RouterPrefill, AConversationsNextTurnStaysWhereItsHistoryIsCached) {
  metric::declare_serving(metrics_);
  auto router = spawn_router(64, 0);
  caf::anon_send(router, add_atom::value, keep(sys_.spawn(silent_replica)), std::string("d0"), std::string("m"));
  caf::anon_send(router, add_atom::value, keep(sys_.spawn(silent_replica)), std::string("p0"), std::string("m"),
                 replica_role::prefill, uint64_t{0}, uint64_t{0});
  auto turn = tokens(1, 200);
  EXPECT_FALSE(routed_with_prefill(router, tokens(1, 64)));  // not over the limit
  EXPECT_TRUE(routed_with_prefill(router, turn));            // 200 uncached tokens
  for (int32_t t = 0; t < 50; ++t) turn.push_back(9000 + t);  // the next turn: 192 cached, 58 new
  EXPECT_FALSE(routed_with_prefill(router, turn));
  EXPECT_EQ(local("cached"), 1.0);
  for (int32_t t = 0; t < 80; ++t) turn.push_back(9500 + t);  // 240 cached, 10 + 80 new: over the limit again
  EXPECT_TRUE(routed_with_prefill(router, turn));
  EXPECT_TRUE(routed_with_prefill(router, tokens(50000, 200)));  // another conversation
  EXPECT_FALSE(routed_with_prefill(router, tokens(70000, 200), false));  // a request that cannot start from blocks
  EXPECT_EQ(local("cached"), 1.0);
  EXPECT_EQ(local("queue"), 0.0);
  EXPECT_EQ(local("unavailable"), 0.0);
  // The replicas' prefix caches are emptied (/reset_prefix_cache): the router forgets too, and
  // the conversation's next turn is prefilled elsewhere again.
  caf::scoped_actor self{sys_};
  self->request(router, std::chrono::seconds(10), reset_atom::value)
      .receive([](uint64_t told) { EXPECT_EQ(told, 2u); }, [&](caf::error& e) { ADD_FAILURE() << sys_.render(e); });
  for (int32_t t = 0; t < 10; ++t) turn.push_back(9800 + t);
  EXPECT_TRUE(routed_with_prefill(router, turn));
}

// A conversation another router (another gateway) sent to the decode replica: this router never
// routed it, yet the replica's KV events say its history is cached there.
TEST_F(RouterPrefill, AHistoryOnlyTheReplicasKvEventsShowStaysLocal) {
  metric::declare_serving(metrics_);
  block_manager cache(64, 16);
  const auto history = tokens(1, 200);  // 12 whole blocks
  {
    block_list b;
    cache.match_prefix(history, b);
    ASSERT_TRUE(cache.reserve(b, history.size()).ok());
    cache.commit(b, history);
    cache.release(b);
  }
  auto router = spawn_router(64, 0, std::chrono::milliseconds(20));
  caf::scoped_actor watcher{sys_};
  caf::anon_send(router, add_atom::value, keep(sys_.spawn(reporting_replica, cache.events_since(0), caf::actor{watcher})),
                 std::string("d0"), std::string("m"));
  caf::anon_send(router, add_atom::value, keep(sys_.spawn(silent_replica)), std::string("p0"), std::string("m"),
                 replica_role::prefill, uint64_t{0}, uint64_t{0});
  watcher->receive([](uint64_t since) { EXPECT_EQ(since, 12u); },
                   caf::after(std::chrono::seconds(10)) >> [] { ADD_FAILURE() << "the router never applied the events"; });
  EXPECT_EQ(metrics_.get_gauge(metric::kv_reported, {"d0"})->value(), 12.0);  // llmesh_router_cached_blocks
  auto turn = history;
  for (int32_t t = 0; t < 50; ++t) turn.push_back(9000 + t);  // 192 cached, 58 new
  EXPECT_FALSE(routed_with_prefill(router, turn));
  EXPECT_EQ(local("cached"), 1.0);
  EXPECT_TRUE(routed_with_prefill(router, tokens(50000, 200)));  // a conversation it does not hold
}

// Dynamo's --no-kv-events: the replica is never asked, so the history it holds is unknown and
// the next turn is prefilled elsewhere (the router predicts from its own routing only).
TEST_F(RouterPrefill, WithoutKvEventsOnlyItsOwnRoutingCounts) {
  metric::declare_serving(metrics_);
  block_manager cache(64, 16);
  const auto history = tokens(1, 200);
  {
    block_list b;
    cache.match_prefix(history, b);
    ASSERT_TRUE(cache.reserve(b, history.size()).ok());
    cache.commit(b, history);
    cache.release(b);
  }
  auto router = spawn_router(64, 0, std::chrono::milliseconds(20), /*kv_events=*/false);
  caf::scoped_actor watcher{sys_};
  auto d0 = keep(sys_.spawn(reporting_replica, cache.events_since(0), caf::actor{watcher}));
  caf::anon_send(router, add_atom::value, d0, std::string("d0"), std::string("m"));
  caf::anon_send(router, add_atom::value, keep(sys_.spawn(silent_replica)), std::string("p0"), std::string("m"),
                 replica_role::prefill, uint64_t{0}, uint64_t{0});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // ten polls
  auto turn = history;
  for (int32_t t = 0; t < 50; ++t) turn.push_back(9000 + t);
  EXPECT_TRUE(routed_with_prefill(router, turn));
  EXPECT_EQ(local("cached"), 0.0);
  EXPECT_FALSE(metrics_.render().find("llmesh_router_cached_blocks{") != std::string::npos);
  // Its own routing is predicted: the history, now sent there with the turn, stays.
  EXPECT_FALSE(routed_with_prefill(router, history));
  EXPECT_EQ(local("cached"), 1.0);
}

TEST_F(RouterPrefill, BusyPrefillReplicasLeaveTheirPromptsLocal) {
  metric::declare_serving(metrics_);
  auto router = spawn_router(64, 0);
  // The limits a prefill replica brings are its model's (a cluster config's prefill entry).
  caf::anon_send(router, add_atom::value, keep(sys_.spawn(silent_replica)), std::string("d0"), std::string("m"));
  caf::anon_send(router, add_atom::value, keep(sys_.spawn(silent_replica)), std::string("p0"), std::string("m"),
                 replica_role::prefill, uint64_t{100}, uint64_t{2});
  EXPECT_FALSE(routed_with_prefill(router, tokens(1, 90)));  // its limit, 100, not the router's 64
  EXPECT_TRUE(routed_with_prefill(router, tokens(1000, 150)));
  const uint64_t p0 = prefill_id_;
  EXPECT_TRUE(routed_with_prefill(router, tokens(2000, 150)));
  EXPECT_FALSE(routed_with_prefill(router, tokens(3000, 150)));  // two in its queue
  EXPECT_EQ(local("queue"), 1.0);
  caf::anon_send(router, done_atom::value, p0);  // one prefill ended
  EXPECT_TRUE(routed_with_prefill(router, tokens(4000, 150)));
  EXPECT_FALSE(routed_with_prefill(router, tokens(5000, 150)));
  EXPECT_EQ(local("queue"), 2.0);
  caf::anon_send(router, drain_atom::value, p0);  // no ready prefill replica
  EXPECT_FALSE(routed_with_prefill(router, tokens(6000, 150)));
  EXPECT_EQ(local("unavailable"), 1.0);
  EXPECT_EQ(local("cached"), 0.0);
}

TEST_F(RouterPrefill, AModelWithoutPrefillReplicasCountsNothing) {
  metric::declare_serving(metrics_);
  auto router = spawn_router(64, 0);
  caf::anon_send(router, add_atom::value, keep(sys_.spawn(silent_replica)), std::string("d0"), std::string("m"));
  EXPECT_FALSE(routed_with_prefill(router, tokens(1, 300)));
  EXPECT_FALSE(routed_with_prefill(router, tokens(1, 300)));
  EXPECT_EQ(local("cached"), 0.0);
  EXPECT_EQ(local("unavailable"), 0.0);
}

}  // namespace
}  // namespace llmesh::actors
