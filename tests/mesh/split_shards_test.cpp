// A replica whose two tensor-parallel shards run in two processes:
// cluster-configs/local-split-shards.yaml (ports moved to free ones) started as three
// `llmesh node` processes — seed (coordinator, gateway, router), shard-0 (rank 0 and the
// replica) and shard-1 (rank 1). Steps cross the mesh plane (ShardStep/ShardResult), and every
// layer's all-reduce the tensor plane, yet greedy tokens equal `llmesh generate --tp 2`'s, alone
// and under concurrent load. When shard-1's process dies, the replica is gone (the group fails
// as a unit): the requests it held end with an error instead of hanging, and when the node
// comes back the replica is formed again and serves the same tokens. A model with
// `quantization: int8` is quantized by each node alike: the tokens are generate --quantization int8's;
// one with `kv_cache_dtype: bfloat16` holds bf16 caches on both nodes: generate --kv-cache-dtype's;
// one with `dtype: bfloat16` rounds its float32 weights on both nodes: generate --dtype's.
#include <algorithm>

#include "mesh_fixture.hpp"

namespace llmesh::testing {
namespace {

mesh_files split_files() {
  return mesh_files("local-split-shards.yaml", {"7200", "7201", "7202", "8090", "8091"}, "split-shards-dev-token-change-me");
}

::testing::AssertionResult replica_ready(const mesh_files& m, child_process& seed, child_process& s0, child_process& s1) {
  nlohmann::json reps;
  if (!wait_replicas(m, [](const nlohmann::json& j) { return count_ready(j, "shard-0") == 1; }, &reps)) {
    return ::testing::AssertionFailure() << reps.dump() << "\n" << seed.log() << s0.log() << s1.log();
  }
  return ::testing::AssertionSuccess();
}

TEST(SplitShards, TwoProcessesServeExactlyAndReformAfterAShardsDeath) {
  auto m = split_files();
  // shard-1 serves its own metrics (its node's `metrics` key): the tensor plane's traffic is there.
  const int s1_metrics = free_local_port();
  m.rewrite("  - name: shard-1\n    roles: [replica]\n",
            "  - name: shard-1\n    roles: [replica]\n    metrics: 127.0.0.1:" + std::to_string(s1_metrics) + "\n");
  node_process seed(m.node("seed"));
  ASSERT_TRUE(seed.wait_for("serving 'kjv-tiny' on http://")) << seed.log();
  node_process s0(m.node("shard-0"));
  auto s1 = std::make_unique<node_process>(m.node("shard-1"));
  ASSERT_TRUE(replica_ready(m, seed, s0, *s1));
  EXPECT_TRUE(s0.wait_for("ready (tp 2 over 2 node(s))")) << s0.log();
  EXPECT_TRUE(s1->wait_for("telling rank 0's node")) << s1->log();
  const auto reps = ctl_json(m, "replicas");
  ASSERT_EQ(reps.size(), 1u) << reps.dump();
  EXPECT_EQ(reps[0]["shards"], (nlohmann::json{"shard-0", "shard-1"})) << reps.dump();

  const std::vector<std::vector<int32_t>> prompts{{1142, 258, 2078, 386, 3345}, {295, 258, 400}, {46, 10, 295}};
  constexpr int max_tokens = 24;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) {
    want.push_back(generate_ids(p, max_tokens, " --tp 2"));
    ASSERT_EQ(want.back().size(), static_cast<size_t>(max_tokens));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::string why;
    EXPECT_EQ(complete(m.http_port, prompts[i], max_tokens, &why), want[i]) << why;
  }
  {  // Echo with logprobs: the prompt is scored across both processes (each scored block of
     // rows is one LM-head gather over the tensor plane); a greedy continuation G of P, echoed
     // as P + G, scores G exactly as it was generated.
    const nlohmann::json gen_body = {{"model", "kjv-tiny"}, {"prompt", prompts[0]}, {"max_tokens", 4},
                                     {"temperature", 0}, {"logprobs", 1}};
    auto g = http_request(m.http_port, "POST", "/v1/completions", gen_body.dump());
    ASSERT_EQ(g.status, 200) << g.body;
    const auto gen = nlohmann::json::parse(g.body)["choices"][0]["logprobs"];
    std::vector<int32_t> whole = prompts[0];
    whole.insert(whole.end(), want[0].begin(), want[0].begin() + 4);
    nlohmann::json echo_body = gen_body;
    echo_body["prompt"] = whole;
    echo_body["max_tokens"] = 1;
    echo_body["echo"] = true;
    auto e = http_request(m.http_port, "POST", "/v1/completions", echo_body.dump());
    ASSERT_EQ(e.status, 200) << e.body;
    const auto lp = nlohmann::json::parse(e.body)["choices"][0]["logprobs"];
    ASSERT_EQ(lp["token_logprobs"].size(), whole.size() + 1) << lp;
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(lp["token_logprobs"][prompts[0].size() + i], gen["token_logprobs"][i]) << i;
      EXPECT_EQ(lp["top_logprobs"][prompts[0].size() + i], gen["top_logprobs"][i]) << i;
    }
  }
  {  // Structured outputs across two processes: the constrained rows' flag crosses the tensor
     // plane with each step (both ranks must agree the rows need their whole logits), and rank
     // 0 masks each draw. Sampled, at several seeds: every answer is one of the choices.
    const std::vector<std::string> names{"Moses", "Aaron", "Pharaoh", "the LORD"};
    for (int seed : {1, 2, 3}) {
      const nlohmann::json body = {{"model", "kjv-tiny"}, {"prompt", "And the LORD spake unto"}, {"max_tokens", 12},
                                   {"temperature", 1.0}, {"seed", seed}, {"guided_choice", names}};
      auto r = http_request(m.http_port, "POST", "/v1/completions", body.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      const auto choice = nlohmann::json::parse(r.body)["choices"][0];
      EXPECT_NE(std::find(names.begin(), names.end(), choice["text"].get<std::string>()), names.end()) << r.body;
      EXPECT_EQ(choice["finish_reason"], "stop") << r.body;
    }
  }
  {  // Concurrent requests batch together in the split replica: still exact.
    load l{m.http_port, prompts, want, max_tokens};
    l.start(3);
    l.more(12);
    l.finish();
    EXPECT_GE(l.done.load(), 12u);
    EXPECT_EQ(l.failed.load(), 0u) << l.first_failure;
    EXPECT_EQ(l.wrong.load(), 0u);
  }
  {  // shard-1's metrics endpoint: every layer's all-reduce went over its tensor plane, both
     // ways (several MB for these requests); its mesh plane carried the joins and heartbeats.
    const std::string tensor = "llmesh_transport_bytes_total{plane=\"tensor\",direction=";
    EXPECT_GT(metric_value(s1_metrics, tensor + "\"sent\"}"), 100000.0) << http_request(s1_metrics, "GET", "/metrics").body;
    EXPECT_GT(metric_value(s1_metrics, tensor + "\"received\"}"), 100000.0);
    EXPECT_GT(metric_value(s1_metrics, "llmesh_transport_frames_total{plane=\"mesh\",direction=\"sent\"}"), 0.0);
    EXPECT_EQ(metric_value(s1_metrics, "llmesh_transport_errors_total{plane=\"tensor\",kind=\"send\"}"), 0.0);
    EXPECT_EQ(http_request(s1_metrics, "GET", "/health").body, R"({"status":"ok"})");
    EXPECT_EQ(http_request(s1_metrics, "POST", "/metrics", "{}").status, 405);
    EXPECT_EQ(http_request(s1_metrics, "GET", "/v1/models").status, 404);  // no API here
  }

  // shard-1 dies while streams run: the replica fails as a unit; no request hangs.
  {
    const std::vector<std::vector<int32_t>> long_prompts{{1142, 258, 2078}};
    const std::vector<std::vector<int32_t>> long_want{generate_ids(long_prompts[0], 400, " --tp 2")};
    load l{m.http_port, long_prompts, long_want, 400};
    l.start(2);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    s1->crash();
    nlohmann::json reps;
    EXPECT_TRUE(wait_replicas(m, [](const nlohmann::json& j) { return count_ready(j) == 0; }, &reps)) << reps.dump();
    l.more(2);  // requests end (failed: no replica is left), they do not hang
    l.finish();
    EXPECT_EQ(l.wrong.load(), 0u);
    EXPECT_GT(l.failed.load(), 0u) << "the crash hit no request";
    EXPECT_TRUE(s0.wait_for("stopped", std::chrono::seconds(30))) << s0.log();
  }

  // The node comes back: the replica is formed again, over both processes, and serves exactly.
  s1 = std::make_unique<node_process>(m.node("shard-1"));
  ASSERT_TRUE(replica_ready(m, seed, s0, *s1));
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::string why;
    EXPECT_EQ(complete(m.http_port, prompts[i], max_tokens, &why), want[i]) << why;
  }
  EXPECT_EQ(s1->stop(), 0) << s1->log();
  EXPECT_EQ(s0.stop(), 0) << s0.log();
  EXPECT_EQ(seed.stop(), 0) << seed.log();
}

