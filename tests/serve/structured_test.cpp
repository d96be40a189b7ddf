// Structured outputs and forced tool calls through `llmesh serve` with the bundled tiny model:
// whatever the model would have written, the output follows the request's constraint —
// response_format json_schema (both endpoints), guided_choice (every choice of n), guided_regex
// (streamed too), a named tool_choice (whole and streamed), tool_choice "required", and "auto"
// with a Hermes-style call in the text — and a bad constraint is a 400 naming its field before
// anything runs; allowed_token_ids masks every draw the same way. Schemas use enums and
// booleans so that a 4096-token model trained on
// scripture ends its answer well within max_tokens.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::ordered_json;

const std::string bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";

/// One server for the suite (the model loads in a moment; the tests only read).
class ServeStructured : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new server_process(bin, {"--model", model_dir}); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_GT(server_->port(), 0) << server_->log(); }

  static http_response post(const std::string& path, const json& body) {
    return http_request(server_->port(), "POST", path, body.dump());
  }
  /// A 200's body, parsed (a failed request fails the test, its body shown).
  static json ok(const std::string& path, const json& body) {
    auto r = post(path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    auto j = json::parse(r.body, nullptr, false);
    return j.is_discarded() ? json::object() : j;
  }
  static json chat_body(const json& extra) {
    json b = {{"model", "kjv-tiny"},
              {"messages", {{{"role", "user"}, {"content", "Who led Israel out of Egypt?"}}}},
              {"max_tokens", 160},
              {"temperature", 0}};
    b.update(extra);
    return b;
  }
  /// The SSE events' JSON payloads (without [DONE]).
  static std::vector<json> events(const std::string& body) {
    std::vector<json> out;
    for (const auto& p : sse_payloads(body)) {
      if (p != "[DONE]") out.push_back(json::parse(p, nullptr, false));
    }
    return out;
  }

  static inline server_process* server_ = nullptr;
};

json answer_schema = json::parse(R"({"type":"object","properties":{
    "leader":{"type":"string","enum":["Moses","Aaron","Pharaoh"]},"sure":{"type":"boolean"}},
    "required":["leader","sure"],"additionalProperties":false})");

/// The output follows answer_schema.
void expect_answer(const std::string& text) {
  auto j = json::parse(text, nullptr, false);
  ASSERT_TRUE(j.is_object()) << "not a JSON object: " << text;
  EXPECT_EQ(j.size(), 2u) << text;
  ASSERT_TRUE(j.contains("leader") && j["leader"].is_string()) << text;
  EXPECT_TRUE(std::set<std::string>({"Moses", "Aaron", "Pharaoh"}).count(j["leader"].get<std::string>())) << text;
  EXPECT_TRUE(j.contains("sure") && j["sure"].is_boolean()) << text;
}

TEST_F(ServeStructured, ResponseFormatJsonSchemaIsFollowedOnBothEndpoints) {
  json rf = {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"strict", true}, {"schema", answer_schema}}}};
  auto c = ok("/v1/chat/completions", chat_body({{"response_format", rf}}));
  ASSERT_TRUE(c.contains("choices")) << c;
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop") << c;
  expect_answer(c["choices"][0]["message"]["content"]);
  auto p = ok("/v1/completions", {{"model", "kjv-tiny"}, {"prompt", "And the LORD said unto"}, {"max_tokens", 160},
                                  {"temperature", 0.8}, {"seed", 3}, {"response_format", rf}});
  ASSERT_TRUE(p.contains("choices")) << p;
  EXPECT_EQ(p["choices"][0]["finish_reason"], "stop") << p;
  expect_answer(p["choices"][0]["text"]);
  // vLLM's guided_json (a schema as a string) means the same.
  auto g = ok("/v1/completions", {{"model", "kjv-tiny"}, {"prompt", "Blessed are the"}, {"max_tokens", 160},
                                  {"temperature", 0}, {"guided_json", answer_schema.dump()}});
  ASSERT_TRUE(g.contains("choices")) << g;
  expect_answer(g["choices"][0]["text"]);
}

