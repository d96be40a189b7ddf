// `llmesh serve` over real HTTP, Anthropic's Messages API: a message says what the same chat
// request says (greedy text, tokens), whole and streamed (the stream's text deltas add up to the
// whole message, its events in Anthropic's order); a stop sequence is named; count_tokens
// counts the chat prompt; the key is taken from x-api-key as from a bearer token, and a wrong
// one is refused in Anthropic's error shape.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";

/// The events of a Messages stream: (event name, data).
std::vector<std::pair<std::string, json>> message_events(const std::string& body) {
  std::vector<std::pair<std::string, json>> out;
  size_t at = 0;
  while ((at = body.find("event: ", at)) != std::string::npos) {
    const size_t eol = body.find('\n', at);
    const size_t data = body.find("data: ", eol);
    const size_t end = body.find("\n\n", data);
    if (eol == std::string::npos || data == std::string::npos || end == std::string::npos) break;
    out.emplace_back(body.substr(at + 7, eol - at - 7), json::parse(body.substr(data + 6, end - data - 6), nullptr, false));
    at = end + 2;
  }
  return out;
}

TEST(ServeMessages, AMessageSaysWhatTheChatRequestSaysWholeAndStreamed) {
  server_process s(bin, {"--model", model_dir, "--api-key", "k", "--max-body-kb", "64"});
  ASSERT_GT(s.port(), 0) << s.log();
  const std::string key = "x-api-key: k\r\nanthropic-version: 2023-06-01\r\n";
  const json msgs = json::array({{{"role", "user"}, {"content", "In the beginning"}}});
  const json req = {{"model", "kjv-tiny"}, {"max_tokens", 20}, {"temperature", 0}, {"system", "Genesis."}, {"messages", msgs}};

  auto r = http_request(s.port(), "POST", "/v1/messages", req.dump(), key);
  ASSERT_EQ(r.status, 200) << r.body;
  const json m = json::parse(r.body);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "kjv-tiny");
  EXPECT_EQ(m["id"].get<std::string>().rfind("msg_", 0), 0u) << m["id"];
  ASSERT_EQ(m["content"].size(), 1u) << r.body;
  EXPECT_EQ(m["content"][0]["type"], "text");
  const std::string text = m["content"][0]["text"];
  EXPECT_FALSE(text.empty());
  EXPECT_TRUE(m["stop_reason"] == "max_tokens" || m["stop_reason"] == "end_turn") << r.body;
  EXPECT_TRUE(m["stop_sequence"].is_null());

  // The chat request it means answers the same (bearer token this time).
  json chat_msgs = msgs;
  chat_msgs.insert(chat_msgs.begin(), json{{"role", "system"}, {"content", "Genesis."}});
  auto c = http_request(s.port(), "POST", "/v1/chat/completions",
                        json{{"model", "kjv-tiny"}, {"max_tokens", 20}, {"temperature", 0}, {"messages", chat_msgs}}.dump(),
                        "Authorization: Bearer k\r\n");
  ASSERT_EQ(c.status, 200) << c.body;
  const json cj = json::parse(c.body);
  EXPECT_EQ(cj["choices"][0]["message"]["content"], text);
  EXPECT_EQ(m["usage"]["output_tokens"], cj["usage"]["completion_tokens"]);
  const int64_t prompt_tokens = cj["usage"]["prompt_tokens"];
  EXPECT_EQ(m["usage"]["input_tokens"].get<int64_t>() + m["usage"].value("cache_read_input_tokens", int64_t{0}), prompt_tokens) << m["usage"];
  EXPECT_TRUE(cj["choices"][0].contains("stop_reason"));  // vLLM's field, on the chat endpoint too

  // Streamed: Anthropic's event order, the deltas adding up to the whole message.
  json sreq = req;
  sreq["stream"] = true;
  auto st = http_request(s.port(), "POST", "/v1/messages", sreq.dump(), key);
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_EQ(st.headers["content-type"].rfind("text/event-stream", 0), 0u);
  const auto ev = message_events(st.body);
  ASSERT_GE(ev.size(), 6u) << st.body;
  EXPECT_EQ(ev.front().first, "message_start");
  EXPECT_EQ(ev.front().second["message"]["usage"]["output_tokens"], 0);
  EXPECT_EQ(ev[1].first, "content_block_start");
  EXPECT_EQ(ev[ev.size() - 3].first, "content_block_stop");
  EXPECT_EQ(ev[ev.size() - 2].first, "message_delta");
  EXPECT_EQ(ev.back().first, "message_stop");
  std::string streamed;
  for (const auto& [name, d] : ev) {
    EXPECT_EQ(d["type"], name);
    if (name == "content_block_delta") streamed += d["delta"]["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(ev[ev.size() - 2].second["delta"]["stop_reason"], m["stop_reason"]);
  EXPECT_EQ(ev[ev.size() - 2].second["usage"]["output_tokens"], m["usage"]["output_tokens"]);
  EXPECT_EQ(st.body.find("[DONE]"), std::string::npos);

  // A stop sequence from the middle of the answer: named, and the text ends before it.
  const size_t cut = text.find(' ', text.size() / 2);
  ASSERT_NE(cut, std::string::npos) << text;
  const std::string word = text.substr(cut, text.find(' ', cut + 1) - cut);
  json stop_req = req;
  stop_req["stop_sequences"] = {word};
  auto sr = http_request(s.port(), "POST", "/v1/messages", stop_req.dump(), key);
  ASSERT_EQ(sr.status, 200) << sr.body;
  const json sm = json::parse(sr.body);
  EXPECT_EQ(sm["stop_reason"], "stop_sequence") << sr.body;
  EXPECT_EQ(sm["stop_sequence"], word);
  EXPECT_EQ(sm["content"][0]["text"], text.substr(0, text.find(word))) << sr.body;

  // count_tokens: the chat prompt's tokens.
  auto ct = http_request(s.port(), "POST", "/v1/messages/count_tokens",
                         json{{"model", "kjv-tiny"}, {"system", "Genesis."}, {"messages", msgs}}.dump(), key);
  ASSERT_EQ(ct.status, 200) << ct.body;
  EXPECT_EQ(json::parse(ct.body), (json{{"input_tokens", prompt_tokens}}));

  // The key: wrong or missing, refused in Anthropic's shape.
  for (const std::string& bad : {std::string("x-api-key: nope\r\n"), std::string()}) {
    auto u = http_request(s.port(), "POST", "/v1/messages", req.dump(), bad);
    EXPECT_EQ(u.status, 401);
    const json e = json::parse(u.body, nullptr, false);
    EXPECT_EQ(e["type"], "error") << u.body;
    EXPECT_EQ(e["error"]["type"], "authentication_error") << u.body;
  }
  // x-api-key serves the OpenAI routes as well (as vLLM accepts it).
  EXPECT_EQ(http_request(s.port(), "GET", "/v1/models", "", "x-api-key: k\r\n").status, 200);
  EXPECT_EQ(http_request(s.port(), "GET", "/v1/models", "", "x-api-key: nope\r\n").status, 401);
  // A refusal of the request itself, named by the API's fields.
  json no_max = req;
  no_max.erase("max_tokens");
  auto nm = http_request(s.port(), "POST", "/v1/messages", no_max.dump(), key);
  EXPECT_EQ(nm.status, 400);
  EXPECT_NE(nm.body.find("'max_tokens' is required"), std::string::npos) << nm.body;
  EXPECT_NE(nm.body.find("\"invalid_request_error\""), std::string::npos) << nm.body;
  // A body over --max-body-kb, refused before any route runs: still this API's shape.
  json big = req;
  big["system"] = std::string(80 * 1024, 'x');
  auto tb = http_request(s.port(), "POST", "/v1/messages", big.dump(), key);
  EXPECT_EQ(tb.status, 413);
  EXPECT_EQ(json::parse(tb.body, nullptr, false)["type"], "error") << tb.body;
  EXPECT_EQ(json::parse(tb.body, nullptr, false)["error"]["type"], "request_too_large") << tb.body;
}

}  // namespace
}  // namespace llmesh::testing
