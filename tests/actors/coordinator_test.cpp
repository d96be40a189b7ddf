// The coordinator's logic without CAF or a network, driven frame by frame with clocks the test
// controls. Covered: the join handshake (the token's holder gets its replica assignment, others
// a refusal and nothing else); ready reports reaching the routers and the ctl views (status,
// nodes, replicas); a node lost by a dropped connection or by silence (its replicas are gone
// and re-placed on a spare node; heartbeats keep a node alive); drain, remove and scale through
// ctl; ctl's authentication (token, clock skew, replays) and argument errors; create();
// replica reports from a peer that does not host the replica being ignored. Spread placement:
// coordinator_spread_test.cpp.
#include "coordinator_fixture.hpp"

namespace llmesh::actors {
namespace {

using namespace coordinator_testing;

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

// Disaggregated prefill: a prefill entry's replicas reach routers as prefill replicas of the
// model they prefill for, with its threshold — the router here (replica_ready) and routers in
// other processes (news, and a briefing for one that joins later); a plain replica carries none.
TEST(Coordinator, PrefillReplicasReachRoutersWithTheirModelAndThreshold) {
  model_spec prefill = tiny();
  prefill.name = "tiny-prefill";
  prefill.prefill_for = "tiny";
  prefill.max_local_prefill_length = 300;
  prefill.max_prefill_queue_size = 4;
  auto c = make({tiny(), prefill});
  join(c, 1, "a");
  join(c, 2, "b");
  join(c, 3, hello("gw2", 3, {transport::role::gateway, transport::role::router}));
  ASSERT_EQ(c.replicas().size(), 2u);
  for (const auto& [id, r] : c.replicas()) {
    const bool is_prefill = r.a.model == "tiny-prefill";
    auto out = ready(c, r.peer, id);
    size_t seen = 0;
    for (const auto& a : out) {
      if (a.k == coordinator_action::replica_ready) {
        ++seen;
        EXPECT_EQ(a.model, r.a.model);
        EXPECT_EQ(a.prefill_for, is_prefill ? "tiny" : "");
        EXPECT_EQ(a.max_local_prefill, is_prefill ? 300u : 0u);
        EXPECT_EQ(a.max_prefill_queue, is_prefill ? 4u : 0u);
      } else if (const auto* m = std::get_if<transport::replica_state_msg>(&a.msg)) {
        ++seen;
        EXPECT_EQ(a.peer, 3u);
        EXPECT_EQ(m->prefill_for, is_prefill ? "tiny" : "");
        EXPECT_EQ(m->max_local_prefill, is_prefill ? 300u : 0u);
        EXPECT_EQ(m->max_prefill_queue, is_prefill ? 4u : 0u);
      }
    }
    EXPECT_EQ(seen, 2u) << testing::PrintToString(describe(out));
  }
  size_t briefed = 0;
  for (const auto& a : join(c, 4, hello("gw3", 4, {transport::role::gateway, transport::role::router}))) {
    const auto* m = std::get_if<transport::replica_state_msg>(&a.msg);
    if (!m) continue;
    ++briefed;
    const bool is_prefill = c.replicas().at(m->replica).a.model == "tiny-prefill";
    EXPECT_EQ(m->prefill_for, is_prefill ? "tiny" : "");
    EXPECT_EQ(m->max_local_prefill, is_prefill ? 300u : 0u);
    EXPECT_EQ(m->max_prefill_queue, is_prefill ? 4u : 0u);
  }
  EXPECT_EQ(briefed, 2u);
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
  auto spec = tiny();
  spec.quantization = "int8";  // the model's settings travel with each assignment
  spec.kv_cache_dtype = "bfloat16";
  spec.max_model_len = 100;
  spec.dtype = "float16";
  spec.expert_parallel = true;
  spec.max_num_batched_tokens = 512;
  spec.max_num_seqs = 8;
  spec.long_prefill_token_threshold = 64;
  spec.max_num_partial_prefills = 3;
  spec.max_long_partial_prefills = 2;
  auto c = make({spec});
  join(c, 1, "a");
  join(c, 2, "b");
  ready(c, 1, 1);

  auto up = ctl(c, "scale", {"tiny", "2"});
  ASSERT_TRUE(up.reply.ok) << up.reply.text;
  EXPECT_EQ(up.reply.text, "tiny scaled to 2");
  EXPECT_EQ(json::parse(up.reply.json), (json{{"ok", true}, {"changes", 1}}));
  ASSERT_EQ(describe(up.effects), (strings{"start r2 -> 2:1"}));
  EXPECT_EQ(assigns(up.effects)[0].kv_cache_mb, 256u);
  EXPECT_EQ(assigns(up.effects)[0].quantization, "int8");
  EXPECT_EQ(assigns(up.effects)[0].kv_cache_dtype, "bfloat16");
  EXPECT_EQ(assigns(up.effects)[0].max_model_len, 100u);
  EXPECT_EQ(assigns(up.effects)[0].dtype, "float16");
  EXPECT_TRUE(assigns(up.effects)[0].expert_parallel);
  const auto& a = assigns(up.effects)[0];
  EXPECT_EQ(std::vector<uint64_t>({a.max_batch_tokens, a.max_seqs, a.long_prefill_threshold, a.max_partial_prefills,
                                   a.max_long_partial_prefills}),
            std::vector<uint64_t>({512, 8, 64, 3, 2}));

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
            "unknown command 'frobnicate' with 0 argument(s) (status, nodes, replicas, loras, drain NODE, remove NODE, "
            "scale MODEL N, fault NODE RULE, load-lora MODEL NAME PATH, unload-lora MODEL NAME)");
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
    // The reply names the command's nonce (a requester waiting on several knows which).
    const auto j = json::parse(a.reply.json);
    EXPECT_EQ(j["ok"], false);
    EXPECT_EQ(j["code"], static_cast<int>(errc::unauthorized));
    EXPECT_EQ(j["request"].get<std::string>(), join_auth::hex(m.nonce));
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

}  // namespace
}  // namespace llmesh::actors
