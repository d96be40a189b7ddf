// completion_group: the choices of one response (prompts × n generations), fed fabricated
// token messages as the mesh sends them. Non-streamed: every choice in index order, usage
// summed with each prompt counted once. Streamed: chunks interleave as tokens arrive, each
// with its choice's index and its own finish chunk, then one usage chunk and one [DONE] at
// the very end. A failure before anything was sent is the reply; mid-stream it is an event;
// either way the other choices are cancelled, and a stop string cancels only its own choice.
#include <gtest/gtest.h>

#include <map>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/completion_group.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;
using actors::finish_reason;
using actors::token_msg;

class CompletionGroup : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
    ASSERT_TRUE(t.ok()) << t.err().message;
    tok_ = *t;
  }
  static group_setup setup(bool chat, bool streaming, size_t n) {
    group_setup g;
    g.chat = chat;
    g.streaming = streaming;
    g.id = "cmpl-g";
    g.created = 7;
    g.model = "m";
    g.n = n;
    return g;
  }
  /// A choice's setup: its prompt and token ids asked for.
  static stream_setup choice(std::vector<int32_t> prompt) {
    stream_setup s;
    s.prompt_ids = std::move(prompt);
    s.return_token_ids = true;
    return s;
  }
  static token_msg tok(uint64_t id, int32_t t, finish_reason f = finish_reason::none) {
    token_msg m;
    m.id = id;
    m.token = t;
    m.finish = f;
    return m;
  }
  static token_msg failed(uint64_t id, errc code, const std::string& msg) {
    token_msg m;
    m.id = id;
    m.failed = true;
    m.err = make_error(code, msg);
    return m;
  }
  /// The events of an SSE body; `done` counts the [DONE] events (and must be the last).
  static std::vector<json> events(const std::string& sse, int& done) {
    std::vector<json> out;
    done = 0;
    for (size_t pos = 0; (pos = sse.find("data: ", pos)) != std::string::npos;) {
      const size_t end = sse.find("\n\n", pos);
      const std::string payload = sse.substr(pos + 6, end - pos - 6);
      if (payload == "[DONE]") {
        ++done;
        EXPECT_EQ(end + 2, sse.size()) << "[DONE] is not the last event";
      } else {
        out.push_back(json::parse(payload));
      }
      pos = end + 2;
    }
    return out;
  }
  std::vector<int32_t> ids(const std::string& text) const { return tok_->encode(text, false); }

  static inline std::shared_ptr<const model::tokenizer> tok_;
};

