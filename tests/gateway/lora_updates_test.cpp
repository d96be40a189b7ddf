// vLLM's runtime LoRA updates on the gateway (api_lora.cpp): POST /v1/load_lora_adapter and
// /v1/unload_lora_adapter against a mesh that records what it is asked (the replicas' side is
// tests/serve/lora_runtime_test.cpp): off by default (a 404 saying how to turn them on), vLLM's
// messages for missing fields, names taken and names not loaded, the adapter listed and routed
// as its base model's once loaded and gone once unloaded, a mesh's refusal passed on with
// nothing listed (an unload it refuses keeps the entry in its place), a mesh without runtime
// updates refusing before anything, several base models needing base_model_name (a further name
// will do), and a mesh's news of the adapters added elsewhere (set_runtime_adapters).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "api_fixture.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;

/// Records the updates; refuses loads of paths starting "/bad" and unloads of "stuck".
struct updating_mesh : fake_mesh {
  bool runtime_lora() const override { return true; }
  status load_lora(std::string_view model, const model::lora_source& src) override {
    if (src.path.starts_with("/bad")) return make_error(errc::not_found, src.path + ": no adapter_config.json");
    calls.push_back("load " + std::string(model) + " " + src.name + " " + src.path);
    return ok_status();
  }
  status unload_lora(std::string_view model, std::string_view name) override {
    if (name == "stuck") return make_error(errc::internal, "the replicas did not let go");
    calls.push_back("unload " + std::string(model) + " " + std::string(name));
    return ok_status();
  }
  std::vector<std::string> calls;
};

http_reply reply(api_outcome o) {
  EXPECT_TRUE(std::holds_alternative<http_reply>(o));
  return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o) : http_reply{};
}

std::string message(const http_reply& r) {
  auto j = json::parse(r.body, nullptr, false);
  return j.is_object() && j.contains("error") ? j["error"]["message"].get<std::string>() : r.body;
}

std::vector<std::string> listed(api_service& api) {
  std::vector<std::string> out;
  const json models = json::parse(reply(api.handle("GET", "/v1/models", "", "")).body);
  for (const auto& m : models["data"]) out.push_back(m["id"]);
  return out;
}

struct service {
  explicit service(bool updates, actors::mesh_client& mesh) {
    api_options o;
    o.runtime_lora_updates = updates;
    api = kjv_service(o, mesh, metrics, tok);
  }
  http_reply post(const std::string& path, const json& body) { return reply(api->handle("POST", path, "", body.dump())); }
  actors::metrics_registry metrics;
  std::shared_ptr<const model::tokenizer> tok;
  std::unique_ptr<api_service> api;
};

