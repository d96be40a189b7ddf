// `llmesh serve` with sequence classifiers, over real HTTP: a …ForSequenceClassification
// checkpoint answers /classify (probabilities that sum to one, the best label named, the same
// whether an input comes alone or in a batch) and refuses embeddings and generations; a causal
// LM turned into Qwen3-Reranker's classifier through --hf-overrides scores /score and /rerank
// pairs as the sigmoid of its own "y" logit minus its "n" logit — read back from the plain
// model's prompt_logprobs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "../model/temp_dir.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string shape = " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --seed 9";

json post(int port, const std::string& path, const json& body, int want = 200) {
  auto r = http_request(port, "POST", path, body.dump());
  EXPECT_EQ(r.status, want) << path << ": " << r.body;
  auto j = json::parse(r.body, nullptr, false);
  return j.is_discarded() ? json{{"raw", r.body}} : j;
}

TEST(ServeClassify, AClassifierLabelsItsInputsAloneOrInABatch) {
  model::testing::temp_dir dir;
  ASSERT_EQ(std::system((bin + " model random --classifier 3 --out " + dir.path() + shape + " 2>/dev/null").c_str()), 0);
  server_process s(bin, {"--model", dir.path()});
  ASSERT_GT(s.port(), 0) << s.log();
  const json batch = post(s.port(), "/classify", {{"input", json::array({json::array({5, 17, 42, 99}), json::array({7})})}});
  ASSERT_EQ(batch["data"].size(), 2u) << batch;
  for (const auto& d : batch["data"]) {
    ASSERT_EQ(d["probs"].size(), 3u);
    EXPECT_EQ(d["num_classes"], 3);
    double sum = 0.0, best = -1.0;
    size_t at = 0;
    for (size_t k = 0; k < 3; ++k) {
      const double p = d["probs"][k].get<double>();
      sum += p;
      if (p > best) best = p, at = k;
    }
    EXPECT_NEAR(sum, 1.0, 1e-9);
    EXPECT_EQ(d["label"], "LABEL_" + std::to_string(at));
  }
  EXPECT_NE(batch["data"][0]["probs"], batch["data"][1]["probs"]);
  const json alone = post(s.port(), "/classify", {{"input", json::array({7})}});
  EXPECT_EQ(alone["data"][0]["probs"], batch["data"][1]["probs"]) << "a batch neighbour changes nothing";
  EXPECT_EQ(alone["usage"]["prompt_tokens"], 1);
  post(s.port(), "/v1/embeddings", {{"input", "a"}}, 400);
  post(s.port(), "/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}}, 400);
  post(s.port(), "/score", {{"text_1", "a"}, {"text_2", "b"}}, 400);
  post(s.port(), "/classify", {{"input", "still serving"}}, 200);
}

TEST(ServeClassify, AQwen3RerankerScoresPairsAsItsYesLogitAgainstItsNo) {
  model::testing::temp_dir dir;
  ASSERT_EQ(std::system((bin + " model random --arch qwen3 --out " + dir.path() + shape + " 2>/dev/null").c_str()), 0);
  // The plain causal LM: log p(y) - log p(n) after each pair is its logit(y) - logit(n) there.
  // The bundled random tokenizer spells each byte as one token and has no pair template: a
  // pair is its two texts' bytes in turn.
  const std::string query = "hi", docs[] = {"yo", "ok", "no"};
  std::vector<double> want;
  {
    server_process lm(bin, {"--model", dir.path(), "--served-model-name", "lm"});
    ASSERT_GT(lm.port(), 0) << lm.log();
    for (const auto& d : docs) {
      double lp[2];
      for (int k = 0; k < 2; ++k) {
        std::vector<int32_t> ids;
        for (char c : query + d) ids.push_back(static_cast<unsigned char>(c));
        ids.push_back(k == 0 ? 'n' : 'y');
        const json r = post(lm.port(), "/v1/completions",
                            {{"model", "lm"}, {"prompt", ids}, {"max_tokens", 1}, {"prompt_logprobs", 0}, {"temperature", 0}});
        lp[k] = r["choices"][0]["prompt_logprobs"][ids.size() - 1][std::to_string(ids.back())]["logprob"].get<double>();
      }
      want.push_back(1.0 / (1.0 + std::exp(-(lp[1] - lp[0]))));
    }
  }
  server_process rr(bin, {"--model", dir.path(), "--hf-overrides",
                          R"({"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["n", "y"], )"
                          R"("is_original_qwen3_reranker": true})"});
  ASSERT_GT(rr.port(), 0) << rr.log();
  const json scored = post(rr.port(), "/score", {{"text_1", query}, {"text_2", {docs[0], docs[1], docs[2]}}});
  ASSERT_EQ(scored["data"].size(), 3u) << scored;
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(scored["data"][i]["score"].get<double>(), want[i], 1e-4) << docs[i];
  const json ranked = post(rr.port(), "/rerank", {{"query", query}, {"documents", {docs[0], docs[1], docs[2]}}});
  ASSERT_EQ(ranked["results"].size(), 3u) << ranked;
  for (const auto& r : ranked["results"]) {
    EXPECT_NEAR(r["relevance_score"].get<double>(), want[r["index"].get<size_t>()], 1e-4);
  }
  EXPECT_GE(ranked["results"][0]["relevance_score"].get<double>(), ranked["results"][2]["relevance_score"].get<double>());
}

}  // namespace
}  // namespace llmesh::testing
