// Anthropic's Messages API over the chat endpoint: requests become the chat requests they mean
// (system and content blocks as messages, client tools as chat tools, tool_choice, stop
// sequences, thinking and output_config), what the server cannot do is refused by name in
// Anthropic's error shape, and the chat output — whole or as SSE chunks — becomes the message
// object or its event stream (the stream's blocks and stop reason the same as the whole path's);
// through api_service: the routes, the key in x-api-key, count_tokens against the chat prompt,
// a stop sequence's name, and fuzzed requests and streams.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "api_fixture.hpp"
#include "json_mutation.hpp"
#include "typed_events.hpp"
#include "llmesh/gateway/messages_api.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

json chat_of(const json& body, bool counting = false) {
  auto c = messages_to_chat(body, counting);
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.err().message);
  return c.ok() ? *c : json();
}

std::string refusal(const json& body) {
  auto c = messages_to_chat(body);
  return c.ok() ? std::string() : c.err().message;
}

TEST(MessagesApi, MessagesBecomeTheChatMessagesTheyMean) {
  const json body = json::parse(R"({"model":"m","max_tokens":64,
    "system":[{"type":"text","text":"x-anthropic-billing-header: cc=1;"},{"type":"text","text":"Be brief."},{"type":"text","text":" Use tools."}],
    "messages":[
      {"role":"user","content":"Weather in Ur?"},
      {"role":"assistant","content":[{"type":"thinking","thinking":"Look it up.","signature":"s"},{"type":"redacted_thinking","data":"opaque"},
        {"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"weather","input":{"city":"Ur"}},
        {"type":"tool_use","id":"toolu_2","name":"time","input":{}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"fair"},
        {"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"noon"},{"type":"tool_reference","tool_name":"t"},{"type":"text","text":"UTC"}]},
        {"type":"text","text":"And tomorrow?"}]},
      {"role":"assistant","content":[{"type":"tool_use","id":"toolu_3","name":"weather","input":{"day":1}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_3","content":"rain","is_error":false}]}]})");
  const json c = chat_of(body);
  const json want = json::parse(R"([
    {"role":"system","content":"Be brief. Use tools."},
    {"role":"user","content":"Weather in Ur?"},
    {"role":"assistant","content":"Checking.","reasoning_content":"Look it up.","tool_calls":[
      {"id":"toolu_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Ur\"}"}},
      {"id":"toolu_2","type":"function","function":{"name":"time","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"toolu_1","content":"fair"},
    {"role":"tool","tool_call_id":"toolu_2","content":"noon\nUTC"},
    {"role":"user","content":"And tomorrow?"},
    {"role":"assistant","content":null,"tool_calls":[
      {"id":"toolu_3","type":"function","function":{"name":"weather","arguments":"{\"day\":1}"}}]},
    {"role":"tool","tool_call_id":"toolu_3","content":"rain"}])");
  EXPECT_EQ(c["messages"], want) << c["messages"].dump(1);
  EXPECT_EQ(c["model"], "m");
  EXPECT_EQ(c["max_tokens"], 64);
  EXPECT_FALSE(c.contains("stream"));

  // Several text blocks stay parts; a system message in the list joins the system prompt.
  const json parts = chat_of(json::parse(R"({"model":"m","max_tokens":1,"system":"A.","messages":[
    {"role":"system","content":"B."},{"role":"user","content":[{"type":"text","text":"x"},{"type":"text","text":""},{"type":"text","text":"y"}]}]})"));
  EXPECT_EQ(parts["messages"], json::parse(R"([{"role":"system","content":"A.B."},
    {"role":"user","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]}])"));
}

TEST(MessagesApi, ToolsChoicesStopsThinkingAndStreamMapToChatFields) {
  const json c = chat_of(json::parse(R"({"model":"m","max_tokens":9,"stream":true,"temperature":0.2,"top_p":0.9,"top_k":5,
    "stop_sequences":["END","\n\n"],"metadata":{"user_id":"u"},"thinking":{"type":"disabled"},
    "output_config":{"effort":"low","format":{"type":"json_schema","schema":{"type":"object"}}},
    "tools":[{"name":"f","description":"d","input_schema":{"properties":{}},"cache_control":{"type":"ephemeral"}},
             {"type":"custom","name":"g","input_schema":{"type":"object"}}],
    "tool_choice":{"type":"any","disable_parallel_tool_use":true},
    "messages":[{"role":"user","content":"hi"}]})"));
  EXPECT_EQ(c["tools"], json::parse(R"([{"type":"function","function":{"name":"f","description":"d","parameters":{"properties":{},"type":"object"}}},
    {"type":"function","function":{"name":"g","parameters":{"type":"object"}}}])"));
  EXPECT_EQ(c["tool_choice"], "required");
  EXPECT_EQ(c["parallel_tool_calls"], false);
  EXPECT_EQ(c["stop"], json::parse(R"(["END","\n\n"])"));
  EXPECT_EQ(c["temperature"], 0.2);
  EXPECT_EQ(c["top_p"], 0.9);
  EXPECT_EQ(c["top_k"], 5);
  EXPECT_EQ(c["chat_template_kwargs"], json::parse(R"({"enable_thinking":false,"reasoning_effort":"low"})"));
  EXPECT_EQ(c["response_format"], json::parse(R"({"type":"json_schema","json_schema":{"name":"response","schema":{"type":"object"}}})"));
  EXPECT_EQ(c["stream"], true);
  EXPECT_EQ(c["stream_options"], json::parse(R"({"include_usage":true,"continuous_usage_stats":true})"));

  auto choice = [](const char* tc) {
    return chat_of(json::parse(std::string(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{}}],"tool_choice":)") + tc + "}"));
  };
  EXPECT_EQ(choice(R"({"type":"auto"})")["tool_choice"], "auto");
  EXPECT_EQ(choice(R"({"type":"none"})")["tool_choice"], "none");
  EXPECT_EQ(choice(R"({"type":"tool","name":"f"})")["tool_choice"], json::parse(R"({"type":"function","function":{"name":"f"}})"));
  EXPECT_FALSE(choice(R"({"type":"auto"})").contains("parallel_tool_calls"));
  // A template's own switch stays as sent; thinking enabled turns it on.
  EXPECT_EQ(chat_of(json::parse(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","budget_tokens":1024}})"))["chat_template_kwargs"],
            json::parse(R"({"enable_thinking":true})"));
  EXPECT_EQ(chat_of(json::parse(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"disabled"},"chat_template_kwargs":{"enable_thinking":true}})"))["chat_template_kwargs"],
            json::parse(R"({"enable_thinking":true})"));
  // Prefill: a final assistant message with text is continued; one that ends with a tool call,
  // or whose text is blank, is not.
  const json pre = chat_of(json::parse(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"},
    {"role":"assistant","content":[{"type":"text","text":"The answer"},{"type":"text","text":" is"}]}]})"));
  EXPECT_EQ(pre["continue_final_message"], true);
  EXPECT_EQ(pre["add_generation_prompt"], false);
  EXPECT_EQ(pre["messages"].back()["content"].size(), 2u);  // (parts, joined as the chat endpoint joins them)
  EXPECT_FALSE(chat_of(json::parse(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":" \n"}]})"))
                   .contains("continue_final_message"));
  const json called = chat_of(json::parse(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"},
    {"role":"assistant","content":[{"type":"text","text":"On it."},{"type":"tool_use","id":"t","name":"f","input":{}}]}]})"));
  EXPECT_FALSE(called.contains("continue_final_message"));
  // count_tokens needs no max_tokens and carries nothing about sampling.
  const json counted = chat_of(json::parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":0.5,"stream":true})"), true);
  EXPECT_EQ(counted, json::parse(R"({"model":"m","messages":[{"role":"user","content":"x"}]})"));
}

TEST(MessagesApi, WhatTheServerCannotDoIsRefusedByName) {
  const json ok = json::parse(R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]})");
  auto with = [&](const char* key, const json& v) {
    json b = ok;
    b[key] = v;
    return refusal(b);
  };
  EXPECT_NE(refusal(json::parse(R"({"model":"m","messages":[{"role":"user","content":"x"}]})")).find("'max_tokens' is required"), std::string::npos);
  EXPECT_NE(with("max_tokens", 0).find("'max_tokens' must be an integer of at least 1"), std::string::npos);
  EXPECT_NE(with("max_tokens", 1.5).find("'max_tokens'"), std::string::npos);
  EXPECT_NE(with("model", "").find("'model' is required"), std::string::npos);
  EXPECT_NE(with("messages", json::array()).find("'messages' is required"), std::string::npos);
  EXPECT_NE(with("messages", json::parse(R"([{"role":"tool","content":"x"}])")).find("'messages[0].role' must be user or assistant"), std::string::npos);
  EXPECT_NE(with("messages", json::parse(R"([{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}])"))
                .find("'messages[0].content[0]': image blocks are not supported: this server serves text models only"),
            std::string::npos);
  EXPECT_NE(with("messages", json::parse(R"([{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}])"))
                .find("tool_use blocks belong to assistant messages"),
            std::string::npos);
  EXPECT_NE(with("messages", json::parse(R"([{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":"{}"}]}])"))
                .find("'messages[0].content[0].input' must be an object"),
            std::string::npos);
  EXPECT_NE(with("messages", json::parse(R"([{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"image","source":{}}]}]}])"))
                .find("'messages[0].content[0].content[0]': blocks of type 'image' cannot be a tool's result"),
            std::string::npos);
  EXPECT_NE(with("messages", json::parse(R"([{"role":"user","content":[{"type":"server_tool_use","id":"a"}]}])"))
                .find("content blocks of type 'server_tool_use' are not supported"),
            std::string::npos);
  EXPECT_NE(with("messages", json::parse(R"([{"role":"system","content":"only"}])")).find("'messages' holds nothing for the model"), std::string::npos);
  EXPECT_NE(with("tools", json::parse(R"([{"type":"web_search_20250305","name":"web_search","max_uses":3}])"))
                .find("'tools[0]': Anthropic's server tools (type 'web_search_20250305') are not supported"),
            std::string::npos);
  EXPECT_NE(with("tools", json::parse(R"([{"name":"f"}])")).find("'tools[0].input_schema' must be an object"), std::string::npos);
  EXPECT_NE(with("tool_choice", json::parse(R"({"type":"tool"})")).find("'tool_choice.name' must be a string"), std::string::npos);
  EXPECT_NE(with("tool_choice", "auto").find("'tool_choice' must be an object"), std::string::npos);
  EXPECT_NE(with("stop_sequences", json::parse(R"(["a",1])")).find("'stop_sequences' must be an array of strings"), std::string::npos);
  EXPECT_NE(with("thinking", json::parse(R"({"type":"on"})")).find("'thinking' must be an object whose 'type' is enabled"), std::string::npos);
  EXPECT_NE(with("output_config", json::parse(R"({"format":{"type":"json_object"}})")).find("'output_config.format' must be"), std::string::npos);
  EXPECT_NE(with("stream", "yes").find("'stream' must be true or false"), std::string::npos);
  EXPECT_NE(with("system", 5).find("'system' must be a string or an array of text blocks"), std::string::npos);
}

