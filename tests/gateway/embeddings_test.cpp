// /v1/embeddings, /score and /rerank without HTTP: the bodies' forms and refusals, a model directory's pooling
// defaults (sentence-transformers' modules.json), the vectors' two encodings, embeddings_output
// (a window of inputs in flight, vectors cut and normalized, in input order whatever order they
// end in, a failure ends it), and api_service's route over the bundled model (its mesh
// requests, the reply, the 400s, the concurrency window) with a mutation fuzz.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "../model/temp_dir.hpp"
#include "api_fixture.hpp"
#include "json_mutation.hpp"
#include "llmesh/gateway/embeddings_api.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

TEST(EmbeddingsRequest, TakesOpenAIsFourInputForms) {
  auto one = parse_embeddings_request(R"({"model":"m","input":"hello"})");
  ASSERT_TRUE(one.ok()) << one.err().message;
  ASSERT_EQ(one->inputs.size(), 1u);
  EXPECT_EQ(*one->inputs[0].text, "hello");
  EXPECT_EQ(one->model, "m");
  EXPECT_FALSE(one->base64);
  EXPECT_TRUE(one->add_special_tokens);
  auto strings = parse_embeddings_request(R"({"input":["a","b","c"],"encoding_format":"base64","dimensions":8,"user":"u"})");
  ASSERT_TRUE(strings.ok()) << strings.err().message;
  EXPECT_EQ(strings->inputs.size(), 3u);
  EXPECT_TRUE(strings->base64);
  EXPECT_EQ(strings->dimensions, 8);
  auto ids = parse_embeddings_request(R"({"input":[5,6,7],"normalize":false,"truncate_prompt_tokens":2,"priority":-3})");
  ASSERT_TRUE(ids.ok()) << ids.err().message;
  ASSERT_EQ(ids->inputs.size(), 1u);
  EXPECT_EQ(ids->inputs[0].ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(ids->normalize, false);
  EXPECT_EQ(ids->truncate_prompt_tokens, 2);
  EXPECT_EQ(ids->priority, -3);
  auto batches = parse_embeddings_request(R"({"input":[[5],[6,7]],"encoding_format":null,"some_new_field":1})");
  ASSERT_TRUE(batches.ok()) << batches.err().message;
  ASSERT_EQ(batches->inputs.size(), 2u);
  EXPECT_EQ(batches->inputs[1].ids, (std::vector<int32_t>{6, 7}));
}

TEST(EmbeddingsRequest, RefusesBadBodiesByName) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"model":"m"})", "'input' is required"},
      {R"({"input":""})", "'input' is an empty string"},
      {R"({"input":[]})", "'input' is an empty array"},
      {R"({"input":["a",""]})", "'input[1]' is an empty string"},
      {R"({"input":["a",[1]]})", "one kind throughout"},
      {R"({"input":[[1],[]]})", "'input[1]' is empty"},
      {R"({"input":[1,-2]})", "token ids must be non-negative"},
      {R"({"input":[1,2.5]})", "token ids must be non-negative"},
      {R"({"input":{"a":1}})", "'input' must be a string"},
      {R"({"input":"a","encoding_format":"int8"})", "'encoding_format' must be"},
      {R"({"input":"a","dimensions":0})", "'dimensions' must be an integer from 1"},
      {R"({"input":"a","dimensions":"8"})", "'dimensions' must be an integer"},
      {R"({"input":"a","truncate_prompt_tokens":0})", "'truncate_prompt_tokens' must be -1"},
      {R"({"input":"a","normalize":"yes"})", "'normalize' must be a boolean"},
      {R"({"input":"a","model":7})", "'model' must be a string"},
      {R"({"input":"a","user":7})", "'user' must be a string"},
      {R"(["input"])", "must be a JSON object"},
  };
  for (const auto& [body, want] : cases) {
    auto r = parse_embeddings_request(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.err().code, errc::invalid_request) << body;
    EXPECT_NE(r.err().message.find(want), std::string::npos) << body << ": " << r.err().message;
  }
  json many = {{"input", json::array()}};
  for (size_t i = 0; i <= max_embedding_inputs; ++i) many["input"].push_back("x");
  auto r = parse_embeddings_request(many.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("2049 inputs (at most 2048)"), std::string::npos) << r.err().message;
}

