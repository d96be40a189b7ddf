// The router's replicas by model: a request only ever goes to a replica of its model, each model
// with its own policy; a model without ready replicas (or unknown) is a clear error naming it;
// ready counts per model, and ready_counts as gateways read them.
#include <gtest/gtest.h>

#include <set>

#include "llmesh/actors/route_table.hpp"

namespace llmesh::actors {
namespace {

TEST(RouteTable, ARequestGoesOnlyToAReplicaOfItsModel) {
  route_table t(balance_policy::least_load, {}, 16);
  t.add(1, "llama");
  t.add(2, "qwen");
  t.add(3, "llama");
  const std::vector<int32_t> prompt{1, 2, 3};
  std::set<uint64_t> llama, qwen;
  for (int i = 0; i < 8; ++i) {
    auto a = t.pick("llama", prompt);
    ASSERT_TRUE(a.ok()) << a.err().message;
    llama.insert(*a);
    auto b = t.pick("qwen", prompt);
    ASSERT_TRUE(b.ok()) << b.err().message;
    qwen.insert(*b);
  }
  EXPECT_EQ(llama, (std::set<uint64_t>{1, 3}));  // least load spreads over both
  EXPECT_EQ(qwen, (std::set<uint64_t>{2}));
}

TEST(RouteTable, AModelWithoutReadyReplicasIsAnErrorNamingIt) {
  route_table t(balance_policy::least_load, {}, 16);
  auto none = t.pick("llama", {});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.err().code, errc::replica_unavailable);
  EXPECT_NE(none.err().message.find("'llama'"), std::string::npos) << none.err().message;
  t.add(1, "qwen");
  EXPECT_FALSE(t.pick("llama", {}).ok());
  t.add(2, "llama");
  EXPECT_TRUE(t.update({2, false, 0, 0}));  // draining or loading: never picked
  EXPECT_EQ(t.pick("llama", {}).err().code, errc::replica_unavailable);
  EXPECT_EQ(*t.pick("qwen", {}), 1u);
  t.remove(1);
  EXPECT_FALSE(t.pick("qwen", {}).ok());
  EXPECT_FALSE(t.has(1));
  EXPECT_FALSE(t.update({1, true, 0, 0}));  // a report that crossed the replica's death
  EXPECT_FALSE(t.pick("qwen", {}).ok());
}

TEST(RouteTable, EachModelHasItsOwnPolicy) {
  // llama is round-robin; qwen falls back to least-load, which keeps picking the idle replica.
  route_table t(balance_policy::least_load, {{"llama", balance_policy::round_robin}}, 16);
  for (uint64_t id : {1, 2}) t.add(id, "llama");
  for (uint64_t id : {3, 4}) t.add(id, "qwen");
  t.update({3, true, 5, 0});  // busy
  std::vector<uint64_t> rr, ll;
  for (int i = 0; i < 4; ++i) {
    rr.push_back(*t.pick("llama", {}));
    auto q = *t.pick("qwen", {});
    ll.push_back(q);
    t.finished(q);
  }
  EXPECT_EQ(rr, (std::vector<uint64_t>{1, 2, 1, 2}));
  EXPECT_EQ(ll, (std::vector<uint64_t>{4, 4, 4, 4}));
}

TEST(RouteTable, ReadyCountsPerModel) {
  route_table t(balance_policy::least_load, {}, 16);
  EXPECT_TRUE(t.ready().empty());
  t.add(1, "llama");
  t.add(2, "llama");
  t.add(3, "qwen");
  t.update({2, false, 0, 0});
  EXPECT_EQ(t.ready(), (model_counts{{"llama", 1}, {"qwen", 1}}));
  t.remove(3);
  EXPECT_EQ(t.ready(), (model_counts{{"llama", 1}}));
  // An id added again (the caller's mistake, or a reused id) belongs to its newest model only.
  t.add(1, "qwen");
  EXPECT_EQ(t.ready(), (model_counts{{"llama", 0}, {"qwen", 1}}));
  EXPECT_FALSE(t.pick("llama", {}).ok());

  ready_counts rc;
  EXPECT_EQ(rc.total(), 0u);
  rc.set(t.ready());
  EXPECT_EQ(rc.total(), 1u);
  EXPECT_EQ(rc.of("qwen"), 1u);
  EXPECT_EQ(rc.of("llama"), 0u);
  EXPECT_EQ(rc.of("mistral"), 0u);
}

}  // namespace
}  // namespace llmesh::actors
