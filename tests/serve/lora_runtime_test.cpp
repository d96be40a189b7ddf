// vLLM's runtime LoRA updates through `llmesh serve` over real HTTP: an adapter loaded with
// POST /v1/load_lora_adapter is a model whose greedy tokens are `llmesh generate --lora`'s on
// either replica; unloading it while a streamed request runs with it loses nothing (the
// stream ends with generate's tokens) and later requests get a 404; loaded again it serves
// again; VLLM_ALLOW_RUNTIME_LORA_UPDATING=true turns the routes on as the flag does (and, as
// in vLLM, needs --enable-lora for a load to succeed).
#include <gtest/gtest.h>

#include <future>
#include <nlohmann/json.hpp>

#include "../cli/subprocess.hpp"
#include "../model/temp_dir.hpp"
#include "reference.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::vector<int32_t> prompt = {5, 17, 100, 42, 8, 99, 1, 259, 33, 71, 12, 250, 3};

json body(const std::string& model, int max_tokens) {
  return {{"model", model}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true},
          {"return_token_ids", true}};
}

std::vector<int32_t> complete(int port, const std::string& model, int max_tokens = 12) {
  auto r = http_request(port, "POST", "/v1/completions", body(model, max_tokens).dump());
  if (r.status != 200) {
    ADD_FAILURE() << r.status << " " << r.body;
    return {};
  }
  return json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>();
}

http_response post(int port, const std::string& path, const json& b) { return http_request(port, "POST", path, b.dump()); }

struct model_files {
  model_files() {
    m = dir.path() + "/m";
    adapter = dir.path() + "/psalms";
    EXPECT_EQ(run_command(bin + " model random --out " + m +
                          " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --seed 4")
                  .exit_code,
              0);
    EXPECT_EQ(run_command(bin + " model random-lora --model " + m + " --out " + adapter + " --rank 8 --strength 0.5").exit_code, 0);
  }
  model::testing::temp_dir dir;
  std::string m, adapter;
};

TEST(ServeLoraRuntime, LoadServeUnloadMidStreamAndLoadAgain) {
  model_files f;
  server_process s(bin, {"--model", f.m, "--replicas", "2", "--enable-lora", "--allow-runtime-lora-updating"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_NE(s.log().find("0 LoRA adapter(s), runtime updates on"), std::string::npos) << s.log();
  const int port = s.port();
  constexpr int long_run = 400;  // long enough that the unload below comes while it streams
  const auto want = generate_ids(bin, f.m, "--prompt-ids " + id_list(prompt), long_run, "--temperature 0 --lora " + f.adapter);
  const auto plain = generate_ids(bin, f.m, "--prompt-ids " + id_list(prompt), 12);
  ASSERT_EQ(want.size(), static_cast<size_t>(long_run));
  ASSERT_NE(std::vector(want.begin(), want.begin() + 12), plain) << "the adapter must change the tokens";

  EXPECT_EQ(post(port, "/v1/completions", body("psalms", 4)).status, 404) << "not loaded yet";
  auto loaded = post(port, "/v1/load_lora_adapter", {{"lora_name", "psalms"}, {"lora_path", f.adapter}});
  ASSERT_EQ(loaded.status, 200) << loaded.body;
  EXPECT_EQ(loaded.body, "Success: LoRA adapter 'psalms' added successfully.");
  auto models = json::parse(http_request(port, "GET", "/v1/models").body)["data"];
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[1]["id"], "psalms");
  EXPECT_EQ(models[1]["parent"], "m");
  {  // at once: least-load puts them on both replicas
    std::vector<std::future<std::vector<int32_t>>> runs;
    for (int i = 0; i < 4; ++i) runs.push_back(std::async(std::launch::async, [&] { return complete(port, "psalms", 12); }));
    for (auto& r : runs) EXPECT_EQ(r.get(), std::vector(want.begin(), want.begin() + 12)) << "either replica";
  }
  EXPECT_EQ(complete(port, "m"), plain);

  // A stream with the adapter: its first chunk read, then the adapter unloaded under it.
  int fd = connect_local(port);
  ASSERT_GE(fd, 0);
  json sb = body("psalms", long_run);
  sb["stream"] = true;
  const std::string payload = sb.dump();
  ASSERT_TRUE(send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: "
                           "application/json\r\nContent-Length: " +
                               std::to_string(payload.size()) + "\r\n\r\n" + payload));
  std::string raw;
  char buf[4096];
  while (raw.find("data: {") == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0) << raw;
    raw.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(raw.find("[DONE]"), std::string::npos) << "the stream must still run when the adapter goes";
  EXPECT_EQ(raw.find("\"finish_reason\":\""), std::string::npos) << raw;
  auto unloaded = post(port, "/v1/unload_lora_adapter", {{"lora_name", "psalms"}});
  EXPECT_EQ(unloaded.status, 200) << unloaded.body;
  raw += read_all(fd);
  close(fd);
  std::vector<int32_t> streamed;
  for (const auto& p : sse_payloads(parse_response(raw).body)) {
    if (p == "[DONE]") continue;
    auto j = json::parse(p);
    if (j.contains("error")) ADD_FAILURE() << p;
    for (const auto& c : j["choices"]) {
      if (c.contains("token_ids") && c["token_ids"].is_array()) {
        for (int32_t t : c["token_ids"]) streamed.push_back(t);
      }
    }
  }
  EXPECT_EQ(streamed, want) << "a request running with the adapter finishes with it";

  EXPECT_EQ(post(port, "/v1/completions", body("psalms", 4)).status, 404);
  EXPECT_EQ(post(port, "/v1/unload_lora_adapter", {{"lora_name", "psalms"}}).status, 404);
  auto bad = post(port, "/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", f.dir.path() + "/nowhere"}});
  EXPECT_GE(bad.status, 400);
  EXPECT_NE(bad.body.find("nowhere"), std::string::npos) << bad.body;
  ASSERT_EQ(post(port, "/v1/load_lora_adapter", {{"lora_name", "psalms"}, {"lora_path", f.adapter}}).status, 200);
  EXPECT_EQ(complete(port, "psalms"), std::vector(want.begin(), want.begin() + 12)) << "loaded again";
  EXPECT_EQ(complete(port, "m"), plain);
}

