// The mesh across processes: cluster-configs/local.yaml (ports moved to free ones) started as
// three `llmesh node` processes — seed (coordinator, gateway, router) and two replica nodes,
// each hosting a tp-2 replica — serves OpenAI requests with exactly `llmesh generate`'s tokens.
// Under a steady load, a fourth node joins at run time (`--join`) and an operator drains
// replica-a with `llmesh ctl`: its replica moves to the new node, which then gets traffic, and
// no request fails or changes a token. Every process stops with exit status 0 on SIGTERM.
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <future>

#include "mesh_fixture.hpp"

namespace llmesh::testing {
namespace {

TEST(Mesh, LocalYamlServesExactlyAndSurvivesAJoinAndADrainUnderLoad) {
  mesh_files m;
  three_nodes n(m);
  ASSERT_TRUE(n.ready(m));
  auto& [seed, a, b] = n;
  nlohmann::json reps;

  // Exact tokens through the gateway, against the engine run directly.
  const std::vector<std::vector<int32_t>> prompts{{1142, 258, 2078, 386, 3345}, {295, 258, 400}, {46, 10, 295}, {1225, 334}};
  constexpr int max_tokens = 24;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) {
    want.push_back(generate_ids(p, max_tokens));
    ASSERT_EQ(want.back().size(), static_cast<size_t>(max_tokens));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::string why;
    EXPECT_EQ(complete(m.http_port, prompts[i], max_tokens, &why), want[i]) << why;
  }

  // A steady load from three clients while the mesh changes under it.
  load l{m.http_port, prompts, want, max_tokens};
  l.start(3);
  // A node added at run time joins and is placed nothing yet (the model has its 2 replicas).
  // It serves its own metrics (it has no gateway): --metrics.
  const int c_metrics = free_local_port();
  node_process c = joiner(m, "replica-c", {"--heartbeat-ms", "200", "--metrics", "127.0.0.1:" + std::to_string(c_metrics)});
  ASSERT_TRUE(c.wait_for("joined the mesh")) << c.log();
  EXPECT_TRUE(c.wait_for("metrics on http://127.0.0.1:" + std::to_string(c_metrics) + "/metrics")) << c.log();
  // Draining replica-a moves its replica to replica-c; a's in-flight requests finish there.
  auto drain = run_command(bin + " ctl --config " + m.config + " drain replica-a");
  ASSERT_EQ(drain.exit_code, 0) << drain.err;
  ASSERT_TRUE(wait_replicas(m, [](const nlohmann::json& j) {
    return count_ready(j, "replica-c") == 1 && count_ready(j, "replica-b") == 1 && j.size() == 2;
  }, &reps)) << reps.dump() << "\n" << c.log() << a.log();
  EXPECT_TRUE(a.wait_for("stopped after draining", std::chrono::seconds(30))) << a.log();
  // The new replica takes traffic: let the clients run a little longer.
  l.more(30);
  l.finish();
  EXPECT_GT(l.done.load(), 30u);
  EXPECT_EQ(l.failed.load(), 0u) << l.first_failure;
  EXPECT_EQ(l.wrong.load(), 0u);
  // A drain is graceful: nothing had to move to another replica mid-stream.
  EXPECT_EQ(metric_value(m.http_port, "llmesh_request_migrations_total"), 0.0);
  auto nodes = ctl_json(m, "nodes");
  bool a_draining = false;
  for (const auto& n : nodes) a_draining |= n["name"] == "replica-a" && n["state"] == "draining";
  EXPECT_TRUE(a_draining) << nodes.dump();
  // Which replica is on replica-c: its routed-request counter grew.
  uint64_t c_replica = 0;
  for (const auto& r : reps) {
    if (r["node"] == "replica-c") c_replica = r["id"].get<uint64_t>();
  }
  const double c_routed = metric_value(m.http_port, "llmesh_replica_requests_total{replica=\"replica-c/" + std::to_string(c_replica) + "\"}");
  EXPECT_GT(c_routed, 0.0);
  // replica-c's own endpoint: each request routed there came to it over its mesh plane (at
  // least a frame each), and its tokens went back.
  EXPECT_GE(metric_value(c_metrics, "llmesh_transport_frames_total{plane=\"mesh\",direction=\"received\"}"), c_routed);
  EXPECT_GT(metric_value(c_metrics, "llmesh_transport_bytes_total{plane=\"mesh\",direction=\"sent\"}"), 0.0);
  EXPECT_EQ(http_request(c_metrics, "GET", "/health").status, 200);

