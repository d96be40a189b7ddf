// The Responses API's stored responses: the bounded store itself, and through api_service
// (a mesh that only records; the test plays the replica) a response stored as it was returned,
// read back with GET and its input_items, continued with previous_response_id — the chained
// request's prompt is the one of sending the whole conversation as input — and deleted.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/api_service.hpp"
#include "llmesh/gateway/response_store.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

stored_response sized(size_t text_bytes) {
  stored_response r;
  r.response = {{"id", "x"}, {"output", json::array({{{"type", "message"}, {"text", std::string(text_bytes, 'a')}}})}};
  r.input_items = json::array();
  return r;
}

TEST(ResponseStore, KeepsTheNewestWithinItsEntryAndByteBounds) {
  response_store s(3, 10000);
  for (const char* id : {"a", "b", "c", "d"}) s.put(id, sized(10));
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s.get("a"), nullptr);  // the oldest went first
  ASSERT_NE(s.get("d"), nullptr);
  EXPECT_EQ(s.get("d")->response["output"][0]["text"], std::string(10, 'a'));
  EXPECT_TRUE(s.erase("c"));
  EXPECT_FALSE(s.erase("c"));
  EXPECT_EQ(s.size(), 2u);
  // Bytes (each kept as its JSON text): one large response pushes out older ones until the
  // total fits again.
  const size_t small = s.bytes() / 2;  // b and d, alike
  response_store probe(1, 1 << 20);
  probe.put("x", sized(0));
  const size_t overhead = probe.bytes();  // a response's bytes beyond its text's
  EXPECT_EQ(small, overhead + 10);
  s.put("big", sized(10000 - small - overhead));  // exactly fills the budget beside one small one
  EXPECT_EQ(s.get("b"), nullptr);                 // so the oldest went
  EXPECT_NE(s.get("d"), nullptr);
  EXPECT_NE(s.get("big"), nullptr);
  EXPECT_EQ(s.bytes(), 10000u);
  // Larger than the whole budget: not kept, and nothing else is dropped for it.
  s.put("huge", sized(20000));
  EXPECT_EQ(s.get("huge"), nullptr);
  EXPECT_NE(s.get("big"), nullptr);
  EXPECT_NE(s.get("d"), nullptr);
  // The same id again replaces it (counted once).
  s.put("big", sized(5));
  EXPECT_EQ(s.bytes(), overhead + 5 + small);
  EXPECT_EQ(s.get("big")->response["output"][0]["text"], "aaaaa");
  // Erasing out of order and storing on keeps the bounds exact.
  response_store t(2, 1 << 20);
  for (int i = 0; i < 1000; ++i) {
    t.put("r" + std::to_string(i), sized(1));
    if (i % 3 == 0) t.erase("r" + std::to_string(i - 1));
  }
  EXPECT_LE(t.size(), 2u);
  EXPECT_NE(t.get("r999"), nullptr);
  response_store off(0, 1 << 20);
  EXPECT_FALSE(off.enabled());
  off.put("a", sized(1));
  EXPECT_EQ(off.get("a"), nullptr);
}

TEST(ResponseStore, AConversationIsTheEarlierItemsThenTheInputThenTheOutput) {
  stored_response r;
  r.earlier = json::parse(R"([{"id":"e"}])");
  r.input_items = json::parse(R"([{"id":"i1"},{"id":"i2"}])");
  r.response = json::parse(R"({"output":[{"id":"o"}]})");
  EXPECT_EQ(r.conversation(), json::parse(R"([{"id":"e"},{"id":"i1"},{"id":"i2"},{"id":"o"}])"));
}

/// Records what it is sent; the test answers for the replica.
struct recording_mesh : actors::mesh_client {
  void submit(actors::replica_request, actors::token_sink) override {}
  void cancel(uint64_t) override {}
  size_t ready_replicas() const override { return 1; }
};

