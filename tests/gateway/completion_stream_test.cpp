// completion_stream: token messages in, OpenAI-shaped SSE chunks or one response out. UTF-8
// characters split over several tokens are never split in a chunk; stop strings cut the text
// across token boundaries; finish reasons, usage and token ids land where OpenAI puts them.
// Each stream runs as the one choice of a completion_group, as api_service builds an n = 1
// request: what these tests read is what a single-choice request's client receives.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/completion_group.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;
using actors::finish_reason;
using actors::token_msg;

/// One generation as the response of one choice (request id 1).
class one_choice {
 public:
  one_choice(const stream_setup& s, const model::detokenizer& d, bool include_usage = false)
      : group_(group_setup{s.chat, s.streaming, include_usage, s.id, s.created, s.model, 1}, d, nullptr) {
    group_.add_choice(1, s);
  }
  std::string on_message(const token_msg& t) { return group_.on_message(t); }
  bool done() const { return group_.done(); }
  bool started() const { return group_.started(); }
  bool stopped_by_string() const { return group_.choice(0).stopped_by_string(); }
  size_t completion_tokens() const { return group_.choice(0).completion_tokens(); }
  http_reply reply() const { return group_.reply(); }

 private:
  completion_group group_;
};

class CompletionStream : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {  // a 128k vocabulary: load it once
    auto t = model::tokenizer::load(LLMESH_TEST_DATA "/tokenizers/llama3");
    ASSERT_TRUE(t.ok()) << t.err().message;
    tok_ = *t;
  }
  /// The id whose bytes are exactly `b` (byte-level vocabularies have one per byte).
  int32_t byte_token(unsigned char b) const {
    const auto& d = tok_->decoder();
    for (size_t id = 0; id < d.vocab_size(); ++id) {
      const auto& s = d.token_bytes(static_cast<int32_t>(id));
      if (s.size() == 1 && static_cast<unsigned char>(s[0]) == b) return static_cast<int32_t>(id);
    }
    return -1;
  }
  /// "Hi " + 🎉 as four one-byte tokens + " é" as bytes + " ok".
  std::vector<int32_t> tricky_ids() const {
    std::vector<int32_t> ids = tok_->encode("Hi", false);
    for (unsigned char b : std::string(" \xF0\x9F\x8E\x89 \xC3\xA9")) ids.push_back(byte_token(b));
    for (int32_t t : tok_->encode(" ok", false)) ids.push_back(t);
    return ids;
  }
  stream_setup setup(bool chat, bool streaming) const {
    stream_setup s;
    s.chat = chat;
    s.streaming = streaming;
    s.id = "cmpl-1";
    s.created = 7;
    s.model = std::string("m");  // not a literal: GCC 12 warns falsely (-Wrestrict) on that assignment here
    s.prompt_ids = {1, 2, 3};
    return s;
  }
  /// Feeds ids, the last one with `last`; returns the concatenated SSE bytes.
  static std::string feed(one_choice& c, const std::vector<int32_t>& ids, finish_reason last) {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      out += c.on_message(token_msg{1, ids[i], i + 1 == ids.size() ? last : finish_reason::none, false, {}, {}, {}});
    }
    return out;
  }
  static std::vector<json> events(const std::string& sse, bool& done) {
    std::vector<json> out;
    done = false;
    size_t pos = 0;
    while ((pos = sse.find("data: ", pos)) != std::string::npos) {
      const size_t end = sse.find("\n\n", pos);
      const std::string payload = sse.substr(pos + 6, end - pos - 6);
      if (payload == "[DONE]") {
        done = true;
      } else {
        out.push_back(json::parse(payload));
      }
      pos = end + 2;
    }
    return out;
  }
  static bool valid_utf8(const std::string& s) { return model::sanitize_utf8(s) == s; }
  /// A message carrying hand-made logprobs: the i-th token's is -0.25 * (i + 1), its
  /// alternatives `alt` at -0.5 and the token itself at its own value.
  static token_msg with_logprobs(int32_t id, size_t i, int32_t alt, finish_reason f = finish_reason::none) {
    token_msg t{1, id, f, false, {}, {}, {}};
    const float lp = -0.25f * static_cast<float>(i + 1);
    t.logprobs = kernels::token_logprobs{lp, {{alt, -0.5f}, {id, lp}}};
    return t;
  }
  std::string text_of(int32_t id) const { return tok_->decoder().token_bytes(id); }
  /// The logprobs of every chunk of a stream, concatenated per field (completions' shape).
  static json joined_completion_logprobs(const std::vector<json>& ev) {
    json all = {{"text_offset", json::array()}, {"token_logprobs", json::array()}, {"tokens", json::array()},
                {"top_logprobs", json::array()}};
    for (const auto& e : ev) {
      if (e["choices"].empty()) continue;  // the usage chunk
      for (const char* f : {"text_offset", "token_logprobs", "tokens", "top_logprobs"}) {
        for (const auto& v : e["choices"][0]["logprobs"][f]) all[f].push_back(v);
      }
    }
    return all;
  }

  static inline std::shared_ptr<const model::tokenizer> tok_;
};

