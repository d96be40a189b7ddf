// Prompt-lookup drafts (ngram_proposer.hpp): the longest suffix match wins, the most recent of
// equals, a match shorter than min_n proposes nothing, and a match that overlaps the suffix
// continues with its period past the history's end.
#include <gtest/gtest.h>

#include <vector>

#include "llmesh/actors/ngram_proposer.hpp"

namespace llmesh::actors {
namespace {

std::vector<int32_t> drafts(const std::vector<int32_t>& h, size_t k, size_t max_n = 4, size_t min_n = 1) {
  std::vector<int32_t> out{-7};  // cleared by the call
  const size_t n = propose_ngram(h, speculation_config{k, max_n, min_n}, k, out);
  EXPECT_EQ(n, out.size());
  return out;
}

TEST(NgramProposer, TheMostRecentOfEqualMatchesProposesWhatFollowedIt) {
  // [1 2] ends at 1 (then 3) and at 4 (then 4): the later one; past the end, its period (3).
  EXPECT_EQ(drafts({1, 2, 3, 1, 2, 4, 1, 2}, 4, 2), (std::vector<int32_t>{4, 1, 2, 4}));
}

TEST(NgramProposer, ALongerMatchBeatsAMoreRecentShorterOne) {
  // [9 1 2] matches 3 tokens back at 2 (then 5); [2] alone matches at 5 (then 6), later.
  EXPECT_EQ(drafts({9, 1, 2, 5, 7, 2, 6, 9, 1, 2}, 2), (std::vector<int32_t>{5, 7}));
}

TEST(NgramProposer, APeriodicHistoryContinuesWithItsPeriod) {
  EXPECT_EQ(drafts({5, 6, 7, 5, 6, 7, 5}, 5), (std::vector<int32_t>{6, 7, 5, 6, 7}));
  EXPECT_EQ(drafts({3, 3}, 3), (std::vector<int32_t>{3, 3, 3}));  // period 1
}

TEST(NgramProposer, AMatchShorterThanMinNProposesNothing) {
  const std::vector<int32_t> h{1, 2, 3, 4, 8, 3, 4};
  EXPECT_EQ(drafts(h, 3, 4, 2), (std::vector<int32_t>{8, 3, 4}));  // [3 4]: 2 tokens
  EXPECT_TRUE(drafts(h, 3, 4, 3).empty());                          // needs 3
  EXPECT_TRUE(drafts({1, 2, 3, 4}, 3).empty());                      // no repeat at all
}

TEST(NgramProposer, EdgeCasesProposeNothing) {
  EXPECT_TRUE(drafts({}, 3).empty());
  EXPECT_TRUE(drafts({4}, 3).empty());
  EXPECT_TRUE(drafts({4, 4}, 0).empty());
  EXPECT_TRUE(drafts({4, 4}, 3, 0, 0).empty());  // max_n 0: nothing to look up
  EXPECT_EQ(drafts({4, 4}, 2, 4, 0), (std::vector<int32_t>{4, 4}));  // min_n 0 counts as 1
}

TEST(NgramProposer, ALongHistoryWithoutRepeatsIsOnePass) {
  std::vector<int32_t> h(200000);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<int32_t>(i);
  EXPECT_TRUE(drafts(h, 4).empty());
  h.push_back(5);  // now [5] ends at 5, then 6, 7, ...
  EXPECT_EQ(drafts(h, 3), (std::vector<int32_t>{6, 7, 8}));
}

}  // namespace
}  // namespace llmesh::actors