TEST(EmbeddingJson, FloatsReadBackExactlyAndBase64IsLittleEndianFloat32) {
  const std::vector<float> v = {0.1f, -2.5f, 1e-30f, 3.4028235e38f, 0.0f, -0.0f, 1.0f / 3.0f};
  const json j = json::parse(embedding_json(v, false));
  ASSERT_EQ(j.size(), v.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(static_cast<float>(j[i].get<double>()), v[i]) << i;
  EXPECT_EQ(embedding_json(std::vector<float>{1.0f}, true), "\"AACAPw==\"");
  EXPECT_EQ(embedding_json(std::vector<float>{1.0f, -2.0f}, true), "\"AACAPwAAAMA=\"");
  EXPECT_EQ(embedding_json(std::vector<float>{0.5f, 0.25f, -0.125f}, true), "\"AAAAPwAAgD4AAAC+\"");
  EXPECT_EQ(embedding_json(std::vector<float>{}, false), "[]");
}

void write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(EmbeddingDefaults, FollowSentenceTransformersModules) {
  model::testing::temp_dir none;
  auto d = load_embedding_defaults(none.path());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->pool, actors::pooling::last);
  EXPECT_TRUE(d->normalize);

  model::testing::temp_dir mean;
  write(mean.path() + "/modules.json",
        R"([{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
            {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}])");
  write(mean.path() + "/1_Pooling/config.json", R"({"word_embedding_dimension":64,"pooling_mode_cls_token":false,
            "pooling_mode_mean_tokens":true,"pooling_mode_lasttoken":false})");
  d = load_embedding_defaults(mean.path());
  ASSERT_TRUE(d.ok()) << d.err().message;
  EXPECT_EQ(d->pool, actors::pooling::mean);
  EXPECT_TRUE(d->normalize);

  model::testing::temp_dir cls;
  write(cls.path() + "/modules.json", R"([{"path":"pool","type":"sentence_transformers.models.Pooling"}])");
  write(cls.path() + "/pool/config.json", R"({"pooling_mode_cls_token":true})");
  d = load_embedding_defaults(cls.path());
  ASSERT_TRUE(d.ok()) << d.err().message;
  EXPECT_EQ(d->pool, actors::pooling::cls);
  EXPECT_FALSE(d->normalize);  // no Normalize module

  // --pooling in place of modules.json's pooling (its Normalize rule stands); a bad name is refused.
  d = load_embedding_defaults(mean.path(), "cls");
  ASSERT_TRUE(d.ok()) << d.err().message;
  EXPECT_EQ(d->pool, actors::pooling::cls);
  EXPECT_TRUE(d->normalize);
  d = load_embedding_defaults(none.path(), "mean");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->pool, actors::pooling::mean);
  EXPECT_FALSE(load_embedding_defaults(none.path(), "max").ok());

  model::testing::temp_dir max;
  write(max.path() + "/modules.json", R"([{"path":"p","type":"sentence_transformers.models.Pooling"}])");
  write(max.path() + "/p/config.json", R"({"pooling_mode_max_tokens":true})");
  d = load_embedding_defaults(max.path());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.err().message.find("a pooling this server does not compute"), std::string::npos) << d.err().message;
  EXPECT_TRUE(load_embedding_defaults(max.path(), "mean").ok());  // replaced: not read

  model::testing::temp_dir dense;  // a projection after the pooling: not skipped silently
  write(dense.path() + "/modules.json", R"([{"path":"p","type":"sentence_transformers.models.Pooling"},
                                            {"path":"2_Dense","type":"sentence_transformers.models.Dense"}])");
  write(dense.path() + "/p/config.json", R"({"pooling_mode_mean_tokens":true})");
  d = load_embedding_defaults(dense.path());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.err().message.find("sentence_transformers.models.Dense"), std::string::npos) << d.err().message;
  write(dense.path() + "/modules.json", R"([{"path":"p","type":"sentence_transformers.models.Pooling"}])");
  write(dense.path() + "/p/config.json", R"({"pooling_mode_mean_tokens":true,"pooling_mode_cls_token":true})");
  EXPECT_FALSE(load_embedding_defaults(dense.path()).ok());  // two poolings concatenated
  write(dense.path() + "/p/config.json", R"({"pooling_mode_mean_tokens":true,"include_prompt":false})");
  EXPECT_FALSE(load_embedding_defaults(dense.path()).ok());

  model::testing::temp_dir broken;
  write(broken.path() + "/modules.json", "[{");
  EXPECT_FALSE(load_embedding_defaults(broken.path()).ok());
  write(broken.path() + "/modules.json", R"([{"path":"missing","type":"sentence_transformers.models.Pooling"}])");
  d = load_embedding_defaults(broken.path());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.err().message.find("cannot read"), std::string::npos) << d.err().message;
}

