// A replica split over two nodes (split_replica_actor): rank 0 and the replica on node A, rank 1
// on node B (a remote_shard_actor exported by B's bridge), each node its own CAF actor system
// and bridge over one loopback network (the mesh plane), the ranks' engine parts joined over a
// second one (the tensor plane). Greedy requests stream exactly the tokens a tp=2 engine in one
// process gives them; a step B's shard refuses (out-of-range block ids, or a malformed frame)
// fails A's requests in flight at once; and node B's death fails them and stops A's replica.
// Every wait is bounded, so a hang fails its test instead of stalling it.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "llmesh/actors/bridge_actor.hpp"
#include "llmesh/actors/replica_actor.hpp"
#include "llmesh/actors/shard_actor.hpp"
#include "llmesh/actors/tensor_communicator.hpp"
#include "llmesh/transport/codec.hpp"
#include "llmesh/transport/loopback.hpp"
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

using namespace std::chrono_literals;
using testing::actor_reaper;
using testing::collector;

constexpr uint64_t shard_id = 17;  ///< B's rank-1 shard, as its bridge exports it
const std::string group_key = "split-replica-test-group-key";
/// How long any wait in these tests lasts before it counts as a hang.
constexpr auto patience = 30s;

caf::actor_system_config& config(caf::actor_system_config& c) {
  c.set("scheduler.max-threads", 2);
  c.set("scheduler.policy", caf::atom("sharing"));
  return c;
}

/// Waits (at most `patience`) until pred() holds, evaluated under the collector's lock.
bool wait_for(collector& c, const std::function<bool()>& pred) {
  std::unique_lock lock(c.mu);
  return c.cv.wait_for(lock, patience, pred);
}

/// The down_msgs a scoped actor received (of actors it monitors), so that waiting for one
/// does not lose another.
struct downs {
  caf::scoped_actor& self;
  std::set<caf::actor_addr> seen;
  /// Waits (at most `patience`) until `a` is down.
  bool wait(const caf::actor& a) {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (!seen.count(a.address())) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      self->receive([&](const caf::down_msg& d) { seen.insert(d.source); }, caf::after(left) >> [] {});
    }
    return true;
  }
};

/// Node B: its engine part (rank 1), its actor system, the shard actor running that rank
/// (exported as `shard_id`) and its bridge, listening at node-b:7101. Destroying it is the
/// node's death: its actors stop, then its part (and with it its tensor-plane transport) goes.
struct node_b {
  std::unique_ptr<model::engine> part;  // first: outlives the actor system that borrows it
  caf::actor_system_config cfg;
  caf::actor_system sys;
  actor_reaper reap;  // after sys: kills B's actors before sys waits for them
  caf::actor shard, bridge;

  node_b(const std::shared_ptr<transport::loopback_network>& net, std::unique_ptr<model::engine> p)
      : part(std::move(p)), sys(config(cfg)) {
    auto t = std::make_shared<transport::loopback_transport>(net);
    EXPECT_TRUE(t->listen("node-b:7101").ok());
    shard = reap(sys.spawn<caf::detached>(remote_shard_actor, part.get(), 1));
    bridge = reap(spawn_bridge(sys, std::shared_ptr<transport::transport>(std::move(t)), std::string("node-b")));
    caf::anon_send(bridge, export_atom::value, shard, shard_id);
  }
};

/// Node A: its engine part (rank 0), its actor system and bridge, and once started the split
/// replica, whose rank 1 is B's shard through its stand-in here. Requests' streams land in `c`.
struct node_a {
  collector c;                          // first: outlives the sink actor that writes into it
  std::unique_ptr<model::engine> part;  // outlives the actor system that borrows it
  caf::actor_system_config cfg;
  caf::actor_system sys;
  actor_reaper reap;  // after sys: kills A's actors before sys waits for them
  caf::actor bridge, sink, replica;

