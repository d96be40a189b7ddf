// token_vocabulary::mask against the definition (each token's bytes fed to a copy of the
// matcher), and the cache.
#include "llmesh/model/token_mask.hpp"

#include <gtest/gtest.h>

#include <random>

namespace llmesh::model {
namespace {

using B = grammar_builder;

bool bit(const std::vector<uint32_t>& mask, size_t id) { return (mask[id >> 5] >> (id & 31)) & 1u; }

/// The definition: a token is allowed when the matcher takes all its bytes (an end id when the
/// matcher is accepting); excluded and empty tokens never.
std::vector<uint32_t> brute(const token_vocabulary& v, const grammar_matcher& m, std::span<const int32_t> end_ids) {
  std::vector<uint32_t> out(v.words(), 0u);
  for (size_t id = 0; id < v.size(); ++id) {
    bool ok = false;
    if (std::find(end_ids.begin(), end_ids.end(), static_cast<int32_t>(id)) != end_ids.end()) {
      ok = m.accepting();
    } else if (!v.excluded(static_cast<int32_t>(id))) {
      grammar_matcher c = m;
      ok = c.accept(v.bytes(static_cast<int32_t>(id)));
    }
    if (ok) out[id >> 5] |= 1u << (id & 31);
  }
  return out;
}

/// A small JSON-ish grammar: value ::= "[" (value ("," value)*)? "]" | digit+ | "\"" [a-z ]* "\"".
std::shared_ptr<const grammar> small_json() {
  B b;
  const auto value = b.declare("value");
  const auto more = b.star("more", {B::byte(','), B::ref(value)});
  const auto items = b.optional("items", {B::ref(value), B::ref(more)});
  const auto digits = b.plus("digits", {B::bytes(byte_set::range('0', '9'))});
  const auto chars = b.star("chars", {B::bytes(byte_set::range('a', 'z').add(' '))});
  b.define(value, {{B::byte('['), B::ref(items), B::byte(']')}, {B::ref(digits)}, {B::byte('"'), B::ref(chars), B::byte('"')}});
  auto g = std::move(b).build(value);
  EXPECT_TRUE(g.ok());
  return *g;
}

std::vector<std::string> random_vocab(std::mt19937& rng, size_t n) {
  const std::string alphabet = "[],\"0123456789ab z{";
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    std::string t;
    const size_t len = 1 + rng() % 5;
    for (size_t k = 0; k < len; ++k) t += alphabet[rng() % alphabet.size()];
    out.push_back(t);
  }
  out.push_back(out[3]);  // a duplicate byte string
  out.push_back("");      // a token without bytes
  return out;
}

TEST(TokenMask, EqualsTheDefinitionAlongRandomWalks) {
  std::mt19937 rng(7);
  auto tokens = random_vocab(rng, 700);
  std::vector<bool> excluded(tokens.size(), false);
  excluded[5] = true;  // a special token
  const int32_t end = static_cast<int32_t>(tokens.size());
  tokens.push_back("</s>");
  excluded.push_back(true);
  auto v = token_vocabulary::from_bytes(tokens, excluded);
  const std::vector<int32_t> end_ids{end};
  auto g = small_json();
  size_t steps = 0, ends = 0;
  grammar_states table(g);  // shared by every walk, as a replica's cache shares it
  grammar_states tiny(g, 3);  // full at once: every walk falls back to the untabled one
  for (int walk = 0; walk < 30; ++walk) {
    grammar_matcher m(g);
    for (int step = 0; step < 40; ++step) {
      const auto mask = v->mask(m, end_ids);
      ASSERT_EQ(mask, brute(*v, m, end_ids)) << "walk " << walk << " step " << step;
      ASSERT_EQ(v->mask(m, end_ids, table), mask) << "walk " << walk << " step " << step;
      ASSERT_EQ(v->mask(m, end_ids, tiny), mask) << "walk " << walk << " step " << step;
      ++steps;
      EXPECT_FALSE(bit(mask, 5));
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < v->size(); ++id) {
        if (bit(mask, id)) allowed.push_back(static_cast<int32_t>(id));
      }
      if (allowed.empty()) break;
      const int32_t pick = allowed[rng() % allowed.size()];
      if (pick == end) {
        ++ends;
        break;
      }
      ASSERT_TRUE(m.accept(v->bytes(pick)));
    }
  }
  EXPECT_GT(steps, 200u);
  EXPECT_GT(ends, 0u);
  EXPECT_EQ(tiny.size(), 3u);
  EXPECT_GT(table.size(), 3u);
}

TEST(TokenMask, EndIdsOnlyWhereTheGrammarIsComplete) {
  auto v = token_vocabulary::from_bytes({"a", "b", "ab", "</s>"}, {false, false, false, true});
  B b;
  const auto root = b.add("root", {B::literal("ab")});
  auto g = *std::move(b).build(root);
  grammar_matcher m(g);
  const std::vector<int32_t> end{3};
  EXPECT_EQ(v->mask(m, end), std::vector<uint32_t>{0b0101u});  // "a", "ab"
  ASSERT_TRUE(m.accept("a"));
  EXPECT_EQ(v->mask(m, end), std::vector<uint32_t>{0b0010u});  // "b"
  ASSERT_TRUE(m.accept("b"));
  EXPECT_EQ(v->mask(m, end), std::vector<uint32_t>{0b1000u});  // only the end
}

TEST(TokenMask, CacheReturnsTheSameMaskForTheSameState) {
  std::mt19937 rng(3);
  auto v = token_vocabulary::from_bytes(random_vocab(rng, 300));
  auto g = small_json();
  token_mask_cache cache(2);
  grammar_matcher m(g);
  const std::vector<int32_t> none;
  auto first = cache.get(*v, m, none);
  ASSERT_TRUE(m.accept("\"ab"));
  auto inside = cache.get(*v, m, none);
  ASSERT_TRUE(m.accept("ba "));  // the same state: inside the string
  auto again = cache.get(*v, m, none);
  EXPECT_EQ(inside.get(), again.get());
  EXPECT_EQ(*again, v->mask(m, none));
  EXPECT_NE(*first, *inside);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.misses(), 2u);
  grammar_matcher fresh(g);
  (void)cache.get(*v, fresh, std::vector<int32_t>{1});  // other end ids: another entry; the LRU drops one
  EXPECT_EQ(cache.size(), 2u);
}

}  // namespace
}  // namespace llmesh::model
