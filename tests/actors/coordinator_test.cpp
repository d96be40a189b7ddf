// The coordinator's logic without CAF or a network, driven frame by frame with clocks the test
// controls. Covered: the join handshake (the token's holder gets its replica assignment, others
// a refusal and nothing else); ready reports reaching the routers and the ctl views (status,
// nodes, replicas); a node lost by a dropped connection or by silence (its replicas are gone
// and re-placed on a spare node; heartbeats keep a node alive); drain, remove and scale through
// ctl; ctl's authentication (token, clock skew, replays) and argument errors; create() refusing
// spread placement; replica reports from a peer that does not host the replica being ignored.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "llmesh/actors/coordinator.hpp"
#include "llmesh/actors/join_auth.hpp"

namespace llmesh::actors {
namespace {

using namespace std::chrono_literals;
using transport::peer_id;
using transport::replica_phase;
using json = nlohmann::json;
using strings = std::vector<std::string>;

const std::string token = "local-cluster-token-0123456789";
const mesh_clock::time_point t0 = mesh_clock::time_point{} + std::chrono::seconds(100);
constexpr uint64_t wall0 = 1'700'000'000'000;  // the coordinator's wall clock, ms
constexpr peer_id ctl_peer = 50;                // `llmesh ctl`'s connection
constexpr uint64_t ctl_actor = 9;               // and its actor there

/// One model: a tp-2 packed replica fills a node's two default shard slots.
model_spec tiny(int replicas = 1) {
  model_spec m;
  m.name = "tiny";
  m.path = "/models/tiny";
  m.tp = 2;
  m.replicas = replicas;
  m.kv_cache_mb = 256;
  return m;
}

/// tiny() spread: each of a replica's two tp shards on a node of its own (one slot each).
model_spec split(int replicas = 1) {
  model_spec m = tiny(replicas);
  m.name = "split";
  m.place = placement::spread;
  return m;
}

/// The mesh address hello() gives the node on connection `peer`.
std::string addr(peer_id peer) { return "127.0.0.1:" + std::to_string(7100 + peer); }

coordinator make(std::vector<model_spec> models = {tiny()}, std::chrono::milliseconds failure_timeout = 3000ms) {
  auto c = coordinator::create({token, failure_timeout, std::move(models)});
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.err().message);
  return std::move(c).value();
}

/// A frame from actor `from` (a node agent unless told).
transport::envelope frame(transport::body b, uint64_t from = agent_actor_id) {
  transport::envelope e;
  e.source = {"sender", from};
  e.destination = {"seed", coordinator_actor_id};
  e.msg = std::move(b);
  return e;
}

/// One line per action, so that a test can compare a whole list (order included) at once:
/// "start r1 -> 1:1" (assign start to peer 1, actor 1), "stop r1 -> 1:1", "welcome -> 1:1",
/// "refused -> 1:1", "challenge -> 1:1", "reply -> 50:9", "ready r1 at 1:1001 (a/1)",
/// "drain r1", "gone r1".
std::string describe(const coordinator_action& a) {
  const std::string r = "r" + std::to_string(a.replica);
  switch (a.k) {
    case coordinator_action::send: {
      const std::string to = " -> " + std::to_string(a.peer) + ":" + std::to_string(a.remote);
      return std::visit(
          [&](const auto& m) -> std::string {
            using T = std::decay_t<decltype(m)>;
            if constexpr (std::is_same_v<T, transport::assign_msg>) {
              return std::string(m.op == transport::assign_op::start ? "start" : "stop") + " r" +
                     std::to_string(m.replica) + to;
            } else if constexpr (std::is_same_v<T, transport::welcome_msg>) {
              return (m.accepted ? "welcome" : "refused") + to;
            } else if constexpr (std::is_same_v<T, transport::challenge_msg>) {
              return "challenge" + to;
            } else if constexpr (std::is_same_v<T, transport::control_reply_msg>) {
              return "reply" + to;
            } else if constexpr (std::is_same_v<T, transport::replica_state_msg>) {
              static constexpr const char* phases[] = {"loading", "ready", "draining", "dead"};
              return std::string("news r") + std::to_string(m.replica) + " " + phases[static_cast<int>(m.phase)] +
                     (m.listen.empty() ? "" : " " + m.node + "@" + m.listen + ":" + std::to_string(m.actor)) + to;
            } else {
              return "other" + to;
            }
          },
          a.msg);
    }
    case coordinator_action::replica_ready:
      return "ready " + r + " at " + std::to_string(a.peer) + ":" + std::to_string(a.remote) + " (" + a.name + ")";
    case coordinator_action::replica_drain: return "drain " + r;
    case coordinator_action::replica_gone: return "gone " + r;
  }
  return "?";
}

strings describe(const coordinator::actions& as) {
  strings out;
  for (const auto& a : as) out.push_back(describe(a));
  return out;
}

/// The assign messages among `as`, in order.
std::vector<transport::assign_msg> assigns(const coordinator::actions& as) {
  std::vector<transport::assign_msg> out;
  for (const auto& a : as) {
    if (const auto* m = std::get_if<transport::assign_msg>(&a.msg); m && a.k == coordinator_action::send) {
      out.push_back(*m);
    }
  }
  return out;
}

transport::hello_msg hello(const std::string& name, peer_id peer,
                           std::vector<transport::role> roles = {transport::role::replica}) {
  return {name, std::move(roles), "127.0.0.1:" + std::to_string(7100 + peer), {2, 1ull << 30, 0, 0},
          *join_auth::make_nonce()};
}

/// The joiner's side of the handshake on connection `peer`: hello, then the proof for the
/// challenge. Returns the coordinator's answer to the proof (the welcome, then any assigns).
coordinator::actions join(coordinator& c, peer_id peer, const transport::hello_msg& h,
                          mesh_clock::time_point now = t0, const std::string& key = token) {
  auto answer = c.on_message(peer, frame(h), now, wall0);
  if (answer.size() != 1 || !std::holds_alternative<transport::challenge_msg>(answer[0].msg)) {
    ADD_FAILURE() << "no challenge for " << h.node << ": " << testing::PrintToString(describe(answer));
    return answer;
  }
  EXPECT_EQ(describe(answer[0]), "challenge -> " + std::to_string(peer) + ":1");
  const auto& nonce = std::get<transport::challenge_msg>(answer[0].msg).nonce;
  return c.on_message(peer, frame(transport::proof_msg{join_auth::proof(key, nonce, h.nonce, h.node)}), now, wall0);
}

coordinator::actions join(coordinator& c, peer_id peer, const std::string& name, mesh_clock::time_point now = t0) {
  return join(c, peer, hello(name, peer), now);
}

coordinator::actions report(coordinator& c, peer_id peer, uint64_t replica, replica_phase phase, uint64_t actor = 0,
                            std::string reason = {}) {
  transport::replica_state_msg m{replica, "node", "tiny", phase, actor, std::move(reason)};
  return c.on_message(peer, frame(m), t0, wall0);
}

coordinator::actions ready(coordinator& c, peer_id peer, uint64_t replica) {
  return report(c, peer, replica, replica_phase::ready, replica_actor_base + replica);
}

/// A ctl command signed with `key` at `timestamp_ms` under a fresh nonce.
transport::control_msg command(const std::string& cmd, strings args = {}, uint64_t timestamp_ms = wall0,
                               const std::string& key = token) {
  transport::control_msg m{cmd, std::move(args), *join_auth::make_nonce(), timestamp_ms, {}};
  m.mac = join_auth::control_mac(key, m.nonce, m.timestamp_ms, m.command, m.args);
  return m;
}

/// The coordinator's answer to a ctl command: the reply (always the last action) and what
/// the command did before it.
struct ctl_answer {
  transport::control_reply_msg reply;
  coordinator::actions effects;
};

ctl_answer send_ctl(coordinator& c, const transport::control_msg& m, uint64_t wall_ms = wall0) {
  ctl_answer out;
  out.effects = c.on_message(ctl_peer, frame(m, ctl_actor), t0, wall_ms);
  if (out.effects.empty()) {
    ADD_FAILURE() << "no reply to '" << m.command << "'";
    return out;
  }
  EXPECT_EQ(describe(out.effects.back()), "reply -> 50:9");
  if (const auto* r = std::get_if<transport::control_reply_msg>(&out.effects.back().msg)) out.reply = *r;
  out.effects.pop_back();
  return out;
}

ctl_answer ctl(coordinator& c, const std::string& cmd, strings args = {}) { return send_ctl(c, command(cmd, std::move(args))); }

/// The `replicas` view as id → phase.
std::map<uint64_t, std::string> phases(coordinator& c) {
  auto a = ctl(c, "replicas");
  EXPECT_TRUE(a.reply.ok) << a.reply.text;
  std::map<uint64_t, std::string> out;
  for (const auto& r : json::parse(a.reply.json)) out[r.at("id").get<uint64_t>()] = r.at("phase").get<std::string>();
  return out;
}

/// The `nodes` view's entry for `name` (null when it is not listed).
json node_view(coordinator& c, const std::string& name) {
  auto a = ctl(c, "nodes");
  EXPECT_TRUE(a.reply.ok) << a.reply.text;
  for (const auto& n : json::parse(a.reply.json))
    if (n.at("name") == name) return n;
  return nullptr;
}

// --- joining ---

TEST(Coordinator, AReplicaNodeWithTheTokenIsWelcomedAndAssignedAReplica) {
  auto c = make({tiny(2)});
  auto a = join(c, 1, "a");
  ASSERT_EQ(describe(a), (strings{"welcome -> 1:1", "start r1 -> 1:1"}));
  const auto& welcome = std::get<transport::welcome_msg>(a[0].msg);
  ASSERT_EQ(welcome.members.size(), 1u);
  EXPECT_EQ(welcome.members[0].node, "a");
  const auto start = std::get<transport::assign_msg>(a[1].msg);
  EXPECT_EQ(start, (transport::assign_msg{1, "tiny", "/models/tiny", 2, 256, transport::assign_op::start}));
  EXPECT_EQ(c.replicas().at(1).peer, 1u);
  EXPECT_EQ(c.replicas().at(1).phase, replica_phase::loading);

  // The second replica does not fit on a (tp 2 fills its two slots): the model is short.
  auto s = ctl(c, "status");
  ASSERT_TRUE(s.reply.ok);
  EXPECT_EQ(s.reply.text, "1 node(s), 0/1 replica(s) ready, tiny short of 1");
  EXPECT_EQ(json::parse(s.reply.json)["pending"], (json{{"tiny", 1}}));

  // A node without the replica role joins but gets nothing to run.
  EXPECT_EQ(describe(join(c, 2, hello("gw", 2, {transport::role::gateway, transport::role::router}))),
            (strings{"welcome -> 2:1"}));
  // The next replica node takes the pending replica.
  auto b = join(c, 3, "b");
  EXPECT_EQ(describe(b), (strings{"welcome -> 3:1", "start r2 -> 3:1"}));
  EXPECT_EQ(std::get<transport::welcome_msg>(b[0].msg).members.size(), 3u);
  EXPECT_EQ(json::parse(ctl(c, "status").reply.json)["pending"], json::object());
}

TEST(Coordinator, ANodeThatAnnouncesMoreSlotsHostsMoreReplicas) {
  auto c = make({tiny(3)});  // tp 2, packed
  auto h = hello("big", 1);
  h.res.slots = 4;
  EXPECT_EQ(assigns(join(c, 1, h)).size(), 2u);  // 4 slots: two tp-2 replicas, the third is short
  EXPECT_EQ(node_view(c, "big")["slots"], 4);
  EXPECT_EQ(assigns(join(c, 2, "small")).size(), 1u);  // the default: 2 slots
  EXPECT_EQ(node_view(c, "small")["slots"], 2);
  auto huge = hello("huge", 3);
  huge.res.slots = UINT32_MAX;  // capped, not wrapped into a negative count
  join(c, 3, huge);
  EXPECT_EQ(node_view(c, "huge")["slots"], 1024);
}

TEST(Coordinator, AWrongTokenOrABadHelloIsRefusedAndAssignsNothing) {
  auto c = make();
  auto wrong = join(c, 1, hello("a", 1), t0, token + "!");
  ASSERT_EQ(describe(wrong), (strings{"refused -> 1:1"}));
  EXPECT_EQ(std::get<transport::welcome_msg>(wrong[0].msg).reason, "wrong cluster token");
  EXPECT_TRUE(c.members().members().empty());
  EXPECT_TRUE(c.replicas().empty());

  // A malformed hello is answered with a refusing welcome straight away (no challenge).
  auto bad = c.on_message(2, frame(hello("bad name!", 2)), t0, wall0);
  ASSERT_EQ(describe(bad), (strings{"refused -> 2:1"}));
  EXPECT_NE(std::get<transport::welcome_msg>(bad[0].msg).reason.find("join refused for 'bad name!'"), std::string::npos);
  // A proof without a hello.
  auto stray = c.on_message(3, frame(transport::proof_msg{std::string(32, 'x')}), t0, wall0);
  EXPECT_EQ(describe(stray), (strings{"refused -> 3:1"}));
  EXPECT_TRUE(c.replicas().empty());

  // The same name with the right token still joins and gets the replica.
  EXPECT_EQ(describe(join(c, 4, "a")), (strings{"welcome -> 4:1", "start r1 -> 4:1"}));
}

// --- ready reports and the ctl views ---

TEST(Coordinator, ReadyReportsReachTheRoutersAndTheCtlViews) {
  auto c = make({tiny(2)});
  join(c, 1, "a");
  join(c, 2, "b");
  auto s = ctl(c, "status");
  EXPECT_EQ(s.reply.text, "2 node(s), 0/2 replica(s) ready");

  EXPECT_EQ(describe(ready(c, 1, 1)), (strings{"ready r1 at 1:1001 (a/1)"}));
  EXPECT_TRUE(ready(c, 1, 1).empty());  // reported twice: the routers already know
  EXPECT_EQ(c.replicas().at(1).actor, 1001u);
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{1, "ready"}, {2, "loading"}}));
  s = ctl(c, "status");
  EXPECT_EQ(s.reply.text, "2 node(s), 1/2 replica(s) ready");

  EXPECT_EQ(describe(ready(c, 2, 2)), (strings{"ready r2 at 2:1002 (b/2)"}));
  s = ctl(c, "status");
  ASSERT_TRUE(s.reply.ok);
  EXPECT_TRUE(s.effects.empty());
  EXPECT_EQ(s.reply.text, "2 node(s), 2/2 replica(s) ready");
  const auto j = json::parse(s.reply.json);
  EXPECT_EQ(j["nodes"], 2);
  EXPECT_EQ(j["replicas"], 2);
  EXPECT_EQ(j["ready"], 2);
  EXPECT_EQ(j["pending"], json::object());

  auto r = ctl(c, "replicas");
  ASSERT_TRUE(r.reply.ok);
  EXPECT_EQ(r.reply.text, "1  tiny  a  ready\n2  tiny  b  ready\n");
  EXPECT_EQ(json::parse(r.reply.json)[1],
            (json{{"id", 2}, {"model", "tiny"}, {"moving", false}, {"node", "b"}, {"phase", "ready"}, {"reason", ""},
                  {"shards", {"b", "b"}}}));

  const json a = node_view(c, "a");
  EXPECT_EQ(a["listen"], "127.0.0.1:7101");
  EXPECT_EQ(a["roles"], "replica");
  EXPECT_EQ(a["state"], "ready");
  EXPECT_EQ(a["shards"], 2);
  EXPECT_EQ(a["slots"], 2);
}