TEST_F(CompletionGroup, AWholeResponseHoldsEveryChoiceInIndexOrderWithUsageSummedOncePerPrompt) {
  // Two prompts × n = 2: choices 0, 1 of prompt A (3 tokens), 2, 3 of prompt B (2 tokens).
  completion_group g(setup(false, false, 2), tok_->decoder(), nullptr);
  const std::vector<int32_t> a{1, 2, 3}, b{4, 5};
  for (uint64_t id : {10u, 11u}) g.add_choice(id, choice(a));
  for (uint64_t id : {12u, 13u}) g.add_choice(id, choice(b));
  const auto x = ids(" the LORD"), y = ids(" and"), z = ids(" said unto");
  ASSERT_EQ(x.size(), 2u);
  ASSERT_EQ(y.size(), 1u);
  ASSERT_EQ(z.size(), 2u);
  // The last choice ends first; each message carries its request's id.
  EXPECT_EQ(g.on_message(tok(13, y[0], finish_reason::eos)), "");
  EXPECT_EQ(g.on_message(tok(10, x[0])), "");
  EXPECT_EQ(g.on_message(tok(12, z[0])), "");
  EXPECT_EQ(g.on_message(tok(99, y[0])), "");  // not one of its requests: ignored
  EXPECT_EQ(g.on_message(tok(10, x[1], finish_reason::length)), "");
  EXPECT_EQ(g.on_message(tok(11, y[0], finish_reason::length)), "");
  EXPECT_FALSE(g.done());
  EXPECT_EQ(g.on_message(tok(12, z[1], finish_reason::length)), "");
  ASSERT_TRUE(g.done());
  EXPECT_TRUE(g.take_cancellations().empty());
  const http_reply r = g.reply();
  EXPECT_EQ(r.status, 200);
  auto want = json::parse(R"({"id":"cmpl-g","object":"text_completion","created":7,"model":"m","choices":[
      {"index":0,"text":" the LORD","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[],"prompt_token_ids":[1,2,3]},
      {"index":1,"text":" and","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[],"prompt_token_ids":[1,2,3]},
      {"index":2,"text":" said unto","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[],"prompt_token_ids":[4,5]},
      {"index":3,"text":" and","logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[],"prompt_token_ids":[4,5]}],
      "usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}})");
  want["choices"][0]["token_ids"] = x;
  want["choices"][1]["token_ids"] = y;
  want["choices"][2]["token_ids"] = z;
  want["choices"][3]["token_ids"] = y;
  EXPECT_EQ(json::parse(r.body), want);
  // Messages after the end change nothing.
  EXPECT_EQ(g.on_message(tok(11, y[0])), "");
  EXPECT_EQ(json::parse(g.reply().body), want);
}

TEST_F(CompletionGroup, StreamedChunksInterleaveAndTheUsageChunkAndDoneComeOnceAtTheEnd) {
  auto gs = setup(false, true, 2);
  gs.include_usage = true;
  completion_group g(gs, tok_->decoder(), nullptr);
  g.add_choice(20, choice({1, 2}));
  g.add_choice(21, choice({1, 2}));
  const auto a = ids(" the LORD God"), b = ids(" and he said");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  // Tokens arrive interleaved; choice 1 ends before choice 0.
  const std::vector<token_msg> msgs{tok(20, a[0]), tok(21, b[0]), tok(21, b[1]), tok(20, a[1]),
                                    tok(21, b[2], finish_reason::eos), tok(20, a[2], finish_reason::length)};
  std::string sse;
  std::vector<size_t> order;  // the index of each choice chunk, in the order sent
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string out = g.on_message(msgs[i]);
    if (i + 1 < msgs.size()) {
      EXPECT_FALSE(g.done());
      EXPECT_EQ(out.find("[DONE]"), std::string::npos) << i;
      EXPECT_EQ(out.find("\"usage\""), std::string::npos) << i;
    }
    sse += out;
  }
  ASSERT_TRUE(g.done());
  EXPECT_TRUE(g.started());
  int done = 0;
  const auto ev = events(sse, done);
  EXPECT_EQ(done, 1);
  ASSERT_EQ(ev.size(), 7u);  // a chunk per message (each has text), then the usage chunk
  std::map<size_t, std::string> text;
  std::map<size_t, std::vector<int32_t>> token_ids;
  std::map<size_t, int> finishes;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    ASSERT_EQ(ev[i]["choices"].size(), 1u);
    const json& c = ev[i]["choices"][0];
    const size_t index = c["index"];
    order.push_back(index);
    EXPECT_EQ(finishes[index], 0) << "a chunk of choice " << index << " after its finish";
    text[index] += c["text"].get<std::string>();
    for (int32_t t : c["token_ids"]) token_ids[index].push_back(t);
    if (!c["finish_reason"].is_null()) ++finishes[index];
    EXPECT_EQ(c.contains("prompt_token_ids"), index == 0 ? i == 0 : i == 1) << i;  // with the first chunk only
  }
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 1, 0, 1, 0}));
  EXPECT_EQ(text, (std::map<size_t, std::string>{{0, " the LORD God"}, {1, " and he said"}}));
  EXPECT_EQ(token_ids[0], a);
  EXPECT_EQ(token_ids[1], b);
  EXPECT_EQ(finishes, (std::map<size_t, int>{{0, 1}, {1, 1}}));
  EXPECT_EQ(ev[4]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(ev[5]["choices"][0]["finish_reason"], "length");
  // The usage chunk: empty choices, the sums (the one prompt counted once).
  EXPECT_EQ(ev[6], json::parse(R"({"id":"cmpl-g","object":"text_completion","created":7,"model":"m","choices":[],
      "usage":{"prompt_tokens":2,"completion_tokens":6,"total_tokens":8}})"));
}

