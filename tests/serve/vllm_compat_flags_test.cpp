// vLLM's remaining serve flags on `llmesh serve`, over real HTTP: --max-logprobs bounds every
// logprobs field (and says so when asked beyond the engine's 20), --response-role names chat
// answers (a continued message keeps its own role), --enable-request-id-headers echoes or makes
// X-Request-Id, --tokenizer takes the tokenizer and chat template from another directory,
// --override-generation-config sets sampling defaults, --speculative-config turns on prompt
// lookup or a draft model (drafts counted, tokens unchanged), --config reads flags from YAML (the command line
// wins), --hf-overrides changes config.json as the model is read, vLLM's flags for what a local
// model never needs start the server, and what llmesh does not do is refused by name before the
// model loads.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../cli/subprocess.hpp"
#include "../model/temp_dir.hpp"
#include "reference.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string kjv = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";

http_response post(int port, const std::string& path, const json& body, const std::string& headers = "") {
  return http_request(port, "POST", path, body.dump(), headers);
}

std::string message_of(const http_response& r) {
  auto j = json::parse(r.body, nullptr, false);
  return j.is_object() && j.contains("error") ? j["error"]["message"].get<std::string>() : r.body;
}

TEST(ServeVllmCompatFlags, MaxLogprobsResponseRoleAndRequestIds) {
  server_process s(bin, {"--model", kjv, "--max-logprobs", "5", "--response-role", "bot", "--enable-request-id-headers",
                         "--root-path", "/api/", "--max-body-kb", "1"});
  ASSERT_GT(s.port(), 0) << s.log();
  const json c = {{"model", "kjv-tiny"}, {"prompt", "In the"}, {"max_tokens", 2}, {"temperature", 0}};
  json ok = c, over = c, prompt_over = c;
  ok["logprobs"] = 5;
  over["logprobs"] = 6;
  prompt_over["prompt_logprobs"] = 6;
  EXPECT_EQ(post(s.port(), "/v1/completions", ok).status, 200);
  auto r = post(s.port(), "/v1/completions", over);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(message_of(r).find("between 0 and 5"), std::string::npos) << r.body;
  EXPECT_EQ(post(s.port(), "/v1/completions", prompt_over).status, 400);
  const json chat = {{"model", "kjv-tiny"}, {"messages", {{{"role", "user"}, {"content", "Who"}}}}, {"max_tokens", 2}};
  json chat_over = chat;
  chat_over["logprobs"] = true;
  chat_over["top_logprobs"] = 6;
  EXPECT_EQ(post(s.port(), "/v1/chat/completions", chat_over).status, 400);

  // The role: the server's after a generation prompt, streamed or not; a continued message's own.
  r = post(s.port(), "/v1/chat/completions", chat);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["message"]["role"], "bot");
  json streamed = chat;
  streamed["stream"] = true;
  r = post(s.port(), "/v1/chat/completions", streamed);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(sse_payloads(r.body).front())["choices"][0]["delta"]["role"], "bot") << r.body;
  json continued = chat;
  continued["messages"].push_back({{"role", "assistant"}, {"content", "It was"}});
  continued["continue_final_message"] = true;
  r = post(s.port(), "/v1/chat/completions", continued);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["message"]["role"], "assistant");

  // X-Request-Id: the client's echoed, else a new one on every answer (errors and streams too).
  r = post(s.port(), "/v1/completions", c, "X-Request-Id: my-id-7\r\n");
  EXPECT_EQ(r.headers["x-request-id"], "my-id-7");
  const std::string made = post(s.port(), "/v1/completions", c).headers["x-request-id"];
  EXPECT_EQ(made.size(), 32u) << made;
  EXPECT_NE(made, post(s.port(), "/v1/completions", c).headers["x-request-id"]);
  EXPECT_EQ(post(s.port(), "/v1/completions", over).headers["x-request-id"].size(), 32u);
  EXPECT_EQ(post(s.port(), "/v1/chat/completions", streamed, "X-Request-Id: s1\r\n").headers["x-request-id"], "s1");
  EXPECT_EQ(http_request(s.port(), "GET", "/health").headers.count("x-request-id"), 1u);
  r = http_request(s.port(), "POST", "/v1/completions", std::string(2000, ' '), "X-Request-Id: big\r\n");
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.headers["x-request-id"], "big") << "a 413 carries it too";
  // Beam search asks 2 × n alternatives a step: within --max-logprobs 5, n is at most 2.
  json beams = c;
  beams["use_beam_search"] = true;
  beams["n"] = 2;
  EXPECT_EQ(post(s.port(), "/v1/completions", beams).status, 200);
  beams["n"] = 3;
  r = post(s.port(), "/v1/completions", beams);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(message_of(r).find("at most 2"), std::string::npos) << r.body;
  // --root-path: a proxy that keeps the prefix reaches the same routes; others are unknown.
  EXPECT_EQ(post(s.port(), "/api/v1/completions", c).status, 200);
  EXPECT_EQ(http_request(s.port(), "GET", "/api/health").status, 200);
  EXPECT_EQ(post(s.port(), "/apix/v1/completions", c).status, 404);

  // Beyond the engine's bound: the start says so, and 20 is the bound.
  server_process wide(bin, {"--model", kjv, "--max-logprobs", "50"});
  ASSERT_GT(wide.port(), 0) << wide.log();
  EXPECT_NE(wide.log().find("--max-logprobs 50: this server returns at most 20 alternatives"), std::string::npos) << wide.log();
  ok["logprobs"] = 20;
  over["logprobs"] = 21;
  EXPECT_EQ(post(wide.port(), "/v1/completions", ok).status, 200);
  EXPECT_EQ(post(wide.port(), "/v1/completions", over).status, 400);
  EXPECT_EQ(post(wide.port(), "/v1/completions", c).headers.count("x-request-id"), 0u) << "off without the flag";
}

