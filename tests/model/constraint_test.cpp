// compile_constraint's dispatch and choice lists, and a fuzz test: random bytes and random
// mutations of valid schemas, patterns and GBNF texts always give a grammar or an
// invalid_request error (never a crash or a hang), and a grammar they give can be followed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar_match.hpp"
#include "llmesh/model/constraint.hpp"
#include "llmesh/model/constraint_cache.hpp"

namespace llmesh::model {
namespace {

using kind = constraint_spec::kind;
using testing::matches;
using testing::compile_ok;

TEST(Constraint, ChoiceIsExactlyOneOfTheStrings) {
  auto g = testing::compile_ok(kind::choice, R"(["yes","no","maybe","no way","caf\u00e9"])");
  ASSERT_TRUE(g);
  for (const char* ok : {"yes", "no", "maybe", "no way", "caf\xC3\xA9"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"ye", "yesno", "\"yes\"", "", "No", "no ", "caf\\u00e9"}) EXPECT_FALSE(matches(g, bad)) << bad;
  grammar_matcher m(g);
  ASSERT_TRUE(m.accept("no"));
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.can_continue());  // "no way"
  ASSERT_TRUE(m.accept(" way"));
  EXPECT_TRUE(m.done());
  testing::compile_error(kind::choice, "[]");
  testing::compile_error(kind::choice, R"(["a",""])");
  testing::compile_error(kind::choice, R"(["a",1])");
  testing::compile_error(kind::choice, R"({"a":"b"})");
  testing::compile_error(kind::choice, "not json");
  EXPECT_FALSE(choice_grammar(std::vector<std::string>{}).ok());
}

TEST(Constraint, ThousandsOfChoicesOrEnumValuesStayOneParseStack) {
  // 6000 choices sharing prefixes ("item 1", "item 10", "item 100", ...): as a trie, one stack
  // follows them (alternatives of whole strings would need one per choice and be refused).
  nlohmann::json choices = nlohmann::json::array();
  for (int i = 0; i < 6000; ++i) choices.push_back("item " + std::to_string(i));
  auto g = compile_ok(kind::choice, choices.dump());
  ASSERT_TRUE(g);
  for (const char* ok : {"item 0", "item 1", "item 10", "item 599", "item 5999"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"item ", "item 6000", "item 01", "item 59999"}) EXPECT_FALSE(matches(g, bad)) << bad;
  grammar_matcher m(g);
  ASSERT_TRUE(m.accept("item 5"));
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.can_continue());
  nlohmann::json schema = {{"enum", choices}};
  auto e = compile_ok(kind::json_schema, schema.dump());
  ASSERT_TRUE(e);
  EXPECT_TRUE(matches(e, "\"item 42\""));
  EXPECT_FALSE(matches(e, "\"item 42"));
  // A hand-built grammar whose start holds more stacks than a matcher follows is refused.
  grammar_builder b;
  std::vector<grammar_builder::sequence> alts;
  for (int i = 0; i < 5000; ++i) alts.push_back(grammar_builder::literal("x" + std::to_string(i)));
  const auto root = b.add("root", std::move(alts));
  auto refused = std::move(b).build(root);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.err().message.find("ways to begin"), std::string::npos) << refused.err().message;
}

TEST(Constraint, ASpecsPatternsShareOneWorkBound) {
  // The costliest (a?){n}a{n} that compiles alone, then a schema holding it in 64 properties:
  // refused as too complex as a whole, instead of costing 64 times the bound of one pattern.
  std::string costly;
  for (int n : {50, 100, 200, 400, 800, 1600}) {
    const std::string p = "^(a?){" + std::to_string(n) + "}a{" + std::to_string(n) + "}$";
    if (!regex_grammar(p).ok()) break;
    costly = p;
  }
  ASSERT_FALSE(costly.empty());
  nlohmann::ordered_json props = nlohmann::ordered_json::object();
  for (int i = 0; i < 64; ++i) props["p" + std::to_string(i)] = {{"type", "string"}, {"pattern", costly}};
  const nlohmann::ordered_json schema = {{"type", "object"}, {"properties", props}};
  auto g = compile_constraint({kind::json_schema, schema.dump()});
  ASSERT_FALSE(g.ok()) << costly;
  EXPECT_NE(g.err().message.find("too complex"), std::string::npos) << g.err().message;
  // Alone again afterwards: the budget was the spec's, not the thread's.
  EXPECT_TRUE(compile_constraint({kind::regex, costly}).ok());
}

