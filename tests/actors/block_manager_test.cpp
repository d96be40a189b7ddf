// The block manager: allocation and refusal without side effects, prefix-cache hits (chained
// hashes, never the prompt's last block, verified content), shared blocks and reference
// counts, LRU eviction (a sequence's tail first), KV events (what entered and left the cache,
// netted, the whole cache for a cursor the log no longer reaches), and a random-operation loop
// checking the bookkeeping after each step.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "llmesh/actors/block_manager.hpp"

namespace llmesh::actors {
namespace {

std::vector<int32_t> seq_tokens(size_t n, int32_t start) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

/// Runs a whole request: match, reserve the prompt, commit it, release.
size_t serve(block_manager& m, const std::vector<int32_t>& prompt) {
  block_list b;
  size_t hit = m.match_prefix(prompt, b);
  EXPECT_TRUE(m.reserve(b, prompt.size()).ok());
  m.commit(b, prompt);
  m.release(b);
  EXPECT_TRUE(m.check_invariants().ok());
  return hit;
}

TEST(BlockManager, ReservesAndRefusesWithoutSideEffects) {
  block_manager m(10, 16);
  block_list a, b;
  ASSERT_TRUE(m.reserve(a, 100).ok());  // 7 blocks
  EXPECT_EQ(a.ids.size(), 7u);
  EXPECT_EQ(m.free_blocks(), 3u);
  auto st = m.reserve(b, 64);  // 4 blocks: one too many
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.err().code, errc::overloaded);
  EXPECT_TRUE(b.ids.empty());
  EXPECT_EQ(m.free_blocks(), 3u);
  ASSERT_TRUE(m.reserve(a, 112).ok());  // still 7 blocks
  EXPECT_EQ(a.ids.size(), 7u);
  m.release(a);
  EXPECT_EQ(m.free_blocks(), 10u);
  EXPECT_TRUE(m.check_invariants().ok());
}

// vLLM's reset_prefix_cache: evictable blocks become free at once; a running sequence keeps its
// blocks, no longer found by a lookup and freed (not cached) at its release; what it fills
// afterwards is cached as usual (but unreachable: its chain starts at a block no longer cached).
TEST(BlockManager, AResetEmptiesThePrefixCacheAndLeavesRunningSequencesTheirBlocks) {
  block_manager m(16, 16);
  const auto first = seq_tokens(50, 100), second = seq_tokens(40, 900);
  EXPECT_EQ(serve(m, first), 0u);  // 3 full blocks cached, evictable
  block_list running;
  ASSERT_EQ(m.match_prefix(second, running), 0u);
  ASSERT_TRUE(m.reserve(running, second.size()).ok());  // 3 blocks
  m.commit(running, second);  // 2 full blocks cached, held
  EXPECT_EQ(m.cached_blocks(), 5u);
  EXPECT_EQ(m.unused_blocks(), 10u);  // 16 - 3 held - 3 evictable
  EXPECT_EQ(m.reset_prefix_cache(), 5u);
  EXPECT_EQ(m.cached_blocks(), 0u);
  EXPECT_EQ(m.unused_blocks(), 13u);  // the evictable ones are free
  EXPECT_EQ(m.free_blocks(), 13u);
  EXPECT_TRUE(m.check_invariants().ok()) << m.check_invariants().err().message;
  block_list probe;
  EXPECT_EQ(m.match_prefix(second, probe), 0u);  // held blocks are not found
  m.release(probe);
  auto grown = second;
  for (int32_t t = 0; t < 30; ++t) grown.push_back(5000 + t);  // 70 tokens: 4 full blocks
  ASSERT_TRUE(m.reserve(running, grown.size()).ok());
  m.commit(running, grown);  // its third and fourth blocks are full now: cached
  EXPECT_EQ(m.cached_blocks(), 2u);
  m.release(running);
  EXPECT_EQ(m.unused_blocks(), 14u);  // the two reset blocks freed, the two new ones evictable
  EXPECT_EQ(m.free_blocks(), 16u);
  EXPECT_TRUE(m.check_invariants().ok()) << m.check_invariants().err().message;
  EXPECT_EQ(serve(m, first), 0u);  // computed again, then cached again
  EXPECT_EQ(serve(m, first), 48u);
  EXPECT_EQ(m.reset_prefix_cache(), 3u + 2u);
  EXPECT_EQ(m.free_blocks(), 16u);
  EXPECT_EQ(m.unused_blocks(), 16u);
  EXPECT_TRUE(m.check_invariants().ok()) << m.check_invariants().err().message;
  // A block two sequences share through the cache: after a reset both keep it; it is freed
  // when the second lets go, and evictions afterwards find nothing stale.
  EXPECT_EQ(serve(m, first), 0u);
  block_list x, y;
  ASSERT_EQ(m.match_prefix(first, x), 48u);
  ASSERT_EQ(m.match_prefix(first, y), 48u);
  EXPECT_EQ(x.ids, y.ids);
  EXPECT_EQ(m.reset_prefix_cache(), 3u);
  m.release(x);
  EXPECT_EQ(m.unused_blocks(), 13u);  // still y's
  m.release(y);
  EXPECT_EQ(m.unused_blocks(), 16u);
  for (int32_t round = 0; round < 6; ++round) serve(m, seq_tokens(100, 2000 + 200 * round));  // evicts as it goes
  EXPECT_TRUE(m.check_invariants().ok()) << m.check_invariants().err().message;
}

TEST(BlockManager, ReusesFullPrefixBlocksButNeverTheLastTokensBlock) {
  block_manager m(32, 16);
  auto prompt = seq_tokens(40, 100);
  EXPECT_EQ(serve(m, prompt), 0u);
  EXPECT_EQ(m.cached_blocks(), 2u);     // blocks [0,16) and [16,32) are full
  EXPECT_EQ(serve(m, prompt), 32u);     // both reused
  auto exact = seq_tokens(32, 100);     // ends on a block boundary: its last block is computed
  EXPECT_EQ(serve(m, exact), 16u);
  auto longer = seq_tokens(70, 100);    // shares the first 32 tokens, then more
  EXPECT_EQ(serve(m, longer), 32u);
  EXPECT_EQ(m.cached_blocks(), 4u);     // + [32,48) and [48,64)
  EXPECT_EQ(serve(m, longer), 64u);
}

TEST(BlockManager, HashesChainOverThePrefix) {
  block_manager m(32, 4);
  std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<int32_t> b = {0, 0, 0, 0, 5, 6, 7, 8, 9};  // same second block after another first
  EXPECT_EQ(serve(m, a), 0u);
  EXPECT_EQ(serve(m, b), 0u);  // no match: block 2's identity includes block 1
  std::vector<int32_t> c = {1, 2, 3, 4, 5, 6, 0, 0, 9};
  EXPECT_EQ(serve(m, c), 4u);  // the first block only
}

TEST(BlockManager, SharedBlocksLiveUntilTheLastUserLeaves) {
  block_manager m(8, 4);
  auto prompt = seq_tokens(9, 1);
  EXPECT_EQ(serve(m, prompt), 0u);
  block_list x, y;
  EXPECT_EQ(m.match_prefix(prompt, x), 8u);
  EXPECT_EQ(m.match_prefix(prompt, y), 8u);
  EXPECT_EQ(x.ids, y.ids);
  ASSERT_TRUE(m.reserve(x, 9).ok());
  ASSERT_TRUE(m.reserve(y, 9).ok());
  EXPECT_NE(x.ids[2], y.ids[2]);  // the partial block is private
  m.release(x);
  EXPECT_TRUE(m.check_invariants().ok());
  // y still holds the shared blocks: filling the pool must not evict them.
  block_list z;
  ASSERT_TRUE(m.reserve(z, 4 * m.free_blocks()).ok());
  for (int32_t id : y.ids) EXPECT_EQ(std::count(z.ids.begin(), z.ids.end(), id), 0);
  m.release(z);
  m.release(y);
  EXPECT_TRUE(m.check_invariants().ok());
}

TEST(BlockManager, EvictsLeastRecentlyUsedFirst) {
  block_manager m(4, 2);
  std::vector<int32_t> a = {1, 1, 9}, b = {2, 2, 9}, c = {3, 3, 9};
  serve(m, a);
  serve(m, b);
  serve(m, c);  // three cached blocks (+ three freed partials): a, b, c in LRU order
  EXPECT_EQ(m.cached_blocks(), 3u);
  block_list big;
  ASSERT_TRUE(m.reserve(big, 4).ok());  // 2 blocks: the free one, then the LRU one (a)
  m.release(big);
  EXPECT_EQ(serve(m, a), 0u);  // a was evicted
  EXPECT_EQ(serve(m, c), 2u);  // c survived
}

TEST(BlockManager, AReleasedSequenceLosesItsTailBeforeItsHead) {
  block_manager m(4, 4);
  const auto a = seq_tokens(9, 1);  // blocks a0, a1 cached, a partial third
  serve(m, a);
  block_list other;
  ASSERT_TRUE(m.reserve(other, 12).ok());  // 3 blocks: the 2 free, then one cached: a1, not a0
  EXPECT_EQ(m.cached_blocks(), 1u);
  block_list again;
  EXPECT_EQ(m.match_prefix(a, again), 4u);  // a0 still serves a's first block
  m.release(again);
  m.release(other);
  EXPECT_TRUE(m.check_invariants().ok());
}

std::set<uint64_t> as_set(const std::vector<uint64_t>& v) { return {v.begin(), v.end()}; }

TEST(BlockManager, KvEventsReportWhatEntersAndLeavesTheCache) {
  block_manager m(4, 4);
  EXPECT_EQ(m.event_seq(), 0u);
  const auto a = seq_tokens(9, 1), b = seq_tokens(9, 100);
  // a0 alone, from a manager that only ever saw a's first block.
  block_manager first(4, 4);
  serve(first, seq_tokens(5, 1));
  const auto a0 = first.events_since(0).stored;
  ASSERT_EQ(a0.size(), 1u);

  serve(m, a);
  auto e = m.events_since(0);
  EXPECT_FALSE(e.full);
  EXPECT_EQ(e.seq, 2u);
  ASSERT_EQ(e.stored.size(), 2u);
  EXPECT_TRUE(e.removed.empty());
  EXPECT_TRUE(as_set(e.stored).contains(a0[0]));
  const auto a_blocks = as_set(e.stored);
  auto none = m.events_since(e.seq);  // nothing since
  EXPECT_FALSE(none.full);
  EXPECT_TRUE(none.stored.empty() && none.removed.empty());
  EXPECT_EQ(none.seq, 2u);

  serve(m, b);  // 3 blocks: the 2 free and a1 (a's tail); b0, b1 cached
  auto d = m.events_since(e.seq);
  EXPECT_FALSE(d.full);
  EXPECT_EQ(d.seq, 5u);
  ASSERT_EQ(d.removed.size(), 1u);
  EXPECT_TRUE(a_blocks.contains(d.removed[0]));
  EXPECT_NE(d.removed[0], a0[0]);
  EXPECT_EQ(d.stored.size(), 2u);
  for (uint64_t h : d.stored) EXPECT_FALSE(a_blocks.contains(h));

  // From the start, netted: a1 came and went, so it is only removed; a0, b0, b1 are stored.
  auto all = m.events_since(0);
  EXPECT_EQ(all.stored.size(), 3u);
  EXPECT_EQ(all.removed, d.removed);
  EXPECT_TRUE(as_set(all.stored).contains(a0[0]));
  // A cursor ahead of the log (another manager's, a restarted replica's): the whole cache.
  auto ahead = m.events_since(99);
  EXPECT_TRUE(ahead.full);
  EXPECT_EQ(as_set(ahead.stored), as_set(all.stored));
  EXPECT_TRUE(ahead.removed.empty());
}

TEST(BlockManager, KvEventsGiveTheWholeCacheWhenTheLogNoLongerReachesBack) {
  block_manager m(8, 2);
  for (int32_t i = 0; i < 3000; ++i) serve(m, {i, i, i, i, -1});  // 2 blocks cached each: 6000 events
  EXPECT_GT(m.event_seq(), 4096u);
  auto e = m.events_since(0);
  EXPECT_TRUE(e.full);
  EXPECT_EQ(e.stored.size(), m.cached_blocks());
  EXPECT_TRUE(e.removed.empty());
  EXPECT_FALSE(m.events_since(m.event_seq() - 10).full);  // a recent cursor still gets changes

  // A reset: every earlier cursor gets the whole, empty, cache; later ones changes again.
  const uint64_t before = m.event_seq();
  m.reset_prefix_cache();
  auto r = m.events_since(before);
  EXPECT_TRUE(r.full);
  EXPECT_TRUE(r.stored.empty());
  EXPECT_EQ(r.seq, before + 1);
  serve(m, {7, 7, 7, 7, -1});
  auto after = m.events_since(r.seq);
  EXPECT_FALSE(after.full);
  EXPECT_EQ(after.stored.size(), 2u);
  // Without prefix caching there is nothing to report.
  block_manager plain(8, 2, /*prefix_caching=*/false);
  serve(plain, {1, 1, 1});
  auto p = plain.events_since(0);
  EXPECT_TRUE(p.stored.empty() && p.removed.empty() && !p.full);
}

TEST(BlockManager, WithoutPrefixCachingNothingIsShared) {
  block_manager m(8, 4, /*prefix_caching=*/false);
  auto prompt = seq_tokens(9, 1);
  EXPECT_EQ(serve(m, prompt), 0u);
  EXPECT_EQ(serve(m, prompt), 0u);
  EXPECT_EQ(m.cached_blocks(), 0u);
}

TEST(BlockManager, RandomOperationsKeepTheBookkeeping) {
  std::mt19937 rng(12345);
  block_manager m(64, 4);
  struct seq {
    std::vector<int32_t> tokens;
    block_list blocks;
  };
  std::vector<seq> live;
  for (int op = 0; op < 5000; ++op) {
    const int what = static_cast<int>(rng() % 4);
    if (what == 0 || live.empty()) {  // a new request with one of a few shared prefixes
      seq s;
      const int32_t family = static_cast<int32_t>(rng() % 3);
      const size_t n = 1 + rng() % 20;
      for (size_t i = 0; i < n; ++i) s.tokens.push_back(i < 8 ? family : static_cast<int32_t>(rng() % 5));
      const size_t hit = m.match_prefix(s.tokens, s.blocks);
      ASSERT_LT(hit, s.tokens.size());
      if (!m.reserve(s.blocks, s.tokens.size()).ok()) {
        m.release(s.blocks);
      } else {
        m.commit(s.blocks, s.tokens);
        live.push_back(std::move(s));
      }
    } else if (what == 1) {  // a decode step
      auto& s = live[rng() % live.size()];
      s.tokens.push_back(static_cast<int32_t>(rng() % 5));
      if (m.reserve(s.blocks, s.tokens.size()).ok()) m.commit(s.blocks, s.tokens); else s.tokens.pop_back();
    } else {  // a request ends
      const size_t i = rng() % live.size();
      m.release(live[i].blocks);
      live.erase(live.begin() + static_cast<ptrdiff_t>(i));
    }
    auto st = m.check_invariants();
    ASSERT_TRUE(st.ok()) << "op " << op << ": " << st.err().message;
  }
  for (auto& s : live) m.release(s.blocks);
  EXPECT_EQ(m.free_blocks(), 64u);
  EXPECT_GT(m.hit_tokens(), 0u);
}

}  // namespace
}  // namespace llmesh::actors