/// The replica's drafts kept (/metrics), once the router's next load report has brought a
/// non-zero count (up to 20 s); 0 if none came.
double drafts_kept(int port) {
  double accepted = 0;
  for (int i = 0; i < 200 && accepted == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string metrics = http_request(port, "GET", "/metrics").body;
    const auto at = metrics.find("\nllmesh_spec_decode_accepted_tokens_total{");
    if (at != std::string::npos) accepted = std::atof(metrics.c_str() + metrics.find("} ", at) + 2);
  }
  return accepted;
}

TEST(ServeVllmCompatFlags, TokenizerGenerationOverridesAndSpeculation) {
  model::testing::temp_dir dir;
  const std::string m = dir.path() + "/m";
  ASSERT_EQ(std::system((bin + " model random --out " + m +
                         " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 4096 --seed 4 2>/dev/null")
                            .c_str()),
            0);
  const json tokenize = {{"model", "m"}, {"prompt", "In the beginning God created the heaven"}};
  const json chat = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "Who"}}}}, {"max_tokens", 2}};
  std::vector<int32_t> kjv_ids;
  {
    // kjv-tiny with prompt lookup from --speculative-config: its greedy tokens are generate's, and
    // drafts were kept (its text repeats itself: lookups match).
    server_process k(bin, {"--model", kjv, "--served-model-name", "m", "--speculative-config",
                           R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1})"});
    ASSERT_GT(k.port(), 0) << k.log();
    auto r = post(k.port(), "/tokenize", tokenize);
    ASSERT_EQ(r.status, 200) << r.body;
    kjv_ids = json::parse(r.body)["tokens"].get<std::vector<int32_t>>();
    const json greedy = {{"model", "m"}, {"prompt", "And God said"}, {"max_tokens", 40}, {"temperature", 0}, {"return_token_ids", true}};
    r = post(k.port(), "/v1/completions", greedy);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
              generate_ids(bin, kjv, "--prompt 'And God said'", 40));
    EXPECT_GT(drafts_kept(k.port()), 0.0) << "no draft kept: speculation did not run";
  }
  {
    // kjv-tiny drafting for itself (a draft model of the same tokenizer): greedy and sampled
    // tokens are those of a plain decode, and greedy drafts are kept.
    server_process k(bin, {"--model", kjv, "--served-model-name", "m", "--speculative-config",
                           R"({"model": ")" + kjv + R"(", "num_speculative_tokens": 3})"});
    ASSERT_GT(k.port(), 0) << k.log();
    const json greedy = {{"model", "m"}, {"prompt", "And God said"}, {"max_tokens", 40}, {"temperature", 0}, {"return_token_ids", true}};
    auto r = post(k.port(), "/v1/completions", greedy);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
              generate_ids(bin, kjv, "--prompt 'And God said'", 40));
    const json sampled = {{"model", "m"}, {"prompt", "The LORD"}, {"max_tokens", 24}, {"temperature", 0.8}, {"top_k", 40}, {"seed", 5},
                          {"return_token_ids", true}};
    r = post(k.port(), "/v1/completions", sampled);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
              generate_ids(bin, kjv, "--prompt 'The LORD'", 24, "--temperature 0.8 --top-k 40 --seed 5"));
    EXPECT_GT(drafts_kept(k.port()), 0.0) << "no draft kept: the draft model did not run";
  }
  {
    server_process own(bin, {"--model", m});
    ASSERT_GT(own.port(), 0) << own.log();
    auto r = post(own.port(), "/tokenize", tokenize);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_NE(json::parse(r.body)["tokens"].get<std::vector<int32_t>>(), kjv_ids) << "the random model's own tokenizer differs";
    EXPECT_EQ(post(own.port(), "/v1/chat/completions", chat).status, 400) << "it has no chat template";
  }
  // The tokenizer and its chat template from kjv-tiny, the only tokenizer now (the replicas'
  // structured-output masks too), whose end-of-text id the model is told; temperature 0 by default.
  std::filesystem::remove(m + "/tokenizer.json");
  std::filesystem::remove(m + "/tokenizer_config.json");
  for (const char* file : {"/config.json", "/generation_config.json"}) {
    json j = json::parse(read_file(m + file));
    j["eos_token_id"] = json::parse(read_file(kjv + "/config.json"))["eos_token_id"];
    std::ofstream(m + file) << j.dump();
  }
  server_process s(bin, {"--model", m, "--tokenizer", kjv, "--override-generation-config", R"({"temperature": 0})"});
  ASSERT_GT(s.port(), 0) << s.log();
  auto r = post(s.port(), "/tokenize", tokenize);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["tokens"].get<std::vector<int32_t>>(), kjv_ids);
  EXPECT_EQ(post(s.port(), "/v1/chat/completions", chat).status, 200);
  r = post(s.port(), "/v1/completions", {{"model", "m"}, {"prompt", "Answer:"}, {"guided_choice", {"yes", "no"}}, {"max_tokens", 8}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string picked = json::parse(r.body)["choices"][0]["text"];
  EXPECT_TRUE(picked == "yes" || picked == "no") << picked;
  // Seedless requests without a temperature are greedy: the same tokens as temperature 0.
  json rep = {{"model", "m"}, {"prompt", "In the beginning"}, {"max_tokens", 24}, {"ignore_eos", true}, {"return_token_ids", true}};
  json greedy = rep;
  greedy["temperature"] = 0;
  const auto a = json::parse(post(s.port(), "/v1/completions", rep).body)["choices"][0]["token_ids"];
  const auto b = json::parse(post(s.port(), "/v1/completions", rep).body)["choices"][0]["token_ids"];
  const auto g = json::parse(post(s.port(), "/v1/completions", greedy).body)["choices"][0]["token_ids"];
  EXPECT_EQ(a.size(), 24u);
  EXPECT_EQ(a, g);
  EXPECT_EQ(b, g);
}

TEST(ServeVllmCompatFlags, ConfigFileAcceptedFlagsAndRefusals) {
  model::testing::temp_dir dir;
  const std::string m = dir.path() + "/other-tokenizer";  // kjv-tiny's vocabulary size, another tokenizer
  ASSERT_EQ(std::system((bin + " model random --out " + m +
                         " --hidden 32 --intermediate 64 --layers 1 --heads 2 --kv-heads 1 --vocab 4096 --seed 4 2>/dev/null")
                            .c_str()),
            0);
  const std::string cfg = dir.path() + "/serve.yaml";
  std::ofstream(cfg) << "model: " << kjv << "\nserved_model_name: from-yaml\nmax-logprobs: 3\nresponse_role: yaml-role\n"
                     << "enable-request-id-headers: true\nswap-space: 4\n";
  {
    // The command line wins over the file (--response-role).
    server_process s(bin, {"--config", cfg, "--response-role", "cli-role"});
    ASSERT_GT(s.port(), 0) << s.log();
    auto models = json::parse(http_request(s.port(), "GET", "/v1/models").body);
    EXPECT_EQ(models["data"][0]["id"], "from-yaml") << models;
    const json c = {{"model", "from-yaml"}, {"prompt", "In the"}, {"max_tokens", 1}, {"logprobs", 4}};
    auto r = post(s.port(), "/v1/completions", c);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.headers["x-request-id"].size(), 32u);
    const json chat = {{"model", "from-yaml"}, {"messages", {{{"role", "user"}, {"content", "Who"}}}}, {"max_tokens", 1}};
    r = post(s.port(), "/v1/chat/completions", chat);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["message"]["role"], "cli-role");
  }
  {
    // `serve MODEL --config F`: the positional model wins over the file's; an empty value is skipped.
    std::ofstream(dir.path() + "/other.yaml") << "model: /no/such/model\nchat-template: ''\nmax-tokens-limit: 7\n";
    child_process p({bin, "serve", kjv, "--config", dir.path() + "/other.yaml", "--http", "127.0.0.1:0", "--rpc", "none"});
    ASSERT_TRUE(p.wait_for("llmesh: try: curl ")) << p.log();
  }
  {
    // vLLM's flags for downloads, executors and compilation: accepted, and the server serves.
    server_process s(bin, {"--model", kjv, "--download-dir", "/tmp", "--revision", "main", "--tokenizer-revision", "main",
                           "--code-revision", "main", "--hf-token", "--swap-space", "4", "--disable-custom-all-reduce",
                           "--distributed-executor-backend", "mp", "--max-seq-len-to-capture", "8192",
                           "--guided-decoding-backend", "xgrammar", "--root-path", "/api", "--disable-uvicorn-access-log",
                           "--tokenizer-mode", "auto", "--load-format", "safetensors", "--task", "generate",
                           "--pipeline-parallel-size", "1", "--disable-frontend-multiprocessing", "--compilation-config", "3",
                           "--max-parallel-loading-workers", "2", "--prefix-caching-hash-algo", "sha256", "--async-scheduling"});
    ASSERT_GT(s.port(), 0) << s.log();
    EXPECT_EQ(post(s.port(), "/v1/completions", {{"model", "kjv-tiny"}, {"prompt", "In"}, {"max_tokens", 1}}).status, 200);
  }
  {
    // --hf-overrides: the model is read with them (a shorter context the API grants, another rope
    // base the tokens follow: generate's on a copy whose config.json says the same).
    const std::string changed = dir.path() + "/changed";
    std::filesystem::create_directories(changed);
    for (const auto& e : std::filesystem::directory_iterator(kjv)) {
      std::filesystem::create_symlink(e.path(), changed + "/" + e.path().filename().string());
    }
    json c = json::parse(read_file(kjv + "/config.json"));
    c["max_position_embeddings"] = 128;
    c["rope_theta"] = 500.0;
    std::filesystem::remove(changed + "/config.json");
    std::ofstream(changed + "/config.json") << c.dump();
    const std::string prompt = "In the beginning God created the heaven and the earth. And the earth was";
    const auto want = generate_ids(bin, changed, "--prompt '" + prompt + "'", 24);
    ASSERT_NE(want, generate_ids(bin, kjv, "--prompt '" + prompt + "'", 24)) << "the rope base must change the tokens";
    server_process s(bin, {"--model", kjv, "--hf-overrides", R"({"max_position_embeddings": 128, "rope_theta": 500.0})"});
    ASSERT_GT(s.port(), 0) << s.log();
    auto models = json::parse(http_request(s.port(), "GET", "/v1/models").body);
    EXPECT_EQ(models["data"][0]["max_model_len"], 128) << models;
    auto r = post(s.port(), "/v1/completions", {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0},
                                                {"ignore_eos", true}, {"return_token_ids", true}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want);

    // --rope-scaling and --rope-theta (vLLM's; Qwen's recipe for a long context): the same as a
    // config.json that says them, and a yarn context of the original one times the factor.
    json y = json::parse(read_file(kjv + "/config.json"));
    y["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 64}};
    y["rope_theta"] = 500.0;
    std::filesystem::remove(changed + "/config.json");
    std::ofstream(changed + "/config.json") << y.dump();
    const auto want_yarn = generate_ids(bin, changed, "--prompt '" + prompt + "'", 24);
    ASSERT_NE(want_yarn, want) << "yarn must change the tokens";
    server_process sy(bin, {"--model", kjv, "--rope-scaling", R"({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64})",
                            "--rope-theta", "500"});
    ASSERT_GT(sy.port(), 0) << sy.log();
    models = json::parse(http_request(sy.port(), "GET", "/v1/models").body);
    EXPECT_EQ(models["data"][0]["max_model_len"], 128) << models;
    r = post(sy.port(), "/v1/completions", {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0},
                                            {"ignore_eos", true}, {"return_token_ids", true}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want_yarn);
  }
  std::ofstream(dir.path() + "/bad.yaml") << "no-such-flag: 1\n";
  const std::string serve = bin + " serve --model " + kjv + " --http 127.0.0.1:0 --rpc none ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--load-format pt", "--load-format pt: this server loads safetensors and GGUF"},
      {"--rope-scaling '[1, 2]'", "--rope-scaling must be a JSON object"},
      {"--rope-theta 0", "--rope-theta must be a positive number, not '0'"},
      {"--rope-scaling '{\"a\": [[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]}'", "--rope-scaling: nested deeper than 16 levels"},
      {"--rope-scaling '{\"rope_type\": \"mrope\", \"factor\": 2.0}'", "unsupported rope_scaling type 'mrope'"},
      {"--load-format gguf", "is not a GGUF file"},
      {"--max-num-partial-prefills 2 --max-long-partial-prefills 3", "--max-long-partial-prefills must be at most --max-num-partial-prefills"},
      {"--long-prefill-token-threshold 100000", "exceeds the model's context (256)"},
      {"--calculate-kv-scales", "--calculate-kv-scales: not supported: scales computed from each replica's first batch"},
      {"--pipeline-parallel-size 2", "no pipeline parallelism here"},
      {"--task reward", "is not a reward model (Qwen2ForRewardModel, Qwen2ForProcessRewardModel)"},
      {"--task rank", "a Qwen2 reward model reward (/pooling)"},
      {"--pooler-config '{\"pooling_type\": \"STEP\", \"step_tag_id\": 5}'", "pooling_type \"STEP\" is not computed here"},
      {"--override-pooler-config '{\"max_embed_len\": 5}'", "'max_embed_len' is not taken here"},
      {"--pooling cls --pooler-config '{\"pooling_type\": \"mean\"}'", "disagree"},
      {"--task classify", "is not a sequence classifier"},
      {"--tokenizer-mode mistral", "--tokenizer-mode mistral"},
      {"--speculative-config '{\"method\": \"eagle\", \"model\": \"x\"}'", "EAGLE, Medusa"},
      {"--speculative-config '{\"num_speculative_tokens\": 4, \"draft_tensor_parallel_size\": 1}'", "'draft_tensor_parallel_size' is a draft model's"},
      {"--speculative-config '{\"model\": \"" + dir.path() + "/nowhere\", \"num_speculative_tokens\": 4}'", "--speculative-config: draft model"},
      {"--speculative-config '{\"model\": \"" + m + "\", \"num_speculative_tokens\": 4}'", "must share the target's tokenizer"},
      {"--speculative-config '{\"model\": \"" + kjv + "\"}'", "a draft model needs num_speculative_tokens"},
      {"--speculative-config '{\"num_speculative_tokens\": 4, \"prompt_lookup_min\": 5, \"prompt_lookup_max\": 2}'", "1 <= min <= max"},
      {"--override-generation-config '{\"min_p\": 0.1}'", "'min_p' is not taken here"},
      {"--override-generation-config '{\"top_p\": 2}'", "'top_p' must be a number in"},
      {"--override-generation-config 'temperature=0'", "not a JSON object"},
      {"--hf-overrides 'max_position_embeddings=4'", "--hf-overrides must be a JSON object"},
      {"--hf-overrides '{\"hidden_act\": \"gelu\"}'", "hidden_act"},
      {"--config " + dir.path() + "/missing.yaml", "missing.yaml"},
      {"--config " + dir.path() + "/bad.yaml", "no-such-flag"},
  };
  for (const auto& [flags, want] : cases) {
    auto r = run_command(serve + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.err.find(want), std::string::npos) << flags << "\n" << r.err;
  }
}

}  // namespace
}  // namespace llmesh::testing