TEST(Coordinator, AReplicaThatFailsOnItsOwnIsReformedOneThatNeverLoadedKeepsItsReason) {
  auto c = make({tiny(2)});
  join(c, 1, "a");
  join(c, 2, "b");
  ready(c, 1, 1);
  // A ready replica dies: the routers forget it, and it is re-formed where there is room (its
  // own node, whose slots it freed).
  EXPECT_EQ(describe(report(c, 1, 1, replica_phase::dead, 0, "out of memory")), (strings{"gone r1", "start r3 -> 1:1"}));
  // One still loading fails: the routers never knew it; it stays, with its reason (placing it
  // again would fail the same way).
  EXPECT_TRUE(report(c, 2, 2, replica_phase::dead, 0, "no such file").empty());
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{2, "dead"}, {3, "loading"}}));
  auto r = ctl(c, "replicas");
  EXPECT_EQ(r.reply.text, "2  tiny  b  dead  (no such file)\n3  tiny  a  loading\n");
  EXPECT_EQ(json::parse(r.reply.json)[0]["reason"], "no such file");
  EXPECT_EQ(ctl(c, "status").reply.text, "2 node(s), 0/2 replica(s) ready");
  EXPECT_TRUE(report(c, 1, 1, replica_phase::ready, 1001).empty());  // a dead replica does not come back
  // Scaling to zero stops the live one and forgets the one that never loaded without a word.
  EXPECT_EQ(describe(ctl(c, "scale", {"tiny", "0"}).effects), (strings{"stop r3 -> 1:1"}));
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{3, "draining"}}));
}