const std::string chat_whole = R"({"id":"chatcmpl-00ff","object":"chat.completion","created":9,"model":"m",
  "choices":[{"index":0,"message":{"role":"assistant","reasoning_content":"Think.","content":"Answer.",
  "tool_calls":[{"id":"call_a","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},
  "logprobs":null,"finish_reason":"tool_calls","stop_reason":null}],
  "usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":12}})";

TEST(MessagesApi, TheWholeChatAnswerBecomesAMessage) {
  messages_renderer r("chatcmpl-00ff", "m");
  const json j = json::parse(r.whole(chat_whole));
  const json want = json::parse(R"({"id":"msg_00ff","type":"message","role":"assistant","model":"m","content":[
    {"type":"thinking","thinking":"Think.","signature":"msg_00ff.0"},{"type":"text","text":"Answer."},
    {"type":"tool_use","id":"call_a","name":"f","input":{"x":1}}],
    "stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":5}})");
  EXPECT_EQ(j, want) << j.dump(1);

  auto stop = [&](const std::string& finish, const std::string& stop_reason, const std::string& usage_extra = "") {
    return json::parse(r.whole(R"({"choices":[{"index":0,"message":{"role":"assistant","content":"A"},"finish_reason":")" + finish +
                               R"(","stop_reason":)" + stop_reason + R"(}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12)" +
                               usage_extra + "}}"));
  };
  EXPECT_EQ(stop("length", "null")["stop_reason"], "max_tokens");
  EXPECT_EQ(stop("stop", "null")["stop_reason"], "end_turn");
  EXPECT_EQ(stop("stop", "128009")["stop_reason"], "end_turn");  // a stop token id is not a sequence
  const json seq = stop("stop", R"("END")");
  EXPECT_EQ(seq["stop_reason"], "stop_sequence");
  EXPECT_EQ(seq["stop_sequence"], "END");
  // Prefix-cache hits are cache reads, not input tokens (vLLM's mapping).
  EXPECT_EQ(stop("stop", "null", R"(,"prompt_tokens_details":{"cached_tokens":8})")["usage"],
            json::parse(R"({"input_tokens":2,"cache_creation_input_tokens":0,"cache_read_input_tokens":8,"output_tokens":2})"));
  // Arguments written as a JSON string of an object are that object; arguments that are no
  // object stay as text (nothing is lost) and, with no tool_use block, the turn ends.
  const json odd = json::parse(r.whole(R"({"choices":[{"index":0,"message":{"role":"assistant","content":"",
    "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"\"{\\\"x\\\":1}\""}},
                  {"id":"d","type":"function","function":{"name":"g","arguments":"[1"}}]},"finish_reason":"tool_calls"}],"usage":{}})"));
  EXPECT_EQ(odd["content"], json::parse(R"([{"type":"tool_use","id":"c","name":"f","input":{"x":1}},{"type":"text","text":"[1"}])")) << odd.dump();
  EXPECT_EQ(odd["stop_reason"], "tool_use");
  const json none = json::parse(r.whole(R"({"choices":[{"index":0,"message":{"role":"assistant","content":"",
    "tool_calls":[{"id":"d","type":"function","function":{"name":"g","arguments":"5"}}]},"finish_reason":"tool_calls"}],"usage":{}})"));
  EXPECT_EQ(none["content"], json::parse(R"([{"type":"text","text":"5"}])"));
  EXPECT_EQ(none["stop_reason"], "end_turn");
  // Errors take Anthropic's shape, typed by our code.
  EXPECT_EQ(json::parse(r.whole(R"({"error":{"message":"no","type":"invalid_request_error","code":"invalid_request"}})")),
            json::parse(R"({"type":"error","error":{"type":"invalid_request_error","message":"no"}})"));
  EXPECT_EQ(json::parse(messages_error_body(R"({"error":{"message":"busy","type":"service_unavailable","code":"replica_unavailable"}})")),
            json::parse(R"({"type":"error","error":{"type":"overloaded_error","message":"busy"}})"));
  EXPECT_EQ(messages_error_type("unauthorized"), "authentication_error");
  EXPECT_EQ(messages_error_type("not_found"), "not_found_error");
  EXPECT_EQ(messages_error_type("overloaded"), "rate_limit_error");
  EXPECT_EQ(messages_error_type("deadline_exceeded"), "timeout_error");
  EXPECT_EQ(messages_error_type("internal"), "api_error");
}