TEST(SplitShards, ADrainMovesASplitReplicaOntoAJoinedNodeWithoutAFailedRequest) {
  auto m = split_files();
  node_process seed(m.node("seed"));
  ASSERT_TRUE(seed.wait_for("serving 'kjv-tiny' on http://")) << seed.log();
  node_process s0(m.node("shard-0")), s1(m.node("shard-1"));
  ASSERT_TRUE(replica_ready(m, seed, s0, s1));
  const std::vector<std::vector<int32_t>> prompts{{1142, 258, 2078, 386, 3345}, {295, 258, 400}};
  constexpr int max_tokens = 32;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(generate_ids(p, max_tokens, " --tp 2"));
  load l{m.http_port, prompts, want, max_tokens};
  l.start(2);
  l.more(4);
  // A third replica node joins; draining shard-0 forms the replacement on shard-1 and the new
  // node (two tensor groups now share shard-1's process), then the old replica drains and its
  // rank 1 on shard-1 is stopped after it.
  node_process s2 = joiner(m, "shard-2");
  ASSERT_TRUE(s2.wait_for("joined the mesh")) << s2.log();
  auto drain = run_command(bin + " ctl --config " + m.config + " drain shard-0");
  ASSERT_EQ(drain.exit_code, 0) << drain.err;
  nlohmann::json reps;
  ASSERT_TRUE(wait_replicas(m, [](const nlohmann::json& j) {
    if (j.size() != 1 || j[0]["phase"] != "ready") return false;
    const auto shards = j[0]["shards"];
    return std::find(shards.begin(), shards.end(), "shard-0") == shards.end();
  }, &reps)) << reps.dump() << "\n" << s0.log() << s1.log() << s2.log();
  EXPECT_TRUE(s0.wait_for("stopped after draining", std::chrono::seconds(30))) << s0.log();
  EXPECT_TRUE(s1.wait_for("shards of replica 1 of 'kjv-tiny' stopped", std::chrono::seconds(30))) << s1.log();
  l.more(10);
  l.finish();
  EXPECT_EQ(l.failed.load(), 0u) << l.first_failure;
  EXPECT_EQ(l.wrong.load(), 0u);
  EXPECT_EQ(metric_value(m.http_port, "llmesh_request_migrations_total"), 0.0);  // a drain moves nothing mid-stream
  EXPECT_EQ(s2.stop(), 0) << s2.log();
  EXPECT_EQ(s1.stop(), 0) << s1.log();
  EXPECT_EQ(s0.stop(), 0) << s0.log();
  EXPECT_EQ(seed.stop(), 0) << seed.log();
}

