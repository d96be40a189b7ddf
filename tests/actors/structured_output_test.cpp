// Structured outputs in the replica: every constrained output follows its grammar to the end
// (a JSON Schema's documents, a choice), whatever its batch neighbours, tensor parallelism or
// a failover in the middle, also when it holds only after a reasoning model's thinking; the vocabulary is a synthetic one over the random model's 300 ids.
#include <nlohmann/json.hpp>

#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

class StructuredOutput : public testing::replica_test_base {
 protected:
  /// 300 tokens: JSON's pieces, every printable ASCII byte alone (a real vocabulary has every
  /// byte: without them, a grammar could reach a prefix no token continues), words; ids 7..14
  /// are end tokens.
  static std::shared_ptr<const model::token_vocabulary> vocabulary() {
    std::vector<std::string> t;
    std::vector<bool> special;
    const std::vector<std::string> pieces = {
        "{", "}", "[", "]", ",", ":", "\"", " ", "\n", "  ", "\t", "-", ".", "e", "0", "1", "2", "3", "4", "5", "6",
        "7", "8", "9", "10", "15", "99", "150", "151", "true", "false", "null", "{\"", "\"}", "\":", "\": ", ", \"",
        "\",", "\"name\"", "\"age\"", "\"tags\"", "name", "age", "tags", "\"a\"", "\"b\"", "a", "b", "ab", "\\", "\\n",
        "\\\"", "\\u00e9", "é", "\xc3", "\xa9", "yes", "no", "maybe", "ye", "s", "n", "o", "[\"", "\"]", "\", \"", "x"};
    std::mt19937 rng(11);
    for (size_t id = 0; id < 300; ++id) {
      if (id >= 7 && id <= 14) {
        t.push_back("</s>");
        special.push_back(true);
      } else if (id < pieces.size() + 8) {  // ids 0..6 and 15..: the pieces in order
        t.push_back(pieces[id < 7 ? id : id - 8]);
        special.push_back(false);
      } else if (id < pieces.size() + 8 + 95) {  // every printable ASCII byte alone, as real vocabularies have
        t.push_back(std::string(1, static_cast<char>(' ' + (id - pieces.size() - 8))));
        special.push_back(false);
      } else {
        std::string w;
        for (size_t k = 0, n = 1 + rng() % 4; k < n; ++k) w += "abcdefgh \"{}:,0123456789"[rng() % 25];
        t.push_back(w);
        special.push_back(false);
      }
    }
    return model::token_vocabulary::from_bytes(t, special);
  }

  static model::constraint_spec person_schema() {
    return {model::constraint_spec::kind::json_schema, R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
      "required": ["name", "age"]})"};
  }

  std::vector<replica_request> constrained(size_t n) {
    auto reqs = requests(n);
    for (auto& r : reqs) {
      r.max_tokens = 300;
      r.prompt.resize(std::min<size_t>(r.prompt.size(), 20));
      r.eos_ids = {7, 8};
      r.constraint = person_schema();
      if (r.id % 2 == 1) r.sampling.temperature = 1.0f, r.sampling.top_k = 0, r.sampling.top_p = 1.0f;
    }
    return reqs;
  }

  struct outcome {
    std::vector<int32_t> tokens;
    finish_reason finish = finish_reason::none;
    replica_times last_times;  ///< the last event's
  };
  static std::map<uint64_t, outcome> serve(replica_core& rc, const std::vector<replica_request>& reqs) {
    std::map<uint64_t, outcome> out;
    for (const auto& r : reqs) {
      auto s = rc.submit(r);
      EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.err().message);
    }
    for (int guard = 0; !rc.idle() && guard < 20000; ++guard) {
      auto ev = rc.step();
      EXPECT_TRUE(ev.ok()) << (ev.ok() ? "" : ev.err().message);
      if (!ev.ok()) break;
      for (const auto& e : *ev) {
        out[e.id].tokens.push_back(e.token);
        out[e.id].finish = e.finish;
        out[e.id].last_times = e.times;
      }
    }
    EXPECT_TRUE(rc.idle());
    return out;
  }

  std::string text(const std::vector<int32_t>& tokens, std::span<const int32_t> end_ids) const {
    std::string s;
    for (int32_t t : tokens) {
      if (std::find(end_ids.begin(), end_ids.end(), t) == end_ids.end()) s += vocab_->bytes(t);
    }
    return s;
  }

  std::shared_ptr<const model::token_vocabulary> vocab_ = vocabulary();
};