const auto events_of = testing::typed_events;
const auto data = testing::sse_data;

TEST(MessagesApi, ChatChunksBecomeMessageEventsWithTheWholePathsBlocks) {
  const std::string env = R"("id":"chatcmpl-00ff","object":"chat.completion.chunk","created":9,"model":"m")";
  const std::string u1 = R"("usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":4}})";
  const std::vector<std::string> chunks = {
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}],)" + u1 + "}"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"reasoning_content":"Thi"},"finish_reason":null}]})"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"reasoning_content":"nk."},"finish_reason":null}]})"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"content":"Ans"},"finish_reason":null}]})") +
          data("{" + env + R"(,"choices":[{"index":0,"delta":{"content":"wer."},"finish_reason":null}]})"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":"{\"x\""}}]},"finish_reason":null}]})"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":null}]})"),
      data("{" + env + R"(,"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls","stop_reason":null}]})"),
      data("{" + env + R"(,"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":4}}})"),
      "data: [DONE]\n\n"};
  messages_renderer r("chatcmpl-00ff", "m");
  std::string sse;
  for (const auto& c : chunks) sse += r.stream(c);
  const auto events = events_of(sse);
  std::vector<std::string> types;
  for (const auto& e : events) types.push_back(e["type"]);
  const std::vector<std::string> want = {"message_start",       "content_block_start", "content_block_delta", "content_block_delta",
                                         "content_block_delta", "content_block_stop",  "content_block_start", "content_block_delta",
                                         "content_block_delta", "content_block_stop",  "content_block_start", "content_block_delta",
                                         "content_block_delta", "content_block_stop",  "message_delta",       "message_stop"};
  EXPECT_EQ(types, want);
  EXPECT_EQ(events[0]["message"], json::parse(R"({"id":"msg_00ff","type":"message","role":"assistant","model":"m","content":[],
    "stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":4,"output_tokens":0}})"));
  EXPECT_EQ(events[1], json::parse(R"({"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}})"));
  EXPECT_EQ(events[2]["delta"], json::parse(R"({"type":"thinking_delta","thinking":"Thi"})"));
  EXPECT_EQ(events[4], json::parse(R"({"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"msg_00ff.0"}})"));
  EXPECT_EQ(events[6]["content_block"], json::parse(R"({"type":"text","text":""})"));
  EXPECT_EQ(events[8], json::parse(R"({"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"wer."}})"));
  EXPECT_EQ(events[10], json::parse(R"({"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"call_a","name":"f","input":{}}})"));
  EXPECT_EQ(events[12]["delta"], json::parse(R"({"type":"input_json_delta","partial_json":":1}"})"));
  EXPECT_EQ(events[13]["index"], 2);
  EXPECT_EQ(events[14], json::parse(R"({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},
    "usage":{"input_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":4,"output_tokens":5}})"));
  // The stream's blocks, put together, are the whole path's.
  const json whole = json::parse(r.whole(chat_whole));
  EXPECT_EQ(events[2]["delta"]["thinking"].get<std::string>() + events[3]["delta"]["thinking"].get<std::string>(), whole["content"][0]["thinking"]);
  EXPECT_EQ(events[4]["delta"]["signature"], whole["content"][0]["signature"]);
  EXPECT_EQ(json::parse(events[11]["delta"]["partial_json"].get<std::string>() + events[12]["delta"]["partial_json"].get<std::string>()),
            whole["content"][2]["input"]);
  EXPECT_EQ(r.stream("data: [DONE]\n\n"), "");  // nothing after the end
}