// `kv_cache_dtype: bfloat16`: each node sizes and holds its ranks' caches as bf16 (ShardReady
// says so, and rank 0's node checks it): the served tokens are `generate --kv-cache-dtype
// bfloat16 --tp 2`'s.
TEST(SplitShards, ABfloat16KvCacheServesGeneratesTokens) {
  auto m = split_files();
  m.rewrite("    placement: spread\n", "    placement: spread\n    kv_cache_dtype: bfloat16\n");
  node_process seed(m.node("seed"));
  ASSERT_TRUE(seed.wait_for("serving 'kjv-tiny' on http://")) << seed.log();
  node_process s0(m.node("shard-0"));
  node_process s1(m.node("shard-1"));
  ASSERT_TRUE(replica_ready(m, seed, s0, s1));
  const std::vector<int32_t> p{1142, 258, 2078, 386, 3345};
  const auto want = testing::generate_ids(bin, model_dir, "--prompt-ids " + id_list(p), 24,
                                          "--tp 2 --temperature 1 --seed 3 --kv-cache-dtype bfloat16");
  ASSERT_EQ(want.size(), 24u);
  ASSERT_NE(want, testing::generate_ids(bin, model_dir, "--prompt-ids " + id_list(p), 24, "--tp 2 --temperature 1 --seed 3"))
      << "this seed must tell a bf16 cache from a float32 one";
  const nlohmann::json body{{"model", "kjv-tiny"}, {"prompt", p}, {"max_tokens", 24},
                            {"temperature", 1},    {"seed", 3}, {"return_token_ids", true}};
  auto r = http_request(m.http_port, "POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(nlohmann::json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want) << r.body;
  EXPECT_EQ(s1.stop(), 0) << s1.log();
  EXPECT_EQ(s0.stop(), 0) << s0.log();
  EXPECT_EQ(seed.stop(), 0) << seed.log();
}

}  // namespace
}  // namespace llmesh::testing

