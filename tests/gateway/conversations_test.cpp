// The Conversations API through api_service (a mesh that only records; the test plays the
// replica): a conversation made, read, renamed in its metadata, its items listed, added,
// read and deleted, then deleted itself; refusals by name; a response that names it sees its
// items first (the prompt of sending them all as input) and then extends it with its input
// and output; and the bounded store underneath (json_store).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>
#include <set>
#include <thread>

#include "api_fixture.hpp"
#include "json_mutation.hpp"
#include "llmesh/gateway/api_service.hpp"
#include "llmesh/gateway/json_store.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

class Conversations : public ::testing::Test {
 protected:
  void SetUp() override { start(api_options{}); }
  void start(api_options o) {
    api_.reset();
    o.max_concurrent = 64;
    api_ = kjv_service(o, mesh_, metrics_, tok_);
    ASSERT_TRUE(api_);
  }
  http_reply reply(const std::string& method, const std::string& path, const json& body = nullptr) {
    auto o = api_->handle(method, path, "", body.is_null() ? "" : body.dump());
    EXPECT_TRUE(std::holds_alternative<http_reply>(o)) << method << " " << path;
    return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o) : http_reply{};
  }
  json ok(const std::string& method, const std::string& path, const json& body = nullptr) {
    auto r = reply(method, path, body);
    EXPECT_EQ(r.status, 200) << method << " " << path << " " << r.body;
    return r.status == 200 ? json::parse(r.body) : json();
  }
  /// Runs a Responses request to its end, the replica answering `answer`'s tokens (the last
  /// one ending it by length): the response object, and the prompt it ran.
  json run(const json& body, const std::string& answer, std::vector<int32_t>* prompt = nullptr) {
    auto o = api_->handle("POST", "/v1/responses", "", body.dump());
    if (!std::holds_alternative<generation_job>(o)) {
      ADD_FAILURE() << std::get<http_reply>(o).body;
      return nullptr;
    }
    auto& job = std::get<generation_job>(o);
    if (prompt) *prompt = job.requests.at(0).prompt;
    const auto ids = tok_->encode(answer, false);
    for (size_t i = 0; i < ids.size(); ++i) {
      job.output->on_message(actors::token_msg{job.requests[0].id, ids[i],
                                               i + 1 == ids.size() ? actors::finish_reason::length : actors::finish_reason::none,
                                               false, {}, {}, {}});
    }
    EXPECT_TRUE(job.output->done());
    return json::parse(job.output->reply().body);
  }
  std::vector<std::string> texts(const json& list) {
    std::vector<std::string> out;
    for (const auto& i : list["data"]) out.push_back(i["content"].is_string() ? i["content"].get<std::string>() : i["content"][0]["text"].get<std::string>());
    return out;
  }

  std::shared_ptr<const model::tokenizer> tok_;
  fake_mesh mesh_;
  actors::metrics_registry metrics_;
  std::unique_ptr<api_service> api_;
};