  node_a(const std::shared_ptr<transport::loopback_network>& net, std::unique_ptr<model::engine> p)
      : part(std::move(p)), sys(config(cfg)) {
    bridge = reap(spawn_bridge(
        sys, std::shared_ptr<transport::transport>(std::make_shared<transport::loopback_transport>(net)),
        std::string("node-a")));
    sink = reap(sys.spawn([s = c.sink()](caf::event_based_actor*) -> caf::behavior {
      return {[=](const token_msg& t) { s(t); }};
    }));
  }

  /// Connects to node B, gets the stand-in for B's shard and starts the replica over it.
  /// False on failure (reported).
  bool start(scheduler_config cfg = {}) {
    caf::scoped_actor self{sys};
    transport::peer_id peer = 0;
    self->request(bridge, patience, connect_atom::value, std::string("node-b:7101"))
        .receive([&](transport::peer_id p) { peer = p; }, [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
    if (peer == 0) return false;
    caf::actor remote;
    self->request(bridge, patience, proxy_atom::value, peer, shard_id)
        .receive([&](caf::actor p) { remote = p; }, [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
    if (!remote) return false;
    replica = reap(sys.spawn(split_replica_actor, part.get(), cfg, std::map<int, caf::actor>{{1, remote}}));
    return true;
  }

  /// Sends every request at once (they share steps).
  void submit(const std::vector<replica_request>& reqs) {
    for (const auto& r : reqs) caf::anon_send(replica, generate_atom::value, r, sink);
  }
  /// Waits until every request has at least `n` tokens.
  bool streaming(const std::vector<replica_request>& reqs, size_t n) {
    return wait_for(c, [&] {
      for (const auto& r : reqs) {
        if (c.tokens[r.id].size() < n) return false;
      }
      return true;
    });
  }
  /// Waits until every request has ended.
  /// Every request ended with a failed token_msg (shard_failed), before its last token.
  void expect_failed(const std::vector<replica_request>& reqs) {
    std::lock_guard lock(c.mu);
    for (const auto& r : reqs) {
      const token_msg& end = c.ends[r.id];
      EXPECT_TRUE(end.failed) << "request " << r.id << " ended without failing, after " << c.tokens[r.id].size()
                              << " tokens";
      EXPECT_EQ(errc_name(end.err.code), errc_name(errc::shard_failed)) << end.err.message;
      EXPECT_LT(c.tokens[r.id].size(), r.max_tokens);
    }
  }
  bool ended(const std::vector<replica_request>& reqs) {
    return wait_for(c, [&] { return c.ends.size() >= reqs.size(); });
  }
};

class SplitReplica : public ::testing::Test {
 protected:
  void SetUp() override {
    model::random_model_spec spec;
    spec.hidden = 64;
    spec.intermediate = 128;
    spec.n_layers = 2;
    spec.n_heads = 4;
    spec.n_kv_heads = 2;
    spec.vocab = 300;
    spec.max_positions = 4096;  // room for requests long enough to be cut mid-stream
    spec.seed = 5;
    ASSERT_TRUE(model::write_random_model(spec, dir_.path()).ok());
    auto m = model::model::load(dir_.path());
    ASSERT_TRUE(m.ok()) << m.err().message;
    model_ = *m;
  }

  model::engine_options options(int threads) const {
    model::engine_options o;
    o.tp = 2;
    o.threads = threads;  // one kernel thread per rank, in the whole engine and in each part
    o.kv_tokens = 8192;
    o.block_size = 8;
    return o;
  }

  /// Rank 0's and rank 1's engine parts, each over its own tensor_communicator on the tensor
  /// plane, the group joined (both ranks join concurrently). Empty on failure.
  std::vector<std::unique_ptr<model::engine>> parts() {
    std::vector<std::unique_ptr<tensor_communicator>> comms;
    std::vector<std::string> addresses;
    for (int r = 0; r < 2; ++r) {
      // The collectives' own timeout is longer than the tests' patience: a rank that waits for
      // a peer that is gone must be released by the group failing, not by the timeout.
      auto c = tensor_communicator::create(std::make_shared<transport::loopback_transport>(tensor_net_),
                                           "tensor-" + std::to_string(r) + ":0", {r, 2, group_key, 60s});
      EXPECT_TRUE(c.ok()) << c.err().message;
      if (!c.ok()) return {};
      addresses.push_back((*c)->address());
      comms.push_back(std::move(*c));
    }
    std::vector<status> joined(2);
    {
      std::vector<std::thread> threads;
      for (size_t r = 0; r < 2; ++r) threads.emplace_back([&, r] { joined[r] = comms[r]->join(addresses); });
      for (auto& t : threads) t.join();  // join() is bounded by the group's timeout
    }
    std::vector<std::unique_ptr<model::engine>> out;
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_TRUE(joined[r].ok()) << "rank " << r << ": " << joined[r].err().message;
      if (!joined[r].ok()) return {};
      model::engine_options o = options(1);
      std::vector<std::unique_ptr<kernels::communicator>> mine;
      mine.push_back(std::move(comms[r]));
      auto e = model::engine::create_part(model_, o, std::move(mine));
      EXPECT_TRUE(e.ok()) << e.err().message;
      if (!e.ok()) return {};
      out.push_back(std::move(*e));
    }
    return out;
  }

  /// `n` greedy requests with distinct prompts, `max_tokens` each, no EOS.
  static std::vector<replica_request> greedy(size_t n, size_t max_tokens) {
    std::mt19937 rng(42);
    std::vector<replica_request> out;
    for (uint64_t id = 0; id < n; ++id) {
      replica_request r;
      r.id = id;
      const size_t len = 5 + rng() % 20;
      for (size_t i = 0; i < len; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % 300));
      r.max_tokens = max_tokens;
      out.push_back(r);
    }
    return out;
  }

  /// What model::generate gives each request alone on one tp=2 engine in this process.
  std::map<uint64_t, std::vector<int32_t>> reference(const std::vector<replica_request>& reqs) {
    auto e = model::engine::create(model_, options(2));
    EXPECT_TRUE(e.ok()) << e.err().message;
    std::map<uint64_t, std::vector<int32_t>> out;
    if (!e.ok()) return out;
    for (const auto& r : reqs) {
      model::generate_request g;
      g.prompt = r.prompt;
      g.max_tokens = r.max_tokens;
      g.sampling = r.sampling;
      auto res = model::generate(**e, g);
      EXPECT_TRUE(res.ok()) << res.err().message;
      if (res.ok()) out[r.id] = res->tokens;
    }
    return out;
  }

  /// Two long greedy requests stream on the split replica; then a peer ("node C") sends B's
  /// shard the frame `bad`. The requests in flight on A must fail (shard_failed) without a
  /// hang, and B's bridge reports the refusal to the sender: a failed ShardResult of rank 1.
  void bad_step_fails_the_requests_in_flight(const transport::shard_step_msg& bad) {
    const auto reqs = greedy(2, 3000);  // far more tokens than stream before the bad step lands
    auto ps = parts();
    ASSERT_EQ(ps.size(), 2u);
    node_a a(mesh_net_, std::move(ps[0]));
    node_b b(mesh_net_, std::move(ps[1]));
    ASSERT_TRUE(a.start());
    a.submit(reqs);
    ASSERT_TRUE(a.streaming(reqs, 2)) << "before the bad step:\n" << a.c.describe();

    // Node C hears back on the network's thread.
    std::mutex mu;
    std::condition_variable cv;
    std::vector<transport::envelope> heard;
    auto node_c = std::make_shared<transport::loopback_transport>(mesh_net_);
    transport::transport_handlers h;
    h.on_frame = [&](transport::peer_id, std::span<const uint8_t> frame) {
      auto e = transport::decode(frame);
      std::lock_guard lock(mu);
      if (e) heard.push_back(std::move(*e));
      cv.notify_all();
    };
    node_c->set_handlers(std::move(h));
    struct closer {  // node C goes before what its handler captures, however the test ends
      std::shared_ptr<transport::loopback_transport>& t;
      ~closer() { t.reset(); }
    } close_c{node_c};
    auto peer = node_c->connect("node-b:7101");
    ASSERT_TRUE(peer.ok()) << peer.err().message;
    ASSERT_TRUE(node_c->send(*peer, transport::encode(transport::envelope{{"node-c", 99}, {"", shard_id}, 0, 0, bad})).ok());

    ASSERT_TRUE(a.ended(reqs)) << "after the bad step:\n" << a.c.describe();
    a.expect_failed(reqs);
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, patience, [&] { return !heard.empty(); })) << "node C heard nothing back";
    const auto* res = std::get_if<transport::shard_result_msg>(&heard.front().msg);
    ASSERT_NE(res, nullptr) << "node C heard something other than a ShardResult";
    EXPECT_EQ(heard.front().destination.actor, 99u);
    EXPECT_EQ(res->step, bad.step);
    EXPECT_EQ(res->rank, 1u);
    EXPECT_FALSE(res->ok);
    EXPECT_EQ(errc_name(res->code), errc_name(errc::invalid_request)) << res->message;
  }

