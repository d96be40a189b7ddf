// `llmesh serve` over real HTTP, /v1/embeddings: vectors of the model's hidden size, unit
// length, and the same bits whether an input comes alone or in a batch, on either of two
// replicas, as floats or base64; normalize and dimensions as vLLM applies them; the prompt
// tokens counted; bad inputs are 400s that leave the server serving; a bare transformer's
// checkpoint serves embeddings only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "../model/temp_dir.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";

json embed(int port, const json& body, int* status) {
  auto r = http_request(port, "POST", "/v1/embeddings", body.dump());
  *status = r.status;
  auto j = json::parse(r.body, nullptr, false);
  return j.is_discarded() ? json{{"raw", r.body}} : j;
}

std::vector<float> floats(const json& v) {
  std::vector<float> out;
  for (const auto& x : v) out.push_back(x.get<float>());
  return out;
}

std::vector<float> from_base64(const std::string& s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::vector<uint8_t> bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    const int v = value(c);
    if (v < 0) break;  // '='
    acc = acc << 6 | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);  // little-endian, as this machine
  return out;
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

TEST(ServeEmbeddings, VectorsAreTheSameAloneInABatchOnEitherReplicaAndInBothEncodings) {
  server_process s(bin, {"--model", model_dir, "--replicas", "2"});
  ASSERT_GT(s.port(), 0) << s.log();
  const std::vector<std::string> texts = {"In the beginning God created the heaven and the earth.", "And God said",
                                          "The LORD is my shepherd; I shall not want.", "Jesus wept.", "Amen"};
  int status = 0;
  const json batch = embed(s.port(), {{"model", "kjv-tiny"}, {"input", texts}}, &status);
  ASSERT_EQ(status, 200) << batch;
  EXPECT_EQ(batch["object"], "list");
  EXPECT_EQ(batch["model"], "kjv-tiny");
  ASSERT_EQ(batch["data"].size(), texts.size());
  size_t hidden = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto& d = batch["data"][i];
    EXPECT_EQ(d["index"], i);
    EXPECT_EQ(d["object"], "embedding");
    const auto v = floats(d["embedding"]);
    if (i == 0) hidden = v.size();
    EXPECT_EQ(v.size(), hidden);
    EXPECT_NEAR(norm(v), 1.0, 1e-5);  // normalized by default (no modules.json: vLLM's default)
  }
  EXPECT_GE(hidden, 64u);
  EXPECT_NE(batch["data"][0]["embedding"], batch["data"][1]["embedding"]);
  // Alone, several times (the router alternates the replicas): the same bits.
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < texts.size(); ++i) {
      const json one = embed(s.port(), {{"input", texts[i]}}, &status);
      ASSERT_EQ(status, 200) << one;
      EXPECT_EQ(one["data"][0]["embedding"], batch["data"][i]["embedding"]) << texts[i];
      EXPECT_EQ(one["usage"]["prompt_tokens"], one["usage"]["total_tokens"]);
    }
  }
  // base64: the same floats.
  const json b64 = embed(s.port(), {{"input", texts}, {"encoding_format", "base64"}}, &status);
  ASSERT_EQ(status, 200) << b64;
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(from_base64(b64["data"][i]["embedding"].get<std::string>()), floats(batch["data"][i]["embedding"])) << i;
  }
  // normalize false: the raw pooled state, whose direction is the normalized one.
  const json raw = embed(s.port(), {{"input", texts[0]}, {"normalize", false}}, &status);
  ASSERT_EQ(status, 200) << raw;
  const auto r = floats(raw["data"][0]["embedding"]);
  const auto n = floats(batch["data"][0]["embedding"]);
  const double rn = norm(r);
  EXPECT_GT(std::abs(rn - 1.0), 1e-3);
  for (size_t d = 0; d < r.size(); ++d) EXPECT_NEAR(r[d] / rn, n[d], 1e-6);
  // dimensions: the first k values, normalized again (Matryoshka).
  const json cut = embed(s.port(), {{"input", texts[0]}, {"dimensions", 8}}, &status);
  ASSERT_EQ(status, 200) << cut;
  const auto c = floats(cut["data"][0]["embedding"]);
  ASSERT_EQ(c.size(), 8u);
  EXPECT_NEAR(norm(c), 1.0, 1e-5);
  const std::vector<float> head(r.begin(), r.begin() + 8);
  for (size_t d = 0; d < 8; ++d) EXPECT_NEAR(c[d], head[d] / norm(head), 1e-6);
  // Token ids embed as their text does.
  const json ids = embed(s.port(), {{"input", json::array({json::array({1, 40, 41, 42})})}}, &status);
  ASSERT_EQ(status, 200) << ids;
  EXPECT_EQ(ids["usage"]["prompt_tokens"], 4);
  // The prompt tokens are counted.
  const auto metrics = http_request(s.port(), "GET", "/metrics").body;
  EXPECT_NE(metrics.find("llmesh_prompt_tokens_total"), std::string::npos);
}