// vLLM's --pooler-config: pooling_type (any case) as --pooling, normalize and use_activation (or
// its older softmax / activation) over what the directory says; other keys refused by name.
TEST(PoolerConfig, SetsTheDefaultsARequestDoesNotOverride) {
  auto c = parse_pooler_config("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pooling, "model");
  EXPECT_FALSE(c->normalize);
  EXPECT_FALSE(c->activation);
  c = parse_pooler_config(R"({"pooling_type": "MEAN", "normalize": false, "softmax": false, "use_activation": true})");
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->pooling, "mean");
  EXPECT_EQ(c->normalize, false);
  EXPECT_EQ(c->activation, false) << "softmax is read first, as vLLM reads it";
  model::testing::temp_dir none;
  auto d = load_embedding_defaults(none.path(), "model", *c);
  ASSERT_TRUE(d.ok()) << d.err().message;
  EXPECT_EQ(d->pool, actors::pooling::mean);
  EXPECT_FALSE(d->normalize);
  EXPECT_FALSE(d->activation);
  d = load_embedding_defaults(none.path(), "mean", *c);  // the same pooling twice
  ASSERT_TRUE(d.ok());
  d = load_embedding_defaults(none.path(), "cls", *c);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.err().message.find("--pooling cls and --pooler-config's pooling_type mean disagree"), std::string::npos) << d.err().message;
  c = parse_pooler_config(R"({"pooling_type": "cls", "normalize": null})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pooling, "cls");
  EXPECT_FALSE(c->normalize);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"pooling_type": "STEP", "step_tag_id": 3})", "pooling_type \"STEP\" is not computed here"},
      {R"({"pooling_type": "ALL"})", "pooling_type \"ALL\""},
      {R"({"step_tag_id": 3})", "'step_tag_id' is not taken here"},
      {R"({"normalize": "yes"})", "normalize must be a boolean"},
      {R"(["MEAN"])", "must be a JSON object"},
      {R"(not json)", "must be a JSON object"},
  };
  for (const auto& [text, want] : bad) {
    auto r = parse_pooler_config(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.err().message.find(want), std::string::npos) << text << ": " << r.err().message;
  }
}

std::vector<actors::replica_request> inputs(size_t n) {
  std::vector<actors::replica_request> out;
  for (size_t i = 0; i < n; ++i) {
    actors::replica_request r;
    r.id = 500 + i;
    r.prompt.assign(1 + i % 3, 7);
    r.max_tokens = 1;
    r.pool = actors::pooling::last;
    out.push_back(r);
  }
  return out;
}