TEST(LoraUpdates, OffByDefaultWithA404SayingHowToTurnThemOn) {
  updating_mesh mesh;
  service s(false, mesh);
  ASSERT_TRUE(s.api);
  for (const char* path : {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"}) {
    auto r = s.post(path, {{"lora_name", "a"}, {"lora_path", "/x"}});
    EXPECT_EQ(r.status, 404) << path;
    EXPECT_NE(message(r).find("--allow-runtime-lora-updating"), std::string::npos) << r.body;
  }
  EXPECT_TRUE(mesh.calls.empty());
  EXPECT_EQ(reply(s.api->handle("GET", "/v1/load_lora_adapter", "", "")).status, 405);
}

TEST(LoraUpdates, LoadListsAndRoutesTheAdapterUnloadTakesItAway) {
  updating_mesh mesh;
  service s(true, mesh);
  ASSERT_TRUE(s.api);
  auto loaded = s.post("/v1/load_lora_adapter", {{"lora_name", "psalms"}, {"lora_path", "/adapters/psalms"}});
  EXPECT_EQ(loaded.status, 200);
  EXPECT_EQ(loaded.content_type, "text/plain; charset=utf-8");
  EXPECT_EQ(loaded.body, "Success: LoRA adapter 'psalms' added successfully.");
  EXPECT_EQ(mesh.calls, (std::vector<std::string>{"load m psalms /adapters/psalms"}));
  EXPECT_EQ(listed(*s.api), (std::vector<std::string>{"m", "psalms"}));
  auto card = json::parse(reply(s.api->handle("GET", "/v1/models/psalms", "", "")).body);
  EXPECT_EQ(card["parent"], "m");
  EXPECT_EQ(card["root"], "/adapters/psalms");

  // A request naming it goes to the base model's replicas with the adapter's name.
  auto job = s.api->handle("POST", "/v1/completions", "", json({{"model", "psalms"}, {"prompt", "In the"}, {"max_tokens", 2}}).dump());
  ASSERT_TRUE(std::holds_alternative<generation_job>(job)) << reply(std::move(job)).body;
  EXPECT_EQ(std::get<generation_job>(job).requests.at(0).model, "m");
  EXPECT_EQ(std::get<generation_job>(job).requests.at(0).lora, "psalms");

  auto again = s.post("/v1/load_lora_adapter", {{"lora_name", "psalms"}, {"lora_path", "/adapters/other"}});
  EXPECT_EQ(again.status, 400);
  EXPECT_EQ(message(again), "The lora adapter 'psalms' has already been loaded.");

  auto unloaded = s.post("/v1/unload_lora_adapter", {{"lora_name", "psalms"}});
  EXPECT_EQ(unloaded.status, 200);
  EXPECT_EQ(unloaded.body, "Success: LoRA adapter 'psalms' removed successfully.");
  EXPECT_EQ(mesh.calls.back(), "unload m psalms");
  EXPECT_EQ(listed(*s.api), (std::vector<std::string>{"m"}));
  auto gone = s.api->handle("POST", "/v1/completions", "", json({{"model", "psalms"}, {"prompt", "In the"}}).dump());
  EXPECT_EQ(reply(std::move(gone)).status, 404);
  auto twice = s.post("/v1/unload_lora_adapter", {{"lora_name", "psalms"}});
  EXPECT_EQ(twice.status, 404);
  EXPECT_EQ(message(twice), "The lora adapter 'psalms' cannot be found.");
  // Loaded again under the same name: served again.
  EXPECT_EQ(s.post("/v1/load_lora_adapter", {{"lora_name", "psalms"}, {"lora_path", "/adapters/psalms"}}).status, 200);
  EXPECT_EQ(listed(*s.api), (std::vector<std::string>{"m", "psalms"}));
}

TEST(LoraUpdates, BadRequestsAndRefusalsChangeNothing) {
  updating_mesh mesh;
  service s(true, mesh);
  ASSERT_TRUE(s.api);
  const std::pair<json, std::string> bad_loads[] = {
      {{{"lora_name", "a"}}, "Both 'lora_name' and 'lora_path' must be provided."},
      {{{"lora_path", "/x"}}, "Both 'lora_name' and 'lora_path' must be provided."},
      {{{"lora_name", 7}, {"lora_path", "/x"}}, "'lora_name' must be a string"},
      {{{"lora_name", "a b"}, {"lora_path", "/x"}}, "'lora_name' must be 1 to 128 letters, digits and -_.:/"},
      {{{"lora_name", "m"}, {"lora_path", "/x"}}, "'m' names a served model; an adapter needs a name of its own"},
      {{{"lora_name", "a"}, {"lora_path", "/x"}, {"base_model_name", "other"}}, "the base model 'other' is not served here"},
      {{{"lora_name", "a"}, {"lora_path", "/bad/a"}}, "/bad/a: no adapter_config.json"},
      {json::array({1}), "the request body must be a JSON object"},
  };
  for (const auto& [body, want] : bad_loads) {
    auto r = s.post("/v1/load_lora_adapter", body);
    EXPECT_GE(r.status, 400) << body.dump();
    EXPECT_EQ(message(r), want) << body.dump();
  }
  auto r = s.post("/v1/unload_lora_adapter", json::object());
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(message(r), "'lora_name' needs to be provided to unload a LoRA adapter.");
  r = s.post("/v1/unload_lora_adapter", {{"lora_name", "m"}});
  EXPECT_EQ(r.status, 404) << "the base model is no adapter";
  EXPECT_TRUE(mesh.calls.empty());
  EXPECT_EQ(listed(*s.api), (std::vector<std::string>{"m"}));
}

TEST(LoraUpdates, AnUnloadTheMeshRefusesKeepsTheAdapterWhereItWasListed) {
  updating_mesh mesh;
  service s(true, mesh);
  ASSERT_TRUE(s.api);
  for (const char* n : {"first", "stuck", "last"}) {
    ASSERT_EQ(s.post("/v1/load_lora_adapter", {{"lora_name", n}, {"lora_path", std::string("/a/") + n}}).status, 200);
  }
  auto r = s.post("/v1/unload_lora_adapter", {{"lora_name", "stuck"}});
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(message(r), "the replicas did not let go");
  EXPECT_EQ(listed(*s.api), (std::vector<std::string>{"m", "first", "stuck", "last"}));
}

TEST(LoraUpdates, AMeshWithoutAWayToItsReplicasRefusesThemWithOneLine) {
  fake_mesh mesh;  // mesh_client's own load_lora
  service s(true, mesh);
  ASSERT_TRUE(s.api);
  auto r = s.post("/v1/load_lora_adapter", {{"lora_name", "a"}, {"lora_path", "/x"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(message(r).find("this mesh takes no runtime LoRA updates"), std::string::npos) << r.body;
  EXPECT_EQ(listed(*s.api), (std::vector<std::string>{"m"}));
}

TEST(LoraUpdates, SeveralBaseModelsNeedBaseModelName) {
  updating_mesh mesh;
  actors::metrics_registry metrics;
  api_options o;
  o.runtime_lora_updates = true;
  auto bible = kjv_tiny("bible");
  bible.aliases = {"kjv-bible"};
  api_service api(o, {kjv_tiny("kjv"), std::move(bible)}, mesh, metrics);
  auto r = reply(api.handle("POST", "/v1/load_lora_adapter", "", json({{"lora_name", "a"}, {"lora_path", "/x"}}).dump()));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(message(r), "this server serves several models: name the adapter's in 'base_model_name'");
  r = reply(api.handle("POST", "/v1/load_lora_adapter", "",
                       json({{"lora_name", "a"}, {"lora_path", "/x"}, {"base_model_name", "bible"}}).dump()));
  EXPECT_EQ(r.status, 200) << r.body;
  r = reply(api.handle("POST", "/v1/load_lora_adapter", "",
                       json({{"lora_name", "b"}, {"lora_path", "/y"}, {"base_model_name", "kjv-bible"}}).dump()));
  EXPECT_EQ(r.status, 200) << "a further name of the base: " << r.body;
  EXPECT_EQ(mesh.calls, (std::vector<std::string>{"load bible a /x", "load bible b /y"}));
}

// A gateway node hears of adapters another gateway (or `llmesh ctl`) loaded: each model's whole
// list, again on every change. Runtime entries come and go with it; the configured adapters,
// other models' adapters and news of models not served here change nothing; a load this
// gateway asked for whose news came first is listed once.
TEST(LoraUpdates, AMeshsNewsListsTheAdaptersAddedElsewhere) {
  updating_mesh mesh;
  actors::metrics_registry metrics;
  api_options o;
  o.runtime_lora_updates = true;
  auto bible = kjv_tiny("bible");
  bible.loras = {{"psalms", "/cfg/psalms"}};
  api_service api(o, {kjv_tiny("kjv"), std::move(bible)}, mesh, metrics);
  EXPECT_EQ(listed(api), (std::vector<std::string>{"kjv", "bible", "psalms"}));
  api.set_runtime_adapters("bible", {{"a", "/a"}, {"b", "/b"}});
  api.set_runtime_adapters("kjv", {{"k", "/k"}});
  api.set_runtime_adapters("elsewhere", {{"z", "/z"}});
  EXPECT_EQ(listed(api), (std::vector<std::string>{"kjv", "bible", "psalms", "a", "b", "k"}));
  api.set_runtime_adapters("bible", {{"a", "/a"}, {"b", "/b"}});  // the same news again
  EXPECT_EQ(listed(api), (std::vector<std::string>{"kjv", "bible", "psalms", "a", "b", "k"}));
  // Routed as the base model's, under the adapter's name.
  auto job = api.handle("POST", "/v1/completions", "", json({{"model", "b"}, {"prompt", "In the"}, {"max_tokens", 2}}).dump());
  ASSERT_TRUE(std::holds_alternative<generation_job>(job));
  ASSERT_EQ(std::get<generation_job>(job).requests.size(), 1u);
  EXPECT_EQ(std::get<generation_job>(job).requests[0].model, "bible");
  EXPECT_EQ(std::get<generation_job>(job).requests[0].lora, "b");
  api.set_runtime_adapters("bible", {{"b", "/b"}});  // a unloaded elsewhere; psalms is the config's
  EXPECT_EQ(listed(api), (std::vector<std::string>{"kjv", "bible", "psalms", "b", "k"}));
  api.set_runtime_adapters("bible", {});
  EXPECT_EQ(listed(api), (std::vector<std::string>{"kjv", "bible", "psalms", "k"}));
  // News of this gateway's own load before the mesh's answer: listed once.
  api.set_runtime_adapters("bible", {{"mine", "/m"}});
  auto r = reply(api.handle("POST", "/v1/load_lora_adapter", "",
                       json({{"lora_name", "mine"}, {"lora_path", "/m"}, {"base_model_name", "bible"}}).dump()));
  EXPECT_EQ(r.status, 400) << "listed already: " << r.body;
  api.set_runtime_adapters("bible", {});
  r = reply(api.handle("POST", "/v1/load_lora_adapter", "",
                       json({{"lora_name", "mine"}, {"lora_path", "/m"}, {"base_model_name", "bible"}}).dump()));
  EXPECT_EQ(r.status, 200) << r.body;
  api.set_runtime_adapters("bible", {{"mine", "/m"}});
  EXPECT_EQ(listed(api), (std::vector<std::string>{"kjv", "bible", "psalms", "k", "mine"}));
  // Unloaded here: the news without it changes nothing more.
  r = reply(api.handle("POST", "/v1/unload_lora_adapter", "", json({{"lora_name", "mine"}}).dump()));
  EXPECT_EQ(r.status, 200) << r.body;
  api.set_runtime_adapters("bible", {});
  EXPECT_EQ(listed(api), (std::vector<std::string>{"kjv", "bible", "psalms", "k"}));
}

}  // namespace
}  // namespace llmesh::gateway
