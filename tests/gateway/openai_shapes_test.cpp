// The OpenAI response shapes the gateway writes, read back as JSON: errors and their statuses,
// responses and SSE chunks, logprobs per endpoint. (openai_api_test.cpp: request parsing.)
#include <gtest/gtest.h>

#include <limits>

#include "llmesh/gateway/openai_api.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;

TEST(OpenaiApi, ErrorsMapToStatusesAndShapes) {
  EXPECT_EQ(http_error_of(errc::invalid_request).status, 400);
  EXPECT_EQ(http_error_of(errc::unauthorized).status, 401);
  EXPECT_EQ(http_error_of(errc::not_found).status, 404);
  EXPECT_EQ(http_error_of(errc::overloaded).status, 429);
  EXPECT_EQ(http_error_of(errc::replica_unavailable).status, 503);
  EXPECT_EQ(http_error_of(errc::internal).status, 500);
  auto j = json::parse(error_json(make_error(errc::invalid_request, "bad \xff field")));
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["code"], "invalid_request");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("bad"), std::string::npos);
}

TEST(OpenaiApi, ResponsesAndChunksHaveOpenaisShape) {
  choice_delta c;
  c.text = "Hi there";
  c.finish = "length";
  c.with_token_ids = true;
  c.token_ids = {5, 6};
  c.prompt_token_ids = {1, 2};
  auto r = json::parse(response_json("text_completion", "cmpl-1", 123, "m", {c}, {3, 2}));
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], "Hi there");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["choices"][0]["token_ids"], json({5, 6}));
  EXPECT_EQ(r["choices"][0]["prompt_token_ids"], json({1, 2}));
  EXPECT_EQ(r["usage"]["total_tokens"], 5);
  choice_delta first;
  first.role = true;
  auto ch = json::parse(chunk_json("chat.completion.chunk", "chatcmpl-1", 123, "m", first));
  EXPECT_EQ(ch["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(ch["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(ch.contains("usage"));
  auto u = json::parse(usage_chunk_json("chat.completion.chunk", "chatcmpl-1", 123, "m", {4, 1}));
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["completion_tokens"], 1);
  auto chat = json::parse(response_json("chat.completion", "chatcmpl-2", 1, "m", {c}, {1, 1}));
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "Hi there");
  EXPECT_EQ(sse_event("{}"), "data: {}\n\n");
  // Without logprobs asked for: null, as before.
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(ch["choices"][0]["logprobs"].is_null());
}

// The two logprobs shapes, value for value: completions' legacy lists (top_logprobs dicts hold
// the chosen token first, then the alternatives), chat's content entries with raw bytes; -inf
// as -9999.0, NaN as null, floats in their shortest form.
TEST(OpenaiApi, LogprobsRenderInTheShapeOfEachEndpoint) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  choice_delta c;
  c.text = "Hi \xF0\x9F";
  c.finish = "stop";
  c.logprobs = std::vector<logprob_entry>{
      {{"Hi", "Hi", -0.1f}, {{"Hi", "Hi", -0.1f}, {"Hello", "Hello", -2.5f}}, 0},
      {{" ", " ", -inf}, {{"!", "!", -0.25f}, {"\xEF\xBF\xBD", "\xF0", -12000.0f}}, 2},
      {{"x", "x", nan}, {}, 3},
  };
  auto r = json::parse(response_json("text_completion", "cmpl-1", 1, "m", {c}, {1, 3}));
  EXPECT_EQ(r["choices"][0]["logprobs"], json::parse(R"({
      "text_offset": [0, 2, 3],
      "token_logprobs": [-0.1, -9999.0, null],
      "tokens": ["Hi", " ", "x"],
      "top_logprobs": [{"Hi": -0.1, "Hello": -2.5}, {" ": -9999.0, "!": -0.25, "\ufffd": -9999.0}, {"x": null}]})"));
  // The text as sent: the key order (chosen first) and the shortest float forms.
  const std::string body = response_json("text_completion", "cmpl-1", 1, "m", {c}, {1, 3});
  EXPECT_NE(body.find(R"("top_logprobs":[{"Hi":-0.1,"Hello":-2.5},{" ":-9999.0,"!":-0.25,)"), std::string::npos)
      << body;
  auto chat = json::parse(chunk_json("chat.completion.chunk", "chatcmpl-1", 1, "m", c));
  EXPECT_EQ(chat["choices"][0]["logprobs"], json::parse(R"({"content": [
      {"token": "Hi", "logprob": -0.1, "bytes": [72, 105],
       "top_logprobs": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105]},
                        {"token": "Hello", "logprob": -2.5, "bytes": [72, 101, 108, 108, 111]}]},
      {"token": " ", "logprob": -9999.0, "bytes": [32],
       "top_logprobs": [{"token": "!", "logprob": -0.25, "bytes": [33]},
                        {"token": "\ufffd", "logprob": -9999.0, "bytes": [240]}]},
      {"token": "x", "logprob": null, "bytes": [120], "top_logprobs": []}]})"));
  // Asked for, none ready in this chunk: the empty shape, not null.
  choice_delta empty;
  empty.logprobs.emplace();
  EXPECT_EQ(json::parse(chunk_json("text_completion", "cmpl-1", 1, "m", empty))["choices"][0]["logprobs"],
            json::parse(R"({"text_offset":[],"token_logprobs":[],"tokens":[],"top_logprobs":[]})"));
  EXPECT_EQ(json::parse(chunk_json("chat.completion.chunk", "c", 1, "m", empty))["choices"][0]["logprobs"],
            json::parse(R"({"content":[]})"));
}

}  // namespace
}  // namespace llmesh::gateway