TEST_F(CompletionStream, StreamedChunksKeepCharactersWholeAndAddUpToTheText) {
  const auto ids = tricky_ids();
  const std::string want = tok_->decoder().decode(ids);
  ASSERT_EQ(want, "Hi \xF0\x9F\x8E\x89 \xC3\xA9 ok");
  auto s = setup(false, true);
  one_choice c(s, tok_->decoder(), /*include_usage=*/true);
  bool done = false;
  auto ev = events(feed(c, ids, finish_reason::length), done);
  EXPECT_TRUE(done);
  EXPECT_TRUE(c.done());
  std::string text;
  ASSERT_GE(ev.size(), 3u);
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    const std::string piece = ev[i]["choices"][0]["text"];
    EXPECT_TRUE(valid_utf8(piece)) << "chunk " << i;
    text += piece;
    EXPECT_EQ(ev[i]["object"], "text_completion");
    EXPECT_EQ(ev[i]["id"], "cmpl-1");
  }
  EXPECT_EQ(text, want);
  EXPECT_EQ(ev[ev.size() - 2]["choices"][0]["finish_reason"], "length");
  // include_usage: a last chunk with empty choices and the counts.
  EXPECT_TRUE(ev.back()["choices"].empty());
  EXPECT_EQ(ev.back()["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(ev.back()["usage"]["completion_tokens"], ids.size());
}

TEST_F(CompletionStream, ChatChunksStartWithTheRoleAndEndOnEos) {
  const auto ids = tok_->encode("Fine, thanks.", false);
  one_choice c(setup(true, true), tok_->decoder());
  bool done = false;
  auto ev = events(feed(c, ids, finish_reason::eos), done);
  ASSERT_TRUE(done);
  EXPECT_EQ(ev[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (const auto& e : ev) text += e["choices"][0]["delta"].value("content", "");
  EXPECT_EQ(text, "Fine, thanks.");
  EXPECT_EQ(ev.back()["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(ev.back()["choices"][0]["stop_reason"].is_null());  // vLLM's: the model's own end names none
  for (size_t i = 1; i < ev.size(); ++i) {
    EXPECT_FALSE(ev[i]["choices"][0]["delta"].contains("role"));
    if (i + 1 < ev.size()) EXPECT_FALSE(ev[i]["choices"][0].contains("stop_reason"));  // only with the finish
  }
}

TEST_F(CompletionStream, StopStringsCutAcrossTokensAndAskForCancellation) {
  const auto ids = tok_->encode("one two three four five", false);
  for (bool streaming : {false, true}) {
    auto s = setup(false, streaming);
    s.stop = {"e fo"};  // straddles "three" and " four"
    one_choice c(s, tok_->decoder());
    std::string sse;
    for (int32_t t : ids) {
      sse += c.on_message(token_msg{1, t, finish_reason::none, false, {}, {}, {}});
      if (c.done()) break;
    }
    ASSERT_TRUE(c.done());
    EXPECT_TRUE(c.stopped_by_string());
    if (streaming) {
      bool done = false;
      auto ev = events(sse, done);
      EXPECT_TRUE(done);
      std::string text;
      for (const auto& e : ev) text += e["choices"][0]["text"];
      EXPECT_EQ(text, "one two thre");
      EXPECT_EQ(ev.back()["choices"][0]["finish_reason"], "stop");
      EXPECT_EQ(ev.back()["choices"][0]["stop_reason"], "e fo");  // vLLM's stop_reason: the string
      for (const auto& e : ev) EXPECT_TRUE(e["choices"][0].contains("stop_reason"));  // completions: on every chunk
    } else {
      auto j = json::parse(c.reply().body);
      EXPECT_EQ(j["choices"][0]["text"], "one two thre");
      EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
      EXPECT_EQ(j["choices"][0]["stop_reason"], "e fo");
    }
  }
}

// min_tokens (vLLM's): stop strings are not looked for in the text of the first min_tokens
// tokens, only from token min_tokens + 1 on (a match may begin in the earlier text); vLLM's own
// test of its detokenizer: " is Lee, and I'm a student..." with stop "e" gives " is L" without
// min_tokens, " is Lee, and I'm a stud" with 5.
TEST_F(CompletionStream, StopStringsWaitForMinTokens) {
  const std::string text = " is Lee, and I'm a student in the college of engineering";
  const auto ids = tok_->encode(text, false);
  ASSERT_GT(ids.size(), 8u);
  // Where the first 5 tokens' text ends: a match must end after it.
  const std::string first5 = tok_->decoder().decode(std::vector<int32_t>(ids.begin(), ids.begin() + 5));
  ASSERT_EQ(first5.find("e"), 5u) << first5;  // an "e" the stop would match without min_tokens
  const std::string want5 = text.substr(0, text.find('e', first5.size()));
  ASSERT_EQ(want5, " is Lee, and I'm a stud");
  struct expect_case {
    int min_tokens;
    std::vector<std::string> stop;
    std::string text, finish;
  };
  const expect_case cases[] = {
      {0, {"e"}, " is L", "stop"},
      {5, {"e"}, want5, "stop"},
      // A stop string that begins in the first min_tokens tokens' text and ends after it.
      {2, {"Lee, and"}, " is ", "stop"},
      // Longer than the whole text in tokens: never looked for, the generation runs to its length.
      {static_cast<int>(ids.size()), {"e"}, text, "length"},
  };
  for (bool streaming : {false, true}) {
    for (const auto& c : cases) {
      auto s = setup(false, streaming);
      s.stop = c.stop;
      s.min_tokens = c.min_tokens;
      one_choice cs(s, tok_->decoder());
      std::string sse;
      for (size_t i = 0; i < ids.size() && !cs.done(); ++i) {
        sse += cs.on_message(
            token_msg{1, ids[i], i + 1 == ids.size() ? finish_reason::length : finish_reason::none, false, {}, {}, {}});
      }
      ASSERT_TRUE(cs.done()) << c.min_tokens;
      EXPECT_EQ(cs.stopped_by_string(), c.finish == "stop") << c.min_tokens;
      std::string got, finish;
      if (streaming) {
        bool done = false;
        for (const auto& e : events(sse, done)) {
          got += e["choices"][0]["text"];
          if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
        }
        EXPECT_TRUE(done);
      } else {
        auto j = json::parse(cs.reply().body);
        got = j["choices"][0]["text"];
        finish = j["choices"][0]["finish_reason"];
      }
      EXPECT_EQ(got, c.text) << "min_tokens " << c.min_tokens << (streaming ? " streamed" : "");
      EXPECT_EQ(finish, c.finish) << "min_tokens " << c.min_tokens;
    }
  }
}

// A generation that ends on one of the request's stop_token_ids (the mesh reports it as an EOS
// finish): finish_reason "stop", the id in token_ids, its text not in the output (vLLM's
// default); an EOS-finished token that is not a requested stop id keeps its text.
TEST_F(CompletionStream, AStopTokenIdEndsTheTextBeforeItselfButStaysInTokenIds) {
  const auto ids = tok_->encode("one two three", false);
  ASSERT_GE(ids.size(), 3u);
  for (bool streaming : {false, true}) {
    auto s = setup(false, streaming);
    s.return_token_ids = true;
    s.stop_token_ids = {ids.back()};
    s.stop_reason_ids = {ids.back()};
    one_choice c(s, tok_->decoder());
    const std::string sse = feed(c, ids, finish_reason::eos);
    ASSERT_TRUE(c.done());
    EXPECT_FALSE(c.stopped_by_string());
    std::string text;
    std::vector<int32_t> token_ids;
    std::string finish;
    json stop_reason;
    if (streaming) {
      bool done = false;
      for (const auto& e : events(sse, done)) {
        text += e["choices"][0]["text"];
        for (int32_t t : e["choices"][0]["token_ids"]) token_ids.push_back(t);
        if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
        if (e["choices"][0].contains("stop_reason")) stop_reason = e["choices"][0]["stop_reason"];
      }
      EXPECT_TRUE(done);
    } else {
      auto j = json::parse(c.reply().body);
      text = j["choices"][0]["text"];
      token_ids = j["choices"][0]["token_ids"].get<std::vector<int32_t>>();
      finish = j["choices"][0]["finish_reason"];
      stop_reason = j["choices"][0]["stop_reason"];
    }
    EXPECT_EQ(stop_reason, ids.back());  // vLLM's stop_reason: the stop token's id
    EXPECT_EQ(text, "one two") << (streaming ? "streamed" : "whole");
    EXPECT_EQ(token_ids, ids);
    EXPECT_EQ(finish, "stop");
    EXPECT_EQ(c.completion_tokens(), ids.size());
  }
  // The same last token ending on EOS without being a requested stop id: its text stays.
  auto s = setup(false, false);
  s.stop_token_ids = {ids.front()};  // seen earlier without a finish: no effect there
  one_choice c(s, tok_->decoder());
  feed(c, ids, finish_reason::eos);
  EXPECT_EQ(json::parse(c.reply().body)["choices"][0]["text"], "one two three");
  EXPECT_TRUE(json::parse(c.reply().body)["choices"][0]["stop_reason"].is_null());
}

// vLLM's skip_special_tokens false: special tokens' text stays in the output, but the end token
// that stopped it is left out unless include_stop_str_in_output; return_tokens_as_token_ids
// names logprobs' tokens by id, their text offsets still the text's.
TEST_F(CompletionStream, SkipSpecialTokensFalseKeepsThemButNotTheEndAndTokensAsIdsNamesThem) {
  auto id_of = [&](const std::string& text) {
    const auto& d = tok_->decoder();
    for (size_t id = 0; id < d.vocab_size(); ++id) {
      if (d.token_bytes(static_cast<int32_t>(id)) == text) return static_cast<int32_t>(id);
    }
    return -1;
  };
  const int32_t header = id_of("<|start_header_id|>"), eot = id_of("<|eot_id|>");
  ASSERT_GE(header, 0);
  ASSERT_GE(eot, 0);
  ASSERT_TRUE(tok_->decoder().is_special(header) && tok_->decoder().is_special(eot));
  std::vector<int32_t> ids = tok_->encode("one two", false);
  ids.push_back(header);
  for (int32_t t : tok_->encode(" three", false)) ids.push_back(t);
  ids.push_back(eot);
  auto text_with = [&](bool skip, bool include_stop, bool streaming) {
    auto s = setup(false, streaming);
    s.skip_special = skip;
    s.include_stop_str = include_stop;
    one_choice c(s, tok_->decoder());
    const std::string sse = feed(c, ids, finish_reason::eos);
    if (!streaming) return json::parse(c.reply().body)["choices"][0]["text"].get<std::string>();
    bool done = false;
    std::string text;
    for (const auto& e : events(sse, done)) text += e["choices"][0]["text"];
    return text;
  };
  for (bool streaming : {false, true}) {
    EXPECT_EQ(text_with(true, false, streaming), "one two three");
    EXPECT_EQ(text_with(false, false, streaming), "one two<|start_header_id|> three");
    EXPECT_EQ(text_with(false, true, streaming), "one two<|start_header_id|> three<|eot_id|>");
    EXPECT_EQ(text_with(true, true, streaming), "one two three");  // skipped: no text to include
  }
  auto s = setup(false, false);
  s.logprobs = 1;
  s.tokens_as_ids = true;
  s.echo_logprobs = true;
  s.prompt_ids = tok_->encode("a b", false);
  one_choice c(s, tok_->decoder());
  const int32_t alt = tok_->encode(" four", false).at(0);
  const auto words = tok_->encode("one two", false);
  token_msg first = with_logprobs(words[0], 0, alt);
  first.prompt_logprobs = {kernels::token_logprobs{-1.0f, {{alt, -0.5f}}}};
  c.on_message(first);
  c.on_message(with_logprobs(words[1], 1, alt, finish_reason::length));
  auto j = json::parse(c.reply().body)["choices"][0]["logprobs"];
  const auto name = [](int32_t id) { return "token_id:" + std::to_string(id); };
  EXPECT_EQ(j["tokens"], json({name(s.prompt_ids[0]), name(s.prompt_ids[1]), name(words[0]), name(words[1])}));
  EXPECT_EQ(j["text_offset"], json({0, 1, 3, 6}));  // "a", " b", "one", " two"
  EXPECT_EQ(j["top_logprobs"][2], json({{name(words[0]), -0.25}, {name(alt), -0.5}}));
}

// vLLM's continuous_usage_stats: every chunk carries its choice's usage so far.
TEST_F(CompletionStream, ContinuousUsageStatsPutTheUsageSoFarOnEveryChunk) {
  auto s = setup(false, true);
  s.prompt_ids = tok_->encode("a b c", false);
  s.continuous_usage = true;
  one_choice c(s, tok_->decoder());
  const auto ids = tok_->encode(" one two three four", false);
  bool done = false;
  auto ev = events(feed(c, ids, finish_reason::length), done);
  ASSERT_FALSE(ev.empty());
  size_t last = 0;
  for (const auto& e : ev) {
    ASSERT_TRUE(e.contains("usage")) << e;
    EXPECT_EQ(e["usage"]["prompt_tokens"], s.prompt_ids.size());
    const size_t n = e["usage"]["completion_tokens"];
    EXPECT_GE(n, last);
    EXPECT_EQ(e["usage"]["total_tokens"], s.prompt_ids.size() + n);
    last = n;
  }
  EXPECT_EQ(last, ids.size());
  auto plain = setup(false, true);
  one_choice p(plain, tok_->decoder());
  for (const auto& e : events(feed(p, ids, finish_reason::length), done)) EXPECT_FALSE(e.contains("usage")) << e;
}

TEST_F(CompletionStream, WholeResponseCarriesUsageAndTokenIds) {
  const auto ids = tricky_ids();
  auto s = setup(false, false);
  s.return_token_ids = true;
  one_choice c(s, tok_->decoder());
  EXPECT_EQ(feed(c, ids, finish_reason::length), "");
  auto r = c.reply();
  EXPECT_EQ(r.status, 200);
  auto j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "Hi \xF0\x9F\x8E\x89 \xC3\xA9 ok");
  EXPECT_EQ(j["choices"][0]["token_ids"], ids);
  EXPECT_EQ(j["choices"][0]["prompt_token_ids"], (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(j["usage"]["total_tokens"], 3 + ids.size());
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());  // not asked for
}

// Completions, whole response: one logprobs object, each token's text, its value, a dict of
// the chosen token and its alternatives, and byte offsets into the text. A stop token id's
// entry stays (vLLM reports every generated token), though its text is left out.
TEST_F(CompletionStream, CompletionLogprobsInAWholeResponse) {
  const auto ids = tok_->encode("one two three", false);
  ASSERT_EQ(ids.size(), 3u);
  ASSERT_EQ(text_of(ids[1]), " two");
  const int32_t alt = tok_->encode(" four", false).at(0);
  auto s = setup(false, false);
  s.logprobs = 1;
  s.stop_token_ids = {ids[2]};
  one_choice c(s, tok_->decoder());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(c.on_message(with_logprobs(ids[i], i, alt, i == 2 ? finish_reason::eos : finish_reason::none)), "");
  }
  auto j = json::parse(c.reply().body);
  EXPECT_EQ(j["choices"][0]["text"], "one two");
  EXPECT_EQ(j["choices"][0]["logprobs"], json::parse(R"({
      "text_offset": [0, 3, 7],
      "token_logprobs": [-0.25, -0.5, -0.75],
      "tokens": ["one", " two", " three"],
      "top_logprobs": [{"one": -0.25, " four": -0.5}, {" two": -0.5, " four": -0.5},
                       {" three": -0.75, " four": -0.5}]})"));
}

// Chat, streamed: each chunk carries the entries of the tokens it reports. The four one-byte
// tokens of an emoji release no text until the last: their entries (text U+FFFD, the raw byte
// in "bytes") ride on the chunk that carries the character. Alternatives: the n asked for.
TEST_F(CompletionStream, ChatLogprobsRideOnTheChunkThatCarriesTheirText) {
  const auto ids = tricky_ids();  // "Hi", " ", F0 9F 8E 89, " ", C3 A9, " ok"
  ASSERT_EQ(ids.size(), 10u);
  const int32_t alt = tok_->encode("Hello", false).at(0);
  auto s = setup(true, true);
  s.logprobs = 1;  // the token itself, second in each hand-made top list, is left out
  one_choice c(s, tok_->decoder());
  std::vector<std::vector<json>> per_message;  // the chunks each message produced
  for (size_t i = 0; i < ids.size(); ++i) {
    const finish_reason f = i + 1 == ids.size() ? finish_reason::length : finish_reason::none;
    bool done = false;
    per_message.push_back(events(c.on_message(with_logprobs(ids[i], i, alt, f)), done));
  }
  // No chunk for 0xF0, 0x9F, 0x8E: their entries wait for 0x89's.
  for (size_t i : {2u, 3u, 4u, 7u}) EXPECT_TRUE(per_message[i].empty()) << i;
  ASSERT_EQ(per_message[5].size(), 1u);
  const json& emoji = per_message[5][0]["choices"][0];
  EXPECT_EQ(emoji["delta"]["content"], "\xF0\x9F\x8E\x89");
  ASSERT_EQ(emoji["logprobs"]["content"].size(), 4u);
  const unsigned char bytes[] = {0xF0, 0x9F, 0x8E, 0x89};
  for (size_t k = 0; k < 4; ++k) {
    const json& e = emoji["logprobs"]["content"][k];
    EXPECT_EQ(e["token"], "\xEF\xBF\xBD") << k;  // U+FFFD: a piece of a character
    EXPECT_EQ(e["bytes"], json::array({bytes[k]})) << k;
    EXPECT_EQ(e["logprob"], -0.25 * static_cast<double>(k + 3)) << k;
    EXPECT_EQ(e["top_logprobs"], json::parse(R"([{"token":"Hello","logprob":-0.5,"bytes":[72,101,108,108,111]}])"));
  }
  // The first chunk: the role, "Hi" and its entry; "é" likewise waits for its second byte.
  EXPECT_EQ(per_message[0][0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(per_message[0][0]["choices"][0]["logprobs"], json::parse(R"({"content":[{"token":"Hi","logprob":-0.25,
      "bytes":[72,105],"top_logprobs":[{"token":"Hello","logprob":-0.5,"bytes":[72,101,108,108,111]}]}]})"));
  EXPECT_EQ(per_message[8][0]["choices"][0]["logprobs"]["content"].size(), 2u);  // 0xC3 and 0xA9
  // Every token's entry exactly once, in order, the last on the final chunk.
  std::vector<double> values;
  for (const auto& chunks : per_message) {
    for (const auto& e : chunks) {
      if (e["choices"].empty()) continue;
      for (const auto& entry : e["choices"][0]["logprobs"]["content"]) values.push_back(entry["logprob"]);
    }
  }
  ASSERT_EQ(values.size(), ids.size());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(values[i], -0.25 * static_cast<double>(i + 1)) << i;
  EXPECT_EQ(per_message[9][0]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(per_message[9][0]["choices"][0]["logprobs"]["content"][0]["token"], " ok");
}

// A token whose text the stop matcher holds back (it could begin a stop string) reports its
// entry with the chunk that releases the text; tokens a stop string cut away are dropped.
TEST_F(CompletionStream, HeldBackTextDelaysItsLogprobsAndAStopStringDropsThem) {
  const auto ids = tok_->encode("one two three four five", false);
  ASSERT_EQ(ids.size(), 5u);
  const int32_t alt = tok_->encode("Hello", false).at(0);
  {  // " two" is all held (" two!" may follow), then released with " three".
    auto s = setup(false, true);
    s.logprobs = 0;
    s.stop = {" two!"};
    one_choice c(s, tok_->decoder());
    std::vector<std::vector<json>> per_message;
    for (size_t i = 0; i < 3; ++i) {
      const finish_reason f = i == 2 ? finish_reason::length : finish_reason::none;
      bool done = false;
      per_message.push_back(events(c.on_message(with_logprobs(ids[i], i, alt, f)), done));
    }
    ASSERT_EQ(per_message[0].size(), 1u);
    EXPECT_EQ(per_message[0][0]["choices"][0]["logprobs"], json::parse(R"({"text_offset":[0],"token_logprobs":[-0.25],
        "tokens":["one"],"top_logprobs":[{"one":-0.25}]})"));
    EXPECT_TRUE(per_message[1].empty());
    ASSERT_EQ(per_message[2].size(), 1u);
    EXPECT_EQ(per_message[2][0]["choices"][0]["text"], " two three");
    EXPECT_EQ(per_message[2][0]["choices"][0]["logprobs"], json::parse(R"({"text_offset":[3,7],
        "token_logprobs":[-0.5,-0.75],"tokens":[" two"," three"],"top_logprobs":[{" two":-0.5},{" three":-0.75}]})"));
  }
  // The stream ends while " two" is held: the end releases its text, and its entry with it.
  for (bool streaming : {false, true}) {
    auto s = setup(false, streaming);
    s.logprobs = 0;
    s.stop = {" two!"};
    one_choice c(s, tok_->decoder());
    std::string sse = c.on_message(with_logprobs(ids[0], 0, alt));
    sse += c.on_message(with_logprobs(ids[1], 1, alt, finish_reason::length));
    json lp;
    if (streaming) {
      bool done = false;
      auto ev = events(sse, done);
      ASSERT_EQ(ev.size(), 2u);
      EXPECT_EQ(ev[1]["choices"][0]["text"], " two");
      EXPECT_EQ(ev[1]["choices"][0]["logprobs"]["tokens"], json::parse(R"([" two"])"));
      lp = joined_completion_logprobs(ev);
    } else {
      lp = json::parse(c.reply().body)["choices"][0]["logprobs"];
    }
    EXPECT_EQ(lp, json::parse(R"({"text_offset":[0,3],"token_logprobs":[-0.25,-0.5],"tokens":["one"," two"],
        "top_logprobs":[{"one":-0.25},{" two":-0.5}]})"))
        << (streaming ? "streamed" : "whole");
  }
  // "e fo" straddles " three" and " four": " four" had none of its text sent and is dropped;
  // " three", partly sent, stays. Streamed and whole alike.
  for (bool streaming : {false, true}) {
    auto s = setup(false, streaming);
    s.logprobs = 0;
    s.stop = {"e fo"};
    one_choice c(s, tok_->decoder());
    std::string sse;
    for (size_t i = 0; i < ids.size() && !c.done(); ++i) sse += c.on_message(with_logprobs(ids[i], i, alt));
    ASSERT_TRUE(c.stopped_by_string());
    json lp;
    if (streaming) {
      bool done = false;
      auto ev = events(sse, done);
      EXPECT_TRUE(done);
      lp = joined_completion_logprobs(ev);
    } else {
      lp = json::parse(c.reply().body)["choices"][0]["logprobs"];
    }
    EXPECT_EQ(lp, json::parse(R"({"text_offset":[0,3,7],"token_logprobs":[-0.25,-0.5,-0.75],
        "tokens":["one"," two"," three"],"top_logprobs":[{"one":-0.25},{" two":-0.5},{" three":-0.75}]})"))
        << (streaming ? "streamed" : "whole");
  }
}

// OpenAI's echo (stream_setup::echo_prefix): the choice's text begins with the prompt's text,
// streamed on the first chunk (the final one when it is also the first); stop strings are not
// looked for in it, only in the generated text.
TEST_F(CompletionStream, TheEchoPrefixLeadsTheTextOnTheFirstChunkAndHoldsNoStopString) {
  const auto ids = tok_->encode(" one two", false);
  ASSERT_EQ(ids.size(), 2u);
  for (bool streaming : {false, true}) {
    auto s = setup(false, streaming);
    s.echo_prefix = "Count: two,";
    s.stop = {"two"};
    one_choice c(s, tok_->decoder());
    const std::string sse = feed(c, ids, finish_reason::length);
    ASSERT_TRUE(c.done());
    EXPECT_TRUE(c.stopped_by_string());
    if (streaming) {
      bool done = false;
      auto ev = events(sse, done);
      ASSERT_EQ(ev.size(), 2u) << sse;
      EXPECT_EQ(ev[0]["choices"][0]["text"], "Count: two, one");
      EXPECT_EQ(ev[1]["choices"][0]["text"], " ");
      EXPECT_EQ(ev[1]["choices"][0]["finish_reason"], "stop");
    } else {
      auto j = json::parse(c.reply().body);
      EXPECT_EQ(j["choices"][0]["text"], "Count: two, one ");
      EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
      EXPECT_EQ(j["usage"]["completion_tokens"], 2);
    }
  }
  // One token, first and last: the prefix rides on the final chunk.
  auto s = setup(false, true);
  s.echo_prefix = "Count:";
  one_choice c(s, tok_->decoder());
  bool done = false;
  auto ev = events(feed(c, {ids[0]}, finish_reason::length), done);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["choices"][0]["text"], "Count: one");
  EXPECT_EQ(ev[0]["choices"][0]["finish_reason"], "length");
}

// Echo with logprobs: the prompt's tokens lead the entries (the first null, with null
// alternatives; offsets summing the prompt tokens' texts from 0), then the generated ones with
// offsets after the echoed text; streamed, the prompt's entries ride on the first chunk.
TEST_F(CompletionStream, EchoWithLogprobsLeadsWithThePromptsScoredTokens) {
  const auto prompt = tok_->encode("Count: one", false);
  const auto out = tok_->encode(" two", false);
  ASSERT_GE(prompt.size(), 2u);
  ASSERT_EQ(out.size(), 1u);
  for (bool streaming : {false, true}) {
    auto s = setup(false, streaming);
    s.prompt_ids = prompt;
    // Not the prompt tokens' texts (as with a BOS token's): offsets still run on from them.
    s.echo_prefix = "Count:one";
    s.echo_logprobs = true;
    s.logprobs = 1;
    one_choice c(s, tok_->decoder());
    token_msg t;
    t.id = 1;
    t.token = out[0];
    t.finish = finish_reason::length;
    t.logprobs = kernels::token_logprobs{-0.5f, {{out[0], -0.5f}}};
    for (size_t i = 1; i < prompt.size(); ++i) {
      t.prompt_logprobs.push_back({-1.0f - static_cast<float>(i), {{prompt[i], -1.0f - static_cast<float>(i)}}});
    }
    const std::string sse = c.on_message(t);
    json lp;
    if (streaming) {
      bool done = false;
      auto ev = events(sse, done);
      ASSERT_EQ(ev.size(), 1u) << sse;
      lp = ev[0]["choices"][0]["logprobs"];
    } else {
      lp = json::parse(c.reply().body)["choices"][0]["logprobs"];
    }
    ASSERT_EQ(lp["tokens"].size(), prompt.size() + 1) << lp;
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    size_t offset = 0;
    for (size_t i = 0; i < prompt.size(); ++i) {
      EXPECT_EQ(lp["text_offset"][i], offset) << i;
      const std::string piece = lp["tokens"][i];
      EXPECT_EQ(piece, tok_->decoder().token_bytes(prompt[i]));
      offset += piece.size();
      if (i == 0) continue;
      EXPECT_EQ(lp["token_logprobs"][i], -1.0 - static_cast<double>(i));
      EXPECT_EQ(lp["top_logprobs"][i], (json{{piece, -1.0 - static_cast<double>(i)}}));
    }
    EXPECT_EQ(lp["text_offset"][prompt.size()], offset);  // the prompt tokens' texts, then its own
    EXPECT_EQ(lp["tokens"][prompt.size()], " two");
    EXPECT_EQ(lp["token_logprobs"][prompt.size()], -0.5);
  }
}

TEST_F(CompletionStream, FailuresBecomeHttpErrorsOrAnErrorEvent) {
  {  // before anything was sent: an HTTP error
    one_choice c(setup(false, true), tok_->decoder());
    EXPECT_EQ(c.on_message(token_msg{1, -1, finish_reason::none, true,
                                     make_error(errc::replica_unavailable, "no replica"), {}, {}}),
              "");
    EXPECT_TRUE(c.done());
    EXPECT_FALSE(c.started());
    EXPECT_EQ(c.reply().status, 503);
  }
  {  // mid-stream: the status is committed, the error is an event, then [DONE]
    one_choice c(setup(false, true), tok_->decoder());
    EXPECT_NE(c.on_message(token_msg{1, tok_->encode("Hi", false)[0], finish_reason::none, false, {}, {}, {}}), "");
    const std::string tail = c.on_message(token_msg{1, -1, finish_reason::none, true, make_error(errc::internal, "boom"), {}, {}});
    bool done = false;
    auto ev = events(tail, done);
    EXPECT_TRUE(done);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0]["error"]["message"], "boom");
  }
}

}  // namespace
}  // namespace llmesh::gateway