TEST_F(Conversations, MadeReadUpdatedItsItemsListedAddedReadDeletedThenDeleted) {
  const json made = ok("POST", "/v1/conversations",
                       {{"metadata", {{"topic", "genesis"}}},
                        {"items", {{{"type", "message"}, {"role", "user"}, {"content", "In the beginning"}},
                                   {{"role", "assistant"}, {"content", "God created"}, {"id", "msg_mine"}}}}});
  ASSERT_TRUE(made.is_object());
  const std::string id = made["id"];
  EXPECT_TRUE(id.starts_with("conv_")) << id;
  EXPECT_EQ(made["object"], "conversation");
  EXPECT_EQ(made["metadata"], json({{"topic", "genesis"}}));
  EXPECT_GT(made["created_at"].get<int64_t>(), 1700000000);
  EXPECT_FALSE(made.contains("items"));
  EXPECT_EQ(ok("GET", "/v1/conversations/" + id), made);

  json renamed = made;
  renamed["metadata"] = {{"topic", "exodus"}};
  EXPECT_EQ(ok("POST", "/v1/conversations/" + id, {{"metadata", {{"topic", "exodus"}}}}), renamed);

  const std::string items = "/v1/conversations/" + id + "/items";
  const json listed = ok("GET", items);  // newest first, as OpenAI's
  EXPECT_EQ(texts(listed), (std::vector<std::string>{"God created", "In the beginning"}));
  EXPECT_EQ(listed["object"], "list");
  EXPECT_EQ(listed["first_id"], "msg_mine");  // a client's own id is kept
  const std::string first_id = listed["last_id"];
  EXPECT_TRUE(first_id.starts_with("msg_")) << first_id;

  const json added = ok("POST", items, {{"items", {{{"role", "user"}, {"content", "And the earth?"}}}}});
  ASSERT_EQ(added["data"].size(), 1u);
  EXPECT_EQ(added["has_more"], false);
  const std::string added_id = added["data"][0]["id"];
  EXPECT_EQ(texts(ok("GET", items + "?order=asc")), (std::vector<std::string>{"In the beginning", "God created", "And the earth?"}));
  EXPECT_EQ(texts(ok("GET", items + "?order=asc&limit=1&after=" + first_id)), (std::vector<std::string>{"God created"}));
  EXPECT_EQ(ok("GET", items + "/" + added_id)["content"][0]["text"], "And the earth?");

  EXPECT_EQ(ok("DELETE", items + "/msg_mine"), renamed);  // answers the conversation
  EXPECT_EQ(reply("GET", items + "/msg_mine").status, 404);
  EXPECT_EQ(reply("DELETE", items + "/msg_mine").status, 404);
  EXPECT_EQ(texts(ok("GET", items)), (std::vector<std::string>{"And the earth?", "In the beginning"}));

  EXPECT_NE(metrics_.render().find("\nllmesh_conversations 1\n"), std::string::npos);
  EXPECT_EQ(ok("DELETE", "/v1/conversations/" + id), json::parse(R"({"id":")" + id + R"(","object":"conversation.deleted","deleted":true})"));
  EXPECT_NE(metrics_.render().find("\nllmesh_conversations 0\n"), std::string::npos);
  EXPECT_NE(metrics_.render().find("\nllmesh_conversations_bytes 0\n"), std::string::npos);
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v1/conversations/" + id}, {"DELETE", "/v1/conversations/" + id}, {"GET", items}, {"GET", items + "/" + added_id}}) {
    EXPECT_EQ(reply(method, path).status, 404) << method << " " << path;
  }
  EXPECT_EQ(reply("POST", items, {{"items", json::array()}}).status, 404);
  // An empty body makes an empty conversation.
  const json empty = ok("POST", "/v1/conversations");
  EXPECT_EQ(ok("GET", "/v1/conversations/" + empty["id"].get<std::string>() + "/items")["data"], json::array());
}

TEST_F(Conversations, RefusesByName) {
  const std::string id = ok("POST", "/v1/conversations")["id"];
  json many = json::array();
  for (int i = 0; i < 21; ++i) many.push_back({{"role", "user"}, {"content", "x"}});
  json big_metadata = json::object();
  for (int i = 0; i < 17; ++i) {
    std::string key = "k";  // (appended: g++ 12 warns on "k" + a temporary string)
    key += std::to_string(i);
    big_metadata[key] = "v";
  }
  for (const auto& [path, body, needle] : std::vector<std::tuple<std::string, json, std::string>>{
           {"/v1/conversations", {{"items", "x"}}, "'items' must be an array"},
           {"/v1/conversations", {{"items", many}}, "at most 20 items"},
           {"/v1/conversations", {{"items", {{{"type", "image_generation_call"}}}}}, "'items[0]': input items of type 'image_generation_call'"},
           {"/v1/conversations", {{"items", {{{"role", "robot"}, {"content", "x"}}}}}, "'items[0].role'"},
           {"/v1/conversations", {{"metadata", {{"k", 1}}}}, "'metadata.k' must be a string"},
           {"/v1/conversations", {{"metadata", big_metadata}}, "at most 16 pairs"},
           {"/v1/conversations/" + id, {{"title", "x"}}, "'metadata' is required"},
           {"/v1/conversations/" + id + "/items", {{"other", 1}}, "'items' is required"},
           {"/v1/conversations", {{"items", {{{"role", "user"}, {"content", "a"}, {"id", "msg_1"}}, {{"role", "user"}, {"content", "b"}, {"id", "msg_1"}}}}},
            "'msg_1' is already in the conversation"}}) {
    const http_reply r = reply("POST", path, body);
    EXPECT_EQ(r.status, 400) << body.dump();
    EXPECT_NE(r.body.find(needle), std::string::npos) << body.dump() << " -> " << r.body;
  }
  EXPECT_EQ(std::get<http_reply>(api_->handle("POST", "/v1/conversations", "", "[1]")).status, 400);
  ok("POST", "/v1/conversations/" + id + "/items", {{"items", {{{"role", "user"}, {"content", "a"}, {"id", "msg_2"}}}}});
  EXPECT_EQ(reply("POST", "/v1/conversations/" + id + "/items", {{"items", {{{"role", "user"}, {"content", "a"}, {"id", "msg_2"}}}}}).status, 400);
  EXPECT_EQ(reply("GET", "/v1/conversations").status, 405);
  EXPECT_EQ(reply("PUT", "/v1/conversations/" + id).status, 405);
  EXPECT_EQ(reply("POST", "/v1/conversations/" + id + "/items/x").status, 405);
  EXPECT_EQ(reply("GET", "/v1/conversations/" + id + "/other").status, 404);
  EXPECT_EQ(reply("GET", "/v1/conversations/" + id + "/items?limit=0").status, 400);
  api_options off;
  off.max_conversations = 0;
  start(off);
  const http_reply none = reply("POST", "/v1/conversations");
  EXPECT_EQ(none.status, 400);
  EXPECT_NE(none.body.find("--max-conversations 0"), std::string::npos) << none.body;
}

