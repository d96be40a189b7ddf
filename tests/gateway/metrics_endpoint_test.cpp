// metrics_endpoint: what a node's own metrics address answers (GET /metrics and /health only).
#include "llmesh/gateway/metrics_endpoint.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace llmesh::gateway {
namespace {

TEST(MetricsEndpoint, ServesTheRegistryAndHealthAndNothingElse) {
  actors::metrics_registry m;
  m.declare_counter("llmesh_test_total", "A test counter", {"plane"});
  m.get_counter("llmesh_test_total", {"tensor"})->add(3);
  http_reply r = metrics_endpoint(m, "GET", "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(r.body.find("\nllmesh_test_total{plane=\"tensor\"} 3\n"), std::string::npos) << r.body;
  EXPECT_EQ(metrics_endpoint(m, "GET", "/metrics?x=1").body, r.body);  // a query is ignored

  r = metrics_endpoint(m, "GET", "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, R"({"status":"ok"})");

  r = metrics_endpoint(m, "POST", "/metrics");
  EXPECT_EQ(r.status, 405);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0], (std::pair<std::string, std::string>{"Allow", "GET"}));
  for (const char* path : {"/v1/models", "/v1/completions", "/ready", "/", "/metricsx"}) {
    r = metrics_endpoint(m, "GET", path);
    EXPECT_EQ(r.status, 404) << path;
    auto j = nlohmann::json::parse(r.body);
    EXPECT_NE(j["error"]["message"].get<std::string>().find("metrics endpoint"), std::string::npos) << r.body;
  }
}

}  // namespace
}  // namespace llmesh::gateway