TEST(Coordinator, ReplicaStatesFromAPeerThatDoesNotHostTheReplicaAreIgnored) {
  auto c = make({tiny(2)});
  join(c, 1, "a");
  join(c, 2, "b");
  EXPECT_TRUE(ready(c, 2, 1).empty());  // r1 runs on peer 1
  EXPECT_TRUE(report(c, 2, 1, replica_phase::dead, 0, "lies").empty());
  EXPECT_TRUE(report(c, ctl_peer, 1, replica_phase::ready, 1001).empty());
  EXPECT_TRUE(ready(c, 1, 99).empty());  // no such replica
  EXPECT_EQ(c.replicas().at(1).phase, replica_phase::loading);
  EXPECT_EQ(c.replicas().at(1).actor, 0u);
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{1, "loading"}, {2, "loading"}}));
  // The real host's report still counts.
  EXPECT_EQ(describe(ready(c, 1, 1)), (strings{"ready r1 at 1:1001 (a/1)"}));
}

// --- losing a node ---

TEST(Coordinator, ALostConnectionsReplicasAreGoneAndPlacedOnASpareNode) {
  auto c = make();
  join(c, 1, "a");
  EXPECT_EQ(describe(join(c, 2, "b")), (strings{"welcome -> 2:1"}));  // a spare: one replica wanted
  ready(c, 1, 1);

  auto down = c.on_peer_down(1);
  ASSERT_EQ(describe(down), (strings{"gone r1", "start r2 -> 2:1"}));
  EXPECT_EQ(assigns(down)[0], (transport::assign_msg{2, "tiny", "/models/tiny", 2, 256, transport::assign_op::start}));
  EXPECT_EQ(c.members().members().count("a"), 0u);
  EXPECT_EQ(c.replicas().count(1), 0u);
  EXPECT_TRUE(c.on_peer_down(1).empty());  // reported twice: harmless
  EXPECT_TRUE(ready(c, 1, 1).empty());     // the old replica is forgotten
  EXPECT_EQ(describe(ready(c, 2, 2)), (strings{"ready r2 at 2:1002 (b/2)"}));
  EXPECT_EQ(ctl(c, "status").reply.text, "1 node(s), 1/1 replica(s) ready");

  // The last replica node goes too: nothing left to place on, the model is short.
  EXPECT_EQ(describe(c.on_peer_down(2)), (strings{"gone r2"}));
  EXPECT_EQ(ctl(c, "status").reply.text, "0 node(s), 0/0 replica(s) ready, tiny short of 1");
  // A node coming back takes it again.
  EXPECT_EQ(describe(join(c, 3, "a")), (strings{"welcome -> 3:1", "start r3 -> 3:1"}));
}