TEST_F(ServeStructured, GuidedChoiceHoldsForEveryChoice) {
  const std::set<std::string> names = {"Moses", "Aaron", "Pharaoh", "the LORD"};
  auto j = ok("/v1/completions", {{"model", "kjv-tiny"}, {"prompt", "And the LORD spake unto"}, {"max_tokens", 16},
                                  {"n", 4}, {"temperature", 1.0}, {"seed", 11},
                                  {"guided_choice", {"Moses", "Aaron", "Pharaoh", "the LORD"}}});
  ASSERT_EQ(j["choices"].size(), 4u) << j;
  for (const auto& c : j["choices"]) {
    EXPECT_TRUE(names.count(c["text"].get<std::string>())) << c;
    EXPECT_EQ(c["finish_reason"], "stop") << c;
  }
  // structured_outputs.choice on chat.
  auto s = ok("/v1/chat/completions", chat_body({{"structured_outputs", {{"choice", {"yes", "no"}}}}}));
  const std::string text = s["choices"][0]["message"]["content"];
  EXPECT_TRUE(text == "yes" || text == "no") << s;
}

TEST_F(ServeStructured, GuidedRegexIsMatchedWholeAndStreamed) {
  const std::string pattern = "[0-9]{3}-[a-z]{2,4}";
  json body = {{"model", "kjv-tiny"}, {"prompt", "In the beginning God created"}, {"max_tokens", 32},
                     {"temperature", 0}, {"guided_regex", pattern}};
  auto j = ok("/v1/completions", body);
  const std::string text = j["choices"][0]["text"];
  EXPECT_TRUE(std::regex_match(text, std::regex(pattern))) << j;
  json streamed = body;
  streamed["stream"] = true;
  auto r = post("/v1/completions", streamed);
  ASSERT_EQ(r.status, 200) << r.body;
  std::string joined;
  for (const auto& e : events(r.body)) {
    if (e.contains("choices") && !e["choices"].empty()) joined += e["choices"][0].value("text", "");
  }
  EXPECT_EQ(joined, text) << r.body;  // greedy: the same constrained text
}

json weather_tools = json::parse(R"([
  {"type":"function","function":{"name":"get_weather","description":"The weather in a city",
   "parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Jerusalem","Babylon","Egypt"]},
   "unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city","unit"],"additionalProperties":false}}},
  {"type":"function","function":{"name":"count_tribes","parameters":{"type":"object",
   "properties":{"of":{"type":"string","enum":["Israel","Judah"]}},"required":["of"],"additionalProperties":false}}}])");

/// A call's arguments follow its tool's parameters.
void expect_arguments(const std::string& name, const std::string& arguments) {
  auto a = json::parse(arguments, nullptr, false);
  ASSERT_TRUE(a.is_object()) << name << ": " << arguments;
  if (name == "get_weather") {
    EXPECT_TRUE(std::set<std::string>({"Jerusalem", "Babylon", "Egypt"}).count(a.value("city", ""))) << arguments;
    EXPECT_TRUE(std::set<std::string>({"celsius", "fahrenheit"}).count(a.value("unit", ""))) << arguments;
  } else {
    EXPECT_EQ(name, "count_tribes");
    EXPECT_TRUE(std::set<std::string>({"Israel", "Judah"}).count(a.value("of", ""))) << arguments;
  }
}