TEST(Constraint, DispatchesOnTheKindAndBoundsTheText) {
  testing::compile_error(kind::none, "");
  for (kind k : {kind::json_schema, kind::regex, kind::choice, kind::grammar}) {
    auto msg = testing::compile_error(k, std::string(max_constraint_bytes + 1, 'a'));
    EXPECT_NE(msg.find("bytes"), std::string::npos) << msg;
  }
  auto regex = testing::compile_ok(kind::regex, "[0-9]{3}");
  ASSERT_TRUE(regex);
  EXPECT_TRUE(matches(regex, "123"));
  auto gbnf = testing::compile_ok(kind::grammar, "root ::= \"x\"");
  ASSERT_TRUE(gbnf);
  EXPECT_TRUE(matches(gbnf, "x"));
  EXPECT_TRUE(testing::compile_ok(kind::json_object, "ignored"));
}

/// A spec compiles or fails with invalid_request; a grammar it gives is followed on a few inputs.
void expect_sane(kind k, const std::string& text, std::mt19937& rng) {
  auto g = compile_constraint({k, text});
  if (!g.ok()) {
    ASSERT_EQ(g.err().code, errc::invalid_request) << g.err().message;
    ASSERT_FALSE(g.err().message.empty());
    return;
  }
  for (int i = 0; i < 3; ++i) {
    grammar_matcher m(g.value());
    for (int j = 0; j < 64 && m.can_continue(); ++j) {
      // Mostly printable bytes, so matches get somewhere.
      const auto b = static_cast<uint8_t>(rng() % 4 == 0 ? rng() % 256 : 0x20 + rng() % 95);
      m.accept(b);
    }
    (void)m.accepting();
  }
}

std::string mutate(std::string s, std::mt19937& rng) {
  static const std::string pieces[] = {"{", "}", "[", "]", "(", ")", "\"", "\\", ",", ":", "*", "+", "?", "|", "{2,3}",
                                       "-1", "1e400", "null", "\"type\"", "\"$ref\":\"#\"", "::=", "\n", "\xC3", "^", "$"};
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t at = rng() % (s.size() + 1);
    switch (rng() % 4) {
      case 0: s.insert(at, pieces[rng() % std::size(pieces)]); break;
      case 1: if (at < s.size()) s.erase(at, 1 + rng() % 3); break;
      case 2: if (at < s.size()) s[at] = static_cast<char>(rng() % 256); break;
      default: s.insert(at, s.substr(rng() % s.size(), rng() % 8)); break;  // duplicate a piece
    }
  }
  return s;
}