TEST_F(Conversations, AResponseContinuesItsConversationAndExtendsIt) {
  const json made = ok("POST", "/v1/conversations", {{"items", {{{"role", "user"}, {"content", "Who is the LORD?"}},
                                                                {{"role", "assistant"}, {"content", "The God of Israel."}}}}});
  const std::string id = made["id"];
  std::vector<int32_t> in_conversation, whole;
  const json r = run({{"model", "m"}, {"conversation", id}, {"input", "And Moses?"}, {"max_output_tokens", 2}}, " a man", &in_conversation);
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["conversation"], json({{"id", id}}));
  run({{"model", "m"}, {"store", false},
       {"input", {{{"role", "user"}, {"content", "Who is the LORD?"}}, {{"role", "assistant"}, {"content", "The God of Israel."}},
                  {{"role", "user"}, {"content", "And Moses?"}}}}},
      " x", &whole);
  EXPECT_EQ(in_conversation, whole);
  ASSERT_FALSE(in_conversation.empty());
  // Its input and output are the conversation's last items now; the next response sees them.
  const json items = ok("GET", "/v1/conversations/" + id + "/items?order=asc");
  ASSERT_EQ(items["data"].size(), 4u);
  EXPECT_EQ(items["data"][2]["content"][0]["text"], "And Moses?");
  EXPECT_EQ(items["data"][3]["id"], r["output"][0]["id"]);
  EXPECT_EQ(items["data"][3]["content"][0]["text"], r["output"][0]["content"][0]["text"]);
  std::vector<int32_t> next;
  run({{"model", "m"}, {"conversation", {{"id", id}}}, {"input", "Go on."}}, " yea", &next);
  const std::string text = tok_->decoder().decode(next, false);
  for (const char* turn : {"Who is the LORD?", "And Moses?", "Go on."}) EXPECT_NE(text.find(turn), std::string::npos) << text;
  EXPECT_EQ(ok("GET", "/v1/conversations/" + id + "/items")["data"].size(), 6u);
  // An earlier output sent back as input (with its id) is not added again.
  run({{"model", "m"}, {"conversation", id}, {"input", {r["output"][0], {{"role", "user"}, {"content", "Again."}}}}}, " so");
  EXPECT_EQ(ok("GET", "/v1/conversations/" + id + "/items")["data"].size(), 8u);
  EXPECT_EQ(ok("GET", "/v1/conversations/" + id + "/items?limit=1&order=asc")["data"][0]["status"], "completed");
  // Without store, the conversation still takes the turn (the response is not kept).
  const json unstored = run({{"model", "m"}, {"conversation", id}, {"input", "More."}, {"store", false}}, " so");
  EXPECT_EQ(reply("GET", "/v1/responses/" + unstored["id"].get<std::string>()).status, 404);
  EXPECT_EQ(ok("GET", "/v1/conversations/" + id + "/items")["data"].size(), 10u);

  // Refusals: with previous_response_id, of another shape, unknown.
  for (const auto& [body, status, needle] : std::vector<std::tuple<json, int, std::string>>{
           {{{"model", "m"}, {"conversation", id}, {"previous_response_id", r["id"]}, {"input", "x"}}, 400, "cannot both be given"},
           {{{"model", "m"}, {"conversation", 5}, {"input", "x"}}, 400, "'conversation' must be"},
           {{{"model", "m"}, {"conversation", {{"id", 5}}}, {"input", "x"}}, 400, "'conversation' must be"},
           {{{"model", "m"}, {"conversation", "conv_nope"}, {"input", "x"}}, 404, "no conversation with id 'conv_nope'"}}) {
    const http_reply bad = reply("POST", "/v1/responses", body);
    EXPECT_EQ(bad.status, status) << body.dump();
    EXPECT_NE(bad.body.find(needle), std::string::npos) << bad.body;
  }
}

