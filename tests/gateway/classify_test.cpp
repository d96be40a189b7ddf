// Sequence classifiers behind the HTTP API, without HTTP: vLLM's /classify (each input one
// pooling request; the logits become probabilities — softmax, or a sigmoid for one label — with
// the best label named), /score and /rerank with a cross-encoder (each pair one request,
// tokenized as a pair; the score a sigmoid of its logit, never normalized), and what each kind
// of model refuses: embeddings from a classifier, /classify from an embedding model, pairs from
// a classifier of several labels, generations from a classifier.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include <nlohmann/json.hpp>

#include "api_fixture.hpp"
#include "json_mutation.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

class ClassifyApi : public ::testing::Test {
 protected:
  void SetUp() override {
    served_model plain = kjv_tiny("m");
    ASSERT_TRUE(plain.tok);
    tok_ = plain.tok;
    served_model sentiment = kjv_tiny("sentiment");
    sentiment.cfg.classifier.labels = 3;
    sentiment.cfg.classifier.names = {"negative", "neutral", "positive"};
    sentiment.cfg.has_lm_head = false;
    served_model reranker = kjv_tiny("reranker");
    reranker.cfg.classifier.labels = 1;
    reranker.cfg.classifier.names = {"LABEL_0"};
    served_model llm_reranker = kjv_tiny("llm-reranker");  // classifier_from_token's default: one string per pair
    llm_reranker.cfg.classifier.labels = 1;
    llm_reranker.cfg.classifier.names = {"LABEL_0"};
    llm_reranker.cfg.classifier.use_pad_token = false;
    llm_reranker.cfg.classifier.score_identity = true;
    api_options o;
    o.model_name = "m";
    o.max_concurrent = 40;
    o.api_key = "k";
    api_ = std::make_unique<api_service>(o, std::vector{std::move(plain), std::move(sentiment), std::move(reranker), std::move(llm_reranker)}, mesh_, metrics_);
  }
  api_outcome call(const std::string& path, const json& body, const std::string& method = "POST") {
    return api_->handle(method, path, "Bearer k", body.dump());
  }
  static int status(const api_outcome& o) { return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o).status : 0; }
  static std::string body(const api_outcome& o) { return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o).body : "(a job)"; }

  fake_mesh mesh_;
  actors::metrics_registry metrics_;
  std::shared_ptr<const model::tokenizer> tok_;
  std::unique_ptr<api_service> api_;
};