namespace llmesh::gateway {
namespace {

// vLLM's prompt_logprobs: parsed on both endpoints (0..20; true and false as 1 and none), never
// streamed; rendered per choice on completions and once on a chat response, each entry
// {id: {logprob, rank, decoded_token}} after a null first entry.
TEST(OpenaiApi, PromptLogprobsAreParsedAndRenderedAsVllmDoes) {
  request_limits lim;
  for (const auto& [field, want] : std::vector<std::pair<std::string, int>>{
           {"null", -1}, {"false", -1}, {"true", 1}, {"0", 0}, {"5", 5}, {"20", 20}}) {
    auto r = parse_completion_request(R"({"model":"m","prompt":"x","prompt_logprobs":)" + field + "}", lim);
    ASSERT_TRUE(r.ok()) << field << " -> " << r.err().message;
    EXPECT_EQ(r->gen.prompt_logprobs_shown, want) << field;
    EXPECT_EQ(r->gen.prompt_logprobs, -1) << "echo's scoring is separate";
    auto c = parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"Hi"}],"prompt_logprobs":)" + field + "}", lim);
    ASSERT_TRUE(c.ok()) << field << " -> " << c.err().message;
    EXPECT_EQ(c->gen.prompt_logprobs_shown, want) << field;
  }
  for (const std::string field : {"-1", "21", "\"2\"", "1.5"}) {
    auto r = parse_completion_request(R"({"model":"m","prompt":"x","prompt_logprobs":)" + field + "}", lim);
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_NE(r.err().message.find("'prompt_logprobs' must be an integer between 0 and 20"), std::string::npos) << r.err().message;
  }
  auto s = parse_completion_request(R"({"model":"m","prompt":"x","prompt_logprobs":1,"stream":true})", lim);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("cannot be streamed"), std::string::npos) << s.err().message;

  choice_delta c;
  c.text = "ok";
  c.finish = "length";
  c.prompt_logprobs = std::vector<prompt_logprob_entry>{
      std::nullopt, std::vector<prompt_logprob_item>{{7, -0.25f, 1, "a"}, {9, -2.5f, 2, "b"}}};
  auto r = json::parse(response_json("text_completion", "cmpl-1", 1, "m", {c}, {2, 1}));
  const json want = json::array({nullptr,
                                 {{"7", {{"logprob", -0.25}, {"rank", 1}, {"decoded_token", "a"}}},
                                  {"9", {{"logprob", -2.5}, {"rank", 2}, {"decoded_token", "b"}}}}});
  EXPECT_EQ(r["choices"][0]["prompt_logprobs"], want) << r;
  EXPECT_FALSE(r.contains("prompt_logprobs"));
  auto chat = json::parse(response_json("chat.completion", "chatcmpl-1", 1, "m", {c, c}, {2, 1}));
  EXPECT_EQ(chat["prompt_logprobs"], want) << chat;
  EXPECT_FALSE(chat["choices"][0].contains("prompt_logprobs")) << chat;
  c.prompt_logprobs.reset();
  EXPECT_FALSE(json::parse(response_json("text_completion", "cmpl-1", 1, "m", {c}, {2, 1}))["choices"][0].contains("prompt_logprobs"));
}

}  // namespace
}  // namespace llmesh::gateway

