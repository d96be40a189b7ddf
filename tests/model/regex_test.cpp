// Regex to grammar (regex_grammar): the grammar accepts exactly the strings std::regex
// (ECMAScript, regex_match) accepts, on every short string over each pattern's alphabet and on
// random longer ones; code points are UTF-8; unsupported syntax is an error with its offset.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "grammar_match.hpp"
#include "llmesh/model/constraint.hpp"

namespace llmesh::model {
namespace {

using testing::matches;

std::shared_ptr<const grammar> compile(const std::string& pattern) {
  return testing::compile_ok(constraint_spec::kind::regex, pattern);
}

/// The characters a pattern mentions, plus a few it does not (and those its escapes stand for).
std::string alphabet_of(const std::string& pattern) {
  if (pattern == "[\\w.+-]+@[\\w-]+\\.\\w+") return "a@.-";
  std::set<char> chars{'x', '1', ' ', '\n', '\r', 'A', 'B', '\\'};
  for (char c : pattern) {
    if (std::string_view("\\()[]{}|*+?^$").find(c) == std::string_view::npos && c >= 0x20) chars.insert(c);
  }
  return std::string(chars.begin(), chars.end());
}

TEST(Regex, AgreesWithStdRegexOnAsciiStrings) {
  const std::vector<std::string> patterns = {
      "a", "abc", "a|b", "ab|cd", "a*", "a+", "a?", "(ab)*", "(a|b)*abb", "a{2}", "a{2,}", "a{1,3}",
      "(a|bc){0,2}c", "[abc]+", "[^a]*", "[a-c]x?", "\\d+", "\\D", "\\w*", "\\W+", "\\s?a", "\\S\\S", ".", ".*",
      "a.c", "[.]", "\\.", "(a*)*", "(a?)+b", "(a|)*", "(?:ab|a)(?:bc|c)", "a*?b", "a+?", "a??b", "a{2,3}?",
      "^abc$", "^(a|b)$", "^a|b$", "[\\d\\s]+", "[a\\-z]", "[-a]", "[a-]", "\\x41\\u0042", "\\t|\\n", "[^\\n]+",
      "x{0}y", "(a)(b)?", "((a|b)(c|d)){1,2}", "\\\\", "\\/", "(0|[1-9][0-9]*)(\\.[0-9]+)?", "-?\\d{1,3}(,\\d{3})*",
      "[\\w.+-]+@[\\w-]+\\.\\w+", "(a|ab)(c|bcd)(d*)", "[^abc\\d]", "(?:a{0,2}b?){2}", "[A-Fa-f0-9]{2}", "((a)|b)+c"};
  std::mt19937 rng(7);
  for (const auto& p : patterns) {
    SCOPED_TRACE(p);
    auto g = compile(p);
    ASSERT_TRUE(g);
    const std::regex re(p, std::regex::ECMAScript);
    const std::string alphabet = alphabet_of(p);
    std::vector<std::string> cases{""};
    // Every string up to the length where there are ~4000 of them.
    for (size_t begin = 0, len = 1; cases.size() < 4000 && len <= 6; ++len) {
      const size_t end = cases.size();
      for (size_t i = begin; i < end && cases.size() < 4000; ++i) {
        for (char c : alphabet) cases.push_back(cases[i] + c);
      }
      begin = end;
    }
    for (int i = 0; i < 1000; ++i) {
      std::string s;
      const size_t n = rng() % 14;
      for (size_t j = 0; j < n; ++j) s += alphabet[rng() % alphabet.size()];
      cases.push_back(s);
    }
    int matched = 0;
    for (const auto& s : cases) {
      const bool want = std::regex_match(s, re);
      matched += want;
      ASSERT_EQ(matches(g, s), want) << "string '" << s << "'";
    }
    EXPECT_GT(matched, 0) << "no case matched: the comparison says little";
  }
}

TEST(Regex, CodePointsAreUtf8) {
  auto dot = compile("^.$");
  ASSERT_TRUE(dot);
  for (const char* ok : {"a", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\t"}) EXPECT_TRUE(matches(dot, ok)) << ok;
  for (const char* bad : {"\n", "\r", "\xE2\x80\xA8", "\xE2\x80\xA9", "ab", "\xC3", "\xED\xA0\x80", "\xC0\x80", ""}) {
    EXPECT_FALSE(matches(dot, bad)) << bad;
  }
  auto negated = compile("[^a\\n]");
  ASSERT_TRUE(negated);
  EXPECT_TRUE(matches(negated, "\xC3\xA9"));
  EXPECT_TRUE(matches(negated, "\r"));
  EXPECT_FALSE(matches(negated, "a"));
  EXPECT_FALSE(matches(negated, "\n"));
  auto greek = compile("[\xCE\xB1-\xCF\x89]+ \\u00e9\\uD83D\\uDE00");  // [α-ω]+ é😀
  ASSERT_TRUE(greek);
  EXPECT_TRUE(matches(greek, "\xCE\xBB\xCF\x89 \xC3\xA9\xF0\x9F\x98\x80"));
  EXPECT_FALSE(matches(greek, "\xCE\x91 \xC3\xA9\xF0\x9F\x98\x80"));  // Α is outside α-ω
  auto space = compile("\\s");
  ASSERT_TRUE(space);
  EXPECT_TRUE(matches(space, "\xC2\xA0"));      // U+00A0
  EXPECT_TRUE(matches(space, "\xE3\x80\x80"));  // U+3000
  EXPECT_FALSE(matches(space, "\xC2\xA1"));
}

TEST(Regex, WholeOutputIsAnchored) {
  auto g = compile("abc");
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "abc"));
  EXPECT_FALSE(matches(g, "xabc"));
  EXPECT_FALSE(matches(g, "abcx"));
  EXPECT_TRUE(testing::viable(g, "ab"));
  EXPECT_FALSE(testing::viable(g, "b"));
  grammar_matcher m(g);
  ASSERT_TRUE(m.accept("abc"));
  EXPECT_TRUE(m.done());
}

TEST(Regex, LargeCountsAndTheirLimits) {
  auto g = compile("a{1000}");
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, std::string(1000, 'a')));
  EXPECT_FALSE(matches(g, std::string(999, 'a')));
  EXPECT_FALSE(matches(g, std::string(1001, 'a')));
  auto any = compile("^.{0,500}$");
  ASSERT_TRUE(any);
  std::string s;
  for (int i = 0; i < 250; ++i) s += "\xC3\xA9";
  EXPECT_TRUE(matches(any, s + s));
  EXPECT_FALSE(matches(any, s + s + "a"));
}

