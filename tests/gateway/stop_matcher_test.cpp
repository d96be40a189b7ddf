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

}  // namespace
}  // namespace llmesh::gateway
