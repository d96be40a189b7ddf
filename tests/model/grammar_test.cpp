// grammar_builder and grammar_matcher: what a grammar accepts, what build() refuses.
#include "llmesh/model/grammar.hpp"

#include <gtest/gtest.h>

#include <random>

namespace llmesh::model {
namespace {

using B = grammar_builder;

std::shared_ptr<const grammar> must(result<std::shared_ptr<const grammar>> g) {
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.err().message);
  return g.ok() ? *g : nullptr;
}

bool matches(const std::shared_ptr<const grammar>& g, std::string_view s) {
  grammar_matcher m(g);
  return m.accept(s) && m.accepting();
}

TEST(Grammar, AlternativesAndSequences) {
  B b;
  const auto ab = b.add("ab", {B::literal("ab"), B::literal("cd"), {}});
  const auto root = b.add("root", {{B::byte('<'), B::ref(ab), B::byte('>')}});
  auto g = must(std::move(b).build(root));
  for (const char* s : {"<ab>", "<cd>", "<>"}) EXPECT_TRUE(matches(g, s)) << s;
  for (const char* s : {"", "<", "<ab", "<abcd>", "<ac>", "<ab>>", "ab"}) EXPECT_FALSE(matches(g, s)) << s;
}

TEST(Grammar, RepetitionBounds) {
  B b;
  const auto digit = B::bytes(byte_set::range('0', '9'));
  const auto r = b.repeat("r", {digit}, 2, 4);
  const auto s = b.star("s", {B::byte('x')});
  const auto p = b.plus("p", {B::byte('y')});
  const auto root = b.add("root", {{B::ref(r), B::byte('-'), B::ref(s), B::byte('-'), B::ref(p)}});
  auto g = must(std::move(b).build(root));
  EXPECT_TRUE(matches(g, "12--y"));
  EXPECT_TRUE(matches(g, "1234-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-yyyyyyyyyyyyyyyyyyy"));
  EXPECT_FALSE(matches(g, "1--y"));
  EXPECT_FALSE(matches(g, "12345--y"));
  EXPECT_FALSE(matches(g, "12--"));
  EXPECT_FALSE(matches(g, "12-x-yx"));
}

TEST(Grammar, UnboundedRepetitionKeepsTheStacksFlat) {
  B b;
  const auto root = b.repeat("root", {B::byte('a')}, 3, -1);
  auto g = must(std::move(b).build(root));
  grammar_matcher m(g);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(m.accept('a'));
  EXPECT_FALSE(m.accepting());
  ASSERT_TRUE(m.accept('a'));
  const std::string key = m.key();
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(m.accept('a'));
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.can_continue());
  EXPECT_EQ(m.key(), key);  // the same state, however many times it repeated
}

TEST(Grammar, RecursionAndDone) {
  // parens ::= "(" parens ")" | "" — nested to any depth; done once the root closes.
  B b;
  const auto p = b.declare("parens");
  b.define(p, {{B::byte('('), B::ref(p), B::byte(')')}, {}});
  const auto root = b.add("root", {{B::byte('['), B::ref(p), B::byte(']')}});
  auto g = must(std::move(b).build(root));
  EXPECT_TRUE(matches(g, "[((()))]"));
  EXPECT_FALSE(matches(g, "[(()]"));
  grammar_matcher m(g);
  ASSERT_TRUE(m.accept("[(())]"));
  EXPECT_TRUE(m.done());
  EXPECT_FALSE(m.accept('x'));
  EXPECT_TRUE(m.done());  // a refused byte changes nothing
}

TEST(Grammar, AcceptOfManyBytesIsAllOrNothing) {
  B b;
  const auto root = b.add("root", {B::literal("hello")});
  auto g = must(std::move(b).build(root));
  grammar_matcher m(g);
  const std::string before = m.key();
  EXPECT_FALSE(m.accept("help"));
  EXPECT_EQ(m.key(), before);
  EXPECT_TRUE(m.accept("hel"));
  EXPECT_FALSE(m.accepting());
  EXPECT_TRUE(m.accept("lo"));
  EXPECT_TRUE(m.done());
}