  // The networks first: they outlive every transport attached to them.
  std::shared_ptr<transport::loopback_network> mesh_net_ = std::make_shared<transport::loopback_network>();
  std::shared_ptr<transport::loopback_network> tensor_net_ = std::make_shared<transport::loopback_network>();
  model::testing::temp_dir dir_;
  std::shared_ptr<const model::model> model_;
};

TEST_F(SplitReplica, StreamsTheTokensOfOneProcessWithRankOneOnAnotherNode) {
  const auto reqs = greedy(3, 40);
  const auto want = reference(reqs);
  ASSERT_EQ(want.size(), reqs.size());
  auto ps = parts();
  ASSERT_EQ(ps.size(), 2u);
  node_a a(mesh_net_, std::move(ps[0]));
  node_b b(mesh_net_, std::move(ps[1]));
  ASSERT_TRUE(a.start());
  a.submit(reqs);
  ASSERT_TRUE(a.ended(reqs)) << a.c.describe();
  {
    std::lock_guard lock(a.c.mu);
    for (const auto& r : reqs) {
      const token_msg& end = a.c.ends[r.id];
      EXPECT_FALSE(end.failed) << "request " << r.id << ": " << end.err.message;
      EXPECT_EQ(end.finish, finish_reason::length) << "request " << r.id;
      EXPECT_EQ(a.c.tokens[r.id], want.at(r.id)) << "request " << r.id;
    }
  }
  caf::scoped_actor self{a.sys};
  downs d{self, {}};
  self->monitor(a.replica);
  self->send_exit(a.replica, caf::exit_reason::user_shutdown);
  EXPECT_TRUE(d.wait(a.replica));
}

