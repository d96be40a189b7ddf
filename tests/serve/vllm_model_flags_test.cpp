// vLLM's --dtype, --seed, --gpu-memory-utilization, --generation-config DIR,
// --return-tokens-as-token-ids and --enable-force-include-usage on `llmesh serve`, over real
// HTTP (a directory's temperature 0 makes requests without one greedy; logprobs name tokens by
// id; a stream that did not ask for usage ends with it): a
// float32 checkpoint served as bfloat16 says so and gives `llmesh generate --dtype bfloat16`'s
// greedy tokens; seedless sampled requests repeat request for request on a server started
// again with the same --seed and differ under another (a request's own seed wins either way);
// on the CPU, --gpu-memory-utilization is accepted and the start line says the CPU's KV cache
// is --kv-cache-mb.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "../cli/subprocess.hpp"

#include "../model/temp_dir.hpp"
#include "reference.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;

std::vector<int32_t> complete(int port, json body) {
  body["model"] = "m";
  body["return_token_ids"] = true;
  auto r = http_request(port, "POST", "/v1/completions", body.dump());
  if (r.status != 200) {
    ADD_FAILURE() << r.status << " " << r.body;
    return {};
  }
  return json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>();
}

const std::vector<int32_t> prompt = {5, 17, 100, 42, 8, 99, 1, 259, 33, 71, 12, 250, 3};

/// Three seedless sampled completions, then one with its own seed, in that order.
std::vector<std::vector<int32_t>> sampled(int port) {
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < 3; ++i) out.push_back(complete(port, {{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 1.5}}));
  out.push_back(complete(port, {{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 1.5}, {"seed", 5}}));
  return out;
}

TEST(ServeVllmModelFlags, DtypeSeedAndGpuMemoryUtilization) {
  model::testing::temp_dir dir;
  const std::string m = dir.path() + "/m";
  ASSERT_EQ(std::system((bin + " model random --out " + m +
                         " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --dtype f32 --seed 4"
                         " 2>/dev/null")
                            .c_str()),
            0);
  std::vector<std::vector<int32_t>> first;
  {
    server_process s(bin, {"--model", m, "--device", "cpu", "--dtype", "bfloat16", "--seed", "7",
                           "--gpu-memory-utilization", "0.9", "--enable-force-include-usage", "--return-tokens-as-token-ids",
                           "--enable-prompt-tokens-details"});
    ASSERT_GT(s.port(), 0) << s.log();
    EXPECT_NE(s.log().find(", bfloat16 weights"), std::string::npos) << s.log();
    EXPECT_NE(s.log().find("--gpu-memory-utilization applies to CUDA devices; the CPU's KV cache is --kv-cache-mb"),
              std::string::npos)
        << s.log();
    const auto want = generate_ids(bin, m, "--prompt-ids " + id_list(prompt), 12, "--temperature 0 --dtype bfloat16");
    ASSERT_EQ(want.size(), 12u);
    EXPECT_EQ(complete(s.port(), {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}}), want);

    first = sampled(s.port());
    // (After the samples, which the seeds of these requests would shift.) --return-tokens-as-
    // token-ids: logprobs name the tokens by id; --enable-force-include-usage: a stream that
    // did not ask for usage ends with it.
    auto lp = http_request(s.port(), "POST", "/v1/completions",
                           json({{"model", "m"}, {"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", 1}}).dump());
    ASSERT_EQ(lp.status, 200) << lp.body;
    const json tokens = json::parse(lp.body)["choices"][0]["logprobs"]["tokens"];
    ASSERT_EQ(tokens.size(), 3u) << lp.body;
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(tokens[i], "token_id:" + std::to_string(want[i]));
    auto st = http_request(s.port(), "POST", "/v1/completions",
                           json({{"model", "m"}, {"prompt", prompt}, {"max_tokens", 3}, {"stream", true}}).dump());
    ASSERT_EQ(st.status, 200);
    const auto events = sse_payloads(st.body);
    ASSERT_GE(events.size(), 2u) << st.body;
    const json last = json::parse(events[events.size() - 2]);  // before [DONE]
    EXPECT_EQ(last["usage"]["completion_tokens"], 3) << st.body;
  }
  {
    server_process again(bin, {"--model", m, "--dtype", "bfloat16", "--seed", "7"});
    ASSERT_GT(again.port(), 0) << again.log();
    complete(again.port(), {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}});  // as the first server's
    EXPECT_EQ(sampled(again.port()), first) << "the same --seed: the same sequence of samples";
  }
  {  // --generation-config DIR: its temperature 0 for requests that leave temperature out
    std::filesystem::create_directories(dir.path() + "/gen");
    std::ofstream(dir.path() + "/gen/generation_config.json") << R"({"temperature": 0.0})";
    server_process greedy(bin, {"--model", m, "--generation-config", dir.path() + "/gen"});
    ASSERT_GT(greedy.port(), 0) << greedy.log();
    std::set<std::vector<int32_t>> outputs;
    for (int i = 0; i < 4; ++i) outputs.insert(complete(greedy.port(), {{"prompt", prompt}, {"max_tokens", 10}}));
    EXPECT_EQ(outputs.size(), 1u) << "greedy: the directory's temperature 0";
    EXPECT_EQ(*outputs.begin(), generate_ids(bin, m, "--prompt-ids " + id_list(prompt), 10, "--temperature 0"));
    auto none = run_command(bin + " serve --model " + m + " --http 127.0.0.1:0 --rpc none --generation-config " + dir.path());
    EXPECT_NE(none.exit_code, 0);
    EXPECT_NE(none.err.find("no generation_config.json there"), std::string::npos) << none.err;
  }
  server_process other(bin, {"--model", m, "--dtype", "bfloat16", "--seed", "8"});
  ASSERT_GT(other.port(), 0) << other.log();
  complete(other.port(), {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}});
  const auto third = sampled(other.port());
  ASSERT_EQ(third.size(), 4u);
  EXPECT_NE(std::vector(third.begin(), third.begin() + 3), std::vector(first.begin(), first.begin() + 3))
      << "another --seed draws other seeds";
  EXPECT_EQ(third[3], first[3]) << "a request's own seed does not depend on --seed";
}

}  // namespace
}  // namespace llmesh::testing
