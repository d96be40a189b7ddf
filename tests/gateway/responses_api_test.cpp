// The Responses API over the chat endpoint: requests become the chat requests they mean
// (instructions and input items as messages, flat tools as chat tools, text.format as a
// response_format), what the server cannot do is refused by name, and the chat output — whole
// or as SSE chunks — becomes the response object or the typed event stream, the stream's last
// event holding the same response the whole path builds.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "json_mutation.hpp"
#include "typed_events.hpp"
#include "llmesh/gateway/api_service.hpp"
#include "llmesh/gateway/responses_api.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

json chat_of(const json& body) {
  responses_echo echo;
  auto c = responses_to_chat(body, echo);
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.err().message);
  return c.ok() ? *c : json();
}

std::string refusal(const json& body) {
  responses_echo echo;
  auto c = responses_to_chat(body, echo);
  return c.ok() ? std::string() : c.err().message;
}

TEST(ResponsesApi, InputItemsBecomeTheChatMessagesTheyMean) {
  auto merged = chat_of({{"instructions", "Be brief."}, {"input", {{{"role", "developer"}, {"content", "No lists."}}, {{"role", "user"}, {"content", "Hi"}}}}});
  EXPECT_EQ(merged["messages"], json::parse(R"([{"role":"system","content":"Be brief.\n\nNo lists."},{"role":"user","content":"Hi"}])"));
  auto c = chat_of({{"model", "m"}, {"instructions", "Be brief."}, {"input", "Hi"}, {"max_output_tokens", 5}});
  EXPECT_EQ(c["model"], "m");
  EXPECT_EQ(c["messages"], json::parse(R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])"));
  EXPECT_EQ(c["max_completion_tokens"], 5);
  EXPECT_FALSE(c.contains("stream"));

  const json input = json::parse(R"([
    {"role":"developer","content":"Rules."},
    {"type":"message","role":"user","content":[{"type":"input_text","text":"Weather?"}]},
    {"type":"reasoning","id":"rs_0","summary":[],"encrypted_content":"opaque"},
    {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Look it up."}]},
    {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking."}]},
    {"type":"function_call","call_id":"c1","name":"weather","arguments":"{\"city\":\"Ur\"}"},
    {"type":"function_call","call_id":"c2","name":"time","arguments":"{}"},
    {"type":"function_call_output","call_id":"c1","output":"fair"},
    {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"noon"}]},
    {"type":"function_call","call_id":"c3","name":"again","arguments":"{}"}])");
  auto items = chat_of({{"input", input}});
  const json want = json::parse(R"([
    {"role":"system","content":"Rules."},
    {"role":"user","content":[{"type":"text","text":"Weather?"}]},
    {"role":"assistant","content":[{"type":"text","text":"Checking."}],"reasoning_content":"Look it up.","tool_calls":[
      {"id":"c1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Ur\"}"}},
      {"id":"c2","type":"function","function":{"name":"time","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"c1","content":"fair"},
    {"role":"tool","tool_call_id":"c2","content":[{"type":"text","text":"noon"}]},
    {"role":"assistant","content":null,"tool_calls":[
      {"id":"c3","type":"function","function":{"name":"again","arguments":"{}"}}]}])");
  EXPECT_EQ(items["messages"], want) << items["messages"].dump(1);
}

TEST(ResponsesApi, ToolsFormatsReasoningAndStreamMapToChatFields) {
  auto c = chat_of(json::parse(R"({"input":"x","stream":true,"temperature":0.5,"top_p":0.9,"seed":7,
    "tools":[{"type":"function","name":"f","description":"d","parameters":{"type":"object"},"strict":true}],
    "tool_choice":{"type":"function","name":"f"},"parallel_tool_calls":false,
    "text":{"format":{"type":"json_schema","name":"out","schema":{"type":"object"},"strict":true}},
    "reasoning":{"effort":"low"},"chat_template_kwargs":{"enable_thinking":true},"metadata":{"k":"v"}})"));
  EXPECT_EQ(c["tools"], json::parse(R"([{"type":"function","function":{"name":"f","description":"d",
    "parameters":{"type":"object"},"strict":true}}])"));
  EXPECT_EQ(c["tool_choice"], json::parse(R"({"type":"function","function":{"name":"f"}})"));
  EXPECT_EQ(c["parallel_tool_calls"], false);
  EXPECT_EQ(c["response_format"], json::parse(R"({"type":"json_schema","json_schema":{"name":"out",
    "schema":{"type":"object"},"strict":true}})"));
  EXPECT_EQ(c["chat_template_kwargs"], json::parse(R"({"enable_thinking":true,"reasoning_effort":"low"})"));
  EXPECT_EQ(c["stream"], true);
  EXPECT_EQ(c["stream_options"], json::parse(R"({"include_usage":true})"));
  EXPECT_EQ(c["temperature"], 0.5);
  EXPECT_EQ(c["seed"], 7);
  EXPECT_FALSE(c.contains("metadata"));
  EXPECT_EQ(chat_of({{"input", "x"}, {"text", {{"format", {{"type", "json_object"}}}}}})["response_format"],
            json::parse(R"({"type":"json_object"})"));
  EXPECT_FALSE(chat_of({{"input", "x"}, {"text", {{"format", {{"type", "text"}}}}}}).contains("response_format"));
}