TEST(ServeLoraRuntime, VllmsEnvironmentVariableTurnsThemOnAndTheyAreOffWithoutIt) {
  model_files f;
  {
    server_process off(bin, {"--model", f.m, "--enable-lora"});
    ASSERT_GT(off.port(), 0) << off.log();
    auto r = post(off.port(), "/v1/load_lora_adapter", {{"lora_name", "psalms"}, {"lora_path", f.adapter}});
    EXPECT_EQ(r.status, 404);
    EXPECT_NE(r.body.find("--allow-runtime-lora-updating"), std::string::npos) << r.body;
  }
  {  // the variable without --enable-lora: the routes answer, the model takes no adapter (as vLLM's)
    child_process plain({"/usr/bin/env", "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true", bin, "serve", "--model", f.m, "--http",
                         "127.0.0.1:0", "--rpc", "none"});
    ASSERT_TRUE(plain.wait_for("on http://127.0.0.1:")) << plain.log();
    EXPECT_EQ(plain.log().find("LoRA"), std::string::npos) << "nothing moves to the CPU for LoRA: " << plain.log();
    const int port = std::atoi(plain.log().c_str() + plain.log().find("on http://127.0.0.1:") + std::strlen("on http://127.0.0.1:"));
    auto r = post(port, "/v1/load_lora_adapter", {{"lora_name", "psalms"}, {"lora_path", f.adapter}});
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.body.find("start with --enable-lora"), std::string::npos) << r.body;
  }
  child_process on({"/usr/bin/env", "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True", bin, "serve", "--model", f.m, "--enable-lora",
                    "--http", "127.0.0.1:0", "--rpc", "none"});
  ASSERT_TRUE(on.wait_for("on http://127.0.0.1:")) << on.log();
  const int port = std::atoi(on.log().c_str() + on.log().find("on http://127.0.0.1:") + std::strlen("on http://127.0.0.1:"));
  auto r = post(port, "/v1/load_lora_adapter", {{"lora_name", "psalms"}, {"lora_path", f.adapter}});
  EXPECT_EQ(r.status, 200) << r.body;
  const auto want = generate_ids(bin, f.m, "--prompt-ids " + id_list(prompt), 12, "--temperature 0 --lora " + f.adapter);
  EXPECT_EQ(complete(port, "psalms"), want);
}

}  // namespace
}  // namespace llmesh::testing
