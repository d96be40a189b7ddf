// `llmesh serve`'s native API, embed: the vectors of /v1/embeddings (the same floats, in input
// order, text or token-id inputs, dimensions and normalize as over HTTP), and its refusals with
// HTTP's codes.
#include <capnp/ez-rpc.h>
#include <kj/async-io.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include <nlohmann/json.hpp>

#include "llmesh/schemas/rpc.capnp.h"
#include "rpc_client.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

struct embedded {
  bool ok = false;
  int code = 0;
  std::string message;
  std::vector<std::vector<float>> vectors;
  size_t prompt_tokens = 0;
};

embedded embed(capnp::EzRpcClient& c, const std::function<void(rpc::EmbedRequest::Builder)>& setup) {
  auto req = c.getMain<rpc::Llmesh>().embedRequest();
  setup(req.initRequest());
  auto r = req.send().wait(c.getWaitScope()).getResult();
  embedded e;
  e.ok = r.getOk();
  e.code = r.getErrorCode();
  e.message = r.getErrorMessage().cStr();
  e.prompt_tokens = r.getPromptTokens();
  for (auto row : r.getEmbeddings()) {
    auto& v = e.vectors.emplace_back();
    for (float x : row) v.push_back(x);
  }
  return e;
}

std::vector<float> floats(const nlohmann::json& v) {
  std::vector<float> out;
  for (const auto& x : v) out.push_back(x.get<float>());
  return out;
}

TEST(Rpc, EmbedGivesHttpsVectors) {
  server_process s(bin, {"--model", model_dir, "--api-key", "k"});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  const std::vector<std::string> texts = {"In the beginning God created the heaven and the earth.", "Jesus wept.", "Amen"};
  auto http = http_request(s.port(), "POST", "/v1/embeddings", nlohmann::json{{"input", texts}, {"dimensions", 16}}.dump(),
                           "Authorization: Bearer k\r\n");
  ASSERT_EQ(http.status, 200) << http.body;
  const auto want = nlohmann::json::parse(http.body);
  capnp::EzRpcClient client("127.0.0.1", static_cast<uint16_t>(port));
  auto got = embed(client, [&](rpc::EmbedRequest::Builder r) {
    r.setApiKey("k");
    auto t = r.initTexts(static_cast<unsigned>(texts.size()));
    for (unsigned i = 0; i < texts.size(); ++i) t.set(i, texts[i]);
    r.setDimensions(16);
  });
  ASSERT_TRUE(got.ok) << got.message;
  ASSERT_EQ(got.vectors.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(got.vectors[i], floats(want["data"][i]["embedding"])) << i;
  EXPECT_EQ(got.prompt_tokens, want["usage"]["prompt_tokens"].get<size_t>());
  // Token ids, not normalized: the raw vector, whose direction is the normalized one's.
  auto raw = embed(client, [&](rpc::EmbedRequest::Builder r) {
    r.setApiKey("k");
    auto ids = r.initIds(1);
    auto one = ids.init(0, 3);
    one.set(0, 40);
    one.set(1, 41);
    one.set(2, 42);
    r.setNormalize(rpc::EmbedRequest::Normalize::NO);
  });
  ASSERT_TRUE(raw.ok) << raw.message;
  ASSERT_EQ(raw.vectors.size(), 1u);
  double norm = 0;
  for (float x : raw.vectors[0]) norm += double(x) * x;
  EXPECT_GT(std::abs(std::sqrt(norm) - 1.0), 1e-3);
  // Refusals with HTTP's codes.
  auto unauthorized = embed(client, [&](rpc::EmbedRequest::Builder r) { r.initTexts(1).set(0, "a"); });
  EXPECT_FALSE(unauthorized.ok);
  EXPECT_EQ(unauthorized.code, 401);
  auto none = embed(client, [&](rpc::EmbedRequest::Builder r) { r.setApiKey("k"); });
  EXPECT_FALSE(none.ok);
  EXPECT_EQ(none.code, 400) << none.message;
  auto empty = embed(client, [&](rpc::EmbedRequest::Builder r) {
    r.setApiKey("k");
    auto t = r.initTexts(2);
    t.set(0, "a");
    t.set(1, "");
  });
  EXPECT_EQ(empty.code, 400);
  EXPECT_NE(empty.message.find("input[1]"), std::string::npos) << empty.message;
  auto too_wide = embed(client, [&](rpc::EmbedRequest::Builder r) {
    r.setApiKey("k");
    r.initTexts(1).set(0, "a");
    r.setDimensions(100000);
  });
  EXPECT_EQ(too_wide.code, 400);
  auto model = embed(client, [&](rpc::EmbedRequest::Builder r) {
    r.setApiKey("k");
    r.setModel("nope");
    r.initTexts(1).set(0, "a");
  });
  EXPECT_EQ(model.code, 404) << model.message;
}

// A long embed call holds its window's slot (--max-concurrent 1: one input at a time); dropped,
// it cancels its inputs in the mesh and frees the slot.
TEST(Rpc, ADroppedEmbedCallCancelsItsInputs) {
  server_process s(bin, {"--model", model_dir, "--max-concurrent", "1"});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  capnp::EzRpcClient c("127.0.0.1", static_cast<uint16_t>(port));
  auto& ws = c.getWaitScope();
  auto req = c.getMain<rpc::Llmesh>().embedRequest();
  auto ids = req.initRequest().initIds(2000);
  for (unsigned i = 0; i < 2000; ++i) {
    auto one = ids.init(i, 250);
    for (unsigned k = 0; k < 250; ++k) one.set(k, static_cast<int32_t>(3 + (i * 7 + k * 13) % 250));
  }
  auto call = req.send();
  c.getIoProvider().getTimer().afterDelay(300 * kj::MILLISECONDS).wait(ws);
  auto base = [](auto r) {
    r.setModel("kjv-tiny");
    r.getPrompt().setText("The LORD is my shepherd");
    r.setMaxTokens(4);
  };
  auto busy = generate(c, base);
  EXPECT_EQ(busy.code, 429) << busy.message;
  { auto dropped = kj::mv(call); }
  outcome next;
  for (int attempt = 0; attempt < 200 && !next.ok; ++attempt) {
    next = generate(c, base);
    if (!next.ok) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(next.ok) << next.code << " " << next.message;
  // Nothing of the embed call is left running in the replica.
  // (Every replica's llmesh_requests_running{replica="..."} line reads 0.)
  auto idle = [](const std::string& metrics) {
    size_t lines = 0;
    for (size_t at = metrics.find("\nllmesh_requests_running{"); at != std::string::npos;
         at = metrics.find("\nllmesh_requests_running{", at + 1)) {
      const size_t end = metrics.find('\n', at + 1);
      if (metrics.compare(end - 2, 2, " 0") != 0) return false;
      ++lines;
    }
    return lines > 0;
  };
  std::string metrics;
  for (int attempt = 0; attempt < 100; ++attempt) {
    metrics = http_request(s.port(), "GET", "/metrics").body;
    if (idle(metrics)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(idle(metrics)) << metrics;
  EXPECT_EQ(s.stop(), 0) << s.log();
}

}  // namespace
}  // namespace llmesh::testing