TEST(MessagesApi, AStopSequenceAnErrorMidStreamAndAnEmptyAnswer) {
  const std::string env = R"("id":"chatcmpl-01","object":"chat.completion.chunk","created":9,"model":"m")";
  messages_renderer stopped("chatcmpl-01", "m");
  auto events = events_of(stopped.stream(data("{" + env + R"(,"choices":[{"index":0,"delta":{"role":"assistant","content":"Par"},"finish_reason":null}]})") +
                                         data("{" + env + R"(,"choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":"END"}]})") +
                                         "data: [DONE]\n\n"));
  ASSERT_EQ(events.size(), 6u);  // start, block start, delta, block stop, message_delta, stop
  EXPECT_EQ(events[4]["delta"], json::parse(R"({"stop_reason":"stop_sequence","stop_sequence":"END"})"));
  EXPECT_EQ(events[4]["usage"], json::parse(R"({"input_tokens":0,"output_tokens":0})"));  // (no usage in these chunks)

  messages_renderer failed("chatcmpl-01", "m");
  std::string sse = failed.stream(data("{" + env + R"(,"choices":[{"index":0,"delta":{"content":"Par"},"finish_reason":null}]})"));
  sse += failed.stream(data(R"({"error":{"message":"replica lost","type":"service_unavailable","code":"replica_unavailable"}})") + "data: [DONE]\n\n");
  events = events_of(sse);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), json::parse(R"({"type":"error","error":{"type":"overloaded_error","message":"replica lost"}})"));
  EXPECT_EQ(events[events.size() - 2]["type"], "content_block_delta");  // no message_stop after an error

  messages_renderer empty("chatcmpl-02", "m");
  events = events_of(empty.stream(data("{" + env + R"(,"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":"stop"}]})") + "data: [DONE]\n\n"));
  std::vector<std::string> types;
  for (const auto& e : events) types.push_back(e["type"]);
  EXPECT_EQ(types, (std::vector<std::string>{"message_start", "message_delta", "message_stop"}));

  // Blank text opens no block; before text, it leads that block's text.
  messages_renderer blank("chatcmpl-03", "m");
  events = events_of(blank.stream(data("{" + env + R"(,"choices":[{"index":0,"delta":{"content":"\n\n"},"finish_reason":null}]})") +
                                  data("{" + env + R"(,"choices":[{"index":0,"delta":{"content":" "},"finish_reason":null}]})") +
                                  data("{" + env + R"(,"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]})") + "data: [DONE]\n\n"));
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[2]["delta"], json::parse(R"({"type":"text_delta","text":"\n\n Hi"})"));
  EXPECT_EQ(json::parse(blank.whole(R"({"choices":[{"index":0,"message":{"role":"assistant","content":" \n"},"finish_reason":"stop"}],"usage":{}})"))["content"],
            json::array());

  // A streamed call whose arguments are complete JSON but no object is text, as whole() makes
  // it; one of a JSON string is its object.
  messages_renderer calls("chatcmpl-04", "m");
  events = events_of(calls.stream(
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"f","arguments":"\"{\\\"x\\\":1}\""}},)"
                       R"({"index":1,"id":"d","type":"function","function":{"name":"g","arguments":"[1]"}}]},"finish_reason":"tool_calls"}]})") +
      "data: [DONE]\n\n"));
  types.clear();
  for (const auto& e : events) types.push_back(e["type"]);
  EXPECT_EQ(types, (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta", "content_block_stop",
                                             "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}));
  EXPECT_EQ(events[2]["delta"], json::parse(R"({"type":"input_json_delta","partial_json":"{\"x\":1}"})"));
  EXPECT_EQ(events[4]["content_block"]["type"], "text");
  EXPECT_EQ(events[5]["delta"]["text"], "[1]");
  EXPECT_EQ(events[7]["delta"]["stop_reason"], "tool_use");
  // A usage of the wrong type counts nothing, and the message still ends.
  messages_renderer odd_usage("chatcmpl-05", "m");
  events = events_of(odd_usage.stream(data("{" + env + R"(,"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}],"usage":{"prompt_tokens":"x"}})") +
                                      "data: [DONE]\n\n"));
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[0]["message"]["usage"]["input_tokens"], 0);
  EXPECT_EQ(events[4]["type"], "message_delta");
  EXPECT_EQ(events[5]["type"], "message_stop");
  // Text before a call that is text after all: two blocks, as whole() gives.
  messages_renderer apart("chatcmpl-06", "m");
  events = events_of(apart.stream(
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"content":"Sure."},"finish_reason":null}]})") +
      data("{" + env + R"(,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"f","arguments":"5"}}]},"finish_reason":"tool_calls"}]})") +
      "data: [DONE]\n\n"));
  std::vector<std::string> texts;
  for (const auto& e : events) {
    if (e["type"] == "content_block_delta") texts.push_back(e["delta"]["text"]);
  }
  EXPECT_EQ(texts, (std::vector<std::string>{"Sure.", "5"}));
  EXPECT_EQ(events[events.size() - 2]["delta"]["stop_reason"], "end_turn");
}

