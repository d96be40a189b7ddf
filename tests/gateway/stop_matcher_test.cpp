// Stop strings across token boundaries: matched whatever the piece boundaries, never leaking
// a partial stop string, releasing held text when the match fails or the stream ends.
#include <gtest/gtest.h>

#include <random>

#include "llmesh/gateway/stop_matcher.hpp"

namespace llmesh::gateway {
namespace {

/// Feeds `text` in pieces of the given sizes; returns (sent text, stopped).
std::pair<std::string, bool> feed(const std::vector<std::string>& stops, const std::string& text,
                                  const std::vector<size_t>& sizes) {
  stop_matcher m(stops);
  std::string sent;
  size_t at = 0, i = 0;
  while (at < text.size()) {
    const size_t n = std::min(sizes[i++ % sizes.size()], text.size() - at);
    auto o = m.push(std::string_view(text).substr(at, n));
    sent += o.text;
    at += n;
    if (o.stopped) return {sent, true};
  }
  return {sent + m.flush(), false};
}

TEST(StopMatcher, FindsStopsAcrossPieces) {
  auto [sent, stopped] = feed({"\n\n", "END"}, "Hello world.\n\nMore text", {1, 2, 3});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(sent, "Hello world.");
  auto r = feed({"END"}, "abcENabcEND tail", {2});
  EXPECT_TRUE(r.second);
  EXPECT_EQ(r.first, "abcENabc");
}

TEST(StopMatcher, EarliestStopWinsAndNoStopReleasesEverything) {
  EXPECT_EQ(feed({"cd", "bc"}, "abcdef", {6}).first, "a");
  auto r = feed({"xyz"}, "abcxy", {1});
  EXPECT_FALSE(r.second);
  EXPECT_EQ(r.first, "abcxy");  // held "xy" is released at the end
  EXPECT_EQ(feed({}, "plain", {2}).first, "plain");
}

TEST(StopMatcher, HoldsBackOnlyPossibleStopPrefixes) {
  stop_matcher m({"</s>"});
  EXPECT_EQ(m.push("Hi <").text, "Hi ");  // "<" may start the stop
  EXPECT_EQ(m.push("b>").text, "<b>");    // it did not
  auto o = m.push("</");
  EXPECT_EQ(o.text, "");
  o = m.push("s> after");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "");
  EXPECT_EQ(m.push("more").text, "");  // nothing after a stop
}

TEST(StopMatcher, AnySplitGivesTheSameResult) {
  std::mt19937 rng(3);
  const std::string text = "The end is near. THE END. Really the END!";
  const std::vector<std::string> stops = {"END.", "near!", "Really"};
  const auto whole = feed(stops, text, {text.size()});
  EXPECT_EQ(whole.first, "The end is near. THE ");
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> sizes;
    for (int i = 0; i < 20; ++i) sizes.push_back(1 + rng() % 5);
    EXPECT_EQ(feed(stops, text, sizes), whole) << "trial " << trial;
  }
}

// vLLM's min_tokens: pushes with match false are not searched; a later matched push finds only
// stop strings that end in its own piece, one that begins in the unmatched text included.
TEST(StopMatcher, UnmatchedPiecesAreNotSearchedButStillHeldBack) {
  {
    stop_matcher m({"END"});
    EXPECT_EQ(m.push("xEN", false).text, "x");  // "EN" may begin a stop that ends later
    auto o = m.push("D tail");
    EXPECT_TRUE(o.stopped);
    EXPECT_EQ(o.text, "");
  }
  {
    stop_matcher m({"END"});
    EXPECT_EQ(m.push("xEND", false).text, "xEND");  // whole in unmatched text: never a match
    auto o = m.push("more");
    EXPECT_FALSE(o.stopped);
    EXPECT_EQ(o.text, "more");
    o = m.push(" END!");
    EXPECT_TRUE(o.stopped);
    EXPECT_EQ(o.text, " ");
  }
  {
    // "ab" lies whole in held-back text ("xab" may begin "xabc"): still not a match later.
    stop_matcher m({"ab", "xabc"});
    EXPECT_EQ(m.push("xab", false).text, "");
    auto o = m.push("z");
    EXPECT_FALSE(o.stopped);
    EXPECT_EQ(o.text, "xabz");
  }
  {
    stop_matcher m({"ab", "xabc"});
    EXPECT_EQ(m.push("xab", false).text, "");
    auto o = m.push("c");  // the longer one ends in the new piece
    EXPECT_TRUE(o.stopped);
    EXPECT_EQ(o.text, "");
  }
}