TEST_F(ClassifyApi, EachInputGetsItsLabelsProbabilities) {
  auto o = call("/classify", {{"model", "sentiment"}, {"input", {"In the beginning", "God"}}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << body(o);
  auto& out = *std::get<generation_job>(o).output;
  auto reqs = out.take_submissions();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].prompt, tok_->encode("In the beginning", true));
  EXPECT_EQ(reqs[0].pool, actors::pooling::last);
  EXPECT_EQ(reqs[0].model, "sentiment");
  out.on_message(end_of(reqs[1].id, {0.0f, 0.0f, 0.0f}));
  out.on_message(end_of(reqs[0].id, {1.0f, 2.0f, 3.0f}));
  ASSERT_TRUE(out.done());
  const json j = json::parse(out.reply().body);
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("classify-")) << j;
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "sentiment");
  ASSERT_EQ(j["data"].size(), 2u);
  const auto& first = j["data"][0];
  EXPECT_EQ(first["index"], 0);
  EXPECT_EQ(first["label"], "positive");
  EXPECT_EQ(first["num_classes"], 3);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  ASSERT_EQ(first["probs"].size(), 3u);
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(first["probs"][k].get<double>(), std::exp(1.0 + k) / z, 1e-12) << k;
  EXPECT_EQ(j["data"][1]["label"], "negative") << "a tie goes to the first label";
  EXPECT_NEAR(j["data"][1]["probs"][2].get<double>(), 1.0 / 3.0, 1e-12);
  EXPECT_EQ(j["usage"]["prompt_tokens"], reqs[0].prompt.size() + reqs[1].prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);

  // One label: a sigmoid.
  auto one = call("/classify", {{"model", "reranker"}, {"input", "Amen"}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(one)) << body(one);
  auto& o1 = *std::get<generation_job>(one).output;
  o1.on_message(end_of(o1.take_submissions().at(0).id, {2.0f}));
  const json j1 = json::parse(o1.reply().body);
  EXPECT_NEAR(j1["data"][0]["probs"][0].get<double>(), sigmoid(2.0), 1e-12);
  EXPECT_EQ(j1["data"][0]["label"], "LABEL_0");

  // vLLM's activation: false gives the logits; pooling is the last token's whatever --pooling says.
  auto raw = call("/classify", {{"model", "sentiment"}, {"input", "God"}, {"activation", false}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(raw)) << body(raw);
  auto& rout = *std::get<generation_job>(raw).output;
  rout.on_message(end_of(rout.take_submissions().at(0).id, {-1.0f, 2.5f, 0.5f}));
  const json jr = json::parse(rout.reply().body);
  EXPECT_EQ(jr["data"][0]["probs"], json::array({-1.0, 2.5, 0.5}));
  EXPECT_EQ(jr["data"][0]["label"], "neutral");
}

TEST_F(ClassifyApi, ACrossEncoderScoresEachPairTokenizedTogether) {
  auto o = call("/score", {{"model", "reranker"}, {"text_1", "God"}, {"text_2", {"In the beginning", "Amen"}}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << body(o);
  auto& out = *std::get<generation_job>(o).output;
  auto reqs = out.take_submissions();
  ASSERT_EQ(reqs.size(), 2u) << "one request per pair";
  EXPECT_EQ(reqs[0].prompt, tok_->encode_pair("God", "In the beginning", true));
  EXPECT_EQ(reqs[1].prompt, tok_->encode_pair("God", "Amen", true));
  out.on_message(end_of(reqs[0].id, {-1.5f}));
  out.on_message(end_of(reqs[1].id, {0.25f}));
  const json j = json::parse(out.reply().body);
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_NEAR(j["data"][0]["score"].get<double>(), sigmoid(-1.5), 1e-7) << "a sigmoid, not a normalized vector";
  EXPECT_NEAR(j["data"][1]["score"].get<double>(), sigmoid(0.25), 1e-7);

  auto r = call("/rerank", {{"model", "reranker"}, {"query", "God"}, {"documents", {"a", "b", "c"}}, {"top_n", 2}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(r)) << body(r);
  auto& rout = *std::get<generation_job>(r).output;
  auto rr = rout.take_submissions();
  ASSERT_EQ(rr.size(), 3u) << "the query with each document";
  EXPECT_EQ(rr[2].prompt, tok_->encode_pair("God", "c", true));
  rout.on_message(end_of(rr[0].id, {-1.0f}));
  rout.on_message(end_of(rr[1].id, {3.0f}));
  rout.on_message(end_of(rr[2].id, {0.0f}));
  const json ranked = json::parse(rout.reply().body);
  ASSERT_EQ(ranked["results"].size(), 2u);
  EXPECT_EQ(ranked["results"][0]["index"], 1);
  EXPECT_EQ(ranked["results"][0]["document"]["text"], "b");
  EXPECT_NEAR(ranked["results"][0]["relevance_score"].get<double>(), sigmoid(3.0), 1e-7);
  EXPECT_EQ(ranked["results"][1]["index"], 2);

  // An LLM as reranker: each pair one string; an Identity activation: the raw logit.
  auto l = call("/score", {{"model", "llm-reranker"}, {"text_1", "God"}, {"text_2", "Amen"}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(l)) << body(l);
  auto& lout = *std::get<generation_job>(l).output;
  auto lr = lout.take_submissions();
  ASSERT_EQ(lr.size(), 1u);
  EXPECT_EQ(lr[0].prompt, tok_->encode("GodAmen", true));
  lout.on_message(end_of(lr[0].id, {-1.5f}));
  EXPECT_EQ(json::parse(lout.reply().body)["data"][0]["score"], -1.5);
  // Pairs are not cut; a vector that is no classifier's answer fails the request.
  auto cut = call("/score", {{"model", "reranker"}, {"text_1", "a"}, {"text_2", "b"}, {"truncate_prompt_tokens", 4}});
  EXPECT_EQ(status(cut), 400);
  EXPECT_NE(body(cut).find("truncate_prompt_tokens"), std::string::npos) << body(cut);
  auto odd = call("/score", {{"model", "reranker"}, {"text_1", "a"}, {"text_2", "b"}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(odd)) << body(odd);
  auto& oout = *std::get<generation_job>(odd).output;
  oout.on_message(end_of(oout.take_submissions().at(0).id, {0.1f, 0.2f}));
  ASSERT_TRUE(oout.failure().has_value());
  EXPECT_NE(oout.failure()->message.find("2 values for a classifier of 1 labels"), std::string::npos) << oout.failure()->message;
}

TEST_F(ClassifyApi, EachKindOfModelRefusesWhatItCannotDo) {
  auto refused = [&](const std::string& path, const json& b) {
    auto o = call(path, b);
    EXPECT_EQ(status(o), 400) << path << " " << b;
    return body(o);
  };
  EXPECT_NE(refused("/v1/embeddings", {{"model", "sentiment"}, {"input", "a"}}).find("is a sequence classifier"), std::string::npos);
  EXPECT_NE(refused("/classify", {{"model", "m"}, {"input", "a"}}).find("is not a sequence classifier"), std::string::npos);
  EXPECT_NE(refused("/score", {{"model", "sentiment"}, {"text_1", "a"}, {"text_2", "b"}}).find("classifier of 3 labels"), std::string::npos);
  EXPECT_NE(refused("/rerank", {{"model", "sentiment"}, {"query", "a"}, {"documents", {"b"}}}).find("classifier of 3 labels"),
            std::string::npos);
  EXPECT_NE(refused("/v1/completions", {{"model", "reranker"}, {"prompt", "a"}}).find("sequence classifier"), std::string::npos);
  EXPECT_NE(refused("/classify", {{"model", "sentiment"}}).find("input"), std::string::npos);
  EXPECT_EQ(status(call("/classify", json::object(), "GET")), 405);
  EXPECT_EQ(status(api_->handle("POST", "/classify", "", R"({"model":"sentiment","input":"a"})")), 401) << "the API key guards it";
  // vLLM's ClassificationChatRequest: messages in place of input.
  auto chat = call("/classify", {{"model", "sentiment"}, {"messages", {{{"role", "user"}, {"content", "Amen"}}}}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(chat)) << body(chat);
  EXPECT_EQ(std::get<generation_job>(chat).output->take_submissions().size(), 1u);
  // SageMaker's /invocations classifies a classifier's input (and embeds another model's).
  auto inv = call("/invocations", {{"model", "sentiment"}, {"input", "a"}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(inv)) << body(inv);
  auto& inv_out = *std::get<generation_job>(inv).output;
  inv_out.on_message(end_of(inv_out.take_submissions().at(0).id, {0.0f, 1.0f, 0.0f}));
  EXPECT_EQ(json::parse(inv_out.reply().body)["data"][0]["label"], "neutral");
  // The plain model still embeds and scores by similarity.
  auto e = call("/score", {{"model", "m"}, {"text_1", "a"}, {"text_2", "b"}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(e)) << body(e);
  EXPECT_EQ(std::get<generation_job>(e).output->take_submissions().size(), 2u) << "each text embedded";
}

TEST_F(ClassifyApi, MutatedBodiesNeverThrow) {
  const std::vector<std::string> seeds = {
      R"({"model":"sentiment","input":["In the beginning","God"],"truncate_prompt_tokens":3,"priority":0})",
      R"({"model":"reranker","text_1":["a","b"],"text_2":["c","d"],"add_special_tokens":false})",
      R"({"model":"reranker","query":"q","documents":[{"text":"x"},"y"],"top_n":1,"return_documents":false})"};
  const char* paths[] = {"/classify", "/score", "/rerank"};
  std::mt19937 rng(23);
  size_t n = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string b = testing::mutate_json(seeds[i % 3], rng);
    api_outcome o;
    ASSERT_NO_THROW(o = api_->handle("POST", paths[i % 3], "Bearer k", b)) << paths[i % 3] << " " << b;
    if (std::holds_alternative<http_reply>(o)) {
      EXPECT_GE(status(o), 400) << b;
      EXPECT_LT(status(o), 500) << b;
    }
    ++n;
  }
  EXPECT_GT(n, 2000u);
}

}  // namespace
}  // namespace llmesh::gateway