TEST(Regex, UnsupportedSyntaxIsAnErrorWithItsOffset) {
  struct refusal {
    std::string pattern;
    std::string says;
  };
  for (const auto& r : std::vector<refusal>{
           {"ab\\1", "backreference"}, {"a(?=b)", "lookaround"}, {"(?<n>a)", "named"}, {"a^b", "offset 1"},
           {"a$b", "offset 1"}, {"(a", "missing ')'"}, {"a)", "unmatched ')'"}, {"*a", "nothing to repeat"},
           {"a{3,2}", "max < min"}, {"a{10001}", "above"}, {"[b-a]", "out of order"}, {"\\p{L}", "property"},
           {"a\\b", "word boundar"}, {"(a|b)*a(a|b){20}", "too complex"}, {"\xFF", "UTF-8"}, {"[ab", "missing ']'"},
           {"ab\\", "ends with"}, {"\\q", "unknown escape"}, {"\\uD800", "surrogate"}, {"[]", "matches no string"},
           {"a{2}{3}", "nothing to repeat"}, {"a**", "nothing to repeat"}, {"(?i)a", "offset 0"}, {"[\\d-z]", "range"},
           {std::string(70, '(') + std::string(70, ')'), "nest"}, {"((a{100}){100}){100}", "too complex"}}) {
    auto msg = testing::compile_error(constraint_spec::kind::regex, r.pattern);
    EXPECT_NE(msg.find(r.says), std::string::npos) << r.pattern << " -> " << msg;
  }
}

}  // namespace
}  // namespace llmesh::model