TEST(Coordinator, SilencePastTheFailureTimeoutLosesANodeHeartbeatsKeepItAlive) {
  auto c = make({tiny()}, 3000ms);
  join(c, 1, "a");
  join(c, 2, "b");
  ready(c, 1, 1);
  auto beat = [&](peer_id p, const std::string& name, uint64_t seq, std::chrono::milliseconds at) {
    EXPECT_TRUE(c.on_message(p, frame(transport::heartbeat_msg{name, seq}), t0 + at, wall0).empty());
  };
  beat(1, "a", 1, 1000ms);
  beat(2, "b", 1, 1000ms);
  beat(2, "b", 2, 3000ms);
  EXPECT_TRUE(c.on_tick(t0 + 3500ms).empty());  // a was heard 2.5 s ago
  EXPECT_TRUE(c.on_tick(t0 + 4000ms).empty());  // exactly the timeout: still alive

  auto lost = c.on_tick(t0 + 4500ms);  // a silent for 3.5 s; b heard 1.5 s ago
  ASSERT_EQ(describe(lost), (strings{"gone r1", "start r2 -> 2:1"}));
  EXPECT_EQ(c.members().members().size(), 1u);
  EXPECT_EQ(c.members().members().count("b"), 1u);
  EXPECT_TRUE(c.on_tick(t0 + 4600ms).empty());

  // a's partition heals: its heartbeats come back, and it is told to join again (it drops the
  // replica that was re-formed on b), then it is a member with nothing placed on it.
  auto back = c.on_message(1, frame(transport::heartbeat_msg{"a", 2}), t0 + 5000ms, wall0);
  ASSERT_EQ(describe(back), (strings{"refused -> 1:1"}));
  EXPECT_EQ(std::get<transport::welcome_msg>(back[0].msg).reason, rejoin_reason);
  EXPECT_TRUE(join(c, 1, "a", t0 + 5100ms).size() == 1);  // the welcome; nothing to place
  EXPECT_EQ(c.members().members().size(), 2u);
  EXPECT_TRUE(c.on_message(1, frame(transport::heartbeat_msg{"a", 3}), t0 + 5200ms, wall0).empty());
}

TEST(Coordinator, RoutersInOtherProcessesHearOfReplicasThroughTheirAgents) {
  auto c = make({tiny(2)});
  join(c, 1, "a");
  join(c, 2, "b");
  ready(c, 1, 1);
  // A router node joins: it is told of the ready replica (where to reach it) at once.
  auto j = join(c, 3, hello("gw2", 3, {transport::role::gateway, transport::role::router}));
  EXPECT_EQ(describe(j), (strings{"welcome -> 3:1", "news r1 ready a@127.0.0.1:7101:1001 -> 3:1"}));
  // Later changes reach it beside the router here.
  EXPECT_EQ(describe(ready(c, 2, 2)), (strings{"ready r2 at 2:1002 (b/2)", "news r2 ready b@127.0.0.1:7102:1002 -> 3:1"}));
  auto scaled = ctl(c, "scale", {"tiny", "1"});
  EXPECT_EQ(describe(scaled.effects), (strings{"drain r2", "stop r2 -> 2:1", "news r2 draining -> 3:1"}));
  EXPECT_EQ(describe(report(c, 2, 2, replica_phase::dead)), (strings{"gone r2", "news r2 dead -> 3:1"}));
  EXPECT_EQ(describe(c.on_peer_down(1)), (strings{"gone r1", "start r3 -> 2:1", "news r1 dead -> 3:1"}));
  // A gone router node hears nothing more.
  c.on_peer_down(3);
  EXPECT_EQ(describe(ready(c, 2, 3)), (strings{"ready r3 at 2:1003 (b/3)"}));
}

// --- drain, remove, scale ---

TEST(Coordinator, DrainStartsTheReplacementThenDrainsAndStopsTheOldReplica) {
  auto c = make();
  join(c, 1, "a");
  join(c, 2, "b");
  ready(c, 1, 1);

  auto d = ctl(c, "drain", {"a"});
  ASSERT_TRUE(d.reply.ok) << d.reply.text;
  EXPECT_EQ(d.reply.text, "draining a");
  EXPECT_EQ(json::parse(d.reply.json), (json{{"ok", true}, {"changes", 2}}));
  // The replacement starts; the old replica serves on until it is ready (no dip in capacity).
  ASSERT_EQ(describe(d.effects), (strings{"start r2 -> 2:1"}));
  EXPECT_EQ(assigns(d.effects)[0], (transport::assign_msg{2, "tiny", "/models/tiny", 2, 256, transport::assign_op::start}));
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{1, "ready"}, {2, "loading"}}));
  EXPECT_EQ(json::parse(ctl(c, "replicas").reply.json)[0]["moving"], true);
  const auto up = ready(c, 2, 2);
  ASSERT_EQ(describe(up), (strings{"ready r2 at 2:1002 (b/2)", "drain r1", "stop r1 -> 1:1"}));
  const auto sent = assigns(up);
  EXPECT_EQ(sent[0].replica, 1u);
  EXPECT_EQ(sent[0].model, "tiny");
  EXPECT_EQ(sent[0].op, transport::assign_op::stop);

  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{1, "draining"}, {2, "ready"}}));
  const json a = node_view(c, "a"), b = node_view(c, "b");
  EXPECT_EQ(a["state"], "draining");
  EXPECT_EQ(a["shards"], 0);
  EXPECT_EQ(b["state"], "ready");
  EXPECT_EQ(b["shards"], 2);
  EXPECT_NE(ctl(c, "nodes").reply.text.find("a  127.0.0.1:7101  replica  draining  shards 0/2\n"), std::string::npos);

  // A draining replica's late ready report changes nothing; its stop report retires it.
  EXPECT_TRUE(ready(c, 1, 1).empty());
  EXPECT_EQ(describe(report(c, 1, 1, replica_phase::dead)), (strings{"gone r1"}));
  EXPECT_EQ(c.replicas().count(1), 0u);
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{2, "ready"}}));

  // Draining the last ready node: nowhere to move to, so r2 keeps running there.
  auto again = ctl(c, "drain", {"b"});
  ASSERT_TRUE(again.reply.ok);
  EXPECT_TRUE(again.effects.empty());
  EXPECT_EQ(json::parse(again.reply.json)["changes"], 0);
  EXPECT_EQ(c.replicas().at(2).phase, replica_phase::ready);
}