TEST_F(ServeStructured, ANamedToolChoiceAnswersWithThatToolsCall) {
  json body = chat_body({{"tools", weather_tools},
                               {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  auto j = ok("/v1/chat/completions", body);
  ASSERT_TRUE(j.contains("choices")) << j;
  json msg = j["choices"][0]["message"];
  ASSERT_EQ(msg["tool_calls"].size(), 1u) << j;
  json call = msg["tool_calls"][0];
  EXPECT_TRUE(std::regex_match(call["id"].get<std::string>(), std::regex("chatcmpl-tool-[0-9a-f]{32}"))) << call;
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  expect_arguments("get_weather", call["function"]["arguments"]);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << j;
  // Streamed: the call's start, then argument pieces that join into the same arguments.
  json s = body;
  s["stream"] = true;
  auto r = post("/v1/chat/completions", s);
  ASSERT_EQ(r.status, 200) << r.body;
  auto ev = events(r.body);
  ASSERT_GE(ev.size(), 2u) << r.body;
  json head = ev[0]["choices"][0]["delta"];
  EXPECT_EQ(head["role"], "assistant") << r.body;
  EXPECT_EQ(head["tool_calls"][0]["function"]["name"], "get_weather") << r.body;
  std::string joined;
  std::string finish;
  for (const auto& e : ev) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    json c = e["choices"][0];
    if (c["delta"].contains("tool_calls")) joined += c["delta"]["tool_calls"][0]["function"]["arguments"].get<std::string>();
    EXPECT_FALSE(c["delta"].contains("content")) << e;
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(joined, call["function"]["arguments"].get<std::string>()) << "greedy: the same arguments";
  EXPECT_EQ(finish, "stop");
}

// The JSON grammar lets each gap between tokens hold a newline and up to 20 spaces, and the
// bundled model fills every gap: an array of calls then outgrows its 256-token context. A
// logit_bias against the four whitespace tokens (tab, newline, CR, space in its byte-level
// vocabulary) keeps the output compact — the grammar still decides what may come, the bias
// only which of the allowed tokens wins. With parallel calls allowed, greedy decoding of this
// model repeats its call until the context ends; a bias for "]" (id 93, allowed only where the
// array may close) ends it after the first.
json no_whitespace = {{"9", -100}, {"10", -100}, {"13", -100}, {"32", -100}};

TEST_F(ServeStructured, ToolChoiceRequiredAnswersWithCalls) {
  for (bool parallel : {true, false}) {
    json bias = no_whitespace;
    if (parallel) bias["93"] = 100;
    auto j = ok("/v1/chat/completions",
                chat_body({{"tools", weather_tools}, {"tool_choice", "required"}, {"parallel_tool_calls", parallel},
                           {"max_tokens", 200}, {"logit_bias", bias}}));
    ASSERT_TRUE(j.contains("choices")) << j;
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << j;
    json calls = j["choices"][0]["message"].value("tool_calls", json::array());
    ASSERT_GE(calls.size(), 1u) << j;
    if (!parallel) {
      EXPECT_EQ(calls.size(), 1u) << j;
    }
    for (const auto& call : calls) expect_arguments(call["function"]["name"], call["function"]["arguments"]);
  }
  // Streamed: the calls come whole with the finish.
  auto r = post("/v1/chat/completions", chat_body({{"tools", weather_tools}, {"tool_choice", "required"},
                                                   {"parallel_tool_calls", false}, {"max_tokens", 200},
                                                   {"logit_bias", no_whitespace}, {"stream", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  auto ev = events(r.body);
  ASSERT_GE(ev.size(), 2u) << r.body;
  json last = ev.back()["choices"][0];
  EXPECT_EQ(last["finish_reason"], "tool_calls") << r.body;
  ASSERT_EQ(last["delta"]["tool_calls"].size(), 1u) << r.body;
  expect_arguments(last["delta"]["tool_calls"][0]["function"]["name"], last["delta"]["tool_calls"][0]["function"]["arguments"]);
}

// tool_choice "auto" constrains nothing; Hermes-style calls in the text come back as
// tool_calls. The bundled model never writes one by itself, so a guided_regex (one constraint,
// allowed beside "auto") makes it write one.
TEST_F(ServeStructured, AutoTakesHermesCallsOutOfTheText) {
  const std::string pattern =
      R"re(Behold\.\n<tool_call>\{"name": "count_tribes", "arguments": \{"of": "(Israel|Judah)"\}\}</tool_call>)re";
  for (bool stream : {false, true}) {
    auto r = post("/v1/chat/completions", chat_body({{"tools", weather_tools}, {"guided_regex", pattern}, {"stream", stream}}));
    ASSERT_EQ(r.status, 200) << r.body;
    std::string content, finish;
    json calls = json::array();
    if (stream) {
      for (const auto& e : events(r.body)) {
        if (!e.contains("choices") || e["choices"].empty()) continue;
        json c = e["choices"][0];
        content += c["delta"].value("content", "");
        for (const auto& t : c["delta"].value("tool_calls", json::array())) calls.push_back(t);
        if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      }
    } else {
      json c = json::parse(r.body)["choices"][0];
      content = c["message"]["content"];
      calls = c["message"].value("tool_calls", json::array());
      finish = c["finish_reason"];
    }
    EXPECT_EQ(content, "Behold.\n") << r.body;
    ASSERT_EQ(calls.size(), 1u) << r.body;
    EXPECT_EQ(calls[0]["function"]["name"], "count_tribes");
    expect_arguments("count_tribes", calls[0]["function"]["arguments"]);
    EXPECT_EQ(finish, "tool_calls") << r.body;
  }
}

TEST_F(ServeStructured, BadConstraintsAre400sNamingTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"guided_regex", "(ab"}}, "'guided_regex': "},
      {{{"guided_choice", json::array()}}, "'guided_choice' must be a non-empty array of strings"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}},
       "'response_format.json_schema.schema' is required"},
      {{{"guided_regex", "a"}, {"guided_choice", {"a"}}}, "'guided_regex' and 'guided_choice'"},
      {{{"tools", weather_tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "smite"}}}}}},
       "'tool_choice' names the function 'smite', which is not in 'tools'"},
      {{{"tools", {{{"type", "function"}}}}}, "'tools[0].function' must be an object"},
  };
  for (const auto& [extra, needle] : cases) {
    auto r = post("/v1/chat/completions", chat_body(extra));
    EXPECT_EQ(r.status, 400) << extra << ": " << r.body;
    auto j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r.body;
  }
}

}  // namespace
}  // namespace llmesh::testing

