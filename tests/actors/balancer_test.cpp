// The router's policies: only ready replicas, round-robin order, least load with assignments
// counted, power-of-two never the busier of its pair, prefix affinity within a load bound, and
// a clear error when no replica is ready; KV events (from a real block_manager, so the hashes
// are the replicas') make what a replica caches exact.
#include <gtest/gtest.h>

#include <map>

#include "llmesh/actors/balancer.hpp"
#include "llmesh/actors/block_manager.hpp"

namespace llmesh::actors {
namespace {

std::vector<int32_t> prompt_of(int32_t family, size_t n) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = family * 1000 + static_cast<int32_t>(i);
  return p;
}

TEST(Balancer, ParsesPolicies) {
  EXPECT_EQ(*parse_balance_policy("prefix-aware"), balance_policy::prefix_aware);
  EXPECT_EQ(*parse_balance_policy("round-robin"), balance_policy::round_robin);
  auto bad = parse_balance_policy("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("random"), std::string::npos);
}

TEST(Balancer, NoReadyReplicaIsAnError) {
  balancer b(balance_policy::least_load);
  EXPECT_EQ(b.pick({}).err().code, errc::replica_unavailable);
  b.update({1, false, 0, 0});
  EXPECT_EQ(b.pick({}).err().code, errc::replica_unavailable);
  b.update({2, true, 0, 0});
  EXPECT_EQ(*b.pick({}), 2u);
}

TEST(Balancer, RoundRobinSkipsReplicasThatAreNotReady) {
  balancer b(balance_policy::round_robin);
  for (uint64_t id : {3, 1, 2}) b.update({id, true, 0, 0});
  b.update({2, false, 0, 0});
  std::vector<uint64_t> order;
  for (int i = 0; i < 4; ++i) order.push_back(*b.pick({}));
  EXPECT_EQ(order, (std::vector<uint64_t>{1, 3, 1, 3}));
}

TEST(Balancer, LeastLoadCountsItsOwnAssignments) {
  balancer b(balance_policy::least_load);
  b.update({1, true, 2, 0});
  b.update({2, true, 0, 1});
  std::map<uint64_t, int> count;
  for (int i = 0; i < 6; ++i) {
    uint64_t r = *b.pick({});
    b.assigned(r, {});
    ++count[r];
  }
  EXPECT_EQ(b.load_of(1), 5u);  // 2 reported + 3 assigned
  EXPECT_EQ(b.load_of(2), 4u);  // 1 reported + 3 assigned (ties go to the lower id)
  EXPECT_EQ(count[1] + count[2], 6);
  b.update({1, true, 0, 0});  // a fresh report replaces the estimate
  EXPECT_EQ(b.load_of(1), 0u);
}

TEST(Balancer, PowerOfTwoNeverPicksTheBusierOfTwo) {
  balancer b(balance_policy::power_of_two, 42);
  b.update({1, true, 10, 0});
  b.update({2, true, 0, 0});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(*b.pick({}), 2u);
}

TEST(Balancer, PrefixAwareKeepsAPrefixOnOneReplicaWithinTheLoadBound) {
  balancer b(balance_policy::prefix_aware, 1, 16);
  for (uint64_t id : {1, 2, 3}) b.update({id, true, 0, 0});
  auto system = prompt_of(7, 64);
  const uint64_t home = *b.pick(system);
  b.assigned(home, system);
  for (int i = 0; i < 2; ++i) {  // same prefix, different tails: same replica
    auto p = system;
    p.push_back(i);
    EXPECT_EQ(*b.pick(p), home);
    b.assigned(home, p);
  }
  auto other = prompt_of(9, 40);  // a new prefix goes to the least loaded
  EXPECT_NE(*b.pick(other), home);
  {  // Affinity is per cache_salt, as the replicas' caches are: another salt's (or no salt's)
     // request of the same prompt goes to the least loaded, the same salt's to its home.
    balancer c(balance_policy::prefix_aware, 1, 16);
    for (uint64_t id : {1, 2, 3}) c.update({id, true, 0, 0});
    const uint64_t salted_home = *c.pick(system, 0x5a17);
    c.assigned(salted_home, system, 0x5a17);
    EXPECT_EQ(*c.pick(system, 0x5a17), salted_home);
    EXPECT_NE(*c.pick(system, 0xb0b), salted_home);
    EXPECT_NE(*c.pick(system), salted_home);
  }
  // The home replica becomes far busier than the others: affinity yields.
  b.update({home, true, 50, 0});
  EXPECT_NE(*b.pick(system), home);
}

// OpenAI's prompt_cache_key: a key's requests follow its last one, whatever their prompts, under
// every policy but round-robin — until that replica is not ready or much busier.
TEST(Balancer, AnAffinityKeyKeepsItsRequestsOnOneReplica) {
  for (auto policy : {balance_policy::least_load, balance_policy::power_of_two, balance_policy::prefix_aware}) {
    balancer b(policy, 3, 16);
    for (uint64_t id : {1, 2, 3}) b.update({id, true, 0, 0});
    const uint64_t key = 0x5e55;
    const uint64_t home = *b.pick(prompt_of(1, 40), 0, key);
    b.assigned(home, prompt_of(1, 40), 0, key);
    for (int i = 2; i < 4; ++i) {  // other prompts, one more request on home each time: still home
      EXPECT_EQ(*b.pick(prompt_of(i, 40), 0, key), home) << static_cast<int>(policy) << " " << i;
      b.assigned(home, prompt_of(i, 40), 0, key);
    }
    EXPECT_EQ(b.load_of(home), 3u);
    // Without the key the least loaded takes it; another key goes its own way.
    if (policy == balance_policy::least_load) EXPECT_NE(*b.pick(prompt_of(9, 40)), home);
    const uint64_t other = *b.pick(prompt_of(9, 40), 0, 0x0123);
    if (policy != balance_policy::power_of_two) EXPECT_NE(other, home);
    // Much busier (more than 2x + 2 the least load): the key yields, and then follows its new home.
    b.update({home, true, 50, 0});
    const uint64_t moved = *b.pick(prompt_of(7, 40), 0, key);
    EXPECT_NE(moved, home);
    b.assigned(moved, prompt_of(7, 40), 0, key);
    b.update({home, true, 0, 0});
    EXPECT_EQ(*b.pick(prompt_of(8, 40), 0, key), moved);
    // Not ready: yields too.
    b.update({moved, false, 0, 0});
    EXPECT_NE(*b.pick(prompt_of(8, 40), 0, key), moved);
  }
  // Round-robin keeps its order.
  balancer rr(balance_policy::round_robin);
  for (uint64_t id : {1, 2}) rr.update({id, true, 0, 0});
  const uint64_t first = *rr.pick({}, 0, 7);
  rr.assigned(first, {}, 0, 7);
  EXPECT_NE(*rr.pick({}, 0, 7), first);
}

// Conditional disaggregation asks what a replica caches of a prompt: the leading whole blocks
// this balancer last sent there — under any policy once tracked, past 64 blocks, per salt.
TEST(Balancer, CachedTokensAreTheLeadingBlocksLastSentToTheReplica) {
  balancer b(balance_policy::least_load, 1, 16);
  b.update({1, true, 0, 0});
  b.update({2, true, 0, 0});
  const auto conversation = prompt_of(1, 100);  // 6 whole blocks
  b.assigned(1, conversation);
  EXPECT_EQ(b.cached_tokens(1, conversation), 0u);  // not tracked: least-load keeps no prefixes
  b.track_prefixes();
  b.assigned(1, conversation);
  EXPECT_EQ(b.cached_tokens(1, conversation), 96u);
  EXPECT_EQ(b.cached_tokens(2, conversation), 0u);
  auto next_turn = conversation;  // the same conversation, grown
  for (int32_t t = 0; t < 40; ++t) next_turn.push_back(5000 + t);
  EXPECT_EQ(b.cached_tokens(1, next_turn), 96u);
  EXPECT_EQ(b.cached_tokens(1, next_turn, /*salt=*/7), 0u);  // another salt, another cache key
  auto other = next_turn;
  other[0] = 9;  // differs at the first token: nothing shared
  EXPECT_EQ(b.cached_tokens(1, other), 0u);
  // The first 3 blocks go to replica 2 with another prompt: replica 1 still holds all 6.
  auto shorter = std::vector<int32_t>(conversation.begin(), conversation.begin() + 50);
  b.assigned(2, shorter);
  EXPECT_EQ(b.cached_tokens(2, conversation), 48u);
  EXPECT_EQ(b.cached_tokens(1, conversation), 96u);
  // Long prompts are followed past 64 blocks (1024 tokens), every 16th block from there: 187
  // whole blocks count as 176.
  const auto long_prompt = prompt_of(2, 3000);
  b.assigned(2, long_prompt);
  EXPECT_EQ(b.cached_tokens(2, long_prompt), 2816u);
  auto long_next = long_prompt;
  long_next.resize(4000, 7);
  EXPECT_EQ(b.cached_tokens(2, long_next), 2816u);
  EXPECT_EQ(b.cached_tokens(2, std::vector<int32_t>(long_prompt.begin(), long_prompt.begin() + 1100)), 1024u);
  // Prefix-aware routing tracks without being asked.
  balancer pa(balance_policy::prefix_aware, 1, 16);
  pa.update({3, true, 0, 0});
  pa.assigned(3, conversation);
  EXPECT_EQ(pa.cached_tokens(3, next_turn), 96u);
}

/// Runs a whole request on a replica's block manager (match, reserve, commit, release).
void serve(block_manager& m, const std::vector<int32_t>& prompt) {
  block_list b;
  m.match_prefix(prompt, b);
  ASSERT_TRUE(m.reserve(b, prompt.size()).ok());
  m.commit(b, prompt);
  m.release(b);
}

/// The replica's events after `since`, as its actor answers them.
kv_events events_of(uint64_t replica, const block_manager& m, uint64_t since) {
  auto e = m.events_since(since);
  e.replica = replica;
  return e;
}

TEST(Balancer, KvEventsTellWhatAReplicaCachesExactly) {
  balancer b(balance_policy::least_load, 1, 16);
  b.track_prefixes();
  b.update({1, true, 0, 0});
  b.update({2, true, 0, 0});
  // Replica 1 computed a conversation this balancer never routed (another router's request).
  block_manager m1(400, 16);
  const auto conversation = prompt_of(1, 100);  // 6 whole blocks
  serve(m1, conversation);
  b.apply(events_of(1, m1, 0));
  EXPECT_EQ(b.cached_tokens(1, conversation), 96u);
  EXPECT_EQ(b.cached_tokens(2, conversation), 0u);
  auto next_turn = conversation;
  next_turn.resize(140, 7);
  EXPECT_EQ(b.cached_tokens(1, next_turn), 96u);
  EXPECT_EQ(b.cached_tokens(1, next_turn, /*salt=*/7), 0u);
  // Reported blocks count every one, also past the 64 blocks predictions follow densely.
  const auto long_prompt = prompt_of(2, 3000);  // 187 whole blocks
  const uint64_t cursor = m1.event_seq();
  serve(m1, long_prompt);
  b.apply(events_of(1, m1, cursor));
  EXPECT_EQ(b.cached_tokens(1, long_prompt), 2992u);
  // Events of an unknown replica change nothing.
  b.apply(events_of(9, m1, 0));
  EXPECT_EQ(b.cached_tokens(9, conversation), 0u);

  // Replica 2 was sent a prompt (predicted), computed it, then evicted its tail for another:
  // the prediction yields to the eviction it reports.
  block_manager m2(8, 16);
  const auto p = prompt_of(3, 97), q = prompt_of(4, 97);  // 7 blocks each, 6 whole
  b.assigned(2, p);
  EXPECT_EQ(b.cached_tokens(2, p), 96u);
  serve(m2, p);
  b.apply(events_of(2, m2, 0));
  const uint64_t after_p = m2.event_seq();
  EXPECT_EQ(b.cached_tokens(2, p), 96u);
  serve(m2, q);  // 7 blocks: the 2 free, then p's 5 last whole blocks
  b.assigned(2, q);
  b.apply(events_of(2, m2, after_p));
  EXPECT_EQ(b.cached_tokens(2, p), 16u);
  EXPECT_EQ(b.cached_tokens(2, q), 96u);
  // A prompt sent there with an affinity key, not computed yet.
  const auto r = prompt_of(8, 40);
  b.assigned(2, r, 0, /*key=*/77);
  EXPECT_EQ(b.cached_tokens(2, r), 32u);
  // Its cache is reset (by another router): the whole, empty cache arrives; every prediction of
  // its blocks goes too, reported before or not; the affinity key stays.
  const uint64_t before_reset = m2.event_seq();
  m2.reset_prefix_cache();
  auto full = events_of(2, m2, before_reset);
  ASSERT_TRUE(full.full);
  b.apply(full);
  EXPECT_EQ(b.cached_tokens(2, q), 0u);
  EXPECT_EQ(b.cached_tokens(2, p), 0u);
  EXPECT_EQ(b.cached_tokens(2, r), 0u);
  b.update({2, true, 0, 0});
  EXPECT_EQ(*b.pick(r, 0, 77), 2u);  // the least loaded would be 1
  // Hashes of blocks of another size never match prompts hashed in this one's: ignored.
  block_manager m8(64, 8);
  serve(m8, conversation);
  b.apply(events_of(2, m8, 0));
  EXPECT_EQ(b.cached_tokens(2, conversation), 0u);
  // Untracked balancers ignore events.
  balancer plain(balance_policy::round_robin, 1, 16);
  plain.update({1, true, 0, 0});
  plain.apply(events_of(1, m1, 0));
  EXPECT_EQ(plain.cached_tokens(1, conversation), 0u);
}

TEST(Balancer, PrefixAwarePicksTheReplicaThatReportsTheLongestPrefix) {
  balancer b(balance_policy::prefix_aware, 1, 16);
  for (uint64_t id : {1, 2, 3}) b.update({id, true, 1, 0});
  const auto system = prompt_of(5, 320);  // 20 blocks
  block_manager m2(64, 16), m3(64, 16);
  serve(m2, std::vector<int32_t>(system.begin(), system.begin() + 100));  // 6 blocks
  serve(m3, system);                                                       // all 20
  b.apply(events_of(2, m2, 0));
  b.apply(events_of(3, m3, 0));
  auto request = system;
  request.push_back(1);
  EXPECT_EQ(*b.pick(request), 3u);  // never routed here before: the events alone decide
  b.update({3, true, 6, 0});        // busier than 2x + 2 the least load: the next longest
  EXPECT_EQ(*b.pick(request), 2u);
  b.update({2, true, 5, 0});
  EXPECT_EQ(*b.pick(request), 1u);  // both over the bound: the least loaded
  EXPECT_EQ(*b.pick(prompt_of(6, 320)), 1u);
  b.update({3, true, 1, 0});
  b.update({2, true, 1, 0});
  b.forget_prefixes();  // the caches were emptied: nothing is known until the next events
  EXPECT_EQ(*b.pick(request), 1u);
}

TEST(Balancer, LeastLoadedIsTheLeastBusyReadyReplica) {
  balancer b(balance_policy::round_robin);
  EXPECT_FALSE(b.least_loaded().ok());
  b.update({1, true, 3, 2});
  b.update({2, false, 0, 0});  // not ready: not counted
  EXPECT_EQ(*b.least_loaded(), 1u);
  b.update({3, true, 5, 0});
  EXPECT_EQ(*b.least_loaded(), 1u);  // equal loads: the lowest id
  b.assigned(1, {});
  EXPECT_EQ(*b.least_loaded(), 3u);
  b.finished(1);
  b.update({3, false, 1, 0});
  EXPECT_EQ(*b.least_loaded(), 1u);
}

}  // namespace
}  // namespace llmesh::actors