namespace llmesh::testing {
namespace {

// vLLM's /ping and /invocations (SageMaker's health and inference routes) and /load.
TEST(ServeVllmRoutes, PingLoadAndInvocationsByShape) {
  server_process s(bin, {"--model", kjv, "--api-key", "k", "--enable-server-load-tracking"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_EQ(http_request(s.port(), "GET", "/ping").status, 200);
  EXPECT_EQ(http_request(s.port(), "POST", "/ping").status, 200);
  auto load = http_request(s.port(), "GET", "/load");
  ASSERT_EQ(load.status, 200);
  EXPECT_EQ(json::parse(load.body)["server_load"], 0) << load.body;
  const std::string auth = "Authorization: Bearer k\r\n";
  EXPECT_EQ(post(s.port(), "/invocations", {{"prompt", "In"}}).status, 401) << "the API key guards it";
  auto r = post(s.port(), "/invocations", {{"model", "kjv-tiny"}, {"prompt", "In the"}, {"max_tokens", 2}}, auth);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["object"], "text_completion");
  r = post(s.port(), "/invocations",
           {{"model", "kjv-tiny"}, {"messages", {{{"role", "user"}, {"content", "Who"}}}}, {"max_tokens", 2}}, auth);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["object"], "chat.completion");
  r = post(s.port(), "/invocations", {{"model", "kjv-tiny"}, {"input", "In the beginning"}}, auth);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["data"][0]["object"], "embedding");
  r = post(s.port(), "/invocations", {{"model", "kjv-tiny"}, {"text_1", "a"}, {"text_2", "b"}}, auth);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["object"], "list");
  r = post(s.port(), "/invocations", {{"model", "kjv-tiny"}, {"query", "a"}, {"documents", {"b", "c"}}}, auth);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["results"].size(), 2u);
  // vLLM's default model name, the argument as given: served (the response names it), not listed.
  r = post(s.port(), "/v1/completions", {{"model", kjv}, {"prompt", "In"}, {"max_tokens", 1}}, auth);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["model"], kjv);
  const auto listed = json::parse(http_request(s.port(), "GET", "/v1/models", "", auth).body);
  ASSERT_EQ(listed["data"].size(), 1u) << listed;
  EXPECT_EQ(listed["data"][0]["id"], "kjv-tiny");
  r = post(s.port(), "/invocations", {{"model", "kjv-tiny"}, {"max_tokens", 2}}, auth);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(message_of(r).find("cannot tell the request's kind"), std::string::npos) << r.body;
  r = post(s.port(), "/invocations", {{"model", "kjv-tiny"}, {"prompt", "x"}, {"temperature", "hot"}}, auth);
  EXPECT_EQ(r.status, 400) << "the completion API's own checks answer";
  EXPECT_NE(message_of(r).find("temperature"), std::string::npos) << r.body;
}