/// The schema's own checks, on a parsed document.
void expect_person(const nlohmann::json& j, const std::string& raw) {
  ASSERT_TRUE(j.is_object()) << raw;
  ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << raw;
  EXPECT_LE(nlohmann::json(j["name"]).get<std::string>().size(), 12u * 4) << raw;
  ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer()) << raw;
  EXPECT_GE(j["age"].get<int64_t>(), 0) << raw;
  EXPECT_LE(j["age"].get<int64_t>(), 150) << raw;
  for (const auto& [k, v] : j.items()) EXPECT_TRUE(k == "name" || k == "age" || k == "tags") << raw;
  if (j.contains("tags")) {
    ASSERT_TRUE(j["tags"].is_array()) << raw;
    EXPECT_LE(j["tags"].size(), 3u) << raw;
    for (const auto& t : j["tags"]) EXPECT_TRUE(t == "a" || t == "b") << raw;
  }
}

TEST_F(StructuredOutput, EveryOutputIsADocumentOfItsSchemaWhateverItsNeighbours) {
  auto reqs = constrained(12);
  auto plain = requests(6);  // unconstrained neighbours in the same steps
  for (auto& r : plain) r.id += 100;
  auto e = engine(1, 4096);
  scheduler_config cfg;
  cfg.max_batch_tokens = 48;
  replica_core rc(*e, cfg);
  rc.set_vocabulary(vocab_);
  auto all = reqs;
  all.insert(all.end(), plain.begin(), plain.end());
  auto got = serve(rc, all);
  size_t ended = 0;
  for (const auto& r : reqs) {
    const auto& o = got[r.id];
    ASSERT_FALSE(o.tokens.empty());
    if (o.finish != finish_reason::eos) continue;
    ++ended;
    EXPECT_TRUE(o.tokens.back() == 7 || o.tokens.back() == 8);
    const std::string raw = text(o.tokens, r.eos_ids);
    auto j = nlohmann::json::parse(raw, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "request " << r.id << ": " << raw;
    expect_person(j, raw);
  }
  EXPECT_GE(ended, 10u);
  EXPECT_GT(rc.mask_cache().hits(), 0u);
  // Alone, on a fresh replica, each gives the same tokens: masks do not depend on the batch.
  for (const auto& r : {reqs[0], reqs[1], reqs[5]}) {
    auto e1 = engine(1, 1024);
    replica_core one(*e1, scheduler_config{});
    one.set_vocabulary(vocab_);
    auto solo = serve(one, {r});
    EXPECT_EQ(solo[r.id].tokens, got[r.id].tokens) << "request " << r.id;
  }
}

TEST_F(StructuredOutput, TensorParallelAndContinuedRequestsDrawTheSameTokens) {
  auto reqs = constrained(6);
  auto e1 = engine(1, 4096);
  replica_core one(*e1, scheduler_config{});
  one.set_vocabulary(vocab_);
  auto want = serve(one, reqs);
  auto e2 = engine(2, 4096);
  replica_core two(*e2, scheduler_config{});
  two.set_vocabulary(vocab_);
  auto got = serve(two, reqs);
  for (const auto& r : reqs) EXPECT_EQ(got[r.id].tokens, want[r.id].tokens) << "request " << r.id;
  // Failover: the output so far rides in the prompt; the new replica replays it through the
  // grammar and continues exactly.
  size_t continued = 0;
  for (const auto& r : reqs) {
    const auto& full = want[r.id].tokens;
    if (full.size() < 4) continue;
    const size_t k = full.size() / 2;
    replica_request c = r;
    c.prompt.insert(c.prompt.end(), full.begin(), full.begin() + static_cast<std::ptrdiff_t>(k));
    c.generated = k;
    c.max_tokens = r.max_tokens - k;
    auto e = engine(1, 4096);
    replica_core rc(*e, scheduler_config{});
    rc.set_vocabulary(vocab_);
    auto rest = serve(rc, {c});
    EXPECT_EQ(rest[r.id].tokens, std::vector<int32_t>(full.begin() + static_cast<std::ptrdiff_t>(k), full.end()))
        << "request " << r.id;
    ++continued;
  }
  EXPECT_GE(continued, 4u);
}

TEST_F(StructuredOutput, SpeculationDraftsOnlyWhatTheGrammarAllowsAndChangesNoToken) {
  // Speculation's drafts are cut where the grammar refuses them, and each drawn row is masked
  // by the grammar after the drafts before it: the tokens are a plain decode's. An array of
  // small objects repeats its keys, which prompt lookup picks up.
  auto reqs = constrained(10);
  for (auto& r : reqs) {
    if (r.id % 2 == 0) {
      r.constraint = {model::constraint_spec::kind::json_schema, R"({"type": "array", "minItems": 3, "maxItems": 6,
        "items": {"type": "object", "properties": {"a": {"enum": ["yes", "no"]},
        "b": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a", "b"]}})"};
    }
    if (r.id % 3 == 0) r.sampling.repetition_penalty = 1.2f;
  }
  auto e = engine(1, 4096);
  replica_core plain(*e, scheduler_config{});
  plain.set_vocabulary(vocab_);
  auto want = serve(plain, reqs);
  scheduler_config cfg;
  cfg.max_batch_tokens = 64;
  cfg.speculation = {4, 3, 1};
  replica_core rc(*e, cfg);
  rc.set_vocabulary(vocab_);
  auto got = serve(rc, reqs);
  size_t documents = 0;
  for (const auto& r : reqs) {
    EXPECT_EQ(got[r.id].tokens, want[r.id].tokens) << "request " << r.id;
    EXPECT_EQ(got[r.id].finish, want[r.id].finish) << "request " << r.id;
    if (got[r.id].finish == finish_reason::eos) {
      const std::string raw = text(got[r.id].tokens, r.eos_ids);
      EXPECT_FALSE(nlohmann::json::parse(raw, nullptr, false).is_discarded()) << raw;
      ++documents;
    }
  }
  EXPECT_GE(documents, 6u);
  EXPECT_GT(rc.scheduler().accepted(), 0u) << "no draft kept: the test no longer exercises speculation";
}

TEST_F(StructuredOutput, TheReplicaUsesTheGrammarTheProcessCompiledAlready) {
  // The gateway checks a spec by compiling it into the process's cache (structured_output.cpp);
  // a replica in the same process takes that grammar instead of compiling it again.
  auto& cache = model::constraint_cache::shared();
  const model::constraint_spec spec{model::constraint_spec::kind::choice, R"(["shared", "once"])"};
  ASSERT_TRUE(cache.get(spec).ok());
  const size_t misses = cache.misses(), hits = cache.hits();
  auto e = engine(1, 1024);
  replica_core rc(*e, scheduler_config{});
  rc.set_vocabulary(vocab_);
  replica_request r;
  r.id = 1;
  r.prompt = {20, 21};
  r.max_tokens = 20;
  r.constraint = spec;
  ASSERT_TRUE(rc.submit(r).ok());
  EXPECT_EQ(cache.misses(), misses);
  EXPECT_EQ(cache.hits(), hits + 1);
}

TEST_F(StructuredOutput, AChoiceEndsWhenCompleteWithOrWithoutAnEndId) {
  auto e = engine(1, 1024);
  replica_core rc(*e, scheduler_config{});
  rc.set_vocabulary(vocab_);
  std::vector<replica_request> reqs;
  for (uint64_t id = 0; id < 8; ++id) {
    replica_request r;
    r.id = id;
    r.prompt = {20, 21, static_cast<int32_t>(22 + id)};
    r.max_tokens = 50;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = id;
    r.constraint = {model::constraint_spec::kind::choice, R"(["yes", "no", "maybe"])"};
    if (id % 2 == 0) r.eos_ids = {7};
    if (id % 4 == 0) r.sampling.min_tokens = 40;  // yields to a complete grammar
    reqs.push_back(r);
  }
  auto got = serve(rc, reqs);
  for (const auto& r : reqs) {
    const auto& o = got[r.id];
    EXPECT_EQ(o.finish, finish_reason::eos) << "request " << r.id;
    const std::string t = text(o.tokens, r.eos_ids);
    EXPECT_TRUE(t == "yes" || t == "no" || t == "maybe") << "request " << r.id << ": " << t;
    if (!r.eos_ids.empty()) {
      EXPECT_EQ(o.tokens.back(), 7) << "request " << r.id;
    }
    // Its last token carries its whole time on the replica, however it ended (at an end id, or
    // at a complete grammar without one, where the replica ends it itself).
    EXPECT_GE(o.last_times.queued_us, 0) << "request " << r.id;
    EXPECT_GE(o.last_times.inference_us, o.last_times.prefill_us) << "request " << r.id;
    EXPECT_GE(o.last_times.prefill_us, 0) << "request " << r.id;
  }
}

TEST_F(StructuredOutput, AGrammarNoTokenContinuesFailsTheRequestInsteadOfEndingIt) {
  // "a" and "abc" exist, "b" does not: after "a" the choice "ab" cannot go on.
  std::vector<std::string> t(300, "q");
  t[20] = "a";
  t[21] = "abc";
  auto e = engine(1, 1024);
  replica_core rc(*e, scheduler_config{});
  rc.set_vocabulary(model::token_vocabulary::from_bytes(t));
  replica_request r;
  r.id = 5;
  r.prompt = {1, 2, 3};
  r.max_tokens = 10;
  r.eos_ids = {7};
  r.constraint = {model::constraint_spec::kind::choice, R"(["ab"])"};
  ASSERT_TRUE(rc.submit(r).ok());
  std::vector<token_event> events;
  for (int guard = 0; !rc.idle() && guard < 100; ++guard) {
    auto ev = rc.step();
    ASSERT_TRUE(ev.ok());
    for (auto& x : *ev) events.push_back(std::move(x));
  }
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].token, 20);  // "a": the only token the grammar allows first
  EXPECT_FALSE(events[0].failure);
  EXPECT_EQ(events[1].token, -1);
  EXPECT_EQ(events[1].finish, finish_reason::cancelled);
  ASSERT_TRUE(events[1].failure);
  EXPECT_NE(events[1].failure->message.find("no token of the vocabulary continues"), std::string::npos)
      << events[1].failure->message;
  EXPECT_EQ(rc.blocks().free_blocks(), rc.blocks().total_blocks());
}

// A reasoning model's structured output (constraint_after): the grammar masks nothing until the
// output shows constraint_after, then holds for the rest; a continued request finds where it
// stands from its output so far; one whose end of thinking never comes is a plain decode.
TEST_F(StructuredOutput, AGrammarThatWaitsForTheEndOfThinking) {
  int32_t think_end = 170;  // a word no JSON object starts with: the grammar masks it at the start
  while (vocab_->bytes(think_end).empty() || vocab_->bytes(think_end)[0] < 'a' || vocab_->bytes(think_end)[0] > 'h') ++think_end;
  ASSERT_LT(think_end, 300);
  auto reqs = constrained(4);
  for (auto& r : reqs) {
    r.constraint_after = {think_end};
    r.logit_bias = {{think_end, 50.0f}};  // drawn at once while it may be
  }
  auto e = engine(1, 4096);
  replica_core rc(*e, scheduler_config{});
  rc.set_vocabulary(vocab_);
  auto got = serve(rc, reqs);
  for (const auto& r : reqs) {
    const auto& o = got[r.id];
    ASSERT_GE(o.tokens.size(), 2u);
    EXPECT_EQ(o.tokens[0], think_end) << "request " << r.id << ": unconstrained before the end of thinking";
    EXPECT_NE(o.tokens[1], think_end) << "request " << r.id << ": masked once the grammar holds (no document starts so)";
    if (o.finish != finish_reason::eos) continue;
    const std::string raw = text(std::vector<int32_t>(o.tokens.begin() + 1, o.tokens.end()), r.eos_ids);
    auto j = nlohmann::json::parse(raw, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "request " << r.id << ": " << raw;
    expect_person(j, raw);
  }
  // Without constraint_after the grammar masks the word from the first token on.
  auto now = reqs;
  for (auto& r : now) r.constraint_after.clear();
  auto e2 = engine(1, 4096);
  replica_core rc2(*e2, scheduler_config{});
  rc2.set_vocabulary(vocab_);
  for (const auto& [id, o] : serve(rc2, now)) EXPECT_NE(o.tokens.at(0), think_end) << "request " << id;
  // Failover before and after the end of thinking: the rest is the same.
  for (const size_t k : {size_t{1}, size_t{3}}) {
    replica_request c = reqs[0];
    const auto& full = got[c.id].tokens;
    ASSERT_GT(full.size(), k);
    c.prompt.insert(c.prompt.end(), full.begin(), full.begin() + static_cast<std::ptrdiff_t>(k));
    c.generated = k;
    c.max_tokens -= k;
    auto e3 = engine(1, 4096);
    replica_core one(*e3, scheduler_config{});
    one.set_vocabulary(vocab_);
    EXPECT_EQ(serve(one, {c})[c.id].tokens, std::vector<int32_t>(full.begin() + static_cast<std::ptrdiff_t>(k), full.end()))
        << "continued after " << k;
  }
  // An end of thinking that never comes: the same tokens as without any constraint.
  auto never = constrained(4);
  auto plain = never;
  for (auto& r : never) {
    r.constraint_after = {think_end, think_end};
    r.logit_bias = {{think_end, -100.0f}};
    r.max_tokens = 40;
  }
  for (auto& r : plain) {
    r.constraint = {};
    r.logit_bias = {{think_end, -100.0f}};
    r.max_tokens = 40;
  }
  auto e4 = engine(1, 4096);
  replica_core a(*e4, scheduler_config{});
  a.set_vocabulary(vocab_);
  auto waiting = serve(a, never);
  auto e5 = engine(1, 4096);
  replica_core b(*e5, scheduler_config{});
  auto unconstrained = serve(b, plain);
  for (const auto& r : never) EXPECT_EQ(waiting[r.id].tokens, unconstrained[r.id].tokens) << "request " << r.id;
}

TEST_F(StructuredOutput, RefusalsAreClear) {
  auto e = engine(1, 1024);
  replica_core rc(*e, scheduler_config{});
  replica_request r;
  r.id = 1;
  r.prompt = {1, 2, 3};
  r.constraint = person_schema();
  auto s = rc.submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("tokenizer"), std::string::npos) << s.err().message;
  rc.set_vocabulary(vocab_);
  r.constraint = {model::constraint_spec::kind::json_schema, R"({"type": "strin"})"};
  EXPECT_FALSE(rc.submit(r).ok());
  r.constraint = {model::constraint_spec::kind::choice, R"(["yes"])"};
  int32_t maybe = 0;
  while (vocab_->bytes(maybe) != "maybe") ++maybe;
  r.prompt = {1, 2, 3, maybe};  // one output token ("maybe" is not "yes")
  r.generated = 1;
  s = rc.submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("does not follow"), std::string::npos) << s.err().message;
  r.constraint = person_schema();
  r.prompt = {1, 2, 3};
  r.generated = 0;
  r.constraint_after = {300};
  s = rc.submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("constraint_after: token 300 is outside the vocabulary"), std::string::npos) << s.err().message;
  r.constraint_after = {5};
  r.constraint = {};
  s = rc.submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("constraint_after without a constraint"), std::string::npos) << s.err().message;
  r.constraint = person_schema();
  r.constraint_after.clear();
  EXPECT_TRUE(rc.submit(r).ok());
}

}  // namespace
}  // namespace llmesh::actors