namespace llmesh::testing {
namespace {

// `quantization: int8` on a model split over two nodes: the assignment carries it, each process
// quantizes the part of the weights its rank reads (the bytes a whole copy would hold there:
// quantization is deterministic), so the two ranks' partial sums fit together and the served tokens are `llmesh generate --tp 2
// --quantization int8`'s. Sampled at a seed where the int8 tokens differ from the
// checkpoint's, so a node that loaded the weights as stored would be caught.
TEST(SplitShards, AnInt8ModelServesGeneratesInt8Tokens) {
  auto m = split_files();
  m.rewrite("    placement: spread\n", "    placement: spread\n    quantization: int8\n");
  node_process seed(m.node("seed"));
  ASSERT_TRUE(seed.wait_for("serving 'kjv-tiny' on http://")) << seed.log();
  node_process s0(m.node("shard-0"));
  node_process s1(m.node("shard-1"));
  ASSERT_TRUE(replica_ready(m, seed, s0, s1));
  EXPECT_TRUE(s0.wait_for("rank 0's part of replica")) << s0.log();  // each node says what it holds
  EXPECT_TRUE(s1.wait_for("MiB of weights in memory); telling rank 0's node")) << s1.log();
  const std::vector<std::vector<int32_t>> prompts{{1142, 258, 2078, 386, 3345}, {295, 258, 400}};
  const std::string sampling = "--tp 2 --temperature 1 --seed 3";
  for (const auto& p : prompts) {
    const std::string prompt = "--prompt-ids " + id_list(p);
    const auto want = testing::generate_ids(bin, model_dir, prompt, 24, sampling + " --quantization int8");
    ASSERT_EQ(want.size(), 24u);
    ASSERT_NE(want, testing::generate_ids(bin, model_dir, prompt, 24, sampling)) << "this seed must tell int8 from the checkpoint's weights";
    const nlohmann::json body{{"model", "kjv-tiny"}, {"prompt", p},      {"max_tokens", 24},
                              {"temperature", 1},    {"seed", 3},        {"return_token_ids", true}};
    auto r = http_request(m.http_port, "POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(nlohmann::json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want) << r.body;
  }
  EXPECT_EQ(s1.stop(), 0) << s1.log();
  EXPECT_EQ(s0.stop(), 0) << s0.log();
  EXPECT_EQ(seed.stop(), 0) << seed.log();
}

}  // namespace
}  // namespace llmesh::testing

namespace llmesh::testing {
namespace {

// A LoRA adapter on a model split over two nodes (a cluster config model's `loras`): the
// assignment carries the adapters, each process loads them, the gateway lists the adapter as a
// model, its requests cross to the replica's node by name and each step names it to rank 1 by
// index: the served tokens are `llmesh generate --tp 2 --lora DIR`'s, and the base model's
// requests beside them keep theirs.
TEST(SplitShards, ALoraAdapterRunsAcrossBothProcesses) {
  auto m = split_files();
  const std::string adapter = m.dir.path() + "/psalms";
  auto made = run_command(bin + " model random-lora --model " + model_dir + " --out " + adapter + " --rank 8 --strength 0.5");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  m.rewrite("    placement: spread\n", "    placement: spread\n    loras:\n      - name: psalms\n        path: " + adapter + "\n");
  node_process seed(m.node("seed"));
  ASSERT_TRUE(seed.wait_for("serving 'kjv-tiny'")) << seed.log();
  node_process s0(m.node("shard-0"));
  node_process s1(m.node("shard-1"));
  ASSERT_TRUE(replica_ready(m, seed, s0, s1));
  auto models = http_request(m.http_port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  const auto listed = nlohmann::json::parse(models.body)["data"];
  ASSERT_EQ(listed.size(), 2u) << models.body;
  EXPECT_EQ(listed[1]["id"], "psalms");
  EXPECT_EQ(listed[1]["parent"], "kjv-tiny");
  const std::vector<std::vector<int32_t>> prompts{{1142, 258, 2078, 386, 3345}, {295, 258, 400}};
  constexpr int max_tokens = 16;
  for (const auto& p : prompts) {
    const auto want = generate_ids(p, max_tokens, " --tp 2 --lora " + adapter);
    const auto plain = generate_ids(p, max_tokens, " --tp 2");
    ASSERT_EQ(want.size(), static_cast<size_t>(max_tokens));
    EXPECT_NE(want, plain) << "the adapter must change the tokens for this test to mean anything";
    for (const std::string model : {"psalms", "kjv-tiny"}) {
      const nlohmann::json body{{"model", model}, {"prompt", p}, {"max_tokens", max_tokens}, {"temperature", 0}, {"return_token_ids", true}};
      auto r = http_request(m.http_port, "POST", "/v1/completions", body.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      EXPECT_EQ(nlohmann::json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), model == "psalms" ? want : plain)
          << model;
    }
  }
  EXPECT_EQ(s1.stop(), 0) << s1.log();
  EXPECT_EQ(s0.stop(), 0) << s0.log();
  EXPECT_EQ(seed.stop(), 0) << seed.log();
}

// `dtype: bfloat16` on a float32 checkpoint split over two nodes: each process rounds its copy
// of the weights alike, and the served tokens are `llmesh generate --tp 2 --dtype bfloat16`'s
// (at a seed where they differ from the float32 weights').
TEST(SplitShards, ADtypeCastAppliesOnBothProcesses) {
  auto m = split_files();
  const std::string model = m.dir.path() + "/f32";
  auto made = run_command(bin + " model random --out " + model +
                          " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --dtype f32 --seed 4");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  m.rewrite("    path: " + model_dir + "\n", "    path: " + model + "\n");
  m.rewrite("    placement: spread\n", "    placement: spread\n    dtype: bfloat16\n");
  node_process seed(m.node("seed"));
  ASSERT_TRUE(seed.wait_for("serving 'kjv-tiny'")) << seed.log();
  node_process s0(m.node("shard-0"));
  node_process s1(m.node("shard-1"));
  ASSERT_TRUE(replica_ready(m, seed, s0, s1));
  const std::vector<int32_t> p{5, 17, 100, 42, 8, 99, 1, 259, 33, 71, 12, 250, 3};
  const std::string sampling = " --tp 2 --temperature 1 --seed 2";
  const auto want = testing::generate_ids(bin, model, "--prompt-ids " + id_list(p), 24, sampling + " --dtype bfloat16");
  ASSERT_EQ(want.size(), 24u);
  ASSERT_NE(want, testing::generate_ids(bin, model, "--prompt-ids " + id_list(p), 24, sampling))
      << "this seed must tell bfloat16 weights from float32 ones";
  const nlohmann::json body{{"model", "kjv-tiny"}, {"prompt", p},  {"max_tokens", 24}, {"temperature", 1},
                            {"seed", 2},           {"ignore_eos", true}, {"return_token_ids", true}};
  auto r = http_request(m.http_port, "POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(nlohmann::json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want) << r.body;
  // vLLM's runtime LoRA routes: the coordinator takes them only for models with enable_lora.
  auto lora = http_request(m.http_port, "POST", "/v1/load_lora_adapter", R"({"lora_name":"a","lora_path":"/x"})");
  EXPECT_EQ(lora.status, 400);
  EXPECT_NE(lora.body.find("'kjv-tiny' does not take LoRA adapters while serving: set 'enable_lora: true'"), std::string::npos)
      << lora.body;
  EXPECT_EQ(s1.stop(), 0) << s1.log();
  EXPECT_EQ(s0.stop(), 0) << s0.log();
  EXPECT_EQ(seed.stop(), 0) << seed.log();
}

}  // namespace
}  // namespace llmesh::testing