TEST(ServeEmbeddings, BadInputsAre400sAndTheServerServesOn) {
  server_process s(bin, {"--model", model_dir});
  ASSERT_GT(s.port(), 0) << s.log();
  int status = 0;
  std::vector<int> too_long(300, 5);  // beyond kjv-tiny's 256 positions
  const json cases[] = {
      {{"input", ""}},
      {{"input", json::array()}},
      {{"input", json::array({too_long})}},
      {{"input", "a"}, {"dimensions", 100000}},
      {{"input", "a"}, {"encoding_format", "binary"}},
      {{"input", "a"}, {"model", "no-such-model"}},
  };
  for (const auto& body : cases) {
    const json r = embed(s.port(), body, &status);
    EXPECT_TRUE(status == 400 || status == 404) << body << " -> " << status << " " << r;
    EXPECT_TRUE(r.contains("error")) << r;
  }
  auto get = http_request(s.port(), "GET", "/v1/embeddings");
  EXPECT_EQ(get.status, 405);
  const json ok = embed(s.port(), {{"input", json::array({too_long})}, {"truncate_prompt_tokens", -1}}, &status);
  ASSERT_EQ(status, 200) << ok;
  EXPECT_EQ(ok["usage"]["prompt_tokens"], 256);
}

// vLLM's /score and /rerank with an embedding model: the cosine similarity of the inputs'
// normalized embeddings (as /v1/embeddings gives them), the documents ranked by it.
TEST(ServeEmbeddings, ScoreAndRerankAreCosineSimilaritiesOfTheEmbeddings) {
  server_process s(bin, {"--model", model_dir});
  ASSERT_GT(s.port(), 0) << s.log();
  const std::string query = "Who created the heaven and the earth?";
  const std::vector<std::string> docs = {"In the beginning God created the heaven and the earth.", "Jesus wept.",
                                         "And the LORD spake unto Moses, saying", "Amen."};
  int status = 0;
  std::vector<std::string> all = {query};
  all.insert(all.end(), docs.begin(), docs.end());
  const json e = embed(s.port(), {{"input", all}}, &status);
  ASSERT_EQ(status, 200) << e;
  auto cos = [&](size_t a, size_t b) {
    const auto x = floats(e["data"][a]["embedding"]), y = floats(e["data"][b]["embedding"]);
    double d = 0;
    for (size_t i = 0; i < x.size(); ++i) d += double(x[i]) * y[i];
    return d;
  };
  auto sc = http_request(s.port(), "POST", "/v1/score", json{{"text_1", query}, {"text_2", docs}}.dump());
  ASSERT_EQ(sc.status, 200) << sc.body;
  const json score = json::parse(sc.body);
  ASSERT_EQ(score["data"].size(), docs.size());
  for (size_t d = 0; d < docs.size(); ++d) EXPECT_NEAR(score["data"][d]["score"].get<double>(), cos(0, d + 1), 1e-6) << d;
  auto rr = http_request(s.port(), "POST", "/rerank", json{{"query", query}, {"documents", docs}, {"top_n", 3}}.dump());
  ASSERT_EQ(rr.status, 200) << rr.body;
  const json ranked = json::parse(rr.body);
  ASSERT_EQ(ranked["results"].size(), 3u);
  double last = 2.0;
  for (const auto& r : ranked["results"]) {
    const size_t d = r["index"];
    EXPECT_EQ(r["document"]["text"], docs[d]);
    EXPECT_NEAR(r["relevance_score"].get<double>(), cos(0, d + 1), 1e-6);
    EXPECT_LE(r["relevance_score"].get<double>(), last);
    last = r["relevance_score"];
  }
}