TEST(EmbeddingsOutput, KeepsAWindowInFlightAndAnswersInInputOrder) {
  embeddings_output::setup s;
  s.id = "embd-1";
  s.model = "m";
  s.window = 4;
  s.normalize = true;
  s.dimensions = 2;
  embeddings_output out(s, inputs(10));
  EXPECT_EQ(out.prompt_tokens(), 1u + 2 + 3 + 1 + 2 + 3 + 1 + 2 + 3 + 1);
  auto first = out.take_submissions();
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(first[0].id, 500u);
  EXPECT_TRUE(out.take_submissions().empty());  // each handed out once, the window full
  EXPECT_EQ(out.running().size(), 4u);
  out.on_message(end_of(502, {3.0f, 4.0f, 100.0f}));  // the third ends first
  auto next = out.take_submissions();
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].id, 504u);
  out.on_message(end_of(999, {1.0f}));  // not ours: ignored
  out.on_message(end_of(509, {1.0f}));  // not handed out yet: ignored
  std::vector<uint64_t> ids = {500, 501, 503, 504};
  for (uint64_t id : ids) out.on_message(end_of(id, {1.0f, 0.0f, 0.0f}));
  for (int k = 0; k < 5 && !out.done(); ++k) {
    for (auto& r : out.take_submissions()) out.on_message(end_of(r.id, {0.0f, -2.0f}));
  }
  ASSERT_TRUE(out.done());
  EXPECT_FALSE(out.failure());
  EXPECT_TRUE(out.running().empty());
  const json j = json::parse(out.reply().body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["id"], "embd-1");
  ASSERT_EQ(j["data"].size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(j["data"][i]["index"], i);
    EXPECT_EQ(j["data"][i]["object"], "embedding");
    EXPECT_EQ(j["data"][i]["embedding"].size(), 2u);  // cut to dimensions
  }
  // (3, 4) normalized; (1, 0); (0, -1).
  EXPECT_FLOAT_EQ(j["data"][2]["embedding"][0].get<float>(), 0.6f);
  EXPECT_FLOAT_EQ(j["data"][2]["embedding"][1].get<float>(), 0.8f);
  EXPECT_EQ(j["data"][0]["embedding"], json::parse("[1.0,0.0]"));
  EXPECT_EQ(j["data"][9]["embedding"], json::parse("[0.0,-1.0]"));
  EXPECT_EQ(j["usage"]["prompt_tokens"], out.prompt_tokens());
  EXPECT_EQ(j["usage"]["total_tokens"], out.prompt_tokens());
}

TEST(EmbeddingsOutput, AFailureOrABrokenVectorEndsIt) {
  embeddings_output::setup s;
  s.window = 8;
  {
    embeddings_output out(s, inputs(3));
    out.take_submissions();
    actors::token_msg failed;
    failed.id = 501;
    failed.failed = true;
    failed.err = make_error(errc::replica_unavailable, "no ready replica");
    out.on_message(failed);
    ASSERT_TRUE(out.done());
    EXPECT_EQ(out.reply().status, 503);
    EXPECT_EQ(out.running().size(), 2u);  // the others, to cancel
  }
  {
    embeddings_output out(s, inputs(2));
    out.take_submissions();
    out.on_message(end_of(500, {1.0f, NAN}));
    ASSERT_TRUE(out.done());
    EXPECT_EQ(out.reply().status, 500);
  }
  {
    embeddings_output out(s, inputs(2));
    out.take_submissions();
    out.on_message(end_of(500, {}));
    ASSERT_TRUE(out.done());
    EXPECT_EQ(out.reply().status, 500);
  }
  {  // not normalized: as the replica sent it
    s.normalize = false;
    embeddings_output out(s, inputs(1));
    out.take_submissions();
    out.on_message(end_of(500, {3.0f, 4.0f}));
    EXPECT_EQ(json::parse(out.reply().body)["data"][0]["embedding"], json::parse("[3.0,4.0]"));
  }
}

