// `llmesh serve --kv-cache-dtype bfloat16` over real HTTP: the same --kv-cache-mb holds twice the
// positions of a float32 cache (the start line says how many), and greedy completions from
// either replica, alone or at once, are `llmesh generate --kv-cache-dtype bfloat16`'s tokens;
// `--kv-cache-dtype fp8` four times the positions, and generate's tokens too.
#include <gtest/gtest.h>

#include <future>
#include <nlohmann/json.hpp>

#include "../model/temp_dir.hpp"
#include "reference.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;

std::vector<int32_t> complete(int port, const std::vector<int32_t>& prompt) {
  const json body = {{"model", "m"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"return_token_ids", true}};
  auto r = http_request(port, "POST", "/v1/completions", body.dump());
  if (r.status != 200) {
    ADD_FAILURE() << r.status << " " << r.body;
    return {};
  }
  return json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>();
}

/// "KV N positions per replica" from the start line.
size_t kv_positions(const std::string& log) {
  const auto at = log.find(", KV ");
  return at == std::string::npos ? 0 : std::stoul(log.substr(at + 5));
}

/// A random model in `dir` (its path; empty if it could not be written): K and V of 2 layers ×
/// 2 kv heads × 16 dims, 512 bytes per position in float32.
std::string random_model(const model::testing::temp_dir& dir) {
  const std::string m = dir.path() + "/m";
  const int rc = std::system((bin + " model random --out " + m +
                              " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --max-positions 8192"
                              " --seed 4 2>/dev/null")
                                 .c_str());
  return rc == 0 ? m : std::string();
}

TEST(ServeKvCache, ABfloat16CacheHoldsTwiceThePositionsAndServesGeneratesTokens) {
  model::testing::temp_dir dir;
  const std::string m = random_model(dir);
  ASSERT_FALSE(m.empty());
  size_t f32_positions = 0;
  {
    server_process s(bin, {"--model", m, "--kv-cache-mb", "1", "--rpc", "none"});
    ASSERT_GT(s.port(), 0) << s.log();
    f32_positions = kv_positions(s.log());
  }
  EXPECT_EQ(f32_positions, 2048u);
  server_process s(bin, {"--model", m, "--kv-cache-mb", "1", "--rpc", "none", "--replicas", "2", "--kv-cache-dtype", "bfloat16"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_NE(s.log().find("positions per replica, bfloat16"), std::string::npos) << s.log();
  EXPECT_EQ(kv_positions(s.log()), 2 * f32_positions) << s.log();

  const std::vector<int32_t> prompt = {5, 17, 100, 42, 8, 99, 1, 259, 33, 71, 12, 250, 3};
  const auto want = generate_ids(bin, m, "--prompt-ids " + id_list(prompt), 12, "--temperature 0 --kv-cache-dtype bfloat16");
  ASSERT_EQ(want.size(), 12u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(complete(s.port(), prompt), want) << "either replica";
  std::vector<std::future<std::vector<int32_t>>> runs;
  for (int i = 0; i < 6; ++i) runs.push_back(std::async(std::launch::async, [&] { return complete(s.port(), prompt); }));
  for (auto& r : runs) EXPECT_EQ(r.get(), want) << "at once";
}

// `--kv-cache-dtype fp8` (vLLM's e4m3) holds four times float32's positions (2048 above) in the
// same megabyte, and greedy completions are `llmesh generate --kv-cache-dtype fp8`'s tokens.
TEST(ServeKvCache, AnFp8CacheHoldsFourTimesThePositionsAndServesGeneratesTokens) {
  model::testing::temp_dir dir;
  const std::string m = random_model(dir);
  ASSERT_FALSE(m.empty());
  server_process s(bin, {"--model", m, "--kv-cache-mb", "1", "--rpc", "none", "--kv-cache-dtype", "fp8"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_NE(s.log().find("positions per replica, fp8_e4m3"), std::string::npos) << s.log();
  EXPECT_EQ(kv_positions(s.log()), 4 * 2048u) << s.log();
  const std::vector<int32_t> prompt = {5, 17, 100, 42, 8, 99, 1, 259, 33, 71, 12, 250, 3};
  const auto want = generate_ids(bin, m, "--prompt-ids " + id_list(prompt), 12, "--temperature 0 --kv-cache-dtype fp8");
  ASSERT_EQ(want.size(), 12u);
  EXPECT_EQ(complete(s.port(), prompt), want);
}

}  // namespace
}  // namespace llmesh::testing