// --pooling replaces the model's pooling: mean and cls give other vectors than last, each
// normalized; an input of one token is the same vector under all three.
TEST(ServeEmbeddings, PoolingFlagChoosesThePooling) {
  const json body = {{"input", json::array({json::array({5, 17, 42, 99}), json::array({7})})}};
  std::map<std::string, json> got;
  for (const char* p : {"model", "last", "mean", "cls"}) {
    server_process s(bin, {"--model", model_dir, "--pooling", p});
    ASSERT_GT(s.port(), 0) << s.log();
    int status = 0;
    got[p] = embed(s.port(), body, &status);
    ASSERT_EQ(status, 200) << p << ": " << got[p];
  }
  EXPECT_EQ(got["model"]["data"], got["last"]["data"]);  // kjv-tiny has no modules.json: last
  EXPECT_NE(got["mean"]["data"][0], got["last"]["data"][0]);
  EXPECT_NE(got["cls"]["data"][0], got["last"]["data"][0]);
  EXPECT_NE(got["cls"]["data"][0], got["mean"]["data"][0]);
  for (const char* p : {"mean", "cls"}) {
    EXPECT_NEAR(norm(floats(got[p]["data"][0]["embedding"])), 1.0, 1e-5) << p;
    EXPECT_EQ(got[p]["data"][1], got["last"]["data"][1]) << p;  // one token: one row
  }
  EXPECT_NE(std::system((bin + " serve --model " + model_dir + " --pooling max 2>/dev/null").c_str()), 0);
  // vLLM's --override-pooler-config (--pooler-config): MEAN as --pooling mean; normalize off.
  server_process s(bin, {"--model", model_dir, "--override-pooler-config", R"({"pooling_type": "MEAN", "normalize": false})"});
  ASSERT_GT(s.port(), 0) << s.log();
  int status = 0;
  const json raw = embed(s.port(), body, &status);
  ASSERT_EQ(status, 200) << raw;
  auto v = floats(raw["data"][0]["embedding"]);
  EXPECT_GT(std::abs(norm(v) - 1.0), 1e-3) << "not normalized";
  const double n = norm(v);
  for (auto& x : v) x = static_cast<float>(x / n);
  const auto unit = floats(got["mean"]["data"][0]["embedding"]);
  ASSERT_EQ(unit.size(), v.size());
  for (size_t d = 0; d < v.size(); ++d) EXPECT_NEAR(v[d], unit[d], 1e-5) << d;
}

// A bare transformer's checkpoint (how embedding models ship: `llmesh model random --base`)
// serves embeddings equal to the full checkpoint's, and refuses generations with a 400.
TEST(ServeEmbeddings, ABareCheckpointServesEmbeddingsOnly) {
  model::testing::temp_dir dir;
  const std::string shape = " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --seed 9";
  ASSERT_EQ(std::system((bin + " model random --out " + dir.path() + "/full" + shape + " 2>/dev/null").c_str()), 0);
  ASSERT_EQ(std::system((bin + " model random --base --out " + dir.path() + "/bare" + shape + " 2>/dev/null").c_str()), 0);
  const json body = {{"input", json::array({json::array({5, 17, 42, 99}), json::array({7})})}};
  int status = 0;
  json want;
  {
    server_process full(bin, {"--model", dir.path() + "/full"});
    ASSERT_GT(full.port(), 0) << full.log();
    want = embed(full.port(), body, &status);
    ASSERT_EQ(status, 200) << want;
  }
  server_process bare(bin, {"--model", dir.path() + "/bare"});
  ASSERT_GT(bare.port(), 0) << bare.log();
  const json got = embed(bare.port(), body, &status);
  ASSERT_EQ(status, 200) << got;
  EXPECT_EQ(got["data"], want["data"]);
  auto gen = http_request(bare.port(), "POST", "/v1/completions", R"({"model":"bare","prompt":[5,6],"max_tokens":2})");
  EXPECT_EQ(gen.status, 400) << gen.body;
  EXPECT_NE(gen.body.find("no LM head"), std::string::npos) << gen.body;
}

}  // namespace
}  // namespace llmesh::testing