  EXPECT_EQ(c.stop(), 0) << c.log();
  EXPECT_EQ(a.stop(), 0) << a.log();
  EXPECT_EQ(b.stop(), 0) << b.log();
  EXPECT_EQ(seed.stop(), 0) << seed.log();
}

TEST(Mesh, AKilledNodesRequestsContinueElsewhereAndItsReplicaIsReplaced) {
  // Heartbeats may pause here (replica-b is frozen below): the kill is seen by the transport.
  mesh_files m("failure_timeout_ms: 60000");
  // replica-a speculates with a draft model (the model itself): the streams that move there
  // continue with the draft catching up on their tokens so far, and change no token.
  three_nodes n(m, {"--speculative-config", R"({"model": ")" + model_dir + R"(", "num_speculative_tokens": 3})"});
  ASSERT_TRUE(n.ready(m));
  auto& [seed, a, b] = n;
  nlohmann::json reps;
  node_process spare = joiner(m, "spare");  // after a and b have theirs: it stays empty
  ASSERT_TRUE(spare.wait_for("joined the mesh")) << spare.log();
  const std::vector<std::vector<int32_t>> prompts{{1142, 258, 2078, 386, 3345}, {295, 258, 400}};
  constexpr int max_tokens = 200;  // long streams: the kill lands in the middle of some
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(generate_ids(p, max_tokens));
  // Embeddings cross the mesh too (their requests and vectors on the wire): a batch's vectors
  // before the failure are the reference.
  nlohmann::json texts = nlohmann::json::array();
  for (int i = 0; i < 12; ++i) texts.push_back("The LORD said unto Moses, " + std::to_string(i));
  const std::string embed_body = nlohmann::json{{"model", "kjv-tiny"}, {"input", texts}}.dump();
  const auto embed_ref = nlohmann::json::parse(http_request(m.http_port, "POST", "/v1/embeddings", embed_body).body, nullptr, false);
  ASSERT_TRUE(embed_ref.is_object() && embed_ref.contains("data")) << embed_ref;
  // And /pooling's token rows (pooling all: every position's row in one message on the wire).
  const std::string rows_body =
      nlohmann::json{{"model", "kjv-tiny"}, {"input", {texts[0], texts[5]}}, {"task", "token_embed"}}.dump();
  const auto rows_ref = nlohmann::json::parse(http_request(m.http_port, "POST", "/pooling", rows_body).body, nullptr, false);
  ASSERT_TRUE(rows_ref.is_object() && rows_ref.contains("data")) << rows_ref;
  ASSERT_GT(rows_ref["data"][1]["data"].size(), 5u) << rows_ref;
  load l{m.http_port, prompts, want, max_tokens};
  l.start(4);
  l.more(8);
  // Freeze replica-b until one of its streams is caught mid-way: a request unfinished for four
  // times the mean request time, while replica-a goes on, is on replica-b.
  const int64_t mean = std::max<int64_t>(l.mean_ms(), 50);
  bool caught = false;
  for (int attempt = 0; attempt < 10 && !caught; ++attempt) {
    b.pause();
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * mean));
    caught = l.some_request_older_than(4 * mean);
    if (!caught) b.resume(), l.more(2);
  }
  ASSERT_TRUE(caught) << "no stream was ever on replica-b";
  // Background responses made now (replica-b still frozen: those routed there wait on it) run
  // without a connection; they too continue elsewhere.
  std::vector<std::string> background;
  const nlohmann::json bg_body = {{"model", "kjv-tiny"}, {"input", "Who is the LORD?"}, {"max_output_tokens", 60},
                                  {"temperature", 0}, {"ignore_eos", true}, {"background", true}};
  for (int i = 0; i < 4; ++i) {
    auto r = nlohmann::json::parse(http_request(m.http_port, "POST", "/v1/responses", bg_body.dump()).body, nullptr, false);
    ASSERT_TRUE(r.is_object() && r.contains("id")) << r;
    background.push_back(r["id"]);
  }
  // An embedding request now: inputs routed to the frozen replica wait, then run elsewhere.
  auto embedded = std::async(std::launch::async, [&] { return http_request(m.http_port, "POST", "/v1/embeddings", embed_body); });
  auto rows = std::async(std::launch::async, [&] { return http_request(m.http_port, "POST", "/pooling", rows_body); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  b.crash();  // replica-b's process dies mid-stream: its streams continue on replica-a
  ASSERT_TRUE(wait_replicas(m, [](const nlohmann::json& j) {
    return count_ready(j, "spare") == 1 && count_ready(j, "replica-a") == 1 && j.size() == 2;
  }, &reps)) << reps.dump() << "\n" << seed.log() << spare.log();
  l.more(8);
  l.finish();
  EXPECT_EQ(l.failed.load(), 0u) << l.first_failure;
  EXPECT_EQ(l.wrong.load(), 0u) << "a migrated stream changed its tokens";
  const auto embed_reply = embedded.get();
  EXPECT_EQ(embed_reply.status, 200) << embed_reply.body;
  const auto embed_after = nlohmann::json::parse(embed_reply.body, nullptr, false);
  ASSERT_TRUE(embed_after.is_object() && embed_after.contains("data")) << embed_reply.body;
  EXPECT_EQ(embed_after["data"], embed_ref["data"]) << "an embedding changed across the failure";
  const auto rows_reply = rows.get();
  EXPECT_EQ(rows_reply.status, 200) << rows_reply.body;
  const auto rows_after = nlohmann::json::parse(rows_reply.body, nullptr, false);
  ASSERT_TRUE(rows_after.is_object() && rows_after.contains("data")) << rows_reply.body;
  EXPECT_EQ(rows_after["data"], rows_ref["data"]) << "token rows changed across the failure";
  // Each background response ended as the same request answers in the foreground.
  nlohmann::json fg_body = bg_body;
  fg_body.erase("background");
  const auto fg = nlohmann::json::parse(http_request(m.http_port, "POST", "/v1/responses", fg_body.dump()).body, nullptr, false);
  ASSERT_TRUE(fg.is_object() && fg.contains("output")) << fg;
  for (const auto& id : background) {
    nlohmann::json r;
    for (int i = 0; i < 3000; ++i) {
      r = nlohmann::json::parse(http_request(m.http_port, "GET", "/v1/responses/" + id).body, nullptr, false);
      if (!r.is_object() || (r["status"] != "queued" && r["status"] != "in_progress")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(r.is_object()) << id;
    EXPECT_EQ(r["status"], "incomplete") << r;
    EXPECT_EQ(r["output"][0]["content"][0]["text"], fg["output"][0]["content"][0]["text"]) << id;
  }
  EXPECT_GT(metric_value(m.http_port, "llmesh_request_migrations_total"), 0.0)
      << "the kill hit no stream; " << http_request(m.http_port, "GET", "/metrics").body << "\n" << seed.log() << a.log() << spare.log();
  double kept = 0;  // replica-a's drafts kept, from the router's load reports
  for (int i = 0; i < 100 && kept == 0; ++i) {
    kept = metric_sum(m.http_port, "llmesh_spec_decode_accepted_tokens_total");
    if (kept == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(kept, 0.0) << "replica-a kept no draft: its draft model did not run\n" << a.log();
  EXPECT_EQ(spare.stop(), 0) << spare.log();
  EXPECT_EQ(a.stop(), 0) << a.log();
  EXPECT_EQ(seed.stop(), 0) << seed.log();
}

TEST(Mesh, APartitionedNodeIsDeclaredDeadByItsSilenceAndItsStreamsContinueElsewhere) {
  mesh_files m("failure_timeout_ms: 1500");
  three_nodes n(m);
  ASSERT_TRUE(n.ready(m));
  auto& [seed, a, b] = n;
  nlohmann::json reps;
  node_process spare = joiner(m, "spare");  // after a and b have theirs: it stays empty
  ASSERT_TRUE(spare.wait_for("joined the mesh")) << spare.log();
  const std::vector<std::vector<int32_t>> prompts{{1142, 258, 2078, 386, 3345}, {295, 258, 400}};
  constexpr int max_tokens = 120;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(generate_ids(p, max_tokens));
  load l{m.http_port, prompts, want, max_tokens};
  l.start(3);
  l.more(4);
  // Nothing passes to or from replica-b any more, and nothing reports it: only the missing
  // heartbeats do.
  // The partition lasts 4 s: long past the 1.5 s failure timeout.
  auto cut = run_command(bin + " ctl --config " + m.config + " fault replica-b partition,for=4s");
  ASSERT_EQ(cut.exit_code, 0) << cut.err;
  EXPECT_TRUE(b.wait_for("fault 'partition,for=4s'", std::chrono::seconds(10))) << b.log();
  ASSERT_TRUE(wait_replicas(m, [](const nlohmann::json& j) {
    return count_ready(j, "spare") == 1 && count_ready(j, "replica-a") == 1 && j.size() == 2;
  }, &reps)) << reps.dump() << "\n" << seed.log();
  l.more(6);
  l.finish();
  EXPECT_EQ(l.failed.load(), 0u) << l.first_failure;
  EXPECT_EQ(l.wrong.load(), 0u);
  // When the partition lifts, replica-b learns it was declared dead, drops its replica (which
  // was re-formed on the spare) and joins again as an empty node, its model still loaded.
  EXPECT_TRUE(b.wait_for("joining again", std::chrono::seconds(30))) << b.log() << seed.log();
  EXPECT_TRUE(b.wait_for("stopped after draining", std::chrono::seconds(30))) << b.log();
  bool back = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!back && std::chrono::steady_clock::now() < until) {
    for (const auto& n : ctl_json(m, "nodes")) back |= n["name"] == "replica-b" && n["shards"] == 0;
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(back) << ctl_json(m, "nodes").dump();
  EXPECT_EQ(count_ready(ctl_json(m, "replicas")), 2u);
  // replica-b keeps the dropped replica's model loaded a while (it may be placed there again).
  EXPECT_FALSE(b.wait_for("unloaded", std::chrono::seconds(1))) << b.log();
  EXPECT_EQ(spare.stop(), 0) << spare.log();
  EXPECT_EQ(b.stop(), 0) << b.log();
  EXPECT_EQ(a.stop(), 0) << a.log();
  EXPECT_EQ(seed.stop(), 0) << seed.log();
}

TEST(Mesh, ASecondGatewayWithItsOwnRouterServesTheSameReplicas) {
  mesh_files m;
  const int gw2_http = m.add_gateway("gw2");
  three_nodes n(m);
  ASSERT_TRUE(n.ready(m));
  node_process gw2(m.node("gw2"));
  ASSERT_TRUE(gw2.wait_for("serving 'kjv-tiny' on http://")) << gw2.log();
  // Its router hears of both replicas through its agent (the coordinator is on the seed).
  bool ready = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!ready && std::chrono::steady_clock::now() < until) {
    ready = metric_value(gw2_http, "llmesh_replicas_ready") == 2.0;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(ready) << http_request(gw2_http, "GET", "/metrics").body << gw2.log();
  const std::vector<int32_t> prompt{1142, 258, 2078, 386, 3345};
  const auto want = generate_ids(prompt, 24);
  for (int i = 0; i < 4; ++i) {
    std::string why;
    EXPECT_EQ(complete(gw2_http, prompt, 24, &why), want) << why;
  }
  // Scaling down stops one replica gracefully: gw2's router drops it too.
  auto scale = run_command(bin + " ctl --config " + m.config + " scale kjv-tiny 1");
  ASSERT_EQ(scale.exit_code, 0) << scale.err;
  ready = false;
  const auto until2 = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!ready && std::chrono::steady_clock::now() < until2) {
    ready = metric_value(gw2_http, "llmesh_replicas_ready") == 1.0;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(ready) << http_request(gw2_http, "GET", "/metrics").body;
  std::string why;
  EXPECT_EQ(complete(gw2_http, prompt, 24, &why), want) << why;
  // Its streams came over the mesh: the transport's counts are on its /metrics.
  const std::string text = http_request(gw2_http, "GET", "/metrics").body;
  EXPECT_GT(metric_value(gw2_http, "llmesh_transport_bytes_total{plane=\"mesh\",direction=\"received\"}"), 1000.0) << text;
  EXPECT_GT(metric_value(gw2_http, "llmesh_transport_frames_total{plane=\"mesh\",direction=\"sent\"}"), 5.0) << text;
  EXPECT_EQ(metric_value(gw2_http, "llmesh_transport_errors_total{plane=\"mesh\",kind=\"decode\"}"), 0.0) << text;
  EXPECT_EQ(gw2.stop(), 0) << gw2.log();
}

// A config's `kv_events: false` (Dynamo's --no-kv-events for the whole mesh): the gateway's
// router never asks replicas what they cache, even with prefix-aware routing, so it reports no
// cached blocks (with KV events on, the same requests make it report some); tokens unchanged.
TEST(Mesh, KvEventsOffInTheConfigLeavesTheRouterPredicting) {
  mesh_files m;
  m.rewrite("policy: least-load", "policy: prefix-aware");
  m.rewrite("\nnodes:", "\nkv_events: false\nnodes:");
  three_nodes n(m);
  ASSERT_TRUE(n.ready(m));
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(100 + (i * 41) % 900);
  const auto want = generate_ids(prompt, 6);
  for (int i = 0; i < 3; ++i) {
    std::string why;
    EXPECT_EQ(complete(m.http_port, prompt, 6, &why), want) << why;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // ten of the router's 50 ms polls
  EXPECT_EQ(metric_sum(m.http_port, "llmesh_router_cached_blocks"), 0.0) << http_request(m.http_port, "GET", "/metrics").body;
}

TEST(Mesh, AJoinedGatewayTakesTheApiKeyLimitAndRpcFlags) {
  mesh_files m;
  three_nodes n(m);
  ASSERT_TRUE(n.ready(m));
  const int http = free_local_port(), rpc = free_local_port();
  node_process gw = joiner(m, "gw3", {"--role", "gateway,router", "--model", model_dir, "--http", "127.0.0.1:" + std::to_string(http),
                                      "--rpc", "127.0.0.1:" + std::to_string(rpc), "--api-key", "sekret-key",
                                      "--max-tokens-limit", "16"});
  ASSERT_TRUE(gw.wait_for("serving 'kjv-tiny' on http://")) << gw.log();
  EXPECT_TRUE(gw.wait_for("and RPC 127.0.0.1:" + std::to_string(rpc))) << gw.log();
  const std::vector<int32_t> prompt{1142, 258, 2078};
  auto body = [&](int max_tokens) {
    return nlohmann::json{{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
                          {"ignore_eos", true}, {"return_token_ids", true}}.dump();
  };
  const std::string key = "Authorization: Bearer sekret-key\r\n";
  EXPECT_EQ(http_request(http, "POST", "/v1/completions", body(8)).status, 401);
  EXPECT_EQ(http_request(http, "POST", "/v1/completions", body(8), "Authorization: Bearer wrong\r\n").status, 401);
  auto over = http_request(http, "POST", "/v1/completions", body(24), key);
  EXPECT_EQ(over.status, 400) << over.body;
  EXPECT_NE(over.body.find("max_tokens"), std::string::npos) << over.body;
  // Its router hears of the replicas through its agent; until then it answers 503.
  http_response ok;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    ok = http_request(http, "POST", "/v1/completions", body(8), key);
    if (ok.status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (ok.status != 200 && std::chrono::steady_clock::now() < until);
  ASSERT_EQ(ok.status, 200) << ok.body << gw.log();
  EXPECT_EQ(nlohmann::json::parse(ok.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), generate_ids(prompt, 8));
  EXPECT_EQ(gw.stop(), 0) << gw.log();
}

TEST(Mesh, CtlNeedsTheTokenAndNamesBadCommands) {
  mesh_files m;
  node_process seed(m.node("seed"));
  ASSERT_TRUE(seed.wait_for("coordinating")) << seed.log();
  const std::string control = " --control 127.0.0.1:" + std::to_string(m.seed_port);
  auto wrong = run_command(bin + " ctl" + control + " --token not-the-cluster-token status");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("bad credentials"), std::string::npos) << wrong.err;
  auto bad = run_command(bin + " ctl --config " + m.config + " frobnicate");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("unknown command 'frobnicate'"), std::string::npos) << bad.err;
  auto unknown = run_command(bin + " ctl --config " + m.config + " drain nobody");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.err.find("nobody"), std::string::npos) << unknown.err;
  auto ok = run_command(bin + " ctl --config " + m.config + " status");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("1 node(s), 0/0 replica(s) ready, kjv-tiny short of 2"), std::string::npos) << ok.out;
  auto scaled = run_command(bin + " ctl --config " + m.config + " scale kjv-tiny 3");
  EXPECT_EQ(scaled.exit_code, 0) << scaled.err;
  EXPECT_EQ(ctl_json(m, "status")["pending"]["kjv-tiny"], 3) << ctl_json(m, "status").dump();
  auto bad_fault = run_command(bin + " ctl --config " + m.config + " fault seed sometimes");
  EXPECT_NE(bad_fault.exit_code, 0);
  EXPECT_NE(bad_fault.err.find("fault: "), std::string::npos) << bad_fault.err;
  auto fault_nobody = run_command(bin + " ctl --config " + m.config + " fault nobody partition");
  EXPECT_NE(fault_nobody.err.find("no node 'nobody'"), std::string::npos) << fault_nobody.err;
  auto bad_scale = run_command(bin + " ctl --config " + m.config + " scale kjv-tiny many");
  EXPECT_NE(bad_scale.exit_code, 0);
  EXPECT_NE(bad_scale.err.find("N must be"), std::string::npos) << bad_scale.err;
  // A node with the wrong token is refused and exits non-zero with one line.
  node_process intruder({"--join", "127.0.0.1:" + std::to_string(m.seed_port), "--name", "intruder", "--listen",
                         "127.0.0.1:" + std::to_string(free_local_port()), "--token", "not-the-cluster-token-at-all"});
  EXPECT_TRUE(intruder.wait_for("refused the join")) << intruder.log();
  EXPECT_NE(intruder.stop(), 0);
  EXPECT_EQ(seed.stop(), 0) << seed.log();
}

TEST(Mesh, NodeAndCtlRefuseBadFlagsAndConfigsWithOneLine) {
  mesh_files m;
  auto missing = run_command(bin + " node --config " + m.config + " --name nobody");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("no node named 'nobody'"), std::string::npos) << missing.err;
  auto no_token = run_command("env -u LLMESH_TOKEN " + bin + " node --join 127.0.0.1:1 --name x --listen 127.0.0.1:2");
  EXPECT_NE(no_token.exit_code, 0);
  EXPECT_NE(no_token.err.find("token"), std::string::npos) << no_token.err;
  auto metrics_in_config = run_command(bin + " node --config " + m.config + " --name replica-a --metrics 127.0.0.1:9");
  EXPECT_NE(metrics_in_config.exit_code, 0);
  EXPECT_NE(metrics_in_config.err.find("--metrics: with --config, set the node's 'metrics' address"), std::string::npos)
      << metrics_in_config.err;
  // vLLM's gateway flags: a config node takes them from its models' entries; a node without the
  // gateway role has no use for them.
  auto len_in_config = run_command(bin + " node --config " + m.config + " --name seed --max-model-len 64");
  EXPECT_NE(len_in_config.exit_code, 0);
  EXPECT_NE(len_in_config.err.find("with --config, set each model's"), std::string::npos) << len_in_config.err;
  auto template_without_gateway = run_command(bin + " node --join 127.0.0.1:1 --name x --listen 127.0.0.1:2 --token "
                                                    "abcdefghijklmnopq --chat-template '{{ x }}'");
  EXPECT_NE(template_without_gateway.exit_code, 0);
  EXPECT_NE(template_without_gateway.err.find("are a gateway's flags"), std::string::npos) << template_without_gateway.err;
  auto bad_metrics = run_command(bin + " node --join 127.0.0.1:1 --name x --listen 127.0.0.1:2 --token abcdefghijklmnopq "
                                       "--metrics 9100");
  EXPECT_NE(bad_metrics.exit_code, 0);
  EXPECT_NE(bad_metrics.err.find("--metrics: "), std::string::npos) << bad_metrics.err;
  {  // a taken metrics port fails before the node joins anything
    const int port = free_local_port();
    node_process holder = joiner(m, "holder", {"--metrics", "127.0.0.1:" + std::to_string(port)});
    ASSERT_TRUE(holder.wait_for("metrics on http://")) << holder.log();
    auto taken = run_command(bin + " node --join 127.0.0.1:" + std::to_string(m.seed_port) +
                             " --name y --listen 127.0.0.1:" + std::to_string(free_local_port()) +
                             " --token " + m.token() + " --metrics 127.0.0.1:" + std::to_string(port));
    EXPECT_NE(taken.exit_code, 0);
    EXPECT_NE(taken.err.find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos) << taken.err;
  }
  auto no_draft = run_command(bin + " node --config " + m.config + " --name replica-a --speculative-config "
                                     "'{\"model\": \"/nowhere/draft\", \"num_speculative_tokens\": 3}'");
  EXPECT_NE(no_draft.exit_code, 0);
  EXPECT_NE(no_draft.err.find("--speculative-config: draft model /nowhere/draft"), std::string::npos) << no_draft.err;
  auto unreachable = run_command(bin + " ctl --control 127.0.0.1:1 --token abcdefghijklmnopq --timeout 3 status");
  EXPECT_NE(unreachable.exit_code, 0);
  EXPECT_NE(unreachable.err.find("coordinator"), std::string::npos) << unreachable.err;
}

}  // namespace
}  // namespace llmesh::testing
