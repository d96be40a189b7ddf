// Disaggregated prefill across processes: cluster-configs/local-disaggregated.yaml (ports moved
// to free ones) — a gateway node, a node serving kjv-tiny and a node whose replica prefills for
// it (`prefill_for`). A long prompt's whole KV blocks cross the mesh twice (prefill node →
// gateway's request actor → serving node) as KvBlocks frames; the response's cached_tokens
// counts them and its tokens are `llmesh generate`'s. A short prompt is computed where it is
// served. With the prefill node killed, long prompts are computed where they are served.
#include "mesh_fixture.hpp"

namespace llmesh::testing {
namespace {

nlohmann::json complete(int port, const std::vector<int32_t>& prompt) {
  nlohmann::json body{{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0}, {"return_token_ids", true}};
  auto r = http_request(port, "POST", "/v1/completions", body.dump());
  if (r.status != 200) return {{"status", r.status}, {"body", r.body}};
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded()) return {{"status", -1}, {"body", r.body}};
  return {{"status", 200}, {"ids", j["choices"][0]["token_ids"]},
          {"cached", j["usage"].contains("prompt_tokens_details") ? j["usage"]["prompt_tokens_details"].value("cached_tokens", 0) : 0}};
}

std::vector<int32_t> prompt_of(size_t n, int seed) {
  std::vector<int32_t> p;
  for (size_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 37 + static_cast<size_t>(seed) * 101) % 4000 + 10));
  return p;
}

TEST(Mesh, LongPromptsArePrefilledOnAnotherNode) {
  mesh_files m("local-disaggregated.yaml", {"7400", "7401", "7402", "8085", "8086"}, "disaggregated-dev-token-change-me");
  node_process seed(m.node("seed")), a(m.node("replica-a")), b(m.node("replica-b"));
  ASSERT_TRUE(seed.wait_for("serving 'kjv-tiny' on http://")) << seed.log();  // the prefill entry is not a model of the API
  nlohmann::json reps;
  ASSERT_TRUE(wait_replicas(m, [](const nlohmann::json& j) {
    return count_ready(j, "replica-a") == 1 && count_ready(j, "replica-b") == 1;
  }, &reps)) << reps.dump() << "\n" << seed.log() << a.log() << b.log();
  std::string prefill_node;  // placement's choice
  for (const auto& r : reps) {
    if (r["model"] == "kjv-tiny-prefill") prefill_node = r["node"].get<std::string>();
  }
  ASSERT_FALSE(prefill_node.empty()) << reps.dump();
  auto models = nlohmann::json::parse(http_request(m.http_port, "GET", "/v1/models").body);
  ASSERT_EQ(models["data"].size(), 1u) << models.dump();

  const auto long_prompt = prompt_of(100, 1), short_prompt = prompt_of(20, 2);
  // The router hears of the prefill replica a moment after the coordinator.
  nlohmann::json moved;
  for (int i = 0; i < 50; ++i) {
    moved = complete(m.http_port, prompt_of(100, 10 + i));
    if (moved["status"] == 200 && moved["cached"] == 96) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(moved["cached"], 96) << moved.dump() << seed.log();
  const double before = metric_value(m.http_port, "llmesh_kv_transfers_total{outcome=\"moved\"}");
  auto got = complete(m.http_port, long_prompt);
  ASSERT_EQ(got["status"], 200) << got.dump();
  EXPECT_EQ(got["cached"], 96) << "six whole blocks of 16 came from the prefill node";
  EXPECT_EQ(got["ids"].get<std::vector<int32_t>>(), generate_ids(bin, model_dir, "--prompt-ids " + id_list(long_prompt), 10));
  EXPECT_EQ(metric_value(m.http_port, "llmesh_kv_transfers_total{outcome=\"moved\"}"), before + 1);
  auto local = complete(m.http_port, short_prompt);
  ASSERT_EQ(local["status"], 200) << local.dump();
  EXPECT_EQ(local["cached"], 0);
  EXPECT_EQ(local["ids"].get<std::vector<int32_t>>(), generate_ids(bin, model_dir, "--prompt-ids " + id_list(short_prompt), 10));
  EXPECT_EQ(metric_value(m.http_port, "llmesh_kv_transfers_total{outcome=\"moved\"}"), before + 1);

  // The long prompt again: its replica holds it, so it stays there (conditional disaggregation).
  auto again = complete(m.http_port, long_prompt);
  ASSERT_EQ(again["status"], 200) << again.dump();
  EXPECT_EQ(again["ids"], got["ids"]);
  EXPECT_EQ(metric_value(m.http_port, "llmesh_kv_transfers_total{outcome=\"moved\"}"), before + 1);
  EXPECT_EQ(metric_value(m.http_port, "llmesh_prefill_local_total{reason=\"cached\"}"), 1.0);
  EXPECT_EQ(complete(m.http_port, short_prompt)["cached"], 16);  // its whole block, cached the first time
  // vLLM's /reset_prefix_cache crosses the bridge (the decode replica's cache is empty after it)
  // and the router forgets where prefixes went (the long prompt is prefilled elsewhere again).
  auto reset = http_request(m.http_port, "POST", "/reset_prefix_cache", "");
  ASSERT_EQ(reset.status, 200) << reset.body;
  EXPECT_EQ(nlohmann::json::parse(reset.body)["replicas"], 2) << reset.body;
  auto short_again = complete(m.http_port, short_prompt);
  EXPECT_EQ(short_again["cached"], 0) << short_again.dump();
  EXPECT_EQ(short_again["ids"], local["ids"]);
  EXPECT_EQ(complete(m.http_port, long_prompt)["cached"], 96);  // prefilled on the other node again
  EXPECT_EQ(metric_value(m.http_port, "llmesh_kv_transfers_total{outcome=\"moved\"}"), before + 2);

  // The prefill node dies: long prompts are computed where they are served.
  (prefill_node == "replica-a" ? a : b).crash();
  ASSERT_TRUE(wait_replicas(m, [](const nlohmann::json& j) { return count_ready(j) == 1; }, &reps)) << reps.dump();
  const auto after = prompt_of(100, 3);
  auto alone = complete(m.http_port, after);
  ASSERT_EQ(alone["status"], 200) << alone.dump();
  EXPECT_EQ(alone["cached"], 0);
  EXPECT_EQ(alone["ids"].get<std::vector<int32_t>>(), generate_ids(bin, model_dir, "--prompt-ids " + id_list(after), 10));
}

}  // namespace
}  // namespace llmesh::testing