TEST(Grammar, BuildRefusesBrokenGrammars) {
  {
    B b;  // left recursion through a nullable prefix
    const auto e = b.add("e", {{}, B::literal("x")});
    const auto l = b.declare("l");
    b.define(l, {{B::ref(e), B::ref(l), B::byte('a')}, B::literal("b")});
    auto g = std::move(b).build(l);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.err().message.find("left-recursive"), std::string::npos) << g.err().message;
  }
  {
    B b;
    const auto u = b.declare("missing");
    const auto root = b.add("root", {{B::ref(u)}});
    auto g = std::move(b).build(root);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.err().message.find("'missing'"), std::string::npos) << g.err().message;
  }
  {
    B b;
    const auto r = b.add("root", {B::literal("a")});
    b.define(r, {B::literal("b")});
    EXPECT_FALSE(std::move(b).build(r).ok());
  }
  {
    B b;
    const auto r = b.add("root", {{B::bytes(byte_set{})}});
    EXPECT_FALSE(std::move(b).build(r).ok());
  }
  {
    B b;
    const auto r = b.repeat("root", B::literal("a"), 3, 2);
    EXPECT_FALSE(std::move(b).build(r).ok());
  }
  {
    B b;
    EXPECT_FALSE(std::move(b).build(0).ok());
  }
}

TEST(Grammar, SizeAndDepthBoundsRefuseHostileGrammars) {
  {  // x{100000} many times: refused once the elements pass the bound, not after gigabytes
    B b;
    B::sequence seq;
    for (int i = 0; i < 40; ++i) seq.push_back(B::ref(b.repeat("r" + std::to_string(i), B::literal("x"), 100000, 100000)));
    const auto root = b.add("root", {seq});
    EXPECT_LE(b.element_count(), grammar_builder::max_elements);
    auto g = std::move(b).build(root);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.err().message.find("too large"), std::string::npos) << g.err().message;
  }
  {  // a chain of 3000 leading references: refused (a matcher would recurse that deep)
    B b;
    std::vector<grammar_builder::rule_id> chain(3000);
    for (auto& r : chain) r = b.declare("c");
    for (size_t i = 0; i + 1 < chain.size(); ++i) b.define(chain[i], {{B::ref(chain[i + 1]), B::byte('y')}});
    b.define(chain.back(), {B::literal("x")});
    auto g = std::move(b).build(chain.front());
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.err().message.find("before its first byte"), std::string::npos) << g.err().message;
  }
  {  // the same chain 1000 long is fine, and matches
    B b;
    std::vector<grammar_builder::rule_id> chain(1000);
    for (auto& r : chain) r = b.declare("c");
    for (size_t i = 0; i + 1 < chain.size(); ++i) b.define(chain[i], {{B::ref(chain[i + 1]), B::byte('y')}});
    b.define(chain.back(), {B::literal("x")});
    auto g = must(std::move(b).build(chain.front()));
    EXPECT_TRUE(matches(g, "x" + std::string(999, 'y')));
    EXPECT_FALSE(matches(g, "x" + std::string(998, 'y')));
  }
}

TEST(Grammar, AmbiguityBeyondTheStackBoundIsRefusedNotFollowed) {
  // x ::= ("a" | "a" | ...)*  with many equivalent paths multiplies stacks only up to a bound.
  B b;
  std::vector<B::sequence> alts;
  for (int i = 0; i < 64; ++i) {
    const auto r = b.add("a" + std::to_string(i), {B::literal("a")});
    alts.push_back({B::ref(r), B::ref(b.add("tail" + std::to_string(i), {B::literal("a"), {}}))});
  }
  const auto one = b.add("one", std::move(alts));
  const auto root = b.star("root", {B::ref(one)});
  auto g = must(std::move(b).build(root));
  grammar_matcher m(g);
  for (int i = 0; i < 64; ++i) {
    if (!m.accept('a')) break;
  }
  // Whatever happens, the matcher stays usable and bounded.
  EXPECT_LE(m.key().size(), (grammar_matcher::max_stacks + 1) * 64 * sizeof(uint32_t));
}

}  // namespace
}  // namespace llmesh::model