// include's "message.output_text.logprobs" (with top_logprobs alternatives) asks the chat endpoint for them;
// they come back on the output text, without the thinking's tokens, whole and streamed.
TEST(ResponsesApi, LogprobsRideOnTheOutputTextWithoutTheThinking) {
  EXPECT_FALSE(chat_of({{"input", "x"}, {"top_logprobs", 2}}).contains("logprobs"));  // vLLM's rule: with include
  auto c = chat_of({{"input", "x"}, {"top_logprobs", 2}, {"include", {"message.output_text.logprobs"}}});
  EXPECT_EQ(c["logprobs"], true);
  EXPECT_EQ(c["top_logprobs"], 2);
  auto i = chat_of({{"input", "x"}, {"include", {"reasoning.encrypted_content", "message.output_text.logprobs"}}});
  EXPECT_EQ(i["logprobs"], true);
  EXPECT_FALSE(i.contains("top_logprobs"));
  EXPECT_FALSE(chat_of({{"input", "x"}, {"include", {"file_search_call.results"}}}).contains("logprobs"));

  const json e1 = {{"token", "<think>"}, {"logprob", -0.1}, {"bytes", json::array()}, {"top_logprobs", json::array()}};
  const json e2 = {{"token", "</think>"}, {"logprob", -0.2}, {"bytes", json::array()}, {"top_logprobs", json::array()}};
  const json e3 = {{"token", "Yes"}, {"logprob", -0.3}, {"bytes", {89, 101, 115}}, {"top_logprobs", json::array()}};
  json chat_body = {{"choices", {{{"index", 0},
                                  {"message", {{"role", "assistant"}, {"reasoning_content", "hm"}, {"content", "Yes"}}},
                                  {"logprobs", {{"content", {e1, e2, e3}}}},
                                  {"finish_reason", "stop"}}}},
                    {"usage", {{"prompt_tokens", 1}, {"completion_tokens", 3}, {"total_tokens", 4}}}};
  responses_renderer r(responses_echo{}, "chatcmpl-0b", 1, "m");
  const json whole = json::parse(r.whole(chat_body.dump()));
  EXPECT_EQ(whole["output"][1]["content"][0]["logprobs"], json::array({e3})) << whole.dump(1);

  const std::string env = R"("id":"chatcmpl-0b","object":"chat.completion.chunk","created":1,"model":"m")";
  auto chunk = [&](const json& delta, const json& entries) {
    json j = json::parse("{" + env + "}");
    j["choices"] = {{{"index", 0}, {"delta", delta}, {"logprobs", {{"content", entries}}}, {"finish_reason", nullptr}}};
    return "data: " + j.dump() + "\n\n";
  };
  responses_renderer s(responses_echo{}, "chatcmpl-0b", 1, "m");
  std::string sse = s.stream(chunk({{"reasoning_content", "hm"}}, json::array({e1})));
  sse += s.stream(chunk({{"content", "Yes"}}, json::array({e3})));
  sse += s.stream("data: {" + env + R"(,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]})" "\n\n" +
                  "data: {" + env + R"(,"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3,"total_tokens":4}})" "\n\n");
  json done;
  for (size_t at = 0; at < sse.size();) {
    const size_t end = sse.find("\n\n", at);
    const json d = json::parse(sse.substr(sse.find("data: ", at) + 6, end - sse.find("data: ", at) - 6));
    at = end + 2;
    if (d["type"] == "response.output_text.delta") {
      EXPECT_EQ(d["logprobs"], json::array({e3}));
    }
    if (d["type"] == "response.completed") done = d;
  }
  EXPECT_EQ(done["response"]["output"][1]["content"][0]["logprobs"], json::array({e3})) << done.dump(1);
}