TEST_F(SplitReplica, SpeculatingStepsCrossToRankOneAndChangeNoToken) {
  // Steps whose sequences draw from several positions (speculation's drafts) travel to node B
  // with their draws and rows: the tokens are still one process's.
  const auto reqs = greedy(3, 40);
  const auto want = reference(reqs);
  auto ps = parts();
  ASSERT_EQ(ps.size(), 2u);
  node_a a(mesh_net_, std::move(ps[0]));
  node_b b(mesh_net_, std::move(ps[1]));
  scheduler_config cfg;
  cfg.speculation = {4, 3, 1};
  ASSERT_TRUE(a.start(cfg));
  a.submit(reqs);
  ASSERT_TRUE(a.ended(reqs)) << a.c.describe();
  {
    std::lock_guard lock(a.c.mu);
    for (const auto& r : reqs) {
      EXPECT_FALSE(a.c.ends[r.id].failed) << "request " << r.id << ": " << a.c.ends[r.id].err.message;
      EXPECT_EQ(a.c.tokens[r.id], want.at(r.id)) << "request " << r.id;
    }
  }
  caf::scoped_actor self{a.sys};
  self->send(a.replica, status_atom::value, caf::actor{self});
  self->receive([&](const replica_load& l) { EXPECT_GT(l.accepted, 0u) << "no draft kept: speculation did not run"; },
                caf::after(std::chrono::seconds(10)) >> [&] { ADD_FAILURE() << "no status"; });
  downs d{self, {}};
  self->monitor(a.replica);
  self->send_exit(a.replica, caf::exit_reason::user_shutdown);
  EXPECT_TRUE(d.wait(a.replica));
}