namespace llmesh::testing {
namespace {

// vLLM's allowed_token_ids: whatever the model would draw, every token is one of the set, sampled
// (n 3) and greedy, alone or one id; beside a structured output it is a 400, as is an id
// outside the vocabulary.
TEST_F(ServeStructured, AllowedTokenIdsAreTheOnlyTokensDrawn) {
  const std::set<int32_t> allowed{258, 340, 386, 2078};
  json body = {{"model", "kjv-tiny"}, {"prompt", "And the LORD said unto Moses"}, {"max_tokens", 12},
               {"temperature", 1.0}, {"seed", 5}, {"n", 3}, {"return_token_ids", true},
               {"allowed_token_ids", std::vector<int32_t>(allowed.begin(), allowed.end())}};
  const json r = ok("/v1/completions", body);
  ASSERT_EQ(r["choices"].size(), 3u) << r;
  std::set<int32_t> drawn;
  for (const auto& c : r["choices"]) {
    const auto ids = c["token_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids.size(), 12u) << c;  // no end id in the set: the output runs to max_tokens
    for (int32_t t : ids) {
      EXPECT_TRUE(allowed.count(t)) << t << " drawn: " << c;
      drawn.insert(t);
    }
  }
  EXPECT_GT(drawn.size(), 1u) << "sampling at temperature 1 should use more than one of the set";
  body["temperature"] = 0;
  body["n"] = 1;
  body["allowed_token_ids"] = {340};
  const json one = ok("/v1/completions", body);
  EXPECT_EQ(one["choices"][0]["token_ids"].get<std::vector<int32_t>>(), std::vector<int32_t>(12, 340)) << one;

  json bad = body;
  bad["allowed_token_ids"] = {1 << 20};
  auto outside = post("/v1/completions", bad);
  EXPECT_EQ(outside.status, 400) << outside.body;
  EXPECT_NE(outside.body.find("'allowed_token_ids'"), std::string::npos) << outside.body;
  bad = body;
  bad["guided_choice"] = {"Moses", "Aaron"};
  auto both = post("/v1/completions", bad);
  EXPECT_EQ(both.status, 400) << both.body;
  EXPECT_NE(both.body.find("cannot be combined"), std::string::npos) << both.body;
}

}  // namespace
}  // namespace llmesh::testing
