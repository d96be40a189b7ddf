// api_service's smaller routes and fields (api_fixture.hpp's gateway): one model's card
// (GET /v1/models/{id}), vLLM's priority (refused unless the policy is priority) and
// cache_salt (a 64-bit key per salt); LoRA adapters answering as models of their own.
#include "api_fixture.hpp"

#include <nlohmann/json.hpp>

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;

TEST_F(ApiService, OneModelIsRetrievedByItsId) {
  auto one = call("GET", "/v1/models/kjv");
  ASSERT_EQ(status(one), 200);
  const json card = json::parse(std::get<http_reply>(one).body);
  const json list = json::parse(std::get<http_reply>(call("GET", "/v1/models")).body);
  EXPECT_EQ(card, list["data"][0]);
  EXPECT_EQ(card["id"], "kjv");
  auto other = call("GET", "/v1/models/other");
  EXPECT_EQ(status(other), 404);
  EXPECT_NE(std::get<http_reply>(other).body.find("serves 'kjv'"), std::string::npos) << std::get<http_reply>(other).body;
  EXPECT_EQ(status(call("POST", "/v1/models/kjv", "{}")), 405);
  EXPECT_EQ(status(call("GET", "/v1/models/kjv", "", "")), 401);
}

// vLLM's priority: refused (by name) unless the server schedules by priority; then it rides
// on every generation of the request, completions, chat and the Responses API alike.
TEST_F(ApiService, PriorityNeedsThePrioritySchedulingPolicy) {
  auto r = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","priority":-3})");
  ASSERT_EQ(status(r), 400);
  EXPECT_NE(std::get<http_reply>(r).body.find("'priority' needs the priority scheduling policy"), std::string::npos)
      << std::get<http_reply>(r).body;
  auto zero = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","priority":0})");
  ASSERT_EQ(status(zero), 0);
  EXPECT_EQ(req(zero).priority, 0);
  zero = http_reply{};
  api_options o;
  o.model_name = "kjv";
  o.priority_scheduling = true;
  o.max_concurrent = 8;
  served_model m = kjv_tiny("kjv");
  api_ = std::make_unique<api_service>(o, m.tok, m.chat, cfg_, mesh_, metrics_);
  auto c = api_->handle("POST", "/v1/completions", "", R"({"model":"kjv","prompt":"x","priority":-3,"n":2})");
  ASSERT_EQ(status(c), 0);
  for (const auto& q : job(c).requests) EXPECT_EQ(q.priority, -3);
  auto chat = api_->handle("POST", "/v1/chat/completions", "", R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"priority":7})");
  ASSERT_EQ(status(chat), 0);
  EXPECT_EQ(req(chat).priority, 7);
  auto resp = api_->handle("POST", "/v1/responses", "", R"({"model":"kjv","input":"Hi","priority":2})");
  ASSERT_EQ(status(resp), 0);
  EXPECT_EQ(req(resp).priority, 2);
  for (const char* bad : {R"("high")", "1.5", "4294967296"}) {
    auto b = api_->handle("POST", "/v1/completions", "", std::string(R"({"model":"kjv","prompt":"x","priority":)") + bad + "}");
    EXPECT_EQ(status(b), 400) << bad;
    EXPECT_NE(std::get<http_reply>(b).body.find("'priority'"), std::string::npos) << std::get<http_reply>(b).body;
  }
}

TEST_F(ApiService, ACacheSaltBecomesTheRequestsKey) {
  auto salt_of = [&](const std::string& fields) -> uint64_t {
    auto o = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x")" + fields + "}");
    EXPECT_EQ(status(o), 0) << fields << (status(o) ? std::get<http_reply>(o).body : "");
    return status(o) ? 0 : req(o).cache_salt;
  };
  EXPECT_EQ(salt_of(""), 0u);
  const uint64_t a = salt_of(R"(,"cache_salt":"tenant-a")");
  EXPECT_NE(a, 0u);
  EXPECT_EQ(salt_of(R"(,"cache_salt":"tenant-a")"), a);
  EXPECT_NE(salt_of(R"(,"cache_salt":"tenant-b")"), a);
  auto chat = call("POST", "/v1/chat/completions", R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"cache_salt":"tenant-a"})");
  ASSERT_EQ(status(chat), 0);
  EXPECT_EQ(req(chat).cache_salt, a);
  chat = http_reply{};
  for (const std::string& bad : std::vector<std::string>{R"("")", "5", "\"" + std::string(1025, 's') + "\""}) {
    auto b = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","cache_salt":)" + bad + "}");
    EXPECT_EQ(status(b), 400) << bad;
    EXPECT_NE(std::get<http_reply>(b).body.find("'cache_salt'"), std::string::npos);
  }
}