/// A served tiny model behind api_service, with an API key.
class MessagesRoute : public ApiService {};

TEST_F(MessagesRoute, RunsAsAChatRequestAndNamesTheStopSequence) {
  const json body = {{"model", "kjv"}, {"max_tokens", 16}, {"stop_sequences", {"God"}}, {"messages", {{{"role", "user"}, {"content", "Who?"}}}}};
  api_outcome o = api_->handle("POST", "/v1/messages", "Bearer sekret", body.dump());
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << std::get<http_reply>(o).body;
  // The chat request it ran: the template's prompt, the stop string, max_tokens.
  EXPECT_EQ(req(o).max_tokens, 16u);
  const auto ids = kjv_tiny("kjv").tok->encode("In the beginning God created", false);
  for (size_t i = 0; i < ids.size() && !job(o).output->done(); ++i) {
    job(o).output->on_message(actors::token_msg{req(o).id, ids[i], actors::finish_reason::none, false, {}, {}, {}});
  }
  ASSERT_TRUE(job(o).output->done());
  const http_reply r = job(o).output->reply();
  const json m = json::parse(r.body);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["content"], json::parse(R"([{"type":"text","text":"In the beginning "}])")) << r.body;
  EXPECT_EQ(m["stop_reason"], "stop_sequence");
  EXPECT_EQ(m["stop_sequence"], "God");
  EXPECT_EQ(m["usage"]["input_tokens"], req(o).prompt.size());
}

