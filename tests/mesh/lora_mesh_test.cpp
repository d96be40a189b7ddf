// vLLM's runtime LoRA updates on a mesh of processes (coordinator_lora.cpp, node_agent_lora.cpp):
// local.yaml's model with `enable_lora: true`, a second gateway node beside the seed's. An
// adapter loaded through one gateway runs on both replica nodes — every answer is `llmesh
// generate --lora`'s, through either gateway — and on a node that joins later (its assignment
// carries it); one that fails to load is refused with the node's reason and left nowhere; an
// unload through the other gateway takes it away from both.
#include "mesh_fixture.hpp"

namespace llmesh::testing {
namespace {

nlohmann::json complete_model(int port, const std::string& model, const std::vector<int32_t>& prompt, int max_tokens) {
  nlohmann::json body{{"model", model}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
                      {"ignore_eos", true}, {"return_token_ids", true}};
  auto r = http_request(port, "POST", "/v1/completions", body.dump());
  if (r.status != 200) return {{"status", r.status}, {"body", r.body}};
  return {{"status", 200}, {"ids", nlohmann::json::parse(r.body)["choices"][0]["token_ids"]}};
}

/// The ids /v1/models lists on the gateway at `port`.
std::vector<std::string> listed(int port) {
  std::vector<std::string> out;
  auto r = http_request(port, "GET", "/v1/models");
  if (r.status != 200) return out;
  const auto j = nlohmann::json::parse(r.body);  // (held: a loop over a temporary's member would dangle)
  for (const auto& m : j["data"]) out.push_back(m["id"].get<std::string>());
  return out;
}

/// Waits (up to 10 s) until the gateway at `port` lists `model` (or no longer does).
bool wait_listed(int port, const std::string& model, bool want) {
  for (int i = 0; i < 100; ++i) {
    auto l = listed(port);
    if ((std::find(l.begin(), l.end(), model) != l.end()) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(MeshLora, AnAdapterLoadedAtOneGatewayRunsOnEveryReplicaNodeAndLeavesThroughAnother) {
  mesh_files m;
  const int gw2_port = m.add_gateway("gw2");
  m.rewrite("    policy: least-load\n", "    policy: round-robin\n    enable_lora: true\n");
  const std::string adapter = m.dir.path() + "/psalms";
  auto made = run_command(bin + " model random-lora --model " + model_dir + " --out " + adapter + " --rank 8 --strength 0.5");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  three_nodes n(m);
  node_process gw2(m.node("gw2"));
  ASSERT_TRUE(n.ready(m));
  ASSERT_TRUE(gw2.wait_for("serving 'kjv-tiny' on http://")) << gw2.log();

  auto load = http_request(m.http_port, "POST", "/v1/load_lora_adapter",
                           nlohmann::json{{"lora_name", "psalms"}, {"lora_path", adapter}}.dump());
  ASSERT_EQ(load.status, 200) << load.body << n.seed.log() << n.a.log() << n.b.log();
  EXPECT_EQ(load.body, "Success: LoRA adapter 'psalms' added successfully.");
  EXPECT_EQ(listed(m.http_port), (std::vector<std::string>{"kjv-tiny", "psalms"}));
  ASSERT_TRUE(wait_listed(gw2_port, "psalms", true)) << "the other gateway hears of it" << gw2.log();
  for (auto* node : {&n.a, &n.b}) {
    EXPECT_TRUE(node->wait_for("LoRA adapter 'psalms' of 'kjv-tiny' loaded")) << node->log();
  }
  auto ctl = ctl_json(m, "loras");
  EXPECT_EQ(ctl["kjv-tiny"], (nlohmann::json::array({{{"name", "psalms"}, {"path", adapter}, {"runtime", true}}}))) << ctl.dump();

  const std::vector<int32_t> p{1142, 258, 2078, 386, 3345};
  constexpr int max_tokens = 12;
  const auto want = generate_ids(p, max_tokens, " --tp 2 --lora " + adapter);
  const auto plain = generate_ids(p, max_tokens, " --tp 2");
  ASSERT_EQ(want.size(), static_cast<size_t>(max_tokens));
  ASSERT_NE(want, plain) << "the adapter must change the tokens for this test to mean anything";
  // Round robin: consecutive requests through each gateway reach both replicas.
  for (int port : {m.http_port, m.http_port, gw2_port, gw2_port}) {
    auto r = complete_model(port, "psalms", p, max_tokens);
    ASSERT_EQ(r["status"], 200) << r.dump();
    EXPECT_EQ(r["ids"].get<std::vector<int32_t>>(), want) << port;
    auto base = complete_model(port, "kjv-tiny", p, max_tokens);
    ASSERT_EQ(base["status"], 200) << base.dump();
    EXPECT_EQ(base["ids"].get<std::vector<int32_t>>(), plain) << port;
  }

  // Refusals, answered with the reason and changing nothing.
  auto again = http_request(gw2_port, "POST", "/v1/load_lora_adapter",
                            nlohmann::json{{"lora_name", "psalms"}, {"lora_path", adapter}}.dump());
  EXPECT_EQ(again.status, 400);
  EXPECT_NE(again.body.find("has already been loaded"), std::string::npos) << again.body;
  auto bad = http_request(m.http_port, "POST", "/v1/load_lora_adapter",
                          nlohmann::json{{"lora_name", "broken"}, {"lora_path", m.dir.path() + "/nowhere"}}.dump());
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("node replica-"), std::string::npos) << bad.body;
  EXPECT_NE(bad.body.find("nowhere"), std::string::npos) << bad.body;
  EXPECT_EQ(listed(m.http_port), (std::vector<std::string>{"kjv-tiny", "psalms"}));
  EXPECT_EQ(complete_model(m.http_port, "broken", p, 2)["status"], 404);

  // A replica node that joins later loads it with its assignment.
  auto scaled = ctl_json(m, "scale kjv-tiny 3");
  ASSERT_EQ(scaled["ok"], true) << scaled.dump();
  auto c = joiner(m, "replica-c");
  nlohmann::json reps;
  ASSERT_TRUE(wait_replicas(m, [](const nlohmann::json& j) { return count_ready(j) == 3; }, &reps)) << reps.dump() << c.log();
  for (int i = 0; i < 3; ++i) {  // round robin: one of these is replica-c's
    auto r = complete_model(m.http_port, "psalms", p, max_tokens);
    ASSERT_EQ(r["status"], 200) << r.dump();
    EXPECT_EQ(r["ids"].get<std::vector<int32_t>>(), want) << i;
  }

  // Unloaded through the other gateway: gone from both.
  auto unload = http_request(gw2_port, "POST", "/v1/unload_lora_adapter", R"({"lora_name":"psalms"})");
  ASSERT_EQ(unload.status, 200) << unload.body;
  EXPECT_EQ(unload.body, "Success: LoRA adapter 'psalms' removed successfully.");
  ASSERT_TRUE(wait_listed(m.http_port, "psalms", false)) << n.seed.log();
  EXPECT_EQ(complete_model(m.http_port, "psalms", p, 2)["status"], 404);
  for (auto* node : {&n.a, &n.b, &c}) {
    EXPECT_TRUE(node->wait_for("LoRA adapter 'psalms' of 'kjv-tiny' unloaded")) << node->log();
  }
  EXPECT_EQ(c.stop(), 0) << c.log();
  EXPECT_EQ(gw2.stop(), 0) << gw2.log();
}

}  // namespace
}  // namespace llmesh::testing
