// vLLM's POST /pooling behind the HTTP API, without HTTP: its fields (task, and use_activation
// read after the deprecated softmax and activation), each task's mesh requests (embed and
// classify pool as /v1/embeddings and /classify do; token_embed and token_classify ask for
// every position's rows), the reply's shape (object "pooling", one list per input or one per
// position, rows normalized or made probabilities one by one), and what is refused: a task the
// model does not serve, a token task whose values would not fit one mesh message, a replica
// that sends the wrong count.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include <nlohmann/json.hpp>

#include "api_fixture.hpp"
#include "json_mutation.hpp"
#include "llmesh/transport/wire.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;

TEST(PoolingFields, TaskAndActivationAsVllmReadsThem) {
  auto f = parse_pooling_fields(R"({"input":"a"})");
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->task);
  EXPECT_FALSE(f->activation);
  for (auto t : {pooling_task::embed, pooling_task::classify, pooling_task::token_embed, pooling_task::token_classify}) {
    f = parse_pooling_fields(json{{"task", task_name(t)}}.dump());
    ASSERT_TRUE(f.ok()) << task_name(t);
    EXPECT_EQ(f->task, t);
  }
  f = parse_pooling_fields(R"({"use_activation":false})");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->activation, false);
  f = parse_pooling_fields(R"({"softmax":true,"activation":false,"use_activation":false})");  // softmax first
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->activation, true);
  f = parse_pooling_fields(R"({"activation":false,"use_activation":true})");  // then activation
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->activation, false);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"task":"score"})", "not \"score\""},
      {R"({"task":"plugin"})", "'task' must be one of embed, classify, token_embed and token_classify"},
      {R"({"task":3})", "'task' must be one of"},
      {R"({"use_activation":"yes"})", "'use_activation' must be a boolean"},
      {R"({"activation":null,"softmax":[true]})", "'softmax' must be a boolean"},
      {R"({"softmax":1})", "'softmax' must be a boolean"},
      {R"([1])", "JSON object"},
  };
  for (const auto& [body, want] : bad) {
    auto r = parse_pooling_fields(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.err().message.find(want), std::string::npos) << body << ": " << r.err().message;
  }
}

class PoolingApi : public ::testing::Test {
 protected:
  void SetUp() override {
    served_model plain = kjv_tiny("m");
    ASSERT_TRUE(plain.tok);
    tok_ = plain.tok;
    hidden_ = plain.cfg.hidden;
    served_model sentiment = kjv_tiny("sentiment");
    sentiment.cfg.classifier.labels = 3;
    sentiment.cfg.classifier.names = {"negative", "neutral", "positive"};
    sentiment.cfg.has_lm_head = false;
    served_model rm = kjv_tiny("rm");  // a reward model
    rm.cfg.classifier.labels = 1;
    rm.cfg.classifier.names = {"LABEL_0"};
    rm.cfg.classifier.reward = true;
    rm.cfg.has_lm_head = false;
    served_model wide = kjv_tiny("wide");  // a hidden size whose token rows fill one message at 64 tokens
    wide.cfg.hidden = transport::max_embedding / 64;
    api_options o;
    o.model_name = "m";
    o.max_concurrent = 40;
    o.api_key = "k";
    api_ = std::make_unique<api_service>(o, std::vector{std::move(plain), std::move(sentiment), std::move(rm), std::move(wide)}, mesh_, metrics_);
  }
  api_outcome post(const json& body) { return api_->handle("POST", "/pooling", "Bearer k", body.dump()); }
  static int status(const api_outcome& o) { return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o).status : 0; }
  static std::string message(const api_outcome& o) { return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o).body : "(a job)"; }

  fake_mesh mesh_;
  actors::metrics_registry metrics_;
  std::shared_ptr<const model::tokenizer> tok_;
  size_t hidden_ = 0;
  std::unique_ptr<api_service> api_;
};

