// HTTPS on a gateway node (`llmesh node` with --ssl-certfile): local.yaml's seed serves the mesh's
// replicas over HTTPS, with the greedy tokens of `llmesh generate`, refuses plain HTTP, and says
// that its native API speaks TLS too. A replica node's own metrics endpoint takes the same
// flags: scraped over HTTPS, not over plain HTTP.
#include <gtest/gtest.h>

#include "../serve/tls_client.hpp"
#include "mesh_fixture.hpp"

namespace llmesh::testing {
namespace {

TEST(MeshTls, AGatewayNodeServesTheMeshOverHttps) {
  mesh_files m;
  const test_cert ca = make_cert("llmesh test CA");
  make_cert("gateway", &ca).write(m.dir.path() + "/cert.pem", m.dir.path() + "/key.pem");
  auto seed_args = m.node("seed");
  for (const std::string& a : std::vector<std::string>{"--ssl-certfile", m.dir.path() + "/cert.pem", "--ssl-keyfile",
                                                        m.dir.path() + "/key.pem"}) {
    seed_args.push_back(a);
  }
  node_process seed(seed_args), a(m.node("replica-a")), b(m.node("replica-b"));
  ASSERT_TRUE(seed.wait_for("serving 'kjv-tiny' on https://")) << seed.log();
  EXPECT_NE(seed.log().find(" and RPC over TLS 127.0.0.1:"), std::string::npos) << seed.log();
  nlohmann::json reps;
  ASSERT_TRUE(wait_replicas(m, [](const nlohmann::json& j) { return count_ready(j) == 2; }, &reps)) << reps.dump();
  const std::vector<int32_t> prompt{1142, 258, 2078, 386, 3345};
  const auto want = generate_ids(prompt, 16);
  const nlohmann::json body{{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0},
                            {"ignore_eos", true}, {"return_token_ids", true}};
  for (int i = 0; i < 3; ++i) {
    auto r = https_request(m.http_port, ca, "POST", "/v1/completions", body.dump());
    ASSERT_TRUE(r.handshake);
    ASSERT_EQ(r.response.status, 200) << r.response.body;
    EXPECT_EQ(nlohmann::json::parse(r.response.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want);
  }
  EXPECT_EQ(http_request(m.http_port, "GET", "/health").status, 0) << "plain HTTP gets no answer";
  // A replica node that joins with a metrics address and a certificate: its /metrics is HTTPS.
  const int metrics_port = free_local_port();
  auto c = joiner(m, "replica-c", {"--metrics", "127.0.0.1:" + std::to_string(metrics_port), "--ssl-certfile",
                                   m.dir.path() + "/cert.pem", "--ssl-keyfile", m.dir.path() + "/key.pem"});
  ASSERT_TRUE(c.wait_for("metrics on https://127.0.0.1:")) << c.log();
  auto scraped = https_request(metrics_port, ca, "GET", "/metrics", "");
  ASSERT_TRUE(scraped.handshake);
  EXPECT_EQ(scraped.response.status, 200);
  EXPECT_NE(scraped.response.body.find("llmesh_transport_"), std::string::npos) << scraped.response.body.substr(0, 400);
  EXPECT_EQ(http_request(metrics_port, "GET", "/metrics").status, 0) << "plain HTTP gets no answer";
  EXPECT_EQ(c.stop(), 0) << c.log();
  EXPECT_EQ(b.stop(), 0) << b.log();
  EXPECT_EQ(a.stop(), 0) << a.log();
  EXPECT_EQ(seed.stop(), 0) << seed.log();
}

}  // namespace
}  // namespace llmesh::testing