TEST_F(Conversations, TruncationAutoLeavesOutTheOldestItemsUntilThePromptFits) {
  // Twelve turns of ~30 tokens each: more than kjv-tiny's context of 256 positions.
  json items = json::array();
  for (int i = 0; i < 12; ++i) {
    items.push_back({{"role", i % 2 ? "assistant" : "user"},
                     {"content", "Turn " + std::to_string(i) + ": and the LORD spake unto Moses, saying, speak unto the children of Israel"}});
  }
  json first_half = json::array(), second_half = json::array();
  for (size_t i = 0; i < items.size(); ++i) (i < 6 ? first_half : second_half).push_back(items[i]);
  const std::string id = ok("POST", "/v1/conversations", {{"items", first_half}})["id"];
  ok("POST", "/v1/conversations/" + id + "/items", {{"items", second_half}});
  const json body = {{"model", "m"}, {"conversation", id}, {"input", "Last question?"}, {"max_output_tokens", 8}};
  const http_reply too_long = reply("POST", "/v1/responses", body);
  EXPECT_EQ(too_long.status, 400);
  EXPECT_NE(too_long.body.find("context"), std::string::npos) << too_long.body;

  json trunc = body;
  trunc["truncation"] = "auto";
  trunc["prompt_cache_key"] = "conversation-7";
  std::vector<int32_t> prompt;
  const json r = run(trunc, " yea", &prompt);
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["truncation"], "auto");
  EXPECT_EQ(r["prompt_cache_key"], "conversation-7") << "echoed as OpenAI's response object does";
  EXPECT_LE(prompt.size() + 8, 256u);
  EXPECT_GT(prompt.size() + 8, 150u);  // the fewest turns left out: it nearly fills the context
  const std::string text = tok_->decoder().decode(prompt, false);
  EXPECT_NE(text.find("Last question?"), std::string::npos) << text;
  EXPECT_NE(text.find("Turn 11:"), std::string::npos) << text;
  EXPECT_EQ(text.find("Turn 0:"), std::string::npos) << text;
  // The conversation keeps every item, and takes the turn.
  EXPECT_EQ(ok("GET", "/v1/conversations/" + id + "/items?limit=100")["data"].size(), 14u);
  // Within the input alone too: its oldest items give way, its last stays.
  json input = items;
  input.push_back({{"role", "user"}, {"content", "Last question?"}});
  const json alone = run({{"model", "m"}, {"input", input}, {"truncation", "auto"}, {"max_output_tokens", 8}}, " yea", &prompt);
  EXPECT_EQ(alone["truncation"], "auto");
  EXPECT_TRUE(alone["prompt_cache_key"].is_null());
  EXPECT_LE(prompt.size() + 8, 256u);
  EXPECT_NE(tok_->decoder().decode(prompt, false).find("Last question?"), std::string::npos);
  EXPECT_EQ(reply("POST", "/v1/responses", {{"model", "m"}, {"input", "x"}, {"truncation", "yes"}}).status, 400);
}