class StoredResponses : public ::testing::Test {
 protected:
  void SetUp() override { start(api_options{}); }
  void start(api_options o) {
    const std::string dir = LLMESH_SOURCE_DIR "/models/kjv-tiny";
    auto t = model::tokenizer::load(dir);
    auto c = model::load_config(dir);
    auto chat = model::chat_template::load(dir);
    ASSERT_TRUE(t.ok() && c.ok() && chat.ok());
    tok_ = *t;
    o.model_name = "m";
    o.api_key = "k";
    o.max_concurrent = 64;
    api_ = std::make_unique<api_service>(o, *t, *chat, *c, mesh_, metrics_);
  }
  api_outcome call(const std::string& method, const std::string& path, const std::string& body = "") {
    return api_->handle(method, path, "Bearer k", body);
  }
  http_reply reply(const std::string& method, const std::string& path, const std::string& body = "") {
    auto o = call(method, path, body);
    EXPECT_TRUE(std::holds_alternative<http_reply>(o)) << method << " " << path;
    return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o) : http_reply{};
  }
  /// Runs a Responses request to its end, the replica answering `answer`'s tokens (the last
  /// one ending it by length): the response object, whole or from the stream's last event.
  json run(const json& body, const std::string& answer, std::vector<int32_t>* prompt = nullptr) {
    auto o = call("POST", "/v1/responses", body.dump());
    if (!std::holds_alternative<generation_job>(o)) {
      ADD_FAILURE() << std::get<http_reply>(o).body;
      return nullptr;
    }
    auto& job = std::get<generation_job>(o);
    if (prompt) *prompt = job.requests.at(0).prompt;
    const auto ids = tok_->encode(answer, false);
    std::string streamed;
    for (size_t i = 0; i < ids.size(); ++i) {
      actors::token_msg t{job.requests[0].id, ids[i], i + 1 == ids.size() ? actors::finish_reason::length : actors::finish_reason::none,
                          false, {}, {}, {}};
      streamed += job.output->on_message(t);
    }
    EXPECT_TRUE(job.output->done());
    if (!job.streaming) return json::parse(job.output->reply().body);
    const size_t last = streamed.rfind("data: ");
    return json::parse(streamed.substr(last + 6))["response"];
  }
  json get(const std::string& path) {
    auto r = reply("GET", path);
    EXPECT_EQ(r.status, 200) << path << " " << r.body;
    return r.status == 200 ? json::parse(r.body) : json();
  }

  std::shared_ptr<const model::tokenizer> tok_;
  recording_mesh mesh_;
  actors::metrics_registry metrics_;
  std::unique_ptr<api_service> api_;
};

TEST_F(StoredResponses, AResponseIsStoredReadContinuedAndDeleted) {
  const json first = run({{"model", "m"}, {"instructions", "Be brief."}, {"input", "Who is the LORD?"}, {"max_output_tokens", 3}},
                         " the God of");
  ASSERT_TRUE(first.is_object());
  EXPECT_EQ(first["store"], true);
  EXPECT_EQ(first["previous_response_id"], nullptr);
  const std::string id = first["id"];
  EXPECT_EQ(get("/v1/responses/" + id), first);
  const json items = get("/v1/responses/" + id + "/input_items");
  const std::string hex = id.substr(5);
  EXPECT_EQ(items, json::parse(R"({"object":"list","data":[{"id":"msg_)" + hex + R"(in0","type":"message","role":"user",
    "content":[{"type":"input_text","text":"Who is the LORD?"}]}],"first_id":"msg_)" + hex + R"(in0","last_id":"msg_)" + hex +
                               R"(in0","has_more":false})"));

  // Continued: the prompt is that of the whole conversation sent as input (the first
  // request's instructions do not carry over; this one's stand first).
  std::vector<int32_t> chained, whole;
  const json second = run({{"model", "m"}, {"instructions", "Be kind."}, {"previous_response_id", id}, {"input", "And Moses?"},
                           {"max_output_tokens", 2}},
                          " a man", &chained);
  EXPECT_EQ(second["previous_response_id"], id);
  const json conversation = json::array({{{"role", "user"}, {"content", "Who is the LORD?"}},
                                         {{"role", "assistant"}, {"content", first["output"][0]["content"][0]["text"]}},
                                         {{"role", "user"}, {"content", "And Moses?"}}});
  run({{"model", "m"}, {"instructions", "Be kind."}, {"input", conversation}, {"store", false}}, " x", &whole);
  EXPECT_EQ(chained, whole);
  ASSERT_FALSE(chained.empty());
  // Only its own input is its input_items.
  EXPECT_EQ(get("/v1/responses/" + second["id"].get<std::string>() + "/input_items")["data"].size(), 1u);

  // A third on the second sees both earlier turns; it still does once the first is deleted.
  std::vector<int32_t> third_prompt, again;
  run({{"model", "m"}, {"previous_response_id", second["id"]}, {"input", "Go on."}}, " yea", &third_prompt);
  const http_reply deleted = reply("DELETE", "/v1/responses/" + id);
  EXPECT_EQ(deleted.status, 200);
  EXPECT_EQ(json::parse(deleted.body), json::parse(R"({"id":")" + id + R"(","object":"response","deleted":true})"));
  EXPECT_EQ(reply("GET", "/v1/responses/" + id).status, 404);
  EXPECT_EQ(reply("DELETE", "/v1/responses/" + id).status, 404);
  run({{"model", "m"}, {"previous_response_id", second["id"]}, {"input", "Go on."}}, " yea", &again);
  EXPECT_EQ(again, third_prompt);
  const std::string prompt_text = tok_->decoder().decode(third_prompt, false);
  for (const char* turn : {"Who is the LORD?", "And Moses?", "Go on."}) EXPECT_NE(prompt_text.find(turn), std::string::npos) << prompt_text;
  EXPECT_EQ(prompt_text.find("Be brief."), std::string::npos) << prompt_text;

  // A continuation of the deleted one, or of one never made, is a 404 naming it.
  auto gone = reply("POST", "/v1/responses", json{{"model", "m"}, {"previous_response_id", id}, {"input", "x"}}.dump());
  EXPECT_EQ(gone.status, 404);
  EXPECT_NE(gone.body.find("no stored response with id '" + id + "'"), std::string::npos) << gone.body;
  EXPECT_EQ(reply("POST", "/v1/responses", R"({"model":"m","previous_response_id":7,"input":"x"})").status, 400);
}