TEST(ResponsesApi, WhatTheServerCannotDoIsRefusedByName) {
  for (const auto& [body, needle] : std::vector<std::pair<json, std::string>>{
           {{{"input", "x"}, {"background", "yes"}}, "'background' must be true or false"},
           {{{"input", "x"}, {"background", true}, {"stream", 1}}, "'stream' must be true or false"},
           {{{"input", "x"}, {"prompt", {{"id", "p"}}}}, "'prompt'"},
           {{{"model", "m"}}, "'input' is required"},
           {{{"input", json::array()}}, "non-empty array"},
           {{{"input", 5}}, "'input' must be a string"},
           {{{"input", {{{"type", "image_generation_call"}}}}}, "'input[0]': input items of type 'image_generation_call'"},
           {{{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "u"}}}}}}}},
            "parts of type 'input_image' are not supported"},
           {{{"input", {{{"role", "robot"}, {"content", "x"}}}}}, "'input[0].role'"},
           {{{"input", {{{"type", "function_call"}, {"name", "f"}, {"arguments", "{}"}}}}}, "'input[0].call_id'"},
           {{{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}, "tools of type 'web_search' are not supported"},
           {{{"input", "x"}, {"tool_choice", {{"type", "file_search"}}}}, "'tool_choice' must be"},
           {{{"input", "x"}, {"text", {{"format", {{"type", "yaml"}}}}}}, "'text.format.type'"},
           {{{"input", "x"}, {"store", "yes"}}, "'store' must be true or false"},
           {{{"input", {{{"role", "user"}, {"content", "x"}, {"id", 5}}}}}, "'input[0].id' must be a string"},
           {{{"input", "x"}, {"include", "all"}}, "'include' must be an array of strings"}}) {
    const std::string got = refusal(body);
    EXPECT_NE(got.find(needle), std::string::npos) << body.dump() << " -> " << got;
  }
  EXPECT_EQ(refusal({{"input", "x"}, {"store", true}, {"background", false}}), "");
  EXPECT_EQ(refusal({{"input", "x"}, {"background", true}}), "");
}

const char* chat_whole = R"({"id":"chatcmpl-00ff","object":"chat.completion","created":9,"model":"m","choices":[
  {"index":0,"message":{"role":"assistant","reasoning_content":"Think.","content":"Answer.","tool_calls":[
    {"id":"call_a","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},
   "logprobs":null,"finish_reason":"tool_calls"}],
  "usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":12}})";

TEST(ResponsesApi, TheWholeChatAnswerBecomesAResponseObject) {
  responses_echo echo;
  echo.instructions = "Be brief.";
  echo.max_output_tokens = 5;
  responses_renderer r(echo, "chatcmpl-00ff", 9, "m");
  const json j = json::parse(r.whole(chat_whole));
  EXPECT_EQ(j["id"], "resp_00ff");
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["created_at"], 9);
  EXPECT_EQ(j["status"], "completed");
  EXPECT_EQ(j["instructions"], "Be brief.");
  EXPECT_EQ(j["store"], false);
  const json want_output = json::parse(R"([
    {"id":"rs_00ff0","type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"Think."}]},
    {"id":"msg_00ff1","type":"message","status":"completed","role":"assistant",
     "content":[{"type":"output_text","text":"Answer.","annotations":[]}]},
    {"id":"fc_00ff2","type":"function_call","status":"completed","call_id":"call_a","name":"f","arguments":"{\"x\":1}"}])");
  EXPECT_EQ(j["output"], want_output) << j["output"].dump(1);
  EXPECT_EQ(j["usage"], json::parse(R"({"input_tokens":7,"input_tokens_details":{"cached_tokens":0},
    "output_tokens":5,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":12})"));

  // Out of tokens: incomplete, and so is the last item.
  const std::string cut = R"({"choices":[{"index":0,"message":{"role":"assistant","content":"Ans"},"finish_reason":"length"}],
    "usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})";
  const json c = json::parse(r.whole(cut));
  EXPECT_EQ(c["status"], "incomplete");
  EXPECT_EQ(c["incomplete_details"], json::parse(R"({"reason":"max_output_tokens"})"));
  EXPECT_EQ(c["output"][0]["status"], "incomplete");
  const std::string err = R"({"error":{"message":"no","type":"invalid_request_error","code":"invalid_request"}})";
  EXPECT_EQ(r.whole(err), err);  // errors keep their shape
}