/// What vLLM's detokenizer gives for `pieces` when the first `unmatched` are not searched: at
/// each later piece, the earliest stop string that ends in it (brute force over the text).
std::pair<std::string, bool> reference(const std::vector<std::string>& stops, const std::vector<std::string>& pieces,
                                       size_t unmatched) {
  std::string text;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const size_t before = text.size();
    text += pieces[i];
    if (i < unmatched) continue;
    size_t first = std::string::npos;
    for (const auto& s : stops) {
      for (size_t p = 0; p + s.size() <= text.size(); ++p) {
        if (p + s.size() > before && text.compare(p, s.size(), s) == 0) first = std::min(first, p);
      }
    }
    if (first != std::string::npos) return {text.substr(0, first), true};
  }
  return {text, false};
}

TEST(StopMatcher, UnmatchedPrefixesAgreeWithABruteForceReference) {
  std::mt19937 rng(11);
  const std::vector<std::string> stops = {"ab", "bab", "cc", "abcab"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> pieces;
    const size_t n = 1 + rng() % 8;
    for (size_t i = 0; i < n; ++i) {
      std::string p;
      for (size_t k = rng() % 4; k > 0; --k) p += static_cast<char>('a' + rng() % 3);
      pieces.push_back(p);
    }
    const size_t unmatched = rng() % (n + 1);
    stop_matcher m(stops);
    std::string sent;
    bool stopped = false;
    for (size_t i = 0; i < n && !stopped; ++i) {
      auto o = m.push(pieces[i], i >= unmatched);
      sent += o.text;
      stopped = o.stopped;
    }
    if (!stopped) sent += m.flush();
    std::string joined;
    for (const auto& p : pieces) joined += p + "|";
    EXPECT_EQ(std::make_pair(sent, stopped), reference(stops, pieces, unmatched))
        << "trial " << trial << ": " << joined << " unmatched " << unmatched;
  }
}

}  // namespace
}  // namespace llmesh::gateway

namespace llmesh::gateway {
namespace {

// include_stop_str_in_output: the text ends with the stop string, whatever the pieces; of
// stops found at the same place, the first listed; nothing after it.
TEST(StopMatcher, IncludingTheStopStringEndsTheTextWithIt) {
  for (const std::vector<size_t>& sizes : {std::vector<size_t>{1}, {2, 3}, {50}}) {
    stop_matcher m({"END", "\n\n"}, true);
    const std::string text = "Hello\n\nworld END more";
    std::string sent;
    bool stopped = false;
    for (size_t at = 0, i = 0; at < text.size() && !stopped; ++i) {
      const size_t n = std::min(sizes[i % sizes.size()], text.size() - at);
      auto o = m.push(std::string_view(text).substr(at, n));
      sent += o.text;
      stopped = o.stopped;
      at += n;
    }
    EXPECT_TRUE(stopped);
    EXPECT_EQ(sent, "Hello\n\n") << "pieces of " << sizes[0];
    EXPECT_EQ(m.flush(), "");
  }
  stop_matcher same_place({"ab", "abc"}, true);
  auto o = same_place.push("xxabcd");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "xxab");
  stop_matcher cut({"ab", "abc"});
  EXPECT_EQ(cut.push("xxabcd").text, "xx");
}

}  // namespace
}  // namespace llmesh::gateway