namespace llmesh::gateway {
namespace {

// vLLM's sampling extras: include_stop_str_in_output, truncate_prompt_tokens and
// allowed_token_ids are served;
// the ones this server does not implement pass only with their neutral values.
TEST(OpenaiApi, VllmSamplingExtrasAreParsedOrRefusedByName) {
  request_limits lim;
  auto parse = [&](const std::string& fields) {
    return parse_completion_request(R"({"model":"m","prompt":"x",)" + fields + "}", lim);
  };
  auto ok = parse(R"("include_stop_str_in_output":true,"truncate_prompt_tokens":7)");
  ASSERT_TRUE(ok.ok()) << ok.err().message;
  EXPECT_TRUE(ok->gen.include_stop_str);
  EXPECT_EQ(ok->gen.truncate_prompt_tokens, 7);
  auto allowed = parse(R"("allowed_token_ids":[9,5,9])");
  ASSERT_TRUE(allowed.ok()) << allowed.err().message;
  EXPECT_EQ(allowed->gen.allowed_ids, (std::vector<int32_t>{5, 9})) << "a set: sorted, each id once";
  for (const std::string bad : {"[-1]", "[\"5\"]", "5", "[1.5]"}) {
    auto r = parse(R"("allowed_token_ids":)" + bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.err().message.find("'allowed_token_ids'"), std::string::npos) << r.err().message;
  }
  auto whole = parse(R"("truncate_prompt_tokens":-1)");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->gen.truncate_prompt_tokens, -1);
  auto none = parse(R"("include_stop_str_in_output":null,"truncate_prompt_tokens":null)");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->gen.include_stop_str);
  EXPECT_EQ(none->gen.truncate_prompt_tokens, 0);
  for (const std::string bad : {"0", "-2", "\"5\""}) {
    auto r = parse(R"("truncate_prompt_tokens":)" + bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.err().message.find("'truncate_prompt_tokens'"), std::string::npos) << r.err().message;
  }
  for (const std::string neutral : {R"("use_beam_search":false)", R"("skip_special_tokens":true)", R"("allowed_token_ids":[])",
                                    R"("bad_words":null)", R"("use_beam_search":null)"}) {
    EXPECT_TRUE(parse(neutral).ok()) << neutral;
  }
  auto continuous = parse(R"("stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true})");
  ASSERT_TRUE(continuous.ok());
  EXPECT_TRUE(continuous->gen.continuous_usage);
  auto without = parse(R"("stream":true,"stream_options":{"continuous_usage_stats":true})");
  ASSERT_TRUE(without.ok());
  EXPECT_FALSE(without->gen.continuous_usage);  // vLLM's rule: only with include_usage
  EXPECT_FALSE(parse(R"("stream_options":{"continuous_usage_stats":1})").ok());
  auto use_beam = parse(R"("use_beam_search":true,"n":3,"length_penalty":0.5)");
  ASSERT_TRUE(use_beam.ok()) << use_beam.err().message;
  EXPECT_TRUE(use_beam->gen.beam_search);
  EXPECT_EQ(use_beam->gen.n, 3u);
  EXPECT_DOUBLE_EQ(use_beam->gen.length_penalty, 0.5);
  EXPECT_FALSE(parse(R"("n":2)")->gen.beam_search);
  EXPECT_TRUE(parse(R"("use_beam_search":true,"stream":true)").ok());  // streamed once the search ends
  EXPECT_DOUBLE_EQ(parse(R"("n":2)")->gen.length_penalty, 1.0);
  for (const auto& [field, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"("use_beam_search":true,"n":11)", "'n' must be at most 10 with 'use_beam_search'"},
           {R"("use_beam_search":true,"best_of":2)", "'use_beam_search' cannot be combined with 'best_of'"},
           {R"("use_beam_search":"yes")", "'use_beam_search' must be true or false"},
           {R"("length_penalty":"x")", "'length_penalty'"}}) {
    auto r = parse(field);
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_NE(r.err().message.find(needle), std::string::npos) << r.err().message;
  }
  auto kept = parse(R"("skip_special_tokens":false,"return_tokens_as_token_ids":true)");
  ASSERT_TRUE(kept.ok()) << kept.err().message;
  EXPECT_FALSE(kept->gen.skip_special_tokens);
  EXPECT_TRUE(kept->gen.tokens_as_ids);
  auto plain = parse(R"("n":1)");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->gen.skip_special_tokens);
  EXPECT_FALSE(plain->gen.tokens_as_ids);
  for (const std::string bad : {R"("skip_special_tokens":"no")", R"("return_tokens_as_token_ids":1)"}) {
    auto r = parse(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.err().message.find("true or false"), std::string::npos) << r.err().message;
  }
}

}  // namespace
}  // namespace llmesh::gateway
