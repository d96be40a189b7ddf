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

// Disaggregated prefill: a model's prefill replicas have a balancer of their own; they are never
// a request's replica, are not counted ready (they cannot serve alone), and are spread by load.
TEST(RouteTable, PrefillReplicasArePickedApartFromTheServingOnes) {
  route_table t(balance_policy::least_load, {}, 16);
  t.add(1, "llama");
  t.add(2, "llama", replica_role::prefill);
  t.add(3, "llama", replica_role::prefill);
  t.add(4, "qwen", replica_role::prefill);
  const std::vector<int32_t> prompt{1, 2, 3};
  std::set<uint64_t> served, prefilled;
  for (int i = 0; i < 6; ++i) {
    served.insert(*t.pick("llama", prompt));
    prefilled.insert(*t.pick_prefill("llama", prompt));
  }
  EXPECT_EQ(served, (std::set<uint64_t>{1}));
  EXPECT_EQ(prefilled, (std::set<uint64_t>{2, 3}));
  auto none = t.pick("qwen", prompt);  // prefill replicas alone do not serve a model
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.err().message.find("no ready replica of model 'qwen'"), std::string::npos) << none.err().message;
  EXPECT_EQ(*t.pick_prefill("qwen", prompt), 4u);
  auto no_prefill = t.pick_prefill("mistral", prompt);
  ASSERT_FALSE(no_prefill.ok());
  EXPECT_NE(no_prefill.err().message.find("no ready prefill replica of model 'mistral'"), std::string::npos);
  EXPECT_EQ(t.ready(), (model_counts{{"llama", 1}, {"qwen", 0}}));
  // A prefill replica's load counts as any replica's: a busy one is passed over.
  t.update(replica_load{2, true, 5, 5, 0, 0});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(*t.pick_prefill("llama", prompt), 3u);
  t.update(replica_load{3, false, 0, 0, 0, 0});  // not ready
  EXPECT_EQ(*t.pick_prefill("llama", prompt), 2u);
  t.remove(2);
  EXPECT_FALSE(t.pick_prefill("llama", prompt).ok());
  t.finished(3);  // harmless for a replica of any role
  EXPECT_EQ(*parse_replica_role("prefill"), replica_role::prefill);
  EXPECT_EQ(*parse_replica_role("decode"), replica_role::decode);
  EXPECT_FALSE(parse_replica_role("both").ok());
  EXPECT_EQ(replica_role_name(replica_role::prefill), "prefill");
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

// Conditional disaggregation: once a model has a prefill replica its decode replicas' prefixes
// are tracked, so the router can tell how much of a prompt the picked replica caches.
TEST(RouteTable, AModelWithPrefillReplicasKnowsWhatItsReplicasCache) {
  route_table t(balance_policy::least_load, {}, 16);
  t.add(1, "llama");
  std::vector<int32_t> prompt(200);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i);
  size_t cached = 99;
  ASSERT_EQ(*t.pick("llama", prompt, 0, 0, &cached), 1u);
  EXPECT_EQ(cached, 0u);
  ASSERT_EQ(*t.pick("llama", prompt, 0, 0, &cached), 1u);
  EXPECT_EQ(cached, 0u);  // no prefill replica yet: nothing tracked
  EXPECT_FALSE(t.has_prefill("llama"));
  t.add(2, "llama", replica_role::prefill);
  EXPECT_TRUE(t.has_prefill("llama"));
  EXPECT_FALSE(t.has_prefill("qwen"));
  ASSERT_EQ(*t.pick("llama", prompt, 0, 0, &cached), 1u);
  EXPECT_EQ(cached, 0u);  // measured before this request's own blocks are recorded
  ASSERT_EQ(*t.pick("llama", prompt, 0, 0, &cached), 1u);
  EXPECT_EQ(cached, 192u);
  t.update({2, false, 0, 0});  // not ready: the model still has one
  EXPECT_TRUE(t.has_prefill("llama"));
  t.remove(2);
  EXPECT_FALSE(t.has_prefill("llama"));
}

// Dynamo's prefill queue: a prefill replica is picked only with fewer than max_queue requests —
// the policy's pick (here an affinity key's replica), else the least busy; overloaded when all
// have that many.
TEST(RouteTable, APrefillReplicaIsPickedOnlyBelowTheQueueLimit) {
  route_table t(balance_policy::least_load, {}, 16);
  t.add(1, "llama", replica_role::prefill);
  t.add(2, "llama", replica_role::prefill);
  const std::vector<int32_t> prompt{1, 2, 3};
  const uint64_t key = 77;
  ASSERT_EQ(*t.pick_prefill("llama", prompt, 0, key, 2), 1u);
  EXPECT_EQ(*t.pick_prefill("llama", prompt, 0, key, 2), 1u);  // the key's replica, within 2x + 2
  EXPECT_EQ(*t.pick_prefill("llama", prompt, 0, key, 2), 2u);  // the key's is full: the least busy
  EXPECT_EQ(*t.pick_prefill("llama", prompt, 0, 0, 2), 2u);
  auto full = t.pick_prefill("llama", prompt, 0, key, 2);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.err().code, errc::overloaded);
  EXPECT_NE(full.err().message.find("every ready prefill replica of model 'llama' has 2 or more requests"), std::string::npos)
      << full.err().message;
  EXPECT_EQ(*t.pick_prefill("llama", prompt, 0, key), 2u);  // no limit: the key's (now 2), 3 requests
  t.finished(1);
  EXPECT_EQ(*t.pick_prefill("llama", prompt, 0, key, 2), 1u);  // the key's is full again
  t.update({1, false, 0, 0});
  t.update({2, false, 0, 0});
  auto none = t.pick_prefill("llama", prompt, 0, key, 2);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.err().code, errc::replica_unavailable);
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