TEST(ScoreRequest, PairsOneWithManyOrInOrder) {
  auto one_many = parse_score_request(R"({"text_1":"q","text_2":["a","b","c"]})");
  ASSERT_TRUE(one_many.ok()) << one_many.err().message;
  EXPECT_EQ(one_many->pairs, (std::vector<std::pair<size_t, size_t>>{{0, 0}, {0, 1}, {0, 2}}));
  auto many_one = parse_score_request(R"({"text_1":["a","b"],"text_2":"q"})");
  ASSERT_TRUE(many_one.ok());
  EXPECT_EQ(many_one->pairs, (std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 0}}));
  auto zip = parse_score_request(R"({"model":"m","text_1":["a","b"],"text_2":["c","d"],"truncate_prompt_tokens":4})");
  ASSERT_TRUE(zip.ok());
  EXPECT_EQ(zip->pairs, (std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 1}}));
  EXPECT_EQ(zip->truncate_prompt_tokens, 4);
  for (const char* body : {R"({"text_1":["a","b"],"text_2":["c","d","e"]})", R"({"text_1":"a"})", R"({"text_1":"","text_2":"b"})",
                           R"({"text_1":[],"text_2":"b"})", R"({"text_1":[1],"text_2":"b"})", R"({"text_1":"a","text_2":"b","priority":"x"})"}) {
    EXPECT_FALSE(parse_score_request(body).ok()) << body;
  }
}

TEST(RerankRequest, TakesStringsOrTextObjects) {
  auto r = parse_rerank_request(R"({"model":"m","query":"q","documents":["a",{"text":"b"}],"top_n":1,"return_documents":false})");
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(r->query, "q");
  EXPECT_EQ(r->documents, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r->top_n, 1u);
  EXPECT_FALSE(r->return_documents);
  auto d = parse_rerank_request(R"({"query":"q","documents":["a"]})");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->return_documents);
  EXPECT_EQ(d->top_n, 0u);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"documents":["a"]})", "'query' must be a non-empty string"},
      {R"({"query":"q","documents":[]})", "'documents' must be an array"},
      {R"({"query":"q","documents":["a",{"txt":"b"}]})", "'documents[1]'"},
      {R"({"query":"q","documents":["a"],"top_n":-1})", "'top_n'"},
  };
  for (const auto& [body, want] : bad) {
    auto x = parse_rerank_request(body);
    ASSERT_FALSE(x.ok()) << body;
    EXPECT_NE(x.err().message.find(want), std::string::npos) << x.err().message;
  }
}

TEST(EmbeddingsOutput, ScoresAndRanksByCosineSimilarity) {
  auto run = [](embeddings_output::setup s, const std::vector<std::vector<float>>& vs) {
    s.window = 8;
    embeddings_output out(std::move(s), inputs(vs.size()));
    for (auto& r : out.take_submissions()) out.on_message(end_of(r.id, vs[r.id - 500]));
    EXPECT_TRUE(out.done());
    return json::parse(out.reply().body);
  };
  // Unnormalized on the way in: (1, 0), (3, 4), (0, -2), (1, 1).
  const std::vector<std::vector<float>> vs = {{1, 0}, {3, 4}, {0, -2}, {1, 1}};
  embeddings_output::setup s;
  s.kind = embeddings_output::shape::score;
  s.pairs = {{0, 1}, {0, 2}, {1, 3}};
  s.id = "score-1";
  s.model = "m";
  const json score = run(s, vs);
  ASSERT_EQ(score["data"].size(), 3u);
  EXPECT_NEAR(score["data"][0]["score"].get<double>(), 0.6, 1e-6);
  EXPECT_NEAR(score["data"][1]["score"].get<double>(), 0.0, 1e-6);
  EXPECT_NEAR(score["data"][2]["score"].get<double>(), 7.0 / (5.0 * std::sqrt(2.0)), 1e-6);
  EXPECT_EQ(score["data"][2]["index"], 2);
  EXPECT_EQ(score["data"][2]["object"], "score");
  EXPECT_EQ(score["object"], "list");
  EXPECT_EQ(score["usage"]["prompt_tokens"], 1 + 2 + 3 + 1);
  embeddings_output::setup r;
  r.kind = embeddings_output::shape::rerank;
  r.documents = {"three-four", "down", "diagonal"};
  r.top_n = 2;
  r.id = "rerank-1";
  r.model = "m";
  const json ranked = run(r, vs);  // the query is (1, 0)
  ASSERT_EQ(ranked["results"].size(), 2u);
  EXPECT_EQ(ranked["results"][0]["index"], 2);  // (1, 1): 0.707
  EXPECT_EQ(ranked["results"][0]["document"]["text"], "diagonal");
  EXPECT_EQ(ranked["results"][1]["index"], 0);  // (3, 4): 0.6
  EXPECT_NEAR(ranked["results"][1]["relevance_score"].get<double>(), 0.6, 1e-6);
  EXPECT_EQ(ranked["usage"]["total_tokens"], 1 + 2 + 3 + 1);
  EXPECT_EQ(ranked["id"], "rerank-1");
  r.documents.clear();  // return_documents false
  r.top_n = 0;
  const json bare = run(r, vs);
  ASSERT_EQ(bare["results"].size(), 3u);
  EXPECT_FALSE(bare["results"][0].contains("document"));
  EXPECT_EQ(bare["results"][2]["index"], 1);  // (0, -2): 0
}