TEST(ResponsesApi, TheThinkingsTokenCountIsTheUsagesReasoningTokens) {
  responses_renderer r(responses_echo{}, "chatcmpl-00ff", 9, "m");
  const std::string chat = R"({"choices":[{"index":0,"message":{"role":"assistant","reasoning_content":"Hm.","content":"A."},
    "finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10,
    "completion_tokens_details":{"reasoning_tokens":3}}})";
  const json j = json::parse(r.whole(chat));
  EXPECT_EQ(j["usage"]["output_tokens_details"], json::parse(R"({"reasoning_tokens":3})"));
  EXPECT_EQ(j["usage"]["output_tokens"], 6);
}

const auto events_of = testing::typed_events;
const auto data = testing::sse_data;

TEST(ResponsesApi, ChatChunksBecomeTypedEventsEndingInTheWholeResponse) {
  const std::string env = R"("id":"chatcmpl-00ff","object":"chat.completion.chunk","created":9,"model":"m")";
  const std::vector<std::string> chunks = {
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"reasoning_content":"Thi"},"finish_reason":null}]})"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"reasoning_content":"nk."},"finish_reason":null}]})"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"content":"Ans"},"finish_reason":null}]})"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"content":"wer."},"finish_reason":null}]})"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":"{\"x\""}}]},"finish_reason":null}]})"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":null}]})"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})"),
      data("{" + env + R"(,"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":12}})"),
      "data: [DONE]\n\n"};
  responses_renderer r(responses_echo{}, "chatcmpl-00ff", 9, "m");
  std::string sse;
  for (size_t i = 0; i < chunks.size(); ++i) sse += r.stream(i == 3 ? chunks[3] + chunks[4] : (i == 4 ? "" : chunks[i]));
  const auto events = events_of(sse);
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    types.push_back(events[i]["type"]);
    EXPECT_EQ(events[i]["sequence_number"], i);
  }
  const std::vector<std::string> want = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
      "response.completed"};
  EXPECT_EQ(types, want);
  // The last event's response is the whole path's, but for their creation stamps.
  const json whole = json::parse(r.whole(chat_whole));
  EXPECT_EQ(events.back()["response"]["output"], whole["output"]) << events.back().dump(1);
  EXPECT_EQ(events.back()["response"]["usage"], whole["usage"]);
  EXPECT_EQ(events[0]["response"]["status"], "in_progress");
  EXPECT_EQ(events[11]["delta"], "Ans");
  EXPECT_EQ(events[11]["item_id"], "msg_00ff1");
  EXPECT_EQ(events[13]["text"], "Answer.");
  EXPECT_EQ(events[19]["arguments"], "{\"x\":1}");
  EXPECT_EQ(events[19]["name"], "f");
  EXPECT_EQ(r.stream("data: [DONE]\n\n"), "");  // nothing after the end
}

TEST(ResponsesApi, AnErrorMidStreamFailsTheResponseAndAnEmptyAnswerIsAnEmptyMessage) {
  const std::string env = R"("id":"chatcmpl-01","object":"chat.completion.chunk","created":9,"model":"m")";
  responses_renderer r(responses_echo{}, "chatcmpl-01", 9, "m");
  std::string sse = r.stream(data("{" + env + R"(,"choices":[{"index":0,"delta":{"content":"Par"},"finish_reason":null}]})"));
  sse += r.stream(data(R"({"error":{"message":"replica lost","type":"server_error","code":"replica_unavailable"}})") +
                  "data: [DONE]\n\n");
  auto events = events_of(sse);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["type"], "response.failed");
  EXPECT_EQ(events.back()["response"]["status"], "failed");
  EXPECT_EQ(events.back()["response"]["error"]["message"], "replica lost");
  EXPECT_EQ(events.back()["response"]["error"]["code"], "server_error");
  EXPECT_EQ(events.back()["response"]["output"][0]["content"][0]["text"], "Par");
  EXPECT_EQ(events.back()["response"]["output"][0]["status"], "incomplete");

  responses_renderer empty(responses_echo{}, "chatcmpl-02", 9, "m");
  sse = empty.stream(data("{" + env + R"(,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"stop"}]})") +
                     data("{" + env + R"(,"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":0,"total_tokens":1}})"));
  events = events_of(sse);
  EXPECT_EQ(events.back()["type"], "response.completed");
  EXPECT_EQ(events.back()["response"]["output"], json::parse(R"([{"id":"msg_020","type":"message","status":"completed",
    "role":"assistant","content":[{"type":"output_text","text":"","annotations":[]}]}])"));
}