// OpenAI's prompt_cache_key: the router's affinity key (replica_request::route_key), on
// completions, chat and the Responses API alike; "" is none; a non-string or a long one is a 400.
TEST_F(ApiService, APromptCacheKeyBecomesTheRoutersAffinityKey) {
  auto key_of = [&](const std::string& path, const std::string& body) -> uint64_t {
    auto o = call("POST", path, body);
    EXPECT_EQ(status(o), 0) << body << (status(o) ? std::get<http_reply>(o).body : "");
    return status(o) ? 0 : req(o).route_key;
  };
  EXPECT_EQ(key_of("/v1/completions", R"({"model":"kjv","prompt":"x"})"), 0u);
  EXPECT_EQ(key_of("/v1/completions", R"({"model":"kjv","prompt":"x","prompt_cache_key":""})"), 0u);
  const uint64_t a = key_of("/v1/completions", R"({"model":"kjv","prompt":"x","prompt_cache_key":"user-17"})");
  EXPECT_NE(a, 0u);
  EXPECT_EQ(key_of("/v1/chat/completions", R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"prompt_cache_key":"user-17"})"), a);
  EXPECT_NE(key_of("/v1/completions", R"({"model":"kjv","prompt":"x","prompt_cache_key":"user-18"})"), a);
  EXPECT_EQ(key_of("/v1/completions", R"({"model":"kjv","prompt":"x","prompt_cache_key":"user-17","cache_salt":"t"})"), a)
      << "the salt scopes the cache, not the key";
  auto resp = call("POST", "/v1/responses", R"({"model":"kjv","input":"Hi","prompt_cache_key":"user-17"})");
  ASSERT_EQ(status(resp), 0) << std::get<http_reply>(resp).body;
  EXPECT_EQ(req(resp).route_key, a);
  for (const std::string& bad : std::vector<std::string>{"5", "[]", "\"" + std::string(1025, 'k') + "\""}) {
    auto b = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","prompt_cache_key":)" + bad + "}");
    EXPECT_EQ(status(b), 400) << bad;
    EXPECT_NE(std::get<http_reply>(b).body.find("'prompt_cache_key'"), std::string::npos);
  }
}

// vLLM's --lora-modules: each adapter is listed as a model whose parent is the base model, and
// its requests go to the base model's replicas with the adapter's name.
TEST(ApiLora, AdaptersAnswerAsModelsRoutedToTheirBase) {
  fake_mesh mesh;
  actors::metrics_registry metrics;
  served_model m = kjv_tiny("kjv");
  ASSERT_TRUE(m.tok);
  m.loras = {{"psalms", "/adapters/psalms"}, {"org/proverbs:v2", "/adapters/proverbs"}};
  api_options o;
  o.model_name = "kjv";
  api_service api(o, std::vector{std::move(m)}, mesh, metrics);
  auto call = [&](const std::string& method, const std::string& path, const std::string& body) {
    return api.handle(method, path, "", body);
  };
  auto list = call("GET", "/v1/models", "");
  const json data = json::parse(std::get<http_reply>(list).body)["data"];
  ASSERT_EQ(data.size(), 3u);
  EXPECT_EQ(data[0]["id"], "kjv");
  EXPECT_FALSE(data[0].contains("parent"));
  EXPECT_EQ(data[1]["id"], "psalms");
  EXPECT_EQ(data[1]["parent"], "kjv");
  EXPECT_EQ(data[1]["root"], "/adapters/psalms");
  EXPECT_EQ(data[2]["id"], "org/proverbs:v2");
  auto one = call("GET", "/v1/models/psalms", "");
  ASSERT_EQ(std::get<http_reply>(one).status, 200);
  EXPECT_EQ(json::parse(std::get<http_reply>(one).body), data[1]);

  auto base = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"In the beginning"})");
  auto ad = call("POST", "/v1/completions", R"({"model":"psalms","prompt":"In the beginning"})");
  auto chat = call("POST", "/v1/chat/completions", R"({"model":"org/proverbs:v2","messages":[{"role":"user","content":"Hi"}]})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(base) && std::holds_alternative<generation_job>(ad) &&
              std::holds_alternative<generation_job>(chat));
  const auto& rb = std::get<generation_job>(base).requests.at(0);
  const auto& ra = std::get<generation_job>(ad).requests.at(0);
  const auto& rc = std::get<generation_job>(chat).requests.at(0);
  EXPECT_EQ(rb.model, "kjv");
  EXPECT_EQ(rb.lora, "");
  EXPECT_EQ(ra.model, "kjv");  // routed to the base model's replicas
  EXPECT_EQ(ra.lora, "psalms");
  EXPECT_EQ(ra.prompt, rb.prompt);  // the base model's tokenizer
  EXPECT_EQ(rc.model, "kjv");
  EXPECT_EQ(rc.lora, "org/proverbs:v2");
  auto emb = call("POST", "/v1/embeddings", R"({"model":"psalms","input":"x"})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(emb));
  auto sub = std::get<generation_job>(emb).output->take_submissions();  // an embedding's requests go out a window at a time
  ASSERT_EQ(sub.size(), 1u);
  EXPECT_EQ(sub[0].model, "kjv");
  EXPECT_EQ(sub[0].lora, "psalms");
  // Whether the base model has ready replicas decides for its adapters too (the native API asks).
  mesh.ready_of["kjv"] = 0;
  EXPECT_EQ(api.model_names(), (std::vector<std::string>{"kjv", "psalms", "org/proverbs:v2"}));
  // Each accepted request counts under the name it used (the adapter's own).
  const std::string scrape = std::get<http_reply>(call("GET", "/metrics", "")).body;
  EXPECT_NE(scrape.find("llmesh_model_requests_total{model=\"kjv\"} 1\n"), std::string::npos) << scrape;
  EXPECT_NE(scrape.find("llmesh_model_requests_total{model=\"psalms\"} 2\n"), std::string::npos) << scrape;  // completion, embedding
  EXPECT_NE(scrape.find("llmesh_model_requests_total{model=\"org/proverbs:v2\"} 1\n"), std::string::npos) << scrape;
  // Routes whose model is optional still take the one base model when none is named.
  auto tok = call("POST", "/tokenize", R"({"prompt":"In the beginning"})");
  ASSERT_EQ(std::get<http_reply>(tok).status, 200) << std::get<http_reply>(tok).body;
  auto unknown = call("POST", "/v1/completions", R"({"model":"hymns","prompt":"x"})");
  ASSERT_EQ(std::get<http_reply>(unknown).status, 404);
  EXPECT_NE(std::get<http_reply>(unknown).body.find("'psalms'"), std::string::npos) << std::get<http_reply>(unknown).body;
}

}  // namespace
}  // namespace llmesh::gateway
