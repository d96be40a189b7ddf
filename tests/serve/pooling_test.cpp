// `llmesh serve` over real HTTP, vLLM's POST /pooling: embed is /v1/embeddings' vector; token_embed
// gives one row per prompt token (unit length each unless normalize is false, cut by dimensions),
// whose mean is what --pooling mean embeds; a sequence classifier's classify is /classify's
// probabilities, and token_classify gives every position's, the last one /classify's own and
// a prefix's rows those of the longer prompt (a causal model: later tokens change nothing); a
// Qwen2 reward model rewards every token by default.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "../cli/subprocess.hpp"
#include "../model/temp_dir.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";

json post(int port, const std::string& path, const json& body, int want = 200) {
  auto r = http_request(port, "POST", path, body.dump());
  EXPECT_EQ(r.status, want) << path << " " << body << ": " << r.body;
  auto j = json::parse(r.body, nullptr, false);
  return j.is_discarded() ? json{{"raw", r.body}} : j;
}

double max_diff(const json& a, const json& b) {
  EXPECT_EQ(a.size(), b.size()) << a << " vs " << b;
  double d = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::abs(a[i].get<double>() - b[i].get<double>()));
  return d;
}

TEST(ServePooling, TokenEmbedRowsAreThePositionsWhoseMeanThePoolingEmbeds) {
  server_process s(bin, {"--model", model_dir, "--pooling", "mean"});
  ASSERT_GT(s.port(), 0) << s.log();
  const json ids = json::array({5, 17, 42, 99, 7});
  const json embedded = post(s.port(), "/v1/embeddings", {{"input", {ids}}, {"normalize", false}});
  const json pooled = post(s.port(), "/pooling", {{"input", {ids}}, {"normalize", false}});
  EXPECT_TRUE(pooled["id"].get<std::string>().starts_with("pool-")) << pooled;
  EXPECT_EQ(pooled["data"][0]["object"], "pooling");
  EXPECT_EQ(pooled["data"][0]["data"], embedded["data"][0]["embedding"]);  // embed: the same vector
  const json rows = post(s.port(), "/pooling", {{"input", {ids}}, {"task", "token_embed"}, {"normalize", false}})["data"][0]["data"];
  ASSERT_EQ(rows.size(), ids.size()) << rows;
  const size_t hidden = embedded["data"][0]["embedding"].size();
  json mean = json::array();
  for (size_t d = 0; d < hidden; ++d) {
    double sum = 0.0;
    for (const auto& r : rows) sum += r[d].get<float>();
    mean.push_back(static_cast<float>(sum / static_cast<double>(rows.size())));
  }
  EXPECT_LT(max_diff(mean, embedded["data"][0]["embedding"]), 1e-6);
  // Normalized row by row (the model's default), cut first with dimensions.
  const json unit = post(s.port(), "/pooling", {{"input", {ids}}, {"task", "token_embed"}, {"dimensions", 8}});
  ASSERT_EQ(unit["data"][0]["data"].size(), ids.size()) << unit;
  for (const auto& r : unit["data"][0]["data"]) {
    ASSERT_EQ(r.size(), 8u);
    double n = 0.0;
    for (const auto& x : r) n += x.get<double>() * x.get<double>();
    EXPECT_NEAR(std::sqrt(n), 1.0, 1e-5);
  }
  EXPECT_EQ(unit["usage"]["prompt_tokens"], ids.size());
  post(s.port(), "/pooling", {{"input", {ids}}, {"task", "token_classify"}}, 400);
  post(s.port(), "/pooling", {{"input", "still serving"}, {"task", "token_embed"}}, 200);
}

