// Two nodes, each its own CAF actor system, joined by the bridge over the loopback network:
// requests routed on node A to a replica on node B stream exactly generate()'s tokens through
// Cap'n Proto frames; when node B dies mid-stream, its proxies stop and every request
// continues on node A's own replica with the exact tokens it would have had.
#include <condition_variable>
#include <mutex>

#include "llmesh/actors/bridge_actor.hpp"
#include "llmesh/actors/request_actor.hpp"
#include "llmesh/actors/router_actor.hpp"
#include "llmesh/actors/serving_metrics.hpp"
#include "llmesh/transport/loopback.hpp"
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

using testing::collector;

caf::actor_system_config& config(caf::actor_system_config& c) {
  c.set("scheduler.max-threads", 2);
  c.set("scheduler.policy", caf::atom("sharing"));
  return c;
}

class Bridge : public testing::replica_test_base {};

TEST_F(Bridge, RequestsRunOnARemoteReplicaAndSurviveItsNodesDeath) {
  auto reqs = requests(8);
  for (auto& r : reqs) r.max_tokens = 100, r.eos_ids.clear();  // long enough to be cut mid-stream
  auto want = alone(reqs, 1);
  auto net = std::make_shared<transport::loopback_network>();
  auto eng_a = engine(1, 4096), eng_b = engine(1, 4096);

  caf::actor_system_config cfg_a, cfg_b;
  caf::actor_system sys_a{config(cfg_a)};
  testing::actor_reaper reap_a;
  collector c;
  {
    caf::actor_system sys_b{config(cfg_b)};
    testing::actor_reaper reap_b;
    // Node B: a replica, exported as actor 1.
    auto net_b = std::make_shared<transport::loopback_transport>(net);
    ASSERT_TRUE(net_b->listen("node-b:7101").ok());
    auto replica_b = reap_b(sys_b.spawn(replica_actor, eng_b.get(), scheduler_config{}));
    // The bridge is the transport's only owner: node B's death takes its connections with it.
    auto bridge_b =
        reap_b(spawn_bridge(sys_b, std::shared_ptr<transport::transport>(std::move(net_b)), std::string("node-b")));
    caf::anon_send(bridge_b, export_atom::value, replica_b, uint64_t{1});

    // Node A: a router that knows B's replica only through its proxy.
    auto bridge_a = reap_a(spawn_bridge(
        sys_a, std::shared_ptr<transport::transport>(std::make_shared<transport::loopback_transport>(net)),
        std::string("node-a")));
    caf::scoped_actor self{sys_a};
    transport::peer_id peer = 0;
    self->request(bridge_a, std::chrono::seconds(30), connect_atom::value, std::string("node-b:7101"))
        .receive([&](transport::peer_id p) { peer = p; }, [&](caf::error& e) { FAIL() << sys_a.render(e); });
    caf::actor remote;
    self->request(bridge_a, std::chrono::seconds(30), proxy_atom::value, peer, uint64_t{1})
        .receive([&](caf::actor p) { remote = p; }, [&](caf::error& e) { FAIL() << sys_a.render(e); });
    router_options ro;
    ro.block_size = eng_a->kv_block_size();
    auto router = reap_a(sys_a.spawn(router_actor, ro));
    caf::anon_send(router, add_atom::value, remote, std::string("b0"), std::string());

    metrics_registry metrics;
    request_options qo;
    qo.router = router;
    qo.metrics = &metrics;
    for (const auto& r : reqs) sys_a.spawn(request_actor, r, c.sink(), qo);
    // Every request is streaming from node B: now add node A's own replica, and kill node B.
    ASSERT_TRUE(c.wait([&] {
      size_t going = 0;
      for (const auto& r : reqs) going += c.tokens[r.id].size() >= 3;
      return going == reqs.size();
    })) << "before node B's death:\n" << c.describe();
    auto replica_a = reap_a(sys_a.spawn(replica_actor, eng_a.get(), scheduler_config{}));
    caf::anon_send(router, add_atom::value, replica_a, std::string("a0"), std::string());
    // Node B's process dies: its transport with it. anon_send_exit, not self->send_exit: an
    // exit sent from sys_a's scoped actor may run B's actors on sys_a's workers, still in
    // their cleanup while sys_b is destroyed (the segfault seen at teardown in session 4).
    caf::anon_send_exit(bridge_b, caf::exit_reason::kill);
    caf::anon_send_exit(replica_b, caf::exit_reason::kill);
    ASSERT_TRUE(c.wait([&] { return c.ends.size() == reqs.size(); })) << "after node B's death:\n" << c.describe();
    for (const auto& r : reqs) {
      EXPECT_FALSE(c.ends[r.id].failed) << c.ends[r.id].err.message;
      EXPECT_EQ(c.tokens[r.id], want[r.id]) << "request " << r.id;
    }
    EXPECT_EQ(metrics.get_counter("llmesh_request_migrations_total")->value(), static_cast<double>(reqs.size()));
    self->send_exit(router, caf::exit_reason::user_shutdown);
    self->send_exit(replica_a, caf::exit_reason::user_shutdown);
    self->send_exit(bridge_a, caf::exit_reason::user_shutdown);
  }
}

}  // namespace
}  // namespace llmesh::actors

