// `llmesh serve --prefill-replicas` over real HTTP (disaggregated prefill): a prompt of which
// more than --max-local-prefill-length tokens are not cached on its replica is computed on a
// prefill replica and its whole blocks reach the
// serving replica — the response reports them as cached prompt tokens, its tokens are
// `llmesh generate`'s, /metrics counts the move — while a short prompt is computed where it is
// served. Prefill replicas without prefix caching are refused at start.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../model/temp_dir.hpp"
#include "reference.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;

TEST(ServeDisaggregated, LongPromptsArePrefilledOnAPrefillReplica) {
  model::testing::temp_dir dir;
  const std::string m = dir.path() + "/m";
  ASSERT_EQ(std::system((bin + " model random --out " + m +
                         " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --max-positions 1024"
                         " --seed 6 2>/dev/null")
                            .c_str()),
            0);
  server_process s(bin, {"--model", m, "--rpc", "none", "--served-model-name", "m", "--prefill-replicas", "1",
                         "--max-local-prefill-length", "40", "--block-size", "16"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_NE(s.log().find("1 prefill replica(s) for prompts over 40 uncached tokens"), std::string::npos) << s.log();
  auto complete = [&](const std::vector<int32_t>& prompt) {
    const json body = {{"model", "m"}, {"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0}, {"return_token_ids", true}};
    auto r = http_request(s.port(), "POST", "/v1/completions", body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? json::parse(r.body) : json();
  };
  std::vector<int32_t> long_prompt, short_prompt;
  for (int i = 0; i < 100; ++i) long_prompt.push_back((i * 13 + 5) % 300);
  for (int i = 0; i < 40; ++i) short_prompt.push_back((i * 11 + 2) % 300);

  auto moved = complete(long_prompt);
  ASSERT_TRUE(moved.is_object());
  EXPECT_EQ(moved["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
            generate_ids(bin, m, "--prompt-ids " + id_list(long_prompt), 10, "--temperature 0"));
  EXPECT_EQ(moved["usage"]["prompt_tokens_details"]["cached_tokens"], 96) << moved.dump();  // 6 whole blocks of 16
  auto local = complete(short_prompt);  // 40 tokens: not over the length, computed where served
  ASSERT_TRUE(local.is_object());
  EXPECT_EQ(local["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
            generate_ids(bin, m, "--prompt-ids " + id_list(short_prompt), 10, "--temperature 0"));
  EXPECT_EQ(local["usage"]["prompt_tokens_details"].value("cached_tokens", 0), 0) << local.dump();

  // The same prompt again: its replica holds its blocks, so it is computed there (Dynamo's
  // conditional disaggregation), nothing moves.
  auto again = complete(long_prompt);
  ASSERT_TRUE(again.is_object());
  EXPECT_EQ(again["choices"][0]["token_ids"], moved["choices"][0]["token_ids"]);
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], 96) << again.dump();

  auto metrics = http_request(s.port(), "GET", "/metrics", "");
  EXPECT_NE(metrics.body.find("llmesh_kv_transfers_total{outcome=\"moved\"} 1"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("llmesh_prefill_local_total{reason=\"cached\"} 1"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("llmesh_kv_transfer_bytes_total 49152"), std::string::npos)  // 6 blocks × 2 layers × K,V × 16 positions × 32 floats
      << metrics.body;
}

TEST(ServeDisaggregated, PrefillReplicasNeedPrefixCaching) {
  model::testing::temp_dir dir;
  const std::string m = dir.path() + "/m";
  ASSERT_EQ(std::system((bin + " model random --out " + m + " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2"
                                                            " --vocab 300 --seed 6 2>/dev/null")
                            .c_str()),
            0);
  auto refused = run_command(bin + " serve " + m + " --http 127.0.0.1:0 --rpc none --prefill-replicas 1 --no-enable-prefix-caching");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("need prefix caching"), std::string::npos) << refused.err;
}

}  // namespace
}  // namespace llmesh::testing
