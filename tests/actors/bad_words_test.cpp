// vLLM's bad_words at the replica: a one-token word is never drawn; a longer word's last token
// is never drawn right after the rest of it, and everything before that point is the plain
// output — greedy and sampled, at tp 1 and 2, with speculation, and for a request continued
// after failover (its output so far counts). Bad ids are refused.
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

class BadWords : public testing::replica_test_base {
 protected:
  std::map<uint64_t, std::vector<int32_t>> serve(int tp, const std::vector<replica_request>& reqs, bool speculate) {
    auto e = engine(tp, 1024);
    scheduler_config cfg;
    if (speculate) cfg.speculation = {4, 3, 1};
    replica_core rc(*e, cfg);
    return testing::serve_tokens(rc, reqs);
  }
  /// Requests long enough for a word to matter, their prompts repeated (speculation has text to copy).
  std::vector<replica_request> long_requests() {
    auto reqs = requests(8);
    for (auto& r : reqs) {
      const auto stretch = r.prompt;
      r.prompt.insert(r.prompt.end(), stretch.begin(), stretch.end());
      r.max_tokens = 20;
      r.eos_ids.clear();
    }
    return reqs;
  }
};

/// Where `word` first occurs in `out`, or npos.
size_t find_word(const std::vector<int32_t>& out, const std::vector<int32_t>& word) {
  auto it = std::search(out.begin(), out.end(), word.begin(), word.end());
  return it == out.end() ? std::string::npos : static_cast<size_t>(it - out.begin());
}

TEST_F(BadWords, AOneTokenWordIsNeverDrawn) {
  auto reqs = long_requests();
  const auto plain = serve(1, reqs, false);
  for (auto& r : reqs) r.bad_words = {{plain.at(r.id).front()}};  // what it would draw first
  for (int tp : {1, 2}) {
    for (bool speculate : {false, true}) {
      auto got = serve(tp, reqs, speculate);
      for (const auto& r : reqs) {
        SCOPED_TRACE("tp " + std::to_string(tp) + (speculate ? " speculating" : "") + " request " + std::to_string(r.id));
        ASSERT_EQ(got[r.id].size(), r.max_tokens);
        EXPECT_EQ(std::count(got[r.id].begin(), got[r.id].end(), r.bad_words[0][0]), 0);
      }
    }
  }
}

TEST_F(BadWords, ALongerWordIsCutAtItsLastTokenAndNothingBeforeChanges) {
  auto reqs = long_requests();
  const auto plain = serve(1, reqs, false);
  for (auto& r : reqs) {
    const auto& o = plain.at(r.id);
    r.bad_words = {{o[3], o[4], o[5]}, {299, 298}};  // the first occurs at 3; the second, likely nowhere
  }
  for (int tp : {1, 2}) {
    for (bool speculate : {false, true}) {
      auto got = serve(tp, reqs, speculate);
      for (const auto& r : reqs) {
        SCOPED_TRACE("tp " + std::to_string(tp) + (speculate ? " speculating" : "") + " request " + std::to_string(r.id));
        const auto& o = plain.at(r.id);
        const auto& g = got[r.id];
        ASSERT_EQ(g.size(), r.max_tokens);
        const size_t first = find_word(o, r.bad_words[0]);
        ASSERT_LE(first, 3u);
        // Identical up to the word's last token, which is then something else.
        EXPECT_TRUE(std::equal(o.begin(), o.begin() + static_cast<std::ptrdiff_t>(first + 2), g.begin()));
        EXPECT_NE(g[first + 2], o[first + 2]);
        for (const auto& w : r.bad_words) EXPECT_EQ(find_word(g, w), std::string::npos);
      }
    }
  }
}

TEST_F(BadWords, AContinuedRequestCountsItsOutputSoFar) {
  auto reqs = long_requests();
  reqs.resize(2);  // one greedy, one sampled
  const auto plain = serve(1, reqs, false);
  std::vector<replica_request> continued;
  for (auto r : reqs) {
    const auto& o = plain.at(r.id);
    r.bad_words = {{o[1], o[2]}};
    // Failover after two tokens: they are output, and the word's first token ends them.
    r.prompt.insert(r.prompt.end(), o.begin(), o.begin() + 2);
    r.generated = 2;
    r.max_tokens -= 2;
    continued.push_back(r);
  }
  auto got = serve(1, continued, false);
  for (const auto& r : continued) {
    ASSERT_FALSE(got[r.id].empty());
    EXPECT_NE(got[r.id][0], plain.at(r.id)[2]) << "request " << r.id << ": the word's end right after its start";
  }
  // Not output (generated 0): the same prompt tail is prompt, and the word may follow it.
  for (auto& r : continued) r.generated = 0;
  got = serve(1, continued, false);
  EXPECT_EQ(got[0][0], plain.at(0)[2]) << "greedy: the prompt does not count";
}

TEST_F(BadWords, BadIdsAreRefused) {
  auto e = engine(1, 256);
  replica_core rc(*e, scheduler_config{});
  replica_request r;
  r.id = 1;
  r.prompt = {5, 6, 7};
  r.max_tokens = 4;
  r.bad_words = {{3}, {}};
  auto s = rc.submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("bad_words: a word without tokens"), std::string::npos) << s.err().message;
  r.bad_words = {{3, 300}};  // outside the 300-token vocabulary
  s = rc.submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("bad_words: token 300 is outside the vocabulary"), std::string::npos) << s.err().message;
  r.bad_words = {{3, 299}};
  EXPECT_TRUE(rc.submit(r).ok());
}

}  // namespace
}  // namespace llmesh::actors