TEST_F(MessagesRoute, AFinalAssistantMessageIsContinued) {
  const json body = json::parse(R"({"model":"kjv","max_tokens":4,"messages":[{"role":"user","content":"Who?"},{"role":"assistant","content":"In the beginning"}]})");
  api_outcome o = api_->handle("POST", "/v1/messages", "Bearer sekret", body.dump());
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << std::get<http_reply>(o).body;
  const std::string prompt = kjv_tiny("kjv").tok->decoder().decode(req(o).prompt, false);
  EXPECT_TRUE(prompt.ends_with("assistant: In the beginning")) << prompt;  // no new turn opened after it
}

TEST_F(MessagesRoute, ErrorsKeyAndTokenCountInTheApisOwnShape) {
  const std::string ok = R"({"model":"kjv","max_tokens":4,"messages":[{"role":"user","content":"Who?"}]})";
  auto reply = [&](api_outcome o) { return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o) : http_reply{0, "", "", {}}; };
  // The key: as a bearer token or in x-api-key (http_server passes it on as a bearer token).
  http_reply r = reply(api_->handle("POST", "/v1/messages", "", ok));
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "authentication_error") << r.body;
  EXPECT_EQ(json::parse(r.body)["type"], "error");
  r = reply(api_->handle("GET", "/v1/messages", "Bearer sekret", ""));
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "invalid_request_error");
  r = reply(api_->handle("POST", "/v1/messages", "Bearer sekret", R"({"model":"nope","max_tokens":4,"messages":[{"role":"user","content":"x"}]})"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "not_found_error") << r.body;
  r = reply(api_->handle("POST", "/v1/messages", "Bearer sekret", R"({"model":"kjv","max_tokens":4,"stop_sequences":"x","messages":[]})"));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(json::parse(r.body)["error"]["message"].get<std::string>().find("'messages'"), std::string::npos) << r.body;
  r = reply(api_->handle("POST", "/v1/messages", "Bearer sekret", "{not json"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["type"], "error");
  // The chat path's checks, in this API's words.
  r = reply(api_->handle("POST", "/v1/messages", "Bearer sekret", R"({"model":"kjv","max_tokens":4,"temperature":-1,"messages":[{"role":"user","content":"x"}]})"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "invalid_request_error") << r.body;
  EXPECT_NE(json::parse(r.body)["error"]["message"].get<std::string>().find("temperature"), std::string::npos) << r.body;
  // The replica failing before any token: the job's error reply in the API's shape.
  api_outcome lost = api_->handle("POST", "/v1/messages", "Bearer sekret", ok);
  ASSERT_TRUE(std::holds_alternative<generation_job>(lost));
  actors::token_msg failure{req(lost).id, -1, actors::finish_reason::none, true, make_error(errc::replica_unavailable, "no replica"), {}, {}};
  job(lost).output->on_message(failure);
  ASSERT_TRUE(job(lost).output->done());
  r = job(lost).output->reply();
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(json::parse(r.body), json::parse(R"({"type":"error","error":{"type":"overloaded_error","message":"no replica"}})")) << r.body;

  // count_tokens: the chat template's prompt, as /tokenize counts the same chat messages.
  const std::string msgs = R"([{"role":"user","content":"In the beginning"},{"role":"assistant","content":"God"},{"role":"user","content":"created?"}])";
  r = reply(api_->handle("POST", "/v1/messages/count_tokens", "Bearer sekret", R"({"model":"kjv","system":"Be brief.","messages":)" + msgs + "}"));
  ASSERT_EQ(r.status, 200) << r.body;
  const http_reply t = reply(api_->handle("POST", "/tokenize", "Bearer sekret",
                                          R"({"model":"kjv","messages":[{"role":"system","content":"Be brief."},)" + msgs.substr(1) + "}"));
  ASSERT_EQ(t.status, 200) << t.body;
  const size_t n = json::parse(r.body)["input_tokens"];
  EXPECT_EQ(n, json::parse(t.body)["count"].get<size_t>());
  EXPECT_GT(n, 5u);
  EXPECT_EQ(json::parse(r.body).size(), 1u);
  r = reply(api_->handle("POST", "/v1/messages/count_tokens", "Bearer sekret", R"({"model":"kjv","messages":[{"role":"user","content":[{"type":"image"}]}]})"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "invalid_request_error");
}

/// An agent's turn with a Qwen3 model (its tokenizer and template): the history's tool_use and
/// tool_result blocks reach the template as the model's own <tool_call> and <tool_response>
/// turns, and the model's thinking and call come back as thinking and tool_use blocks — whole
/// and streamed — with Hermes-style calls, and with Qwen3-Coder's XML ones typed by the tool's
/// input_schema.
class MessagesWithQwen : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = model::tokenizer::load(LLMESH_TEST_DATA "/tokenizers/qwen3");
    auto chat = model::chat_template::load(LLMESH_TEST_DATA "/tokenizers/qwen3");
    ASSERT_TRUE(t.ok() && chat.ok());
    tok_ = *t;
    chat_ = *chat;
  }
  std::unique_ptr<api_service> service(tool_call_parser parser) {
    model::model_config cfg;
    cfg.vocab = 151936;
    cfg.max_positions = 8192;
    return std::make_unique<api_service>(api_options{}, std::vector{served_model{"q", tok_, chat_, cfg, reasoning_parser::qwen3, parser}},
                                         mesh_, metrics_);
  }
  /// The reply of a request answered with `output`'s tokens (the last one ending it).
  std::string answer(api_service& api, const json& body, const std::string& output, std::string* prompt = nullptr) {
    api_outcome o = api.handle("POST", "/v1/messages", "", body.dump());
    if (!std::holds_alternative<generation_job>(o)) {
      ADD_FAILURE() << std::get<http_reply>(o).body;
      return "";
    }
    auto& job = std::get<generation_job>(o);
    if (prompt) *prompt = tok_->decoder().decode(job.requests.at(0).prompt, false);
    const auto ids = tok_->encode(output, false);
    std::string sse;
    for (size_t i = 0; i < ids.size(); ++i) {
      sse += job.output->on_message(actors::token_msg{job.requests[0].id, ids[i], i + 1 == ids.size() ? actors::finish_reason::eos : actors::finish_reason::none,
                                                      false, {}, {}, {}});
    }
    EXPECT_TRUE(job.output->done());
    return body.value("stream", false) ? sse : job.output->reply().body;
  }
  const json turn = json::parse(R"({"model":"q","max_tokens":200,
    "system":[{"type":"text","text":"You are an agent."}],
    "tools":[{"name":"get_weather","description":"The weather.","input_schema":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}],
    "messages":[{"role":"user","content":"Weather in Ur?"},
      {"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Ur"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"fair"},{"type":"text","text":"And for 3 days?"}]}]})");
  std::shared_ptr<const model::tokenizer> tok_;
  std::optional<model::chat_template> chat_;
  fake_mesh mesh_;
  actors::metrics_registry metrics_;
};