TEST_F(StoredResponses, AStreamedResponseIsStoredAsItsLastEventHoldsIt) {
  const json r = run({{"model", "m"}, {"input", "Who is the LORD?"}, {"stream", true}}, " the God");
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(get("/v1/responses/" + r["id"].get<std::string>()), r);
}

TEST_F(StoredResponses, StoreFalseKeepsNothingAndAServerWithoutAStoreSaysSo) {
  const json r = run({{"model", "m"}, {"input", "x"}, {"store", false}}, " y");
  EXPECT_EQ(r["store"], false);
  EXPECT_EQ(reply("GET", "/v1/responses/" + r["id"].get<std::string>()).status, 404);
  api_options none;
  none.max_stored_responses = 0;
  start(none);
  const json n = run({{"model", "m"}, {"input", "x"}}, " y");
  EXPECT_EQ(n["store"], false);
  auto chained = reply("POST", "/v1/responses", json{{"model", "m"}, {"previous_response_id", n["id"]}, {"input", "x"}}.dump());
  EXPECT_EQ(chained.status, 400);
  EXPECT_NE(chained.body.find("--max-stored-responses 0"), std::string::npos) << chained.body;
}

TEST_F(StoredResponses, InputItemsPageInEitherOrderAndTheRoutesAnswerAsOpenAIs) {
  json input = json::array();
  for (int i = 0; i < 5; ++i) input.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "turn " + std::to_string(i)}});
  input[1]["id"] = "msg_given";  // an item's own id is kept
  const std::string id = run({{"model", "m"}, {"input", input}}, " y")["id"];
  const std::string base = "/v1/responses/" + id + "/input_items";
  auto texts = [](const json& page) {
    std::vector<std::string> out;
    for (const auto& i : page["data"]) out.push_back(i["content"]);
    return out;
  };
  const json desc = get(base);
  EXPECT_EQ(texts(desc), (std::vector<std::string>{"turn 4", "turn 3", "turn 2", "turn 1", "turn 0"}));
  const json asc = get(base + "?order=asc&limit=2");
  EXPECT_EQ(texts(asc), (std::vector<std::string>{"turn 0", "turn 1"}));
  EXPECT_EQ(asc["last_id"], "msg_given");
  EXPECT_EQ(asc["has_more"], true);
  const json next = get(base + "?order=asc&limit=2&after=msg_given");
  EXPECT_EQ(texts(next), (std::vector<std::string>{"turn 2", "turn 3"}));
  EXPECT_EQ(get(base + "?order=asc&after=" + next["last_id"].get<std::string>())["has_more"], false);
  for (const char* q : {"?limit=0", "?limit=101", "?limit=x", "?order=up", "?after=nope"}) {
    EXPECT_EQ(reply("GET", base + q).status, 400) << q;
  }
  auto cancel = reply("POST", "/v1/responses/" + id + "/cancel");
  EXPECT_EQ(cancel.status, 400);
  EXPECT_NE(cancel.body.find("only a background response can be cancelled"), std::string::npos) << cancel.body;
  EXPECT_EQ(reply("POST", "/v1/responses/" + id).status, 405);
  EXPECT_EQ(reply("DELETE", base).status, 405);
  EXPECT_EQ(reply("GET", "/v1/responses/" + id + "/other").status, 404);
  EXPECT_EQ(reply("GET", "/v1/responses/").status, 404);
  EXPECT_EQ(reply("GET", "/v1/responses/resp_nope").status, 404);
  EXPECT_EQ(std::get<http_reply>(api_->handle("GET", "/v1/responses/" + id, "", "")).status, 401);  // the API key guards them
}

}  // namespace
}  // namespace llmesh::gateway
