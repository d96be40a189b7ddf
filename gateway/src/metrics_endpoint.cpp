#include "llmesh/gateway/metrics_endpoint.hpp"

#include <string>

namespace llmesh::gateway {

http_reply metrics_reply(const actors::metrics_registry& metrics) {
  http_reply r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = metrics.render();
  return r;
}

http_reply metrics_endpoint(const actors::metrics_registry& metrics, std::string_view method, std::string_view target) {
  const std::string_view path = target.substr(0, target.find('?'));
  if (path != "/metrics" && path != "/health") {
    return error_reply(make_error(errc::not_found, "no route for " + std::string(method) + " " + std::string(path) +
                                                       " (this is a metrics endpoint: GET /metrics, GET /health)"));
  }
  if (method != "GET") {
    http_reply r = error_reply(make_error(errc::invalid_request, std::string(method) + " is not allowed on " + std::string(path)));
    r.status = 405;
    r.headers.emplace_back("Allow", "GET");
    return r;
  }
  if (path == "/health") {
    http_reply r;
    r.body = R"({"status":"ok"})";
    return r;
  }
  return metrics_reply(metrics);
}

}  // namespace llmesh::gateway