// Mutated bodies, paths and queries on every conversation route, and mutated Responses requests
// naming a conversation (with truncation), never throw and answer 200 or a 4xx; the store's
// conversations stay readable JSON throughout.
TEST_F(Conversations, MutatedRequestsNeverThrow) {
  const std::string id = ok("POST", "/v1/conversations", {{"items", {{{"role", "user"}, {"content", "x"}, {"id", "msg_a"}}}}})["id"];
  const std::string base = "/v1/conversations/" + id;
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"/v1/conversations", R"({"metadata":{"k":"v"},"items":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]})"},
      {base, R"({"metadata":{"topic":"t"}})"},
      {base + "/items", R"({"items":[{"role":"assistant","content":"a"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]})"},
      {"/v1/responses", R"({"model":"m","conversation":")" + id + R"(","input":"q","truncation":"auto","max_output_tokens":4})"},
  };
  const std::vector<std::string> gets = {base, base + "/items?limit=2&order=asc&after=msg_a", base + "/items/msg_a"};
  std::mt19937 rng(11);
  size_t answered = 0, refused = 0, jobs = 0;
  for (int i = 0; i < 3000; ++i) {
    const auto& [path, body] = seeds[static_cast<size_t>(i) % seeds.size()];
    const std::string mutated = testing::mutate_json(body, rng);
    api_outcome out;
    ASSERT_NO_THROW(out = api_->handle("POST", path, "", mutated)) << path << " " << mutated;
    if (auto* r = std::get_if<http_reply>(&out)) {
      EXPECT_TRUE(r->status == 200 || (r->status >= 400 && r->status < 500)) << path << " " << mutated << " -> " << r->status << " " << r->body;
      ++(r->status == 200 ? answered : refused);
    } else {
      ++jobs;
    }
    const std::string get = testing::mutate_json(gets[static_cast<size_t>(i) % gets.size()], rng);
    for (const char* method : {"GET", "DELETE"}) {
      if (std::string(method) == "DELETE" && i % 50 != 0) continue;  // (rarely: they delete what the others read)
      ASSERT_NO_THROW(out = api_->handle(method, get, "", "")) << get;
      if (auto* r = std::get_if<http_reply>(&out)) {
        EXPECT_TRUE(r->status == 200 || (r->status >= 400 && r->status < 500)) << method << " " << get << " -> " << r->status;
      }
    }
  }
  // Every kind of outcome was met: mutations that still parse, refused ones, and generations.
  EXPECT_GT(answered, 50u);
  EXPECT_GT(refused, 100u);
  EXPECT_GT(jobs, 50u);
}

TEST(JsonStore, KeepsTheLeastRecentlyWrittenLastAndUpdatesWithinItsBudget) {
  json_store s(2, 1000);
  EXPECT_TRUE(s.put("a", {{"n", 1}}));
  EXPECT_TRUE(s.put("b", {{"n", 2}}));
  // Writing "a" again makes "b" the oldest.
  ASSERT_TRUE(s.update("a", [](json& v) {
                 v["n"] = 3;
                 return ok_status();
               }).ok());
  EXPECT_TRUE(s.put("c", {{"n", 4}}));
  EXPECT_FALSE(s.get("b"));
  EXPECT_EQ((*s.get("a"))["n"], 3);
  // A change that fails, or that would not fit, leaves the value as it was.
  auto failed = s.update("a", [](json& v) -> status {
    v["n"] = 9;
    return make_error(errc::invalid_request, "no");
  });
  EXPECT_FALSE(failed.ok());
  auto too_big = s.update("a", [](json& v) {
    v["text"] = std::string(2000, 'x');
    return ok_status();
  });
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.err().code, errc::invalid_request);
  EXPECT_EQ(*s.get("a"), json({{"n", 3}}));
  EXPECT_EQ(s.update("zz", [](json&) { return ok_status(); }).err().code, errc::not_found);
  EXPECT_FALSE(s.put("huge", {{"text", std::string(2000, 'x')}}));
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.bytes(), std::string(R"({"n":3})").size() + std::string(R"({"n":4})").size());
}

TEST(JsonStore, ConcurrentUpdatesLoseNothing) {
  // Four threads append 200 items each to one value while a fifth reads: every append is there.
  json_store s(4, size_t{1} << 20);
  ASSERT_TRUE(s.put("c", {{"items", json::array()}}));
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&s, w] {
      for (int i = 0; i < 200; ++i) {
        auto r = s.update("c", [&](json& v) {
          v["items"].push_back(w * 1000 + i);
          return ok_status();
        });
        EXPECT_TRUE(r.ok());
      }
    });
  }
  for (int i = 0; i < 200; ++i) EXPECT_TRUE(s.get("c").has_value());
  for (auto& t : writers) t.join();
  const json v = *s.get("c");
  ASSERT_EQ(v["items"].size(), 800u);
  std::set<int> seen;
  for (const auto& x : v["items"]) seen.insert(x.get<int>());
  EXPECT_EQ(seen.size(), 800u);
  // Each writer's items in its own order.
  for (int w = 0; w < 4; ++w) {
    int last = -1;
    for (const auto& x : v["items"]) {
      const int n = x.get<int>();
      if (n / 1000 != w) continue;
      EXPECT_GT(n % 1000, last);
      last = n % 1000;
    }
  }
}

}  // namespace
}  // namespace llmesh::gateway