TEST_F(MessagesWithQwen, ToolUseAndResultsReachTheTemplateAndCallsComeBackAsToolUse) {
  auto api = service(tool_call_parser::hermes);
  std::string prompt;
  const std::string out = "<think>\nLook it up.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Ur\", \"days\": 3}}\n</tool_call>";
  const json m = json::parse(answer(*api, turn, out, &prompt));
  EXPECT_NE(prompt.find("You are an agent.\n\n# Tools"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find(R"("name": "get_weather")"), std::string::npos) << prompt;
  // (the arguments reach the template as an object, as vLLM passes them)
  EXPECT_NE(prompt.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Ur\"}}\n</tool_call>"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<|im_start|>user\n<tool_response>\nfair\n</tool_response><|im_end|>\n<|im_start|>user\nAnd for 3 days?<|im_end|>\n<|im_start|>assistant\n"),
            std::string::npos)
      << prompt;
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();  // (the blank "\n\n" between them: no text block)
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "\nLook it up.\n");
  EXPECT_EQ(m["content"][1]["type"], "tool_use");
  EXPECT_EQ(m["content"][1]["name"], "get_weather");
  EXPECT_EQ(m["content"][1]["input"], json::parse(R"({"city":"Ur","days":3})"));
  EXPECT_EQ(m["stop_reason"], "tool_use");

  json streamed = turn;
  streamed["stream"] = true;
  const auto events = events_of(answer(*api, streamed, out));
  std::vector<std::string> blocks;
  std::string args;
  for (const auto& e : events) {
    if (e["type"] == "content_block_start") blocks.push_back(e["content_block"]["type"]);
    if (e["type"] == "content_block_delta" && e["delta"]["type"] == "input_json_delta") args += e["delta"]["partial_json"].get<std::string>();
  }
  EXPECT_EQ(blocks, (std::vector<std::string>{"thinking", "tool_use"}));
  EXPECT_EQ(json::parse(args), m["content"][1]["input"]);
  EXPECT_EQ(events.back()["type"], "message_stop");
  EXPECT_EQ(events[events.size() - 2]["delta"]["stop_reason"], "tool_use");
}

// vLLM's stop_reason on the chat endpoint: the model's end ids name it but the tokenizer's EOS
// (Qwen3's <|im_end|>, tested first in vLLM), and so does a requested stop id.
TEST_F(MessagesWithQwen, StopReasonNamesEveryEndIdButTheTokenizersEos) {
  model::model_config cfg;
  cfg.vocab = 151936;
  cfg.max_positions = 8192;
  const int32_t im_end = tok_->encode("<|im_end|>", false).at(0), eot = tok_->encode("<|endoftext|>", false).at(0);
  cfg.eos_ids = {im_end, eot};
  api_service api(api_options{}, std::vector{served_model{"q", tok_, chat_, cfg}}, mesh_, metrics_);
  auto stop_reason = [&](const std::string& extra, int32_t last) {
    api_outcome o = api.handle("POST", "/v1/chat/completions", "", R"({"model":"q","messages":[{"role":"user","content":"hi"}])" + extra + "}");
    EXPECT_TRUE(std::holds_alternative<generation_job>(o));
    if (!std::holds_alternative<generation_job>(o)) return json();
    auto& job = std::get<generation_job>(o);
    job.output->on_message(actors::token_msg{job.requests[0].id, tok_->encode("Hi", false).at(0), actors::finish_reason::none, false, {}, {}, {}});
    job.output->on_message(actors::token_msg{job.requests[0].id, last, actors::finish_reason::eos, false, {}, {}, {}});
    return json::parse(job.output->reply().body)["choices"][0]["stop_reason"];
  };
  EXPECT_TRUE(stop_reason("", im_end).is_null());
  EXPECT_EQ(stop_reason("", eot), eot);
  EXPECT_TRUE(stop_reason(R"(,"stop_token_ids":[)" + std::to_string(im_end) + "]", im_end).is_null());
  EXPECT_EQ(stop_reason(R"(,"stop_token_ids":[)" + std::to_string(im_end) + R"(],"ignore_eos":true)", im_end), im_end);
  EXPECT_TRUE(stop_reason(R"(,"ignore_eos":true,"stop_token_ids":[7])", eot).is_null());  // ignore_eos: the model's ends are not stops
}