class EmbeddingsApi : public ::testing::Test {
 protected:
  void SetUp() override {
    api_options o;
    o.max_concurrent = 40;
    api_ = kjv_service(o, mesh_, metrics_, tok_);
    ASSERT_TRUE(api_);
  }
  api_outcome post(const std::string& body) { return api_->handle("POST", "/v1/embeddings", "", body); }
  static int status(const api_outcome& o) { return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o).status : 0; }
  static std::string message(const api_outcome& o) {
    return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o).body : "(a job)";
  }

  fake_mesh mesh_;
  actors::metrics_registry metrics_;
  std::shared_ptr<const model::tokenizer> tok_;
  std::unique_ptr<api_service> api_;
};

TEST_F(EmbeddingsApi, EachInputIsAnEmbeddingRequestAndTheReplyListsThem) {
  auto o = post(R"({"model":"m","input":["In the beginning","God"],"encoding_format":"base64"})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  auto& job = std::get<generation_job>(o);
  EXPECT_TRUE(job.requests.empty());  // they come out of the output, a window at a time
  auto reqs = job.output->take_submissions();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].prompt, tok_->encode("In the beginning", true));
  EXPECT_EQ(reqs[1].prompt, tok_->encode("God", true));
  EXPECT_NE(reqs[0].id, reqs[1].id);
  for (const auto& r : reqs) {
    EXPECT_EQ(r.pool, actors::pooling::last);  // no modules.json: last-token pooling
    EXPECT_EQ(r.max_tokens, 1u);
    EXPECT_EQ(r.model, "m");
  }
  EXPECT_EQ(api_->inflight(), 2u);
  job.output->on_message(end_of(reqs[1].id, {0.0f, 2.0f}));
  EXPECT_FALSE(job.output->done());
  job.output->on_message(end_of(reqs[0].id, {1.0f, 0.0f}));
  ASSERT_TRUE(job.output->done());
  const json j = json::parse(job.output->reply().body);
  EXPECT_EQ(j["data"][0]["embedding"], "AACAPwAAAAA=");  // (1, 0)
  EXPECT_EQ(j["data"][1]["embedding"], "AAAAAAAAgD8=");  // (0, 2) normalized: (0, 1)
  EXPECT_EQ(j["usage"]["prompt_tokens"], reqs[0].prompt.size() + reqs[1].prompt.size());
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("embd-"));
}