// --enable-log-requests: a line per admitted request, its prompt cut to --max-log-len characters
// and ids; none without the flag.
TEST(ServeVllmRoutes, EnableLogRequestsLogsEachAdmittedPrompt) {
  server_process s(bin, {"--model", kjv, "--enable-log-requests", "--enable-log-outputs", "--max-log-len", "2"});
  ASSERT_GT(s.port(), 0) << s.log();
  auto r = post(s.port(), "/v1/completions", {{"model", "kjv-tiny"}, {"prompt", {"In the beginning God", "And"}}, {"max_tokens", 2},
                                             {"seed", 7}, {"temperature", 0.5}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string id = json::parse(r.body)["id"];
  ASSERT_TRUE(s.wait_for("llmesh: request " + id + " (prompt 1 of 2)", std::chrono::seconds(10))) << s.log();
  const std::string log = s.log();
  const auto at = log.find("llmesh: request " + id + " (prompt 0 of 2) for 'kjv-tiny': prompt \"In\"... (4 tokens: [");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  EXPECT_NE(line.find(", ...]), max_tokens 2, temperature 0.5,"), std::string::npos) << line;
  EXPECT_NE(line.find(", seed 7, n 1"), std::string::npos) << line;
  // --enable-log-outputs: each choice's end, its text cut to 2 characters (the response's own
  // text is whole), streamed choices too.
  const std::string text = json::parse(r.body)["choices"][1]["text"];
  ASSERT_TRUE(s.wait_for("llmesh: response " + id + " choice 1: finish length, output ", std::chrono::seconds(10))) << s.log();
  const std::string out_line = s.log().substr(s.log().find("llmesh: response " + id + " choice 1:"));
  EXPECT_NE(out_line.find("output " + json(text.substr(0, 2)).dump() + "... (2 tokens: ["), std::string::npos) << out_line;
  auto streamed = post(s.port(), "/v1/completions", {{"model", "kjv-tiny"}, {"prompt", "And"}, {"max_tokens", 1}, {"stream", true}});
  ASSERT_EQ(streamed.status, 200);
  const std::string sid = json::parse(sse_payloads(streamed.body).front())["id"];
  EXPECT_TRUE(s.wait_for("llmesh: response " + sid + " choice 0: finish length, output ", std::chrono::seconds(10))) << s.log();
  EXPECT_EQ(post(s.port(), "/v1/completions", {{"model", "kjv-tiny"}, {"prompt", "x"}, {"temperature", "hot"}}).status, 400);
  server_process quiet(bin, {"--model", kjv});
  ASSERT_GT(quiet.port(), 0) << quiet.log();
  ASSERT_EQ(post(quiet.port(), "/v1/completions", {{"model", "kjv-tiny"}, {"prompt", "In"}, {"max_tokens", 1}}).status, 200);
  quiet.stop();
  EXPECT_EQ(quiet.log().find("llmesh: request "), std::string::npos) << quiet.log();
}

// --chat-template-content-format openai: the template sees content as text parts (a template
// that iterates them renders each); by default it sees one string.
TEST(ServeVllmRoutes, ChatTemplateContentFormatOpenaiGivesParts) {
  const std::string tmpl = "{% for m in messages %}{% for p in m['content'] %}<{{ p['text'] }}>{% endfor %}{% endfor %}";
  const json messages = {{{"role", "user"}, {"content", "Who"}}, {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "He"}}}}}};
  auto rendered = [&](int port) {
    auto r = post(port, "/tokenize", {{"model", "kjv-tiny"}, {"messages", messages}, {"add_special_tokens", false}});
    if (r.status != 200) return "HTTP " + std::to_string(r.status);
    auto d = post(port, "/detokenize", {{"model", "kjv-tiny"}, {"tokens", json::parse(r.body)["tokens"]}});
    return d.status == 200 ? json::parse(d.body)["prompt"].get<std::string>() : "HTTP " + std::to_string(d.status);
  };
  server_process parts(bin, {"--model", kjv, "--chat-template", tmpl, "--chat-template-content-format", "openai"});
  ASSERT_GT(parts.port(), 0) << parts.log();
  EXPECT_EQ(rendered(parts.port()), "<Who><He>");
  // Continuing a final message given as parts.
  const json cont = {{"model", "kjv-tiny"}, {"messages", {{{"role", "assistant"}, {"content", "In the"}}}}, {"max_tokens", 1},
                     {"continue_final_message", true}, {"add_generation_prompt", false}};
  EXPECT_EQ(post(parts.port(), "/v1/chat/completions", cont).status, 200);
  server_process plain(bin, {"--model", kjv, "--chat-template", tmpl});
  ASSERT_GT(plain.port(), 0) << plain.log();
  EXPECT_NE(rendered(plain.port()), "<Who><He>");
}

}  // namespace
}  // namespace llmesh::testing