TEST_F(PoolingApi, EmbedIsTheEmbeddingsVectorUnderPoolingsShape) {
  auto o = post({{"model", "m"}, {"input", {"In the beginning", "God"}}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  auto& out = *std::get<generation_job>(o).output;
  auto reqs = out.take_submissions();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].prompt, tok_->encode("In the beginning", true));
  EXPECT_EQ(reqs[0].pool, actors::pooling::last);  // the model's pooling, as /v1/embeddings
  out.on_message(end_of(reqs[0].id, {3.0f, 4.0f}));
  out.on_message(end_of(reqs[1].id, {0.0f, -2.0f}));
  ASSERT_TRUE(out.done());
  const json j = json::parse(out.reply().body);
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("pool-")) << j;
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "m");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][0]["index"], 0);
  EXPECT_EQ(j["data"][0]["object"], "pooling");
  EXPECT_EQ(j["data"][0]["data"], json::parse("[0.6,0.8]"));  // normalized, as the model's default
  EXPECT_EQ(j["data"][1]["data"], json::parse("[0.0,-1.0]"));
  EXPECT_EQ(j["usage"]["prompt_tokens"], reqs[0].prompt.size() + reqs[1].prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  // normalize false and dimensions, as /v1/embeddings takes them.
  o = post({{"model", "m"}, {"input", "God"}, {"task", "embed"}, {"normalize", false}, {"dimensions", 1}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  auto& cut = *std::get<generation_job>(o).output;
  cut.on_message(end_of(cut.take_submissions().at(0).id, {3.0f, 4.0f}));
  EXPECT_EQ(json::parse(cut.reply().body)["data"][0]["data"], json::parse("[3.0]"));
}

TEST_F(PoolingApi, TokenEmbedGivesEveryPositionsRowNormalizedOnItsOwn) {
  auto o = post({{"model", "m"}, {"input", json::array({json::array({5, 6, 7})})}, {"task", "token_embed"}, {"dimensions", 2}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  auto& out = *std::get<generation_job>(o).output;
  auto reqs = out.take_submissions();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].pool, actors::pooling::all);
  EXPECT_EQ(reqs[0].prompt, (std::vector<int32_t>{5, 6, 7}));
  std::vector<float> rows(3 * hidden_, 0.0f);
  rows[0] = 3.0f, rows[1] = 4.0f;                        // (3, 4, 0...) → cut (3, 4) → (0.6, 0.8)
  rows[hidden_] = -5.0f, rows[hidden_ + 2] = 9.0f;       // (-5, 0, 9...) → cut (-5, 0) → (-1, 0)
  rows[2 * hidden_ + 1] = 0.5f;                          // → (0, 1)
  out.on_message(end_of(reqs[0].id, rows));
  ASSERT_TRUE(out.done());
  ASSERT_FALSE(out.failure()) << out.failure()->message;
  const json j = json::parse(out.reply().body);
  EXPECT_EQ(j["data"][0]["data"], json::parse("[[0.6,0.8],[-1.0,0.0],[0.0,1.0]]")) << j;
  // base64: the rows' float32 bytes one after another.
  o = post({{"model", "m"}, {"input", json::array({json::array({5, 6})})}, {"task", "token_embed"}, {"dimensions", 1}, {"encoding_format", "base64"}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  auto& packed = *std::get<generation_job>(o).output;
  std::vector<float> two(2 * hidden_, 0.0f);
  two[0] = 2.0f, two[hidden_] = -0.5f;
  packed.on_message(end_of(packed.take_submissions().at(0).id, two));
  const float want[] = {1.0f, -1.0f};
  EXPECT_EQ(json::parse(packed.reply().body)["data"][0]["data"], json::parse(embedding_json(want, true)));
  EXPECT_EQ(embedding_json(want, true), "\"AACAPwAAgL8=\"");
}

TEST_F(PoolingApi, AClassifiersTasksAreClassifyAndTokenClassify) {
  auto o = post({{"model", "sentiment"}, {"input", "God"}});  // its task: classify
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  auto& out = *std::get<generation_job>(o).output;
  auto reqs = out.take_submissions();
  EXPECT_EQ(reqs.at(0).pool, actors::pooling::last);
  out.on_message(end_of(reqs[0].id, {0.0f, 0.0f, std::log(2.0f)}));
  const json j = json::parse(out.reply().body);
  ASSERT_EQ(j["data"][0]["data"].size(), 3u) << j;
  EXPECT_NEAR(j["data"][0]["data"][0].get<double>(), 0.25, 1e-6);
  EXPECT_NEAR(j["data"][0]["data"][2].get<double>(), 0.5, 1e-6);
  // token_classify, logits as they are (use_activation false), then softmax row by row.
  for (const bool activation : {false, true}) {
    o = post({{"model", "sentiment"}, {"input", json::array({json::array({5, 6})})}, {"task", "token_classify"},
              {"use_activation", activation}});
    ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
    auto& rows = *std::get<generation_job>(o).output;
    auto r = rows.take_submissions();
    EXPECT_EQ(r.at(0).pool, actors::pooling::all);
    rows.on_message(end_of(r[0].id, {1.0f, 1.0f, 1.0f, 0.0f, std::log(3.0f), 0.0f}));
    ASSERT_FALSE(rows.failure());
    const json d = json::parse(rows.reply().body)["data"][0]["data"];
    ASSERT_EQ(d.size(), 2u) << d;
    if (!activation) {
      EXPECT_EQ(d[0], json::parse("[1.0,1.0,1.0]"));
      EXPECT_EQ(static_cast<float>(d[1][1].get<double>()), std::log(3.0f));  // the float's shortest text
    } else {
      EXPECT_NEAR(d[0][0].get<double>(), 1.0 / 3, 1e-6);
      EXPECT_NEAR(d[1][1].get<double>(), 0.6, 1e-6);
      EXPECT_NEAR(d[1][2].get<double>(), 0.2, 1e-6);
    }
  }
}

// vLLM's one switch (normalize, then softmax, activation, use_activation): off, an embed task's
// rows are not normalized and a classify task's values are its logits.
TEST_F(PoolingApi, OneSwitchTurnsNormalizationOrTheActivationOff) {
  const std::pair<json, json> cases[] = {
      {{{"model", "m"}, {"input", {json::array({5})}}, {"task", "token_embed"}, {"use_activation", false}}, json::parse("[[3.0,4.0]]")},
      {{{"model", "m"}, {"input", {json::array({5})}}, {"task", "embed"}, {"normalize", true}, {"use_activation", false}},
       json::parse("[0.6,0.8]")},  // normalize first
      {{{"model", "sentiment"}, {"input", "a"}, {"normalize", false}}, json::parse("[3.0,4.0,0.0]")},
      {{{"model", "sentiment"}, {"input", "a"}, {"softmax", false}, {"use_activation", true}}, json::parse("[3.0,4.0,0.0]")},
  };
  for (const auto& [body, want] : cases) {
    auto o = post(body);
    ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << body << ": " << message(o);
    auto& out = *std::get<generation_job>(o).output;
    auto r = out.take_submissions();
    const bool token = body.value("task", "") == "token_embed";
    const bool classifier = body["model"] == "sentiment";
    std::vector<float> v(classifier ? 3 : hidden_, 0.0f);
    v[0] = 3.0f, v[1] = 4.0f;
    out.on_message(end_of(r.at(0).id, v));
    ASSERT_FALSE(out.failure()) << body;
    json got = json::parse(out.reply().body)["data"][0]["data"];
    if (!classifier) {  // the first two values of the hidden size's
      if (token) got[0] = json::array({got[0][0], got[0][1]});
      else got = json::array({got[0], got[1]});
    }
    EXPECT_EQ(got, want) << body;
  }
  // /classify reads the same switch (no normalize there).
  auto o = api_->handle("POST", "/classify", "Bearer k", R"({"model":"sentiment","input":"a","use_activation":false})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  auto& out = *std::get<generation_job>(o).output;
  out.on_message(end_of(out.take_submissions().at(0).id, {3.0f, 4.0f, 0.0f}));
  EXPECT_EQ(json::parse(out.reply().body)["data"][0]["probs"], json::parse("[3.0,4.0,0.0]"));
  EXPECT_EQ(status(api_->handle("POST", "/classify", "Bearer k", R"({"model":"sentiment","input":"a","use_activation":1})")), 400);
}

TEST_F(PoolingApi, ARewardModelRewardsEveryTokenByDefault) {
  auto o = post({{"model", "rm"}, {"input", json::array({json::array({5, 6})})}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  auto& out = *std::get<generation_job>(o).output;
  auto reqs = out.take_submissions();
  EXPECT_EQ(reqs.at(0).pool, actors::pooling::all);
  out.on_message(end_of(reqs[0].id, {0.0f, std::log(3.0f)}));
  const json d = json::parse(out.reply().body)["data"][0]["data"];
  ASSERT_EQ(d.size(), 2u) << d;
  EXPECT_NEAR(d[0][0].get<double>(), 0.5, 1e-6);
  EXPECT_NEAR(d[1][0].get<double>(), 0.75, 1e-6);  // sigmoid(ln 3)
  o = post({{"model", "rm"}, {"input", "a"}, {"task", "classify"}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  EXPECT_EQ(std::get<generation_job>(o).output->take_submissions().at(0).pool, actors::pooling::last);
  auto score = api_->handle("POST", "/score", "Bearer k", R"({"model":"rm","text_1":"a","text_2":"b"})");
  EXPECT_EQ(status(score), 400);
  EXPECT_NE(message(score).find("is a reward model"), std::string::npos) << message(score);
}

TEST_F(PoolingApi, RefusesWhatTheModelOrTheMeshCannotGive) {
  json long_ids = json::array();
  for (int i = 0; i < 65; ++i) long_ids.push_back(5);
  const std::pair<json, std::string> cases[] = {
      {{{"model", "m"}, {"input", "a"}, {"task", "classify"}},
       "the model 'm' is not a sequence classifier: its tasks are embed and token_embed, not classify"},
      {{{"model", "sentiment"}, {"input", "a"}, {"task", "token_embed"}},
       "the model 'sentiment' is a sequence classifier: its tasks are classify and token_classify, not token_embed"},
      {{{"model", "m"}, {"input", "a"}, {"task", "reward"}}, "'task' must be one of"},
      {{{"model", "wide"}, {"input", {json::array({5}), long_ids}}, {"task", "token_embed"}},
       "input[1]: its 65 tokens would give 4259840 values (65536 a token); a token task gives 4194304 at most: send at most 64"},
      {{{"model", "sentiment"}, {"input", "a"}, {"dimensions", 2}}, "'dimensions' cuts an embedding; task classify"},
      {{{"model", "nobody"}, {"input", "a"}}, "nobody"},
      {{{"input", "a"}, {"messages", json::array()}}, "send one of 'input' and 'messages'"},
  };
  for (const auto& [body, want] : cases) {
    auto o = post(body);
    EXPECT_EQ(status(o) / 100, 4) << body;
    EXPECT_NE(message(o).find(want), std::string::npos) << body << ": " << message(o);
  }
  // 64 tokens fit one message, and four such inputs one reply; embed (one row each) of 65 fits too.
  EXPECT_TRUE(std::holds_alternative<generation_job>(post({{"model", "wide"}, {"input", {long_ids}}})));
  long_ids.erase(long_ids.begin());
  const json four = {long_ids, long_ids, long_ids, long_ids};
  EXPECT_TRUE(std::holds_alternative<generation_job>(post({{"model", "wide"}, {"input", four}, {"task", "token_embed"}})));
  json five = four;
  five.push_back(long_ids);
  auto o = post({{"model", "wide"}, {"input", five}, {"task", "token_embed"}});
  EXPECT_EQ(status(o), 400);
  EXPECT_NE(message(o).find("more than 16777216 values in all (from input 4)"), std::string::npos) << message(o);
  EXPECT_EQ(status(api_->handle("GET", "/pooling", "Bearer k", "")), 405);
  EXPECT_EQ(status(api_->handle("POST", "/pooling", "Bearer wrong", R"({"input":"a"})")), 401);
}

TEST_F(PoolingApi, AReplicaThatSendsTheWrongCountFailsTheRequest) {
  auto o = post({{"model", "m"}, {"input", json::array({json::array({5, 6, 7})})}, {"task", "token_embed"}});
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  auto& out = *std::get<generation_job>(o).output;
  out.on_message(end_of(out.take_submissions().at(0).id, std::vector<float>(hidden_, 1.0f)));  // one row of three
  ASSERT_TRUE(out.done());
  ASSERT_TRUE(out.failure());
  EXPECT_NE(out.failure()->message.find("for 3 positions of"), std::string::npos) << out.failure()->message;
  EXPECT_EQ(out.reply().status, 500);
}

TEST_F(PoolingApi, MutatedBodiesNeverThrow) {
  const std::vector<std::string> seeds = {
      R"({"model":"sentiment","input":["In the beginning","God"],"task":"token_classify","use_activation":true})",
      R"({"model":"m","input":[[5,6,7]],"task":"token_embed","dimensions":2,"encoding_format":"base64","normalize":false})"};
  std::mt19937 rng(29);
  for (int i = 0; i < 2000; ++i) {
    const std::string b = testing::mutate_json(seeds[i % 2], rng);
    api_outcome o;
    ASSERT_NO_THROW(o = api_->handle("POST", "/pooling", "Bearer k", b)) << b;
    if (std::holds_alternative<http_reply>(o)) {
      EXPECT_GE(status(o), 400) << b;
      EXPECT_LT(status(o), 500) << b;
    }
  }
}

}  // namespace
}  // namespace llmesh::gateway