TEST(ServePooling, AClassifiersTokenRowsEndWithItsClassifyAnswer) {
  model::testing::temp_dir dir;
  const std::string shape = " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --seed 9";
  ASSERT_EQ(std::system((bin + " model random --classifier 3 --out " + dir.path() + shape + " 2>/dev/null").c_str()), 0);
  server_process s(bin, {"--model", dir.path()});
  ASSERT_GT(s.port(), 0) << s.log();
  const json ids = json::array({5, 17, 42, 99});
  const json classified = post(s.port(), "/classify", {{"input", {ids}}});
  const json pooled = post(s.port(), "/pooling", {{"input", {ids}}});  // the task: classify
  EXPECT_LT(max_diff(pooled["data"][0]["data"], classified["data"][0]["probs"]), 1e-6) << pooled;
  const json rows = post(s.port(), "/pooling", {{"input", {ids}}, {"task", "token_classify"}})["data"][0]["data"];
  ASSERT_EQ(rows.size(), ids.size()) << rows;
  for (const auto& r : rows) {
    ASSERT_EQ(r.size(), 3u);
    EXPECT_NEAR(r[0].get<double>() + r[1].get<double>() + r[2].get<double>(), 1.0, 1e-5);
  }
  EXPECT_LT(max_diff(rows.back(), classified["data"][0]["probs"]), 1e-6);
  EXPECT_NE(rows[0], rows[3]);
  const json prefix = post(s.port(), "/pooling", {{"input", {json::array({5, 17})}}, {"task", "token_classify"}})["data"][0]["data"];
  ASSERT_EQ(prefix.size(), 2u);
  EXPECT_EQ(prefix[0], rows[0]);
  EXPECT_EQ(prefix[1], rows[1]);
  // The logits as they are: their softmax is the probabilities.
  const json logits = post(s.port(), "/pooling", {{"input", {ids}}, {"task", "token_classify"}, {"use_activation", false}});
  const json& last = logits["data"][0]["data"][3];
  double z = 0.0;
  for (const auto& x : last) z += std::exp(x.get<double>());
  EXPECT_NEAR(std::exp(last[2].get<double>()) / z, rows[3][2].get<double>(), 1e-5);
  post(s.port(), "/pooling", {{"input", {ids}}, {"task", "embed"}}, 400);
}

// A Qwen2 reward model (`--task reward`, vLLM's): /pooling rewards every token by default
// (token_classify: a sigmoid of its one logit; the raw reward with use_activation false),
// /classify reads the last token's, and it refuses /score, embeddings and generations.
TEST(ServePooling, AQwen2RewardModelRewardsEveryToken) {
  model::testing::temp_dir dir;
  const std::string shape = " --arch qwen2 --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --seed 3";
  ASSERT_EQ(std::system((bin + " model random --classifier 1 --reward --out " + dir.path() + shape + " 2>/dev/null").c_str()), 0);
  for (const char* refused : {" --task score", " --runner generate", " --convert embed"}) {  // a reward model's refusals
    auto r = run_command(bin + " serve --model " + dir.path() + refused);
    EXPECT_NE(r.exit_code, 0) << refused;
    EXPECT_NE(r.err.find("the model is a reward model"), std::string::npos) << refused << ": " << r.err;
  }
  server_process s(bin, {"--model", dir.path(), "--task", "reward"});
  ASSERT_GT(s.port(), 0) << s.log();
  const json ids = json::array({5, 17, 42, 99, 7, 3});
  const json rewards = post(s.port(), "/pooling", {{"input", {ids}}})["data"][0]["data"];
  const json raw = post(s.port(), "/pooling", {{"input", {ids}}, {"use_activation", false}})["data"][0]["data"];
  ASSERT_EQ(rewards.size(), ids.size()) << rewards;
  ASSERT_EQ(raw.size(), ids.size()) << raw;
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(raw[i].size(), 1u);
    EXPECT_NEAR(rewards[i][0].get<double>(), 1.0 / (1.0 + std::exp(-raw[i][0].get<double>())), 1e-6) << i;
  }
  EXPECT_NE(raw[0], raw[5]);
  const json last = post(s.port(), "/classify", {{"input", {ids}}});
  EXPECT_NEAR(last["data"][0]["probs"][0].get<double>(), rewards[5][0].get<double>(), 1e-6) << last;
  post(s.port(), "/score", {{"text_1", "a"}, {"text_2", "b"}}, 400);
  post(s.port(), "/v1/embeddings", {{"input", "a"}}, 400);
  post(s.port(), "/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}}, 400);
  post(s.port(), "/pooling", {{"input", {ids}}, {"task", "classify"}}, 200);
}

}  // namespace
}  // namespace llmesh::testing