TEST(Coordinator, RemoveStopsANodesReplicasAndPlacesThemElsewhere) {
  auto c = make();
  join(c, 1, "a");
  join(c, 2, "b");
  ready(c, 1, 1);
  auto r = ctl(c, "remove", {"a"});
  ASSERT_TRUE(r.reply.ok) << r.reply.text;
  EXPECT_EQ(r.reply.text, "removed a");
  EXPECT_EQ(describe(r.effects), (strings{"drain r1", "stop r1 -> 1:1", "start r2 -> 2:1"}));
  // a stays a member (its connection is up) but hosts nothing any more.
  const json a = node_view(c, "a");
  ASSERT_FALSE(a.is_null());
  EXPECT_FALSE(a.contains("state"));
  EXPECT_EQ(describe(report(c, 1, 1, replica_phase::dead)), (strings{"gone r1"}));
  EXPECT_FALSE(ctl(c, "remove", {"a"}).reply.ok);  // placement no longer knows it
}

TEST(Coordinator, ScaleUpAndDownThroughCtl) {
  auto c = make();
  join(c, 1, "a");
  join(c, 2, "b");
  ready(c, 1, 1);

  auto up = ctl(c, "scale", {"tiny", "2"});
  ASSERT_TRUE(up.reply.ok) << up.reply.text;
  EXPECT_EQ(up.reply.text, "tiny scaled to 2");
  EXPECT_EQ(json::parse(up.reply.json), (json{{"ok", true}, {"changes", 1}}));
  ASSERT_EQ(describe(up.effects), (strings{"start r2 -> 2:1"}));
  EXPECT_EQ(assigns(up.effects)[0].kv_cache_mb, 256u);

  // Past capacity: the rest is pending.
  auto more = ctl(c, "scale", {"tiny", "3"});
  ASSERT_TRUE(more.reply.ok);
  EXPECT_TRUE(more.effects.empty());
  EXPECT_EQ(ctl(c, "status").reply.text, "2 node(s), 1/2 replica(s) ready, tiny short of 1");

  // Down: the newest goes first; it was still loading, so the routers hear nothing.
  auto down = ctl(c, "scale", {"tiny", "1"});
  ASSERT_TRUE(down.reply.ok);
  EXPECT_EQ(describe(down.effects), (strings{"stop r2 -> 2:1"}));
  auto zero = ctl(c, "scale", {"tiny", "0"});
  ASSERT_TRUE(zero.reply.ok);
  EXPECT_EQ(describe(zero.effects), (strings{"drain r1", "stop r1 -> 1:1"}));
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{1, "draining"}, {2, "draining"}}));
  EXPECT_EQ(describe(report(c, 1, 1, replica_phase::dead)), (strings{"gone r1"}));
  // r2 never got ready; the coordinator still says gone (harmless: routers forget an unknown id).
  EXPECT_EQ(describe(report(c, 2, 2, replica_phase::dead, 0, "stopped while loading")), (strings{"gone r2"}));
  EXPECT_TRUE(c.replicas().empty());
  EXPECT_EQ(ctl(c, "status").reply.text, "2 node(s), 0/0 replica(s) ready");
}

TEST(Coordinator, CtlRefusesBadArgumentsWithAClearMessageAndChangesNothing) {
  auto c = make();
  join(c, 1, "a");
  join(c, 2, "b");
  auto refused = [&](const std::string& cmd, strings args) {
    auto a = ctl(c, cmd, std::move(args));
    EXPECT_FALSE(a.reply.ok) << cmd;
    EXPECT_TRUE(a.effects.empty()) << cmd;
    EXPECT_EQ(a.reply.json, "") << cmd;
    return a.reply.text;
  };
  for (const auto& n : strings{"abc", "", "-1", "1025", "2x", "99999999999999999999"}) {
    EXPECT_EQ(refused("scale", {"tiny", n}), "scale: N must be 0..1024") << n;
  }
  EXPECT_EQ(refused("scale", {"nope", "1"}), "placement: no model 'nope'");
  EXPECT_EQ(refused("drain", {"ghost"}), "placement: no node 'ghost'");
  EXPECT_EQ(refused("remove", {"ghost"}), "placement: no node 'ghost'");
  EXPECT_EQ(refused("frobnicate", {}),
            "unknown command 'frobnicate' with 0 argument(s) (status, nodes, replicas, drain NODE, remove NODE, "
            "scale MODEL N, fault NODE RULE)");
  EXPECT_EQ(refused("status", {"now"}).rfind("unknown command 'status' with 1 argument(s)", 0), 0u);
  EXPECT_EQ(refused("drain", {}).rfind("unknown command 'drain' with 0 argument(s)", 0), 0u);
  EXPECT_EQ(refused("scale", {"tiny"}).rfind("unknown command 'scale' with 1 argument(s)", 0), 0u);
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{1, "loading"}}));
  EXPECT_EQ(node_view(c, "a")["state"], "ready");
}

// --- ctl authentication ---