TEST(Constraint, FuzzedSpecsGiveAGrammarOrAnError) {
  std::mt19937 rng(2024);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> schemas = {
      R"({"type":"object","properties":{"a":{"type":"integer","minimum":-5,"maximum":300},"b":{"type":"array","items":{"type":"string","maxLength":4},"maxItems":3},"c":{"anyOf":[{"type":"null"},{"$ref":"#"}]}},"required":["a"]})",
      R"({"$defs":{"n":{"type":"object","properties":{"v":{"enum":[1,"x",null]},"k":{"$ref":"#/$defs/n"}}}},"allOf":[{"$ref":"#/$defs/n"},{"required":["v"]}]})",
      R"({"type":"array","prefixItems":[{"type":"string","pattern":"^a+b?$"},{"type":"string","format":"date"}],"items":{"type":"number","minimum":0},"minItems":1})",
      R"({"type":["string","integer","null"],"minLength":1,"exclusiveMaximum":10,"nullable":true})"};
  const std::vector<std::string> patterns = {"^(a|b)*c{2,4}[^x-z]\\d+$", "(?:\\w+@)?[A-F0-9]{2,}(\\.\\s)*.?",
                                             "[\\u00e9-\\u00ff]+|\\x41{3}|(a*b*)*"};
  const std::vector<std::string> grammars = {
      "root ::= (item \",\")* item\nitem ::= [a-z]+ | \"(\" root \")\" # nested\n",
      "root ::= \"a\"{2,5} [^\\n\\x00-\\x1F]* (\"b\" | \"c\")?\n"};
  for (int i = 0; i < 600; ++i) {
    SCOPED_TRACE(i);
    expect_sane(kind::json_schema, mutate(schemas[i % schemas.size()], rng), rng);
    expect_sane(kind::regex, mutate(patterns[i % patterns.size()], rng), rng);
    expect_sane(kind::grammar, mutate(grammars[i % grammars.size()], rng), rng);
    std::string bytes(rng() % 40, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng() % 256);
    expect_sane(static_cast<kind>(1 + rng() % 5), bytes, rng);
    if (HasFatalFailure()) return;
  }
  // Structural mutations: swap a random subschema value for another JSON value.
  const std::vector<nlohmann::ordered_json> replacements = {
      nullptr, true, false, -1, 1e308, "string", nlohmann::ordered_json::array(), nlohmann::ordered_json::object(),
      {{"type", "integer"}, {"minimum", 3}}, {{"$ref", "#/$defs/n"}}, {{"not", {}}}, {{"enum", {}}}};
  for (int i = 0; i < 400; ++i) {
    auto doc = nlohmann::ordered_json::parse(schemas[i % schemas.size()]);
    std::vector<nlohmann::ordered_json*> nodes;
    std::vector<nlohmann::ordered_json*> todo{&doc};
    while (!todo.empty()) {
      auto* n = todo.back();
      todo.pop_back();
      nodes.push_back(n);
      if (n->is_structured()) {
        for (auto& c : *n) todo.push_back(&c);
      }
    }
    *nodes[rng() % nodes.size()] = replacements[rng() % replacements.size()];
    expect_sane(kind::json_schema, doc.dump(), rng);
    if (HasFatalFailure()) return;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}


TEST(Constraint, HostileSpecsFinishQuickly) {
  struct spec {
    kind k;
    std::string text;
  };
  std::string many_repeats = "root ::=";
  for (int i = 0; i < 30; ++i) many_repeats += " \"a\"{10000}";
  nlohmann::ordered_json wide = {{"type", "object"}, {"properties", nlohmann::ordered_json::object()}};
  for (int i = 0; i < 60; ++i) {
    const std::string name = std::to_string(i);  // ("p" + to_string: GCC 12's false -Wrestrict)
    wide["properties"][name] = {{"type", "string"}, {"maxLength", 10000 - i}};
  }
  nlohmann::ordered_json nested = {{"type", "integer"}};
  for (int i = 0; i < 60; ++i) nested = {{"anyOf", {nested, {{"type", "string"}, {"pattern", "^[a-z]{1,50}$"}}}}};
  nlohmann::ordered_json many_choices = nlohmann::ordered_json::array();
  for (int i = 0; i < 15000; ++i) many_choices.push_back("choice " + std::to_string(i));
  const std::vector<spec> specs = {
      {kind::regex, "(a|b)*a(a|b){20}"},
      {kind::regex, "((a{100}){100}){100}"},
      {kind::regex, "(.*){1000}"},
      {kind::regex, "[^a]{0,2000}"},
      {kind::regex, "(a?){5000}a{5000}"},
      {kind::regex, std::string(200000, 'a')},
      {kind::regex, "(a|aa)*(b|a{1,30})*c(\\w+\\s?)*$"},
      {kind::grammar, "root ::= (\"a\"{10000}){10000}\n"},
      {kind::grammar, many_repeats},
      {kind::json_schema, wide.dump()},
      {kind::json_schema, nested.dump()},
      {kind::json_schema, R"({"type":"string","pattern":"(a|b)*a(a|b){20}"})"},
      {kind::choice, many_choices.dump()},
  };
  for (const auto& s : specs) {
    const auto start = std::chrono::steady_clock::now();
    auto g = compile_constraint({s.k, s.text});
    const auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Why 5 s: each takes well under a second on one idle core; the margin is for slow CI.
    EXPECT_LT(took, 5.0) << s.text.substr(0, 80);
    if (!g.ok()) {
      EXPECT_EQ(g.err().code, errc::invalid_request);
    }
    std::printf("%-60s %s %.3fs\n", s.text.substr(0, 60).c_str(), g.ok() ? "ok   " : "error", took);
  }
}

// The process's compiled-grammar cache: a spec compiles once, a refusal is kept too, entries go
// least recently used first within the element and entry bounds, and threads share it.
TEST(ConstraintCache, CompilesASpecOnceAndKeepsRefusals) {
  constraint_cache cache;
  const constraint_spec choice{constraint_spec::kind::choice, R"(["yes", "no"])"};
  auto a = cache.get(choice);
  auto b = cache.get(choice);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());  // the same grammar, not a second compile
  EXPECT_EQ(cache.misses(), 1u);
  EXPECT_EQ(cache.hits(), 1u);
  const constraint_spec bad{constraint_spec::kind::regex, "[ab]*a[ab]{20}"};  // too complex: refused
  auto r1 = cache.get(bad);
  auto r2 = cache.get(bad);
  ASSERT_FALSE(r1.ok());
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r1.err().message, r2.err().message);
  EXPECT_EQ(r2.err().code, errc::invalid_request);
  EXPECT_EQ(cache.misses(), 2u);
  // The kind is part of the key: the same text as a regex is another spec.
  ASSERT_TRUE(cache.get({constraint_spec::kind::regex, "yes|no"}).ok());
  ASSERT_TRUE(cache.get({constraint_spec::kind::choice, R"(["yes|no"])"}).ok());
  EXPECT_EQ(cache.misses(), 4u);
}