TEST_F(CompletionGroup, EachChatChoiceStartsWithTheRole) {
  completion_group g(setup(true, true, 3), tok_->decoder(), nullptr);
  for (uint64_t id : {1u, 2u, 3u}) g.add_choice(id, stream_setup{});
  const auto t = ids(" yea");
  ASSERT_EQ(t.size(), 1u);
  std::string sse;
  for (uint64_t id : {2u, 1u, 3u}) sse += g.on_message(tok(id, t[0]));
  for (uint64_t id : {3u, 2u, 1u}) sse += g.on_message(tok(id, t[0], finish_reason::length));
  int done = 0;
  const auto ev = events(sse, done);
  EXPECT_EQ(done, 1);
  ASSERT_EQ(ev.size(), 6u);  // no usage chunk: not asked for
  std::vector<size_t> with_role;
  for (const auto& e : ev) {
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_EQ(e["choices"][0]["delta"]["content"], " yea");
    if (e["choices"][0]["delta"].contains("role")) with_role.push_back(e["choices"][0]["index"]);
  }
  EXPECT_EQ(with_role, (std::vector<size_t>{1, 0, 2}));
}

TEST_F(CompletionGroup, AFailureBeforeAnythingWasSentIsTheReplyAndCancelsTheOthers) {
  {  // non-streamed: any failure, whatever the other choices did
    completion_group g(setup(false, false, 3), tok_->decoder(), nullptr);
    for (uint64_t id : {5u, 6u, 7u}) g.add_choice(id, choice({1}));
    const auto t = ids(" and");
    EXPECT_EQ(g.on_message(tok(7, t[0], finish_reason::length)), "");
    EXPECT_EQ(g.on_message(tok(5, t[0])), "");
    EXPECT_EQ(g.on_message(failed(6, errc::replica_unavailable, "no replica")), "");
    ASSERT_TRUE(g.done());
    EXPECT_FALSE(g.started());
    EXPECT_EQ(g.take_cancellations(), (std::vector<uint64_t>{5}));  // 7 ended, 6 failed on its own
    EXPECT_TRUE(g.take_cancellations().empty());                     // handed out once
    const http_reply r = g.reply();
    EXPECT_EQ(r.status, 503);
    EXPECT_EQ(json::parse(r.body)["error"]["message"], "no replica");
    EXPECT_EQ(g.on_message(tok(5, t[0])), "");  // after the end: ignored
  }
  // Streamed, nothing produced yet: the same error reply, no stream.
  completion_group g(setup(false, true, 2), tok_->decoder(), nullptr);
  g.add_choice(1, choice({1}));
  g.add_choice(2, choice({1}));
  EXPECT_EQ(g.on_message(failed(2, errc::overloaded, "full")), "");
  ASSERT_TRUE(g.done());
  EXPECT_FALSE(g.started());
  EXPECT_EQ(g.take_cancellations(), (std::vector<uint64_t>{1}));
  EXPECT_EQ(g.reply().status, 429);
}

TEST_F(CompletionGroup, AMidStreamFailureIsAnErrorEventThenDoneOnce) {
  completion_group g(setup(false, true, 2), tok_->decoder(), nullptr);
  g.add_choice(1, choice({1}));
  g.add_choice(2, choice({1}));
  const auto t = ids(" and");
  EXPECT_NE(g.on_message(tok(1, t[0])), "");
  const std::string tail = g.on_message(failed(2, errc::internal, "boom"));
  ASSERT_TRUE(g.done());
  int done = 0;
  const auto ev = events(tail, done);
  EXPECT_EQ(done, 1);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["error"]["message"], "boom");
  EXPECT_EQ(g.take_cancellations(), (std::vector<uint64_t>{1}));
  EXPECT_EQ(g.on_message(tok(1, t[0], finish_reason::length)), "");  // nothing after [DONE]
}