TEST(Coordinator, CtlRefusesAWrongTokenAStaleClockAndReplays) {
  auto c = make();
  join(c, 1, "a");
  join(c, 2, "b");
  auto expect_refused = [&](const transport::control_msg& m, uint64_t wall, const std::string& why) {
    auto a = send_ctl(c, m, wall);
    EXPECT_FALSE(a.reply.ok);
    EXPECT_EQ(a.reply.text, why);
    EXPECT_EQ(a.reply.json, "");
    EXPECT_TRUE(a.effects.empty());
  };
  const std::string bad_token = "refused: bad credentials (check the cluster token)";
  const std::string bad_clock = "refused: the command's clock is more than 60 s off";

  expect_refused(command("scale", {"tiny", "2"}, wall0, token + "x"), wall0, bad_token);
  auto tampered = command("scale", {"tiny", "0"});
  tampered.args[1] = "2";
  expect_refused(tampered, wall0, bad_token);
  auto short_nonce = command("status");
  short_nonce.nonce.resize(16);
  short_nonce.mac = join_auth::control_mac(token, short_nonce.nonce, short_nonce.timestamp_ms, "status", {});
  expect_refused(short_nonce, wall0, bad_token);
  auto no_mac = command("status");
  no_mac.mac.clear();
  expect_refused(no_mac, wall0, bad_token);

  expect_refused(command("scale", {"tiny", "2"}, wall0 - 60001), wall0, bad_clock);
  expect_refused(command("scale", {"tiny", "2"}, wall0 + 60001), wall0, bad_clock);
  EXPECT_TRUE(send_ctl(c, command("status", {}, wall0 - 60000)).reply.ok);  // at the limit: fine
  EXPECT_TRUE(send_ctl(c, command("status", {}, wall0 + 60000)).reply.ok);
  EXPECT_EQ(c.replicas().size(), 1u);  // none of the refused scales ran

  // A command is accepted once; the same frame again is a replay, even much later than the
  // first but within the clock window.
  const auto scale = command("scale", {"tiny", "2"});
  auto first = send_ctl(c, scale);
  ASSERT_TRUE(first.reply.ok) << first.reply.text;
  EXPECT_EQ(describe(first.effects), (strings{"start r2 -> 2:1"}));
  expect_refused(scale, wall0, "refused: a replayed command");
  expect_refused(scale, wall0 + 30000, "refused: a replayed command");
  EXPECT_EQ(c.replicas().size(), 2u);
}

TEST(Coordinator, ACustomClockSkewIsHonoured) {
  auto made = coordinator::create({token, 3000ms, {tiny()}, 5000ms});
  ASSERT_TRUE(made.ok());
  auto& c = *made;
  EXPECT_TRUE(send_ctl(c, command("status", {}, wall0 - 5000)).reply.ok);
  auto late = send_ctl(c, command("status", {}, wall0 - 5001));
  EXPECT_FALSE(late.reply.ok);
  EXPECT_EQ(late.reply.text, "refused: the command's clock is more than 5 s off");
}

// --- create ---

TEST(Coordinator, CreateAcceptsSpreadPlacementAndRefusesBadModels) {
  auto both = coordinator::create({token, 3000ms, {tiny(), split()}});
  ASSERT_TRUE(both.ok()) << both.err().message;
  EXPECT_TRUE(both->replicas().empty());  // nothing placed before a node joins

  auto zero_tp = split();
  zero_tp.tp = 0;
  auto z = coordinator::create({token, 3000ms, {zero_tp}});
  ASSERT_FALSE(z.ok());
  EXPECT_EQ(z.err().code, errc::invalid_request);

  auto twice = coordinator::create({token, 3000ms, {tiny(), tiny()}});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.err().code, errc::invalid_request);
  // The same name twice is refused whatever the placements.
  auto spread_tiny = tiny();
  spread_tiny.place = placement::spread;
  auto mixed = coordinator::create({token, 3000ms, {tiny(), spread_tiny}});
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.err().code, errc::invalid_request);

  EXPECT_TRUE(coordinator::create({token, 3000ms, {}}).ok());  // no models yet: fine
}

// --- spread placement (a replica's tp shards on different nodes) ---

TEST(Coordinator, ASpreadReplicaStartsOnEveryShardNodeWithItsRanksTheAddressesAndOneGroupKey) {
  auto c = make({split(2)});
  // One node cannot host a spread tp-2 replica: nothing starts.
  EXPECT_EQ(describe(join(c, 1, "a")), (strings{"welcome -> 1:1"}));
  EXPECT_EQ(ctl(c, "status").reply.text, "1 node(s), 0/0 replica(s) ready, split short of 2");

  // With b both replicas fit, rank 0 on a and rank 1 on b; each node is told its own ranks.
  auto b = join(c, 2, "b");
  ASSERT_EQ(describe(b), (strings{"welcome -> 2:1", "start r1 -> 1:1", "start r1 -> 2:1", "start r2 -> 1:1",
                                  "start r2 -> 2:1"}));
  const auto sent = assigns(b);
  ASSERT_EQ(sent.size(), 4u);
  const std::string k1 = sent[0].group_key, k2 = sent[2].group_key;
  EXPECT_EQ(k1.size(), 32u);
  EXPECT_EQ(k2.size(), 32u);
  EXPECT_NE(k1, std::string(32, '\0'));
  EXPECT_NE(k1, k2);  // every replica forms its own group
  const strings addresses{addr(1), addr(2)};
  using transport::assign_op;
  EXPECT_EQ(sent[0], (transport::assign_msg{1, "split", "/models/tiny", 2, 256, assign_op::start, {0}, addresses, k1}));
  EXPECT_EQ(sent[1], (transport::assign_msg{1, "split", "/models/tiny", 2, 256, assign_op::start, {1}, addresses, k1}));
  EXPECT_EQ(sent[2], (transport::assign_msg{2, "split", "/models/tiny", 2, 256, assign_op::start, {0}, addresses, k2}));
  EXPECT_EQ(sent[3], (transport::assign_msg{2, "split", "/models/tiny", 2, 256, assign_op::start, {1}, addresses, k2}));

  // The record lives at rank 0's node; each node hosts one shard of each replica.
  EXPECT_EQ(c.replicas().at(1).peer, 1u);
  EXPECT_EQ(c.replicas().at(1).a.shards, (strings{"a", "b"}));
  EXPECT_EQ(c.replicas().at(2).peer, 1u);
  EXPECT_EQ(node_view(c, "a")["shards"], 2);
  EXPECT_EQ(node_view(c, "b")["shards"], 2);
  EXPECT_EQ(ctl(c, "replicas").reply.text, "1  split  a,b  loading\n2  split  a,b  loading\n");  // every rank's node
  EXPECT_EQ(json::parse(ctl(c, "replicas").reply.json)[0]["shards"], (json{"a", "b"}));
}