TEST(ConstraintCache, EvictsTheLeastRecentlyUsedWithinItsBounds) {
  constraint_cache cache(/*max_elements=*/1 << 20, /*max_entries=*/3);
  auto spec = [](int i) { return constraint_spec{constraint_spec::kind::regex, "x{" + std::to_string(i) + "}"}; };
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(cache.get(spec(i)).ok());
  ASSERT_TRUE(cache.get(spec(1)).ok());  // 1 is now the most recent; 2 the least
  ASSERT_TRUE(cache.get(spec(4)).ok());  // evicts 2
  EXPECT_EQ(cache.entries(), 3u);
  const size_t misses = cache.misses();
  ASSERT_TRUE(cache.get(spec(1)).ok());
  ASSERT_TRUE(cache.get(spec(3)).ok());
  EXPECT_EQ(cache.misses(), misses);
  ASSERT_TRUE(cache.get(spec(2)).ok());
  EXPECT_EQ(cache.misses(), misses + 1);
  // A grammar bigger than the element bound is compiled and returned, never kept.
  constraint_cache tiny(/*max_elements=*/4, /*max_entries=*/8);
  ASSERT_TRUE(tiny.get(spec(50)).ok());
  EXPECT_EQ(tiny.entries(), 0u);
}

TEST(ConstraintCache, ThreadsShareIt) {
  constraint_cache cache;
  std::vector<std::thread> pool;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto g = cache.get({constraint_spec::kind::regex, "[0-9]{" + std::to_string(1 + (i + t) % 7) + "}"});
        ok[t] += g.ok();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 200);
  EXPECT_EQ(cache.entries(), 7u);
  EXPECT_EQ(cache.hits() + cache.misses(), 800u);
  EXPECT_LE(cache.misses(), 7u * 4);  // a spec missed by several threads at once compiles in each
}

}  // namespace
}  // namespace llmesh::model