struct quiet_mesh : actors::mesh_client {
  void submit(actors::replica_request, actors::token_sink) override {}
  void cancel(uint64_t) override {}
  size_t ready_replicas() const override { return 1; }
};

// Mutated requests through the whole endpoint (api_service: parse, translate, the chat
// checks, the template) never throw and answer a 4xx or a job; mutated chat streams through
// the renderer never throw and each event it writes is JSON of its announced type.
TEST(ResponsesApi, MutatedRequestsAndStreamsNeverThrow) {
  const std::string dir = LLMESH_SOURCE_DIR "/models/kjv-tiny";
  auto tok = model::tokenizer::load(dir);
  auto cfg = model::load_config(dir);
  auto chat = model::chat_template::load(dir);
  ASSERT_TRUE(tok.ok() && cfg.ok() && chat.ok());
  quiet_mesh mesh;
  actors::metrics_registry metrics;
  api_options o;
  o.model_name = "m";
  o.max_concurrent = 1 << 20;
  api_service api(o, *tok, *chat, *cfg, mesh, metrics);
  const std::string seeds[] = {
      R"({"model":"m","instructions":"i","input":"x","max_output_tokens":3,"temperature":0.5,"stream":true})",
      R"({"model":"m","input":[{"role":"developer","content":"r"},{"type":"message","role":"user","content":[{"type":"input_text","text":"w"}]},)"
      R"({"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}],)"
      R"("tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"}})",
      R"({"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"}}},"reasoning":{"effort":"low"},"metadata":{"a":"b"}})",
  };
  for (const auto& b : seeds) {
    auto out = api.handle("POST", "/v1/responses", "", b);
    EXPECT_TRUE(std::holds_alternative<generation_job>(out)) << b << " " << (std::holds_alternative<http_reply>(out) ? std::get<http_reply>(out).body : "");
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 6000; ++i) {
    const std::string body = testing::mutate_json(seeds[static_cast<size_t>(i) % std::size(seeds)], rng);
    api_outcome out;
    ASSERT_NO_THROW(out = api.handle("POST", "/v1/responses", "", body)) << body;
    if (auto* r = std::get_if<http_reply>(&out)) {
      if (r->status == 200) {  // a mutation that asked for the background: answered as queued
        EXPECT_NE(r->body.find(R"("status":"queued","background":true)"), std::string::npos) << body << " " << r->body;
        continue;
      }
      EXPECT_GE(r->status, 400) << body;
      EXPECT_LT(r->status, 500) << body << " " << r->body;
    }
  }
  const std::string env = R"("id":"chatcmpl-0a","object":"chat.completion.chunk","created":1,"model":"m")";
  const std::string stream_seed =
      "data: {" + env + R"(,"choices":[{"index":0,"delta":{"reasoning_content":"a","content":"b","tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":"{"}}]},"finish_reason":null}]})" "\n\n"
      "data: {" + env + R"(,"choices":[{"index":0,"delta":{},"finish_reason":"length"}]})" "\n\n"
      "data: {" + env + R"(,"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})" "\n\n"
      "data: [DONE]\n\n";
  for (int i = 0; i < 3000; ++i) {
    responses_renderer r(responses_echo{}, "chatcmpl-0a", 1, "m");
    std::string out;
    ASSERT_NO_THROW(out = r.stream(testing::mutate_json(stream_seed, rng)));
    ASSERT_NO_THROW(r.whole(testing::mutate_json(chat_whole, rng)));
    testing::expect_well_typed(out);
  }
}

}  // namespace
}  // namespace llmesh::gateway