TEST(Coordinator, APackedReplicasAssignStaysPlainBesideASpreadOne) {
  auto c = make({tiny(), split()});
  // a takes the packed replica whole (both slots); a spread one needs two nodes with room.
  auto a = join(c, 1, "a");
  ASSERT_EQ(describe(a), (strings{"welcome -> 1:1", "start r1 -> 1:1"}));
  EXPECT_EQ(assigns(a)[0],
            (transport::assign_msg{1, "tiny", "/models/tiny", 2, 256, transport::assign_op::start, {}, {}, {}}));
  EXPECT_TRUE(assigns(a)[0].ranks.empty());
  EXPECT_TRUE(assigns(a)[0].shard_nodes.empty());
  EXPECT_TRUE(assigns(a)[0].group_key.empty());
  EXPECT_EQ(describe(join(c, 2, "b")), (strings{"welcome -> 2:1"}));  // a is full: still one node short

  auto third = join(c, 3, "c");
  ASSERT_EQ(describe(third), (strings{"welcome -> 3:1", "start r2 -> 2:1", "start r2 -> 3:1"}));
  const auto sent = assigns(third);
  EXPECT_EQ(sent[0].ranks, (std::vector<uint32_t>{0}));
  EXPECT_EQ(sent[1].ranks, (std::vector<uint32_t>{1}));
  EXPECT_EQ(sent[0].shard_nodes, (strings{addr(2), addr(3)}));
  EXPECT_EQ(sent[1].shard_nodes, (strings{addr(2), addr(3)}));
  EXPECT_EQ(sent[0].group_key.size(), 32u);
  EXPECT_EQ(sent[0].group_key, sent[1].group_key);
  EXPECT_EQ(c.replicas().at(2).peer, 2u);
}

TEST(Coordinator, ReportsOnASpreadReplicaCountOnlyFromRankZerosNode) {
  auto c = make({split()});
  join(c, 1, "a");
  join(c, 2, "b");
  // b runs rank 1 of r1: its reports are not the replica's.
  EXPECT_TRUE(ready(c, 2, 1).empty());
  EXPECT_TRUE(report(c, 2, 1, replica_phase::dead, 0, "lies").empty());
  EXPECT_EQ(c.replicas().at(1).phase, replica_phase::loading);
  EXPECT_EQ(c.replicas().at(1).actor, 0u);

  EXPECT_EQ(describe(ready(c, 1, 1)), (strings{"ready r1 at 1:1001 (a/1)"}));
  EXPECT_TRUE(report(c, 2, 1, replica_phase::dead, 0, "lies").empty());  // still ignored once ready
  EXPECT_EQ(c.replicas().at(1).phase, replica_phase::ready);
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{1, "ready"}}));
  // A router node learns it at rank 0's node.
  EXPECT_EQ(describe(join(c, 3, hello("gw", 3, {transport::role::gateway, transport::role::router}))),
            (strings{"welcome -> 3:1", "news r1 ready a@" + addr(1) + ":1001 -> 3:1"}));
}

TEST(Coordinator, ScalingASpreadReplicaDownStopsRankZeroThenTheOtherShards) {
  auto c = make({split()});
  join(c, 1, "a");
  join(c, 2, "b");
  ready(c, 1, 1);
  // Only rank 0's node is told; it drains the replica (its group) first.
  auto down = ctl(c, "scale", {"split", "0"});
  ASSERT_TRUE(down.reply.ok) << down.reply.text;
  ASSERT_EQ(describe(down.effects), (strings{"drain r1", "stop r1 -> 1:1"}));
  EXPECT_EQ(assigns(down.effects)[0],
            (transport::assign_msg{1, "split", "", 0, 0, transport::assign_op::stop, {}, {}, {}}));
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{1, "draining"}}));
  EXPECT_TRUE(report(c, 2, 1, replica_phase::dead).empty());  // not rank 0's node: ignored
  // Rank 0's node reports it stopped: now the other shard goes too.
  const auto stopped = report(c, 1, 1, replica_phase::dead);
  ASSERT_EQ(describe(stopped), (strings{"stop r1 -> 2:1", "gone r1"}));
  EXPECT_EQ(assigns(stopped)[0], (transport::assign_msg{1, "split", "", 0, 0, transport::assign_op::stop, {}, {}, {}}));
  EXPECT_TRUE(c.replicas().empty());
  EXPECT_TRUE(report(c, 1, 1, replica_phase::dead).empty());  // forgotten
}

TEST(Coordinator, DrainingASpreadReplicasNodeMovesItThenStopsRankZeroThenTheOtherShards) {
  auto c = make({split()});
  join(c, 1, "a");
  join(c, 2, "b");
  EXPECT_EQ(describe(join(c, 3, "c")), (strings{"welcome -> 3:1"}));  // a spare
  ready(c, 1, 1);

  auto d = ctl(c, "drain", {"a"});
  ASSERT_TRUE(d.reply.ok) << d.reply.text;
  // The replacement (rank 0 on b, rank 1 on c) starts; r1 serves on until it is ready.
  ASSERT_EQ(describe(d.effects), (strings{"start r2 -> 2:1", "start r2 -> 3:1"}));
  EXPECT_EQ(assigns(d.effects)[0].shard_nodes, (strings{addr(2), addr(3)}));
  EXPECT_EQ(c.replicas().at(2).peer, 2u);
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{1, "ready"}, {2, "loading"}}));
  EXPECT_TRUE(ready(c, 3, 2).empty());  // c runs rank 1: not the replica's report
  ASSERT_EQ(describe(ready(c, 2, 2)), (strings{"ready r2 at 2:1002 (b/2)", "drain r1", "stop r1 -> 1:1"}));
  EXPECT_EQ(describe(report(c, 1, 1, replica_phase::dead)), (strings{"stop r1 -> 2:1", "gone r1"}));
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{2, "ready"}}));
}