namespace llmesh::actors {
namespace {

namespace tr = llmesh::transport;

/// A transport whose send queue says it is `full` (more than half its bound queued) or empty.
class queue_transport final : public tr::transport {
 public:
  queue_transport(std::unique_ptr<tr::transport> inner, std::shared_ptr<std::atomic<bool>> full)
      : inner_(std::move(inner)), full_(std::move(full)) {}
  void set_handlers(tr::transport_handlers h) override { inner_->set_handlers(std::move(h)); }
  result<std::string> listen(const std::string& a) override { return inner_->listen(a); }
  result<tr::peer_id> connect(const std::string& a) override { return inner_->connect(a); }
  status send(tr::peer_id p, std::vector<uint8_t> f) override { return inner_->send(p, std::move(f)); }
  void close(tr::peer_id p) override { inner_->close(p); }
  tr::transport_stats stats() const override { return inner_->stats(); }
  size_t pending_send_bytes() const override { return *full_ ? (size_t{600} << 20) : 0; }
  size_t max_pending_send_bytes() const override { return size_t{1000} << 20; }

 private:
  std::unique_ptr<tr::transport> inner_;
  std::shared_ptr<std::atomic<bool>> full_;
};

// Disaggregated prefill across the bridge: a prefill for a replica in another node answers
// with its blocks, which then go to import there; when a node's send queue is past half full,
// its KV frames give way to small ones — a prefill's answer goes as an overloaded refusal (the
// request's replica would compute the prompt), blocks to import are not sent. KV events cross too.
TEST_F(Bridge, KvBlocksCrossAndGiveWayWhenTheQueueIsFull) {
  auto net = std::make_shared<transport::loopback_network>();
  auto eng_b = engine(1, 4096);
  auto full_a = std::make_shared<std::atomic<bool>>(false), full_b = std::make_shared<std::atomic<bool>>(false);
  caf::actor_system_config cfg_a, cfg_b;
  caf::actor_system sys_a{config(cfg_a)}, sys_b{config(cfg_b)};
  testing::actor_reaper reap_a, reap_b;
  auto net_b = std::make_unique<transport::loopback_transport>(net);
  ASSERT_TRUE(net_b->listen("node-b:7101").ok());
  auto replica_b = reap_b(sys_b.spawn(replica_actor, eng_b.get(), scheduler_config{}));
  auto bridge_b = reap_b(spawn_bridge(sys_b, std::make_shared<queue_transport>(std::move(net_b), full_b), std::string("node-b")));
  caf::anon_send(bridge_b, export_atom::value, replica_b, uint64_t{1});
  auto bridge_a = reap_a(spawn_bridge(
      sys_a, std::make_shared<queue_transport>(std::make_unique<transport::loopback_transport>(net), full_a), std::string("node-a")));
  caf::scoped_actor self{sys_a};
  transport::peer_id peer = 0;
  self->request(bridge_a, std::chrono::seconds(30), connect_atom::value, std::string("node-b:7101"))
      .receive([&](transport::peer_id p) { peer = p; }, [&](caf::error& e) { FAIL() << sys_a.render(e); });
  caf::actor remote;
  self->request(bridge_a, std::chrono::seconds(30), proxy_atom::value, peer, uint64_t{1})
      .receive([&](caf::actor p) { remote = p; }, [&](caf::error& e) { FAIL() << sys_a.render(e); });

  replica_request r;
  r.id = 1;
  for (int i = 0; i < 50; ++i) r.prompt.push_back((i * 3) % 300);
  auto prefill = [&](uint64_t id) {
    r.id = id;
    prefill_reply got;
    self->send(remote, prefill_atom::value, r, caf::actor{self});
    self->receive([&](prefill_reply& p) { got = std::move(p); },
                  caf::after(std::chrono::seconds(30)) >> [&] { ADD_FAILURE() << "no answer"; });
    return got;
  };
  auto imported = [&] {
    replica_load load;
    self->send(remote, status_atom::value, caf::actor{self});
    self->receive([&](const replica_load& l) { load = l; }, caf::after(std::chrono::seconds(30)) >> [&] { ADD_FAILURE() << "no status"; });
    return load.kv_imported;
  };
  auto blocks = prefill(1);
  ASSERT_TRUE(blocks.ok) << blocks.err.message;
  EXPECT_EQ(blocks.id, 1u);
  EXPECT_EQ(blocks.prefix.tokens.size(), 48u);  // six whole blocks of 8 crossed in a KvBlocks frame
  ASSERT_TRUE(blocks.prefix.data);
  EXPECT_EQ(blocks.prefix.data->size(), 6 * eng_b->kv_block_bytes());
  // The prefill left the prompt's 6 whole blocks in node B's prefix cache: its KV events say
  // so across the bridge, named by the proxy (as a router knows the replica).
  self->send(remote, kv_events_atom::value, caf::actor{self}, uint64_t{0});
  self->receive(
      [&](const kv_events& e) {
        EXPECT_EQ(e.replica, remote.id());
        EXPECT_FALSE(e.full);
        EXPECT_EQ(e.stored.size(), 6u);
        EXPECT_EQ(e.seq, 6u);
        EXPECT_TRUE(e.removed.empty());
      },
      caf::after(std::chrono::seconds(30)) >> [&] { ADD_FAILURE() << "no KV events"; });

  *full_b = true;  // node B's queue: the answer gives way
  auto refused = prefill(2);
  EXPECT_FALSE(refused.ok);
  EXPECT_EQ(refused.id, 2u);
  EXPECT_EQ(refused.err.code, errc::overloaded) << refused.err.message;
  r.prompt = {1, 999};  // a refusal of its own (no blocks) always goes
  auto bad = prefill(3);
  EXPECT_FALSE(bad.ok);
  EXPECT_EQ(bad.err.code, errc::invalid_request) << bad.err.message;
  *full_b = false;

  // Blocks to import: another prompt's, so node B's replica does not hold them yet.
  auto other = blocks.prefix;
  other.tokens[0] = (other.tokens[0] + 1) % 300;
  *full_a = true;  // node A's queue: not sent
  self->send(remote, kvimport_atom::value, other);
  EXPECT_EQ(imported(), 0u);  // the status went after it: the import would have come first
  *full_a = false;
  self->send(remote, kvimport_atom::value, other);
  EXPECT_EQ(imported(), 6u);
}

}  // namespace
}  // namespace llmesh::actors