TEST_F(SplitReplica, AStepWithBlockIdsOutOfRangeFailsTheRequestsInFlight) {
  transport::shard_step_msg bad;
  bad.step = 1'000'000;
  bad.tokens = {1, 2};
  bad.tables = {1 << 20};  // far beyond the KV cache's 1024 blocks
  bad.seqs = {{2, 0, 1, true}};
  bad.rows = {{}};  // well formed but for its block id
  bad_step_fails_the_requests_in_flight(bad);
}

TEST_F(SplitReplica, AMalformedStepFailsTheRequestsInFlight) {
  transport::shard_step_msg bad;  // its sequence needs more tokens and blocks than it carries
  bad.step = 1'000'001;
  bad.tokens = {1};
  bad.seqs = {{5, 0, 3, true}};
  bad_step_fails_the_requests_in_flight(bad);
}

TEST_F(SplitReplica, AStepWithoutItsSamplingRowsFailsTheRequestsInFlight) {
  transport::shard_step_msg bad;  // a sequence that wants a token, but no row saying how to draw it
  bad.step = 1'000'002;
  bad.tokens = {1, 2};
  bad.tables = {0};
  bad.seqs = {{2, 0, 1, true}};
  bad_step_fails_the_requests_in_flight(bad);
}

TEST_F(SplitReplica, NodeBsDeathFailsTheRequestsInFlightAndStopsTheReplica) {
  const auto reqs = greedy(2, 3000);  // far more tokens than stream before node B dies
  auto ps = parts();
  ASSERT_EQ(ps.size(), 2u);
  node_a a(mesh_net_, std::move(ps[0]));
  auto b = std::make_unique<node_b>(mesh_net_, std::move(ps[1]));
  ASSERT_TRUE(a.start());
  std::vector<caf::actor> shards;  // rank 0's shard actor here, and B's stand-in
  {
    // Asked by an actor of its own: the request's timeout message, which comes even after the
    // answer, must not reach `self` (in CAF 0.17 it would restart the timeouts of its receives).
    caf::scoped_actor asker{a.sys};
    asker->request(a.replica, patience, shards_atom::value)
        .receive([&](std::vector<caf::actor>& s) { shards = std::move(s); },
                 [&](caf::error& e) { ADD_FAILURE() << a.sys.render(e); });
  }
  ASSERT_EQ(shards.size(), 2u);
  caf::scoped_actor self{a.sys};
  self->monitor(a.replica);
  self->monitor(shards[0]);
  a.submit(reqs);
  ASSERT_TRUE(a.streaming(reqs, 2)) << "before node B's death:\n" << a.c.describe();

  // Node B's process dies: its bridge, and its mesh transport with it (as in bridge_test), and
  // its shard. B's tensor plane is still up here, so A can learn of the death only through
  // the mesh: its stand-in for B's shard stops.
  // Anonymous exits, not self->send_exit: CAF 0.17 runs an idle actor that a message wakes on
  // the sender's scheduler, so B's bridge would end on one of A's workers, where the tail of
  // its cleanup may still run (on B's system) while b.reset() below destroys that system.
  caf::anon_send_exit(b->bridge, caf::exit_reason::kill);
  caf::anon_send_exit(b->shard, caf::exit_reason::kill);
  ASSERT_TRUE(a.ended(reqs)) << "after node B's death:\n" << a.c.describe();
  a.expect_failed(reqs);
  downs d{self, {}};
  EXPECT_TRUE(d.wait(a.replica)) << "the replica outlived node B";

  // The rest of node B goes (its engine part, and its tensor-plane transport with it): rank
  // 0's shard, which may wait in a collective for B's rank, is released and stops.
  b.reset();
  EXPECT_TRUE(d.wait(shards[0])) << "rank 0's shard still runs after node B is gone";
  // Nothing more reaches the requests after their failure.
  std::lock_guard lock(a.c.mu);
  for (const auto& r : reqs) EXPECT_TRUE(a.c.ends[r.id].failed);
}

}  // namespace
}  // namespace llmesh::actors
