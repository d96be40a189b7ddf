// The coordinator with spread placement (a replica's tensor-parallel ranks on different nodes):
// every node of a replica gets its ranks, every rank's address and one group key; reports count
// only from rank 0's node; a planned stop drains rank 0's node first and stops the others once
// it reports the replica gone; losing any rank's node kills the replica, stops its other ranks
// and places it again.
#include "coordinator_fixture.hpp"

namespace llmesh::actors {
namespace {

using namespace coordinator_testing;

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