TEST(Coordinator, RemovingARank1NodeStopsRankZeroThenTheOtherShardsAndReplaces) {
  auto c = make({split()});
  join(c, 1, "a");
  join(c, 2, "b");
  join(c, 3, "c");
  ready(c, 1, 1);
  auto r = ctl(c, "remove", {"b"});
  ASSERT_TRUE(r.reply.ok) << r.reply.text;
  ASSERT_EQ(describe(r.effects), (strings{"drain r1", "stop r1 -> 1:1", "start r2 -> 1:1", "start r2 -> 3:1"}));
  EXPECT_EQ(assigns(r.effects)[1].shard_nodes, (strings{addr(1), addr(3)}));
  // b (still connected) stops its shard once rank 0's node has stopped the replica.
  EXPECT_EQ(describe(report(c, 1, 1, replica_phase::dead)), (strings{"stop r1 -> 2:1", "gone r1"}));
}

TEST(Coordinator, ASpreadReplicaThatCrashesStopsItsOtherShardsAndIsReformed) {
  auto c = make({split()});
  join(c, 1, "a");
  const auto first = assigns(join(c, 2, "b"));
  ASSERT_EQ(first.size(), 2u);
  ready(c, 1, 1);

  const auto crash = report(c, 1, 1, replica_phase::dead, 0, "out of memory");
  ASSERT_EQ(describe(crash), (strings{"stop r1 -> 2:1", "gone r1", "start r2 -> 1:1", "start r2 -> 2:1"}));
  const auto sent = assigns(crash);
  EXPECT_EQ(sent[0], (transport::assign_msg{1, "split", "", 0, 0, transport::assign_op::stop, {}, {}, {}}));
  EXPECT_EQ(sent[1].ranks, (std::vector<uint32_t>{0}));
  EXPECT_EQ(sent[2].ranks, (std::vector<uint32_t>{1}));
  EXPECT_EQ(sent[1].group_key, sent[2].group_key);
  EXPECT_EQ(sent[1].group_key.size(), 32u);
  EXPECT_NE(sent[1].group_key, first[0].group_key);  // a new group, a new key
  EXPECT_EQ(c.replicas().count(1), 0u);

  // The re-formed one never loads: its other shard is stopped, and it is kept with its reason.
  EXPECT_EQ(describe(report(c, 1, 2, replica_phase::dead, 0, "no such file")), (strings{"stop r2 -> 2:1"}));
  EXPECT_EQ(phases(c), (std::map<uint64_t, std::string>{{2, "dead"}}));
  // Scaling to zero forgets it without a word (nothing runs any more).
  EXPECT_TRUE(ctl(c, "scale", {"split", "0"}).effects.empty());
  EXPECT_TRUE(c.replicas().empty());
}

TEST(Coordinator, LosingTheRank1NodeStopsRankZeroAndReformsTheSpreadReplica) {
  auto c = make({split()});
  join(c, 1, "a");
  join(c, 2, "b");
  join(c, 3, "c");
  ready(c, 1, 1);

  const auto down = c.on_peer_down(2);
  ASSERT_EQ(describe(down), (strings{"gone r1", "stop r1 -> 1:1", "start r2 -> 1:1", "start r2 -> 3:1"}));
  const auto sent = assigns(down);
  EXPECT_EQ(sent[0], (transport::assign_msg{1, "split", "", 0, 0, transport::assign_op::stop, {}, {}, {}}));
  EXPECT_EQ(sent[1].ranks, (std::vector<uint32_t>{0}));
  EXPECT_EQ(sent[2].ranks, (std::vector<uint32_t>{1}));
  EXPECT_EQ(sent[1].shard_nodes, (strings{addr(1), addr(3)}));
  EXPECT_EQ(sent[1].group_key, sent[2].group_key);
  EXPECT_EQ(c.replicas().count(1), 0u);
  EXPECT_EQ(c.replicas().at(2).peer, 1u);
  EXPECT_TRUE(report(c, 1, 1, replica_phase::dead).empty());  // r1 is forgotten
  EXPECT_TRUE(c.on_peer_down(2).empty());                      // reported twice: harmless
  EXPECT_EQ(describe(ready(c, 1, 2)), (strings{"ready r2 at 1:1002 (a/2)"}));
}

TEST(Coordinator, LosingTheRank0NodeBySilenceStopsTheOtherShardsAndReformsTheSpreadReplica) {
  auto c = make({split()}, 3000ms);
  join(c, 1, "a");
  join(c, 2, "b");
  join(c, 3, "c");
  ready(c, 1, 1);
  EXPECT_TRUE(c.on_message(2, frame(transport::heartbeat_msg{"b", 1}), t0 + 2000ms, wall0).empty());
  EXPECT_TRUE(c.on_message(3, frame(transport::heartbeat_msg{"c", 1}), t0 + 2000ms, wall0).empty());

  const auto lost = c.on_tick(t0 + 4000ms);  // a silent for 4 s
  ASSERT_EQ(describe(lost), (strings{"gone r1", "stop r1 -> 2:1", "start r2 -> 2:1", "start r2 -> 3:1"}));
  const auto sent = assigns(lost);
  EXPECT_EQ(sent[0], (transport::assign_msg{1, "split", "", 0, 0, transport::assign_op::stop, {}, {}, {}}));
  EXPECT_EQ(sent[1].shard_nodes, (strings{addr(2), addr(3)}));
  EXPECT_EQ(sent[1].ranks, (std::vector<uint32_t>{0}));
  EXPECT_EQ(sent[2].ranks, (std::vector<uint32_t>{1}));
  EXPECT_EQ(c.replicas().count(1), 0u);
  EXPECT_EQ(c.replicas().at(2).peer, 2u);  // rank 0 is b's now
  EXPECT_EQ(describe(ready(c, 2, 2)), (strings{"ready r2 at 2:1002 (b/2)"}));
}

TEST(Coordinator, LosingTheRank0NodeWithNoSpareStopsTheOtherShardAndWaitsForCapacity) {
  auto c = make({split()});
  join(c, 1, "a");
  join(c, 2, "b");
  ready(c, 1, 1);
  ASSERT_EQ(describe(c.on_peer_down(1)), (strings{"gone r1", "stop r1 -> 2:1"}));
  EXPECT_TRUE(c.replicas().empty());
  EXPECT_EQ(ctl(c, "status").reply.text, "1 node(s), 0/0 replica(s) ready, split short of 1");
  // Capacity comes back: re-formed on b and the newcomer.
  EXPECT_EQ(describe(join(c, 3, "c")), (strings{"welcome -> 3:1", "start r2 -> 2:1", "start r2 -> 3:1"}));
}

}  // namespace
}  // namespace llmesh::actors
