// Two models in one mesh across processes: cluster-configs/local-two-models.yaml (ports moved to
// free ones) serves kjv-tiny (one tp-2 replica, speculating with a draft model its entry's
// speculative_config names, and scheduler limits) and a random Qwen2 model (one tp-1 replica).
// Each request is answered by a replica of the model it names — exactly `llmesh generate`'s
// tokens for that model, logprobs included — /v1/models lists both, an unknown model is a 404, and scaling one
// model to zero makes only its requests 503 while the other model goes on serving, and its
// node lets the model go (its memory freed, logged); scaled back to one, it loads it again.
#include "mesh_fixture.hpp"

namespace llmesh::testing {
namespace {

/// One greedy completion of `model` through the gateway (EOS honoured): its ids, or the status.
nlohmann::json complete_model(int port, const std::string& model, const std::vector<int32_t>& prompt, int max_tokens) {
  nlohmann::json body{{"model", model}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
                      {"return_token_ids", true}};
  auto r = http_request(port, "POST", "/v1/completions", body.dump());
  if (r.status != 200) return {{"status", r.status}, {"body", r.body}};
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded()) return {{"status", -1}, {"body", r.body}};
  return {{"status", 200}, {"ids", j["choices"][0]["token_ids"]}, {"model", j["model"]}};
}

TEST(Mesh, TwoModelsAreEachServedByTheirOwnReplicas) {
  mesh_files m("local-two-models.yaml", {"7300", "7301", "7302", "8095", "8096"}, "two-models-dev-token-change-me");
  const std::string qwen_dir = m.dir.path() + "/tiny-qwen";
  auto made = run_command(bin + " model random --out " + qwen_dir + " --arch qwen2 --seed 7 --vocab 600");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  {
    std::ifstream in(m.config);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string yaml = std::regex_replace(ss.str(), std::regex("path: models/tiny-qwen"), "path: " + qwen_dir);
    ASSERT_NE(yaml.find(qwen_dir), std::string::npos);
    // kjv-tiny's replicas speculate with a draft model (kjv-tiny itself), named in its entry:
    // the replica node loads it from the assignment; tiny-qwen's replicas do not speculate.
    const std::string kjv_entry = "    kv_cache_mb: 256\n";
    ASSERT_NE(yaml.find(kjv_entry), std::string::npos);
    // Its scheduler limits travel with the assignment too: prompts run 2 tokens a step, a step
    // holds at most 16 tokens and 4 sequences; the tokens stay those of `llmesh generate`.
    yaml.insert(yaml.find(kjv_entry) + kjv_entry.size(),
                "    speculative_config: {model: " + model_dir + ", num_speculative_tokens: 3}\n"
                "    max_num_batched_tokens: 16\n    max_num_seqs: 4\n    long_prefill_token_threshold: 2\n");
    std::ofstream(m.config) << yaml;
  }
  node_process seed(m.node("seed")), a(m.node("replica-a")), b(m.node("replica-b"));
  ASSERT_TRUE(seed.wait_for("serving 'kjv-tiny', 'tiny-qwen' on http://")) << seed.log();
  nlohmann::json reps;
  ASSERT_TRUE(wait_replicas(m, [](const nlohmann::json& j) {
    return count_ready(j) == 2 && count_ready(j, "replica-a") == 1 && count_ready(j, "replica-b") == 1;
  }, &reps)) << reps.dump() << "\n" << seed.log() << a.log() << b.log();
  std::string qwen_replica, qwen_node;
  for (const auto& r : reps) {
    if (r["model"] != "tiny-qwen") continue;
    qwen_node = r["node"].get<std::string>();
    qwen_replica = qwen_node + "/" + std::to_string(r["id"].get<uint64_t>());
  }
  ASSERT_FALSE(qwen_replica.empty()) << reps.dump();
  // kjv-tiny's replica node took the entry's scheduler limits (its ready line says so).
  EXPECT_NE((a.log() + b.log()).find("of 'kjv-tiny' ready (tp 2; prompts at most 2 tokens a step)"), std::string::npos)
      << a.log() << b.log();

  auto models = http_request(m.http_port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  auto listed = nlohmann::json::parse(models.body);
  ASSERT_EQ(listed["data"].size(), 2u) << models.body;
  EXPECT_EQ(listed["data"][0]["id"], "kjv-tiny");
  EXPECT_EQ(listed["data"][1]["id"], "tiny-qwen");

  // The two models give different tokens for the same prompts: a request that reached the
  // other model's replica could not match.
  const std::vector<std::vector<int32_t>> prompts{{295, 258, 400}, {46, 10, 295}, {1, 2, 3, 4}};
  constexpr int max_tokens = 12;
  size_t differ = 0;
  for (const auto& p : prompts) {
    const auto want_kjv = generate_ids(bin, model_dir, "--prompt-ids " + id_list(p), max_tokens);
    const auto want_qwen = generate_ids(bin, qwen_dir, "--prompt-ids " + id_list(p), max_tokens);
    ASSERT_FALSE(want_kjv.empty());
    ASSERT_FALSE(want_qwen.empty());
    differ += want_kjv != want_qwen;
    auto k = complete_model(m.http_port, "kjv-tiny", p, max_tokens);
    ASSERT_EQ(k["status"], 200) << k.dump();
    EXPECT_EQ(k["ids"].get<std::vector<int32_t>>(), want_kjv);
    EXPECT_EQ(k["model"], "kjv-tiny");
    auto q = complete_model(m.http_port, "tiny-qwen", p, max_tokens);
    ASSERT_EQ(q["status"], 200) << q.dump();
    EXPECT_EQ(q["ids"].get<std::vector<int32_t>>(), want_qwen);
    EXPECT_EQ(q["model"], "tiny-qwen");
  }
  EXPECT_GT(differ, 0u) << "the test's two models should not agree";
  double kept = 0;  // kjv-tiny's replica kept drafts of its draft model (the router's load reports)
  for (int i = 0; i < 100 && kept == 0; ++i) {
    kept = metric_sum(m.http_port, "llmesh_spec_decode_accepted_tokens_total");
    if (kept == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(kept, 0.0) << "kjv-tiny's replica ran no draft model";
  EXPECT_EQ(metric_value(m.http_port, "llmesh_spec_decode_draft_tokens_total{replica=\"" + qwen_replica + "\"}"), 0.0)
      << "tiny-qwen's replica has no speculative_config";
  // Every tiny-qwen request went to tiny-qwen's replica.
  EXPECT_EQ(metric_value(m.http_port, "llmesh_replica_requests_total{replica=\"" + qwen_replica + "\"}"),
            static_cast<double>(prompts.size()));

  // Logprobs cross the process boundary with each token (the replica's node to the gateway's).
  {
    nlohmann::json body{{"model", "tiny-qwen"}, {"prompt", prompts[0]}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", 2}};
    auto r = http_request(m.http_port, "POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    auto lp = nlohmann::json::parse(r.body)["choices"][0]["logprobs"];
    ASSERT_EQ(lp["token_logprobs"].size(), 4u) << r.body;
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0) << r.body;
      EXPECT_EQ(lp["top_logprobs"][i].size(), 2u) << r.body;  // greedy: the chosen token is among the 2
    }
  }

  auto unknown = complete_model(m.http_port, "llama", {1, 2}, 4);
  EXPECT_EQ(unknown["status"], 404) << unknown.dump();
  EXPECT_NE(unknown["body"].get<std::string>().find("'kjv-tiny', 'tiny-qwen'"), std::string::npos) << unknown.dump();

  // Scaling tiny-qwen to zero: its requests get 503, kjv-tiny's are still served.
  auto scaled = run_command(bin + " ctl --config " + m.config + " scale tiny-qwen 0");
  ASSERT_EQ(scaled.exit_code, 0) << scaled.err;
  ASSERT_TRUE(wait_replicas(m, [](const nlohmann::json& j) { return count_ready(j) == 1; }, &reps)) << reps.dump();
  nlohmann::json gone;
  for (int i = 0; i < 100; ++i) {  // the router hears of the stop a moment after the coordinator
    gone = complete_model(m.http_port, "tiny-qwen", prompts[0], 4);
    if (gone["status"] == 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(gone["status"], 503) << gone.dump();
  auto still = complete_model(m.http_port, "kjv-tiny", prompts[0], max_tokens);
  ASSERT_EQ(still["status"], 200) << still.dump();
  EXPECT_EQ(still["ids"].get<std::vector<int32_t>>(), generate_ids(bin, model_dir, "--prompt-ids " + id_list(prompts[0]), max_tokens));
  // No replica on its node uses tiny-qwen now: the node lets it go.
  node_process& host = qwen_node == "replica-a" ? a : b;
  EXPECT_TRUE(host.wait_for("node " + qwen_node + ": 'tiny-qwen' unloaded (")) << host.log();
  node_process& other = qwen_node == "replica-a" ? b : a;
  EXPECT_EQ(other.log().find("unloaded"), std::string::npos) << other.log();  // kjv-tiny is still served there

  // Scaled back to one, tiny-qwen is loaded again and gives the same tokens.
  scaled = run_command(bin + " ctl --config " + m.config + " scale tiny-qwen 1");
  ASSERT_EQ(scaled.exit_code, 0) << scaled.err;
  ASSERT_TRUE(wait_replicas(m, [](const nlohmann::json& j) { return count_ready(j) == 2; }, &reps)) << reps.dump();
  nlohmann::json back;
  for (int i = 0; i < 100; ++i) {  // the router hears of the new replica a moment after the coordinator
    back = complete_model(m.http_port, "tiny-qwen", prompts[0], max_tokens);
    if (back["status"] == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(back["status"], 200) << back.dump();
  EXPECT_EQ(back["ids"].get<std::vector<int32_t>>(), generate_ids(bin, qwen_dir, "--prompt-ids " + id_list(prompts[0]), max_tokens));

  EXPECT_EQ(a.stop(), 0) << a.log();
  EXPECT_EQ(b.stop(), 0) << b.log();
  EXPECT_EQ(seed.stop(), 0) << seed.log();
}

}  // namespace
}  // namespace llmesh::testing