TEST_F(MessagesWithQwen, Qwen3CoderCallsAreTypedByTheToolsInputSchema) {
  auto api = service(tool_call_parser::qwen3_coder);
  const std::string out = "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nUr\n</parameter>\n"
                          "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  json quick = turn;
  quick["thinking"] = {{"type", "disabled"}};  // the template closes the block: no thinking
  const json m = json::parse(answer(*api, quick, out));
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(m["content"][0], json::parse(R"({"type":"text","text":"Checking.\n"})"));
  EXPECT_EQ(m["content"][1]["input"], json::parse(R"({"city":"Ur","days":3})"));  // days an integer, as its schema says
  EXPECT_EQ(m["stop_reason"], "tool_use");
}

// Mutated requests through the whole endpoint never throw and answer a job or a 4xx in the
// API's shape; mutated chat streams through the renderer never throw and each event it writes
// is JSON of its announced type.
TEST(MessagesApi, MutatedRequestsAndStreamsNeverThrow) {
  fake_mesh mesh;
  actors::metrics_registry metrics;
  std::shared_ptr<const model::tokenizer> tok;
  api_options o;
  o.max_concurrent = 1 << 20;
  auto api = kjv_service(o, mesh, metrics, tok);
  ASSERT_TRUE(api);
  const std::string seeds[] = {
      R"({"model":"m","max_tokens":3,"system":"s","messages":[{"role":"user","content":"x"}],"temperature":0.5,"stream":true,"stop_sequences":["a"]})",
      R"({"model":"m","max_tokens":3,"messages":[{"role":"user","content":[{"type":"text","text":"w"}]},)"
      R"({"role":"assistant","content":[{"type":"text","text":"t"},{"type":"tool_use","id":"c","name":"f","input":{"a":1}}]},)"
      R"({"role":"user","content":[{"type":"tool_result","tool_use_id":"c","content":[{"type":"text","text":"o"}]}]}],)"
      R"("tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"}})",
      R"({"model":"m","max_tokens":3,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"disabled"},"output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}}})",
  };
  for (const auto& b : seeds) {
    auto out = api->handle("POST", "/v1/messages", "", b);
    EXPECT_TRUE(std::holds_alternative<generation_job>(out)) << b << " " << (std::holds_alternative<http_reply>(out) ? std::get<http_reply>(out).body : "");
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 4000; ++i) {
    const std::string body = testing::mutate_json(seeds[static_cast<size_t>(i) % std::size(seeds)], rng);
    for (const char* path : {"/v1/messages", "/v1/messages/count_tokens"}) {
      api_outcome out;
      ASSERT_NO_THROW(out = api->handle("POST", path, "", body)) << body;
      if (auto* r = std::get_if<http_reply>(&out)) {
        if (r->status == 200) continue;  // count_tokens' answer
        EXPECT_GE(r->status, 400) << body;
        EXPECT_LT(r->status, 500) << body << " " << r->body;
        const json e = json::parse(r->body, nullptr, false);
        EXPECT_TRUE(e.is_object() && e["type"] == "error" && e["error"]["type"].is_string()) << r->body;
      }
    }
  }
  const std::string env = R"("id":"chatcmpl-0a","object":"chat.completion.chunk","created":1,"model":"m")";
  const std::string stream_seed =
      "data: {" + env + R"(,"choices":[{"index":0,"delta":{"reasoning_content":"a","content":"b","tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":"{"}}]},"finish_reason":null}],"usage":{"prompt_tokens":1,"completion_tokens":1}})" "\n\n"
      "data: {" + env + R"(,"choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":"x"}]})" "\n\n"
      "data: {" + env + R"(,"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})" "\n\n"
      "data: [DONE]\n\n";
  for (int i = 0; i < 3000; ++i) {
    messages_renderer r("chatcmpl-0a", "m");
    std::string out;
    ASSERT_NO_THROW(out = r.stream(testing::mutate_json(stream_seed, rng)));
    ASSERT_NO_THROW(r.whole(testing::mutate_json(chat_whole, rng)));
    testing::expect_well_typed(out);
  }
}

}  // namespace
}  // namespace llmesh::gateway