TEST_F(EmbeddingsApi, TokenIdsTruncationAndSpecialTokens) {
  auto o = post(R"({"input":[[5,6,7,8,9]],"truncate_prompt_tokens":3})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  EXPECT_EQ(std::get<generation_job>(o).output->take_submissions().at(0).prompt, (std::vector<int32_t>{7, 8, 9}));
  o = post(R"({"input":"God","add_special_tokens":false})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  EXPECT_EQ(std::get<generation_job>(o).output->take_submissions().at(0).prompt, tok_->encode("God", false));
}

TEST_F(EmbeddingsApi, RefusesWhatCannotBeEmbedded) {
  const size_t ctx = 256;  // kjv-tiny's context
  std::string long_ids = "[";
  for (size_t i = 0; i <= ctx; ++i) long_ids += (i ? ",5" : "5");
  long_ids += "]";
  const std::pair<std::string, std::string> cases[] = {
      {R"({"model":"other","input":"a"})", "other"},
      {R"({"input":[99999]})", "outside the vocabulary"},
      {R"({"input":["a",[1]]})", "one kind throughout"},
      {R"({"input":"a","dimensions":100000})", "'dimensions' is 100000"},
      {R"({"input":"a","priority":1})", "'priority' needs the priority scheduling policy"},
      {R"({"input":)" + long_ids + "}", "maximum context length is 256 tokens; the input has 257"},
      {R"({"input":["a",)" + long_ids + "]}", "one kind throughout"},
      {R"({"input":"a","truncate_prompt_tokens":100000})", "'truncate_prompt_tokens' (100000)"},
  };
  for (const auto& [body, want] : cases) {
    auto o = post(body);
    ASSERT_TRUE(std::holds_alternative<http_reply>(o)) << body;
    EXPECT_GE(status(o), 400) << body;
    EXPECT_LT(status(o), 500) << body;
    EXPECT_NE(message(o).find(want), std::string::npos) << body << ": " << message(o);
  }
  // A long input is cut to the context when asked.
  auto o = post(R"({"input":)" + long_ids + R"(,"truncate_prompt_tokens":-1})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  EXPECT_EQ(std::get<generation_job>(o).output->take_submissions().at(0).prompt.size(), ctx);
  EXPECT_EQ(status(api_->handle("GET", "/v1/embeddings", "", "")), 405);
}

TEST_F(EmbeddingsApi, ABigBatchHoldsAWindowOfSlots) {
  json body = {{"input", json::array()}};
  for (int i = 0; i < 100; ++i) body["input"].push_back("word " + std::to_string(i));
  auto o = post(body.dump());
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  EXPECT_EQ(api_->inflight(), 32u);  // the window, not one slot per input
  auto& out = *std::get<generation_job>(o).output;
  size_t handed = 0;
  for (int round = 0; round < 10 && !out.done(); ++round) {
    auto reqs = out.take_submissions();
    handed += reqs.size();
    for (auto& r : reqs) out.on_message(end_of(r.id, {1.0f}));
  }
  EXPECT_TRUE(out.done());
  EXPECT_EQ(handed, 100u);
  // While the job is held its window is: 8 slots of 40 are left, fewer than a window.
  auto second = post(body.dump());
  EXPECT_EQ(status(second), 429) << message(second);
  o = http_reply{};
  EXPECT_EQ(api_->inflight(), 0u);
  auto third = post(R"({"input":["a","b","c"]})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(third)) << message(third);
  EXPECT_EQ(api_->inflight(), 3u);  // a small request: a slot per input
}

TEST_F(EmbeddingsApi, ScoreAndRerankEmbedEveryTextNormalized) {
  auto o = api_->handle("POST", "/score", "", R"({"text_1":"God","text_2":["In the beginning","Amen"]})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  auto reqs = std::get<generation_job>(o).output->take_submissions();
  ASSERT_EQ(reqs.size(), 3u);  // text_1's, then text_2's
  EXPECT_EQ(reqs[0].prompt, tok_->encode("God", true));
  EXPECT_EQ(reqs[2].prompt, tok_->encode("Amen", true));
  for (const char* path : {"/rerank", "/v1/rerank", "/v2/rerank"}) {
    auto r = api_->handle("POST", path, "", R"({"query":"God","documents":["In the beginning","Amen"],"top_n":1})");
    ASSERT_TRUE(std::holds_alternative<generation_job>(r)) << path << ": " << message(r);
    auto& out = *std::get<generation_job>(r).output;
    auto rr = out.take_submissions();
    ASSERT_EQ(rr.size(), 3u);  // the query, then the documents
    EXPECT_EQ(rr[0].prompt, tok_->encode("God", true));
    out.on_message(end_of(rr[0].id, {2.0f, 0.0f}));
    out.on_message(end_of(rr[1].id, {0.0f, 5.0f}));
    out.on_message(end_of(rr[2].id, {1.0f, 1.0f}));
    ASSERT_TRUE(out.done());
    const json j = json::parse(out.reply().body);
    ASSERT_EQ(j["results"].size(), 1u);
    EXPECT_EQ(j["results"][0]["index"], 1);
    EXPECT_EQ(j["results"][0]["document"]["text"], "Amen");
  }
  EXPECT_EQ(status(api_->handle("POST", "/score", "", R"({"text_1":"a"})")), 400);
  EXPECT_EQ(status(api_->handle("GET", "/rerank", "", "")), 405);
  // The API key guards them as it guards /v1.
  api_options keyed;
  keyed.api_key = "k";
  std::shared_ptr<const model::tokenizer> tok;
  auto guarded = kjv_service(keyed, mesh_, metrics_, tok);
  for (const char* path : {"/score", "/rerank", "/v2/rerank", "/v1/embeddings"}) {
    EXPECT_EQ(status(guarded->handle("POST", path, "", R"({"query":"a","documents":["b"]})")), 401) << path;
  }
}

// vLLM's chat form (EmbeddingChatRequest): `messages` in place of `input`, rendered through the
// chat template as /tokenize renders them — without a generation prompt unless asked.
TEST_F(EmbeddingsApi, MessagesAreOneInputThroughTheChatTemplate) {
  const std::string msgs = R"("messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"In the beginning"}])";
  auto tokens_of = [&](const std::string& extra) {
    auto t = api_->handle("POST", "/tokenize", "", "{" + msgs + extra + "}");
    EXPECT_EQ(status(t), 200) << message(t);
    return json::parse(std::get<http_reply>(t).body)["tokens"].get<std::vector<int32_t>>();
  };
  const auto plain = tokens_of(R"(,"add_generation_prompt":false)"), prompted = tokens_of("");
  ASSERT_NE(plain, prompted);
  auto o = post("{" + msgs + R"(,"encoding_format":"base64"})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  auto reqs = std::get<generation_job>(o).output->take_submissions();
  ASSERT_EQ(reqs.size(), 1u) << "the conversation is one input";
  EXPECT_EQ(reqs[0].prompt, plain);
  o = post("{" + msgs + R"(,"add_generation_prompt":true})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << message(o);
  EXPECT_EQ(std::get<generation_job>(o).output->take_submissions().at(0).prompt, prompted);
  EXPECT_EQ(status(post("{" + msgs + R"(,"input":"x"})")), 400);
  EXPECT_EQ(status(post(R"({"messages":"x"})")), 400);
  EXPECT_EQ(status(post(R"({"messages":[]})")), 400);
  EXPECT_EQ(status(post("{" + msgs + R"(,"dimensions":0})")), 400) << "the embedding fields are checked as ever";
}

TEST_F(EmbeddingsApi, MutatedBodiesNeverThrow) {
  std::mt19937 rng(17);
  const std::string seeds[] = {
      R"({"model":"m","input":["In the beginning","God"],"encoding_format":"base64","dimensions":4})",
      R"({"input":[[5,6,7],[8]],"truncate_prompt_tokens":2,"normalize":false})",
      R"({"input":"God","add_special_tokens":false,"user":"x"})",
  };
  const std::pair<const char*, std::string> routes[] = {
      {"/score", R"({"text_1":"God","text_2":["In the beginning","Amen"],"truncate_prompt_tokens":3})"},
      {"/rerank", R"({"query":"God","documents":["In the beginning",{"text":"Amen"}],"top_n":1,"return_documents":false})"},
  };
  for (int i = 0; i < 5000; ++i) {
    const bool pooling_route = i % 5 >= 3;
    const std::string body = testing::mutate_json(pooling_route ? routes[i % 5 - 3].second : seeds[i % 5], rng);
    api_outcome o;
    ASSERT_NO_THROW(o = pooling_route ? api_->handle("POST", routes[i % 5 - 3].first, "", body) : post(body)) << body;
    if (std::holds_alternative<http_reply>(o)) {
      EXPECT_GE(status(o), 400) << body;
      EXPECT_LT(status(o), 500) << body;
    }
  }
}

}  // namespace
}  // namespace llmesh::gateway