TEST_F(CompletionGroup, AStopStringEndsAndCancelsOnlyItsOwnChoice) {
  completion_group g(setup(false, true, 2), tok_->decoder(), nullptr);
  stream_setup s = choice({1});
  s.stop = {" LORD"};
  g.add_choice(1, s);
  g.add_choice(2, s);
  const auto a = ids(" the LORD God"), b = ids(" and he said");
  std::string sse = g.on_message(tok(1, a[0]));
  sse += g.on_message(tok(2, b[0]));
  sse += g.on_message(tok(1, a[1]));  // " LORD": choice 0 ends here
  EXPECT_EQ(g.take_cancellations(), (std::vector<uint64_t>{1}));
  EXPECT_FALSE(g.done());
  sse += g.on_message(tok(2, b[1]));
  sse += g.on_message(tok(2, b[2], finish_reason::length));
  ASSERT_TRUE(g.done());
  EXPECT_TRUE(g.take_cancellations().empty());
  int done = 0;
  const auto ev = events(sse, done);
  EXPECT_EQ(done, 1);
  std::map<size_t, std::string> text, finish;
  for (const auto& e : ev) {
    const json& c = e["choices"][0];
    text[c["index"]] += c["text"].get<std::string>();
    if (!c["finish_reason"].is_null()) finish[c["index"]] = c["finish_reason"];
  }
  EXPECT_EQ(text, (std::map<size_t, std::string>{{0, " the"}, {1, " and he said"}}));
  EXPECT_EQ(finish, (std::map<size_t, std::string>{{0, "stop"}, {1, "length"}}));
}

// best_of (not streamed): each prompt's candidates ranked by the sum of their tokens'
// log-probabilities; the best n returned, best first, numbered prompt * n + rank (ties: the
// lower candidate first); usage counts every candidate; logprobs shown only when asked for.
TEST_F(CompletionGroup, BestOfReturnsEachPromptsTopNByCumulativeLogprob) {
  const std::vector<std::string> words{" the", " and", " said", " LORD", " God", " unto"};
  // Candidate k's two tokens: its word twice, with these log-probabilities.
  const std::vector<std::pair<float, float>> lps{{-1.0f, -2.0f}, {-0.5f, -0.5f}, {-0.25f, -0.75f},   // prompt A
                                                 {-0.25f, -0.25f}, {-2.0f, -2.0f}, {-0.5f, -0.25f}};  // prompt B
  for (int shown : {-1, 0}) {
    auto gs = setup(false, false, 2);
    gs.best_of = 3;
    completion_group g(gs, tok_->decoder(), nullptr);
    for (uint64_t k = 0; k < 6; ++k) {
      stream_setup s = choice(k < 3 ? std::vector<int32_t>{1, 2} : std::vector<int32_t>{3});
      s.return_token_ids = false;
      s.logprobs = shown;
      g.add_choice(100 + k, s);
    }
    for (size_t step = 0; step < 2; ++step) {
      for (uint64_t k : {5u, 0u, 3u, 1u, 4u, 2u}) {
        const auto w = ids(words[k]);
        ASSERT_EQ(w.size(), 1u) << words[k];
        token_msg m = tok(100 + k, w[0], step == 1 ? finish_reason::length : finish_reason::none);
        m.logprobs = kernels::token_logprobs{step == 0 ? lps[k].first : lps[k].second, {}};
        EXPECT_EQ(g.on_message(m), "");
      }
    }
    ASSERT_TRUE(g.done());
    const auto j = json::parse(g.reply().body);
    std::vector<std::pair<size_t, std::string>> got;
    for (const auto& c : j["choices"]) got.emplace_back(c["index"], c["text"]);
    // A: candidates 1 and 2 tie at -1.0 (1 first), 0 at -3.0 is dropped; B: 3 (-0.5), 5 (-0.75).
    EXPECT_EQ(got, (std::vector<std::pair<size_t, std::string>>{
                       {0, " and and"}, {1, " said said"}, {2, " LORD LORD"}, {3, " unto unto"}}));
    EXPECT_EQ(j["usage"], json::parse(R"({"prompt_tokens":3,"completion_tokens":12,"total_tokens":15})"));
    if (shown < 0) {
      EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
    } else {
      EXPECT_EQ(j["choices"][0]["logprobs"]["token_logprobs"], json::parse("[-0.5,-0.5]"));
      EXPECT_EQ(j["choices"][3]["logprobs"]["token_logprobs"], json::parse("[-0.5,-0.25]"));
    }
  }
}

}  // namespace
}  // namespace llmesh::gateway
