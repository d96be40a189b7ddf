// A process's own metrics endpoint, without the API: what `llmesh node --metrics HOST:PORT`
// (or a node's `metrics:` in a cluster config) serves, so that a node without a gateway — a
// replica node — can be scraped (http_server::listen_metrics is its transport).
#pragma once

#include <string_view>

#include "llmesh/actors/metrics.hpp"
#include "llmesh/gateway/completion_stream.hpp"

namespace llmesh::gateway {

/// `metrics` rendered as Prometheus text (version 0.0.4), the body of every GET /metrics.
http_reply metrics_reply(const actors::metrics_registry& metrics);

/// GET /metrics: metrics_reply; GET /health: 200 {"status":"ok"}; any other method on those
/// two paths: 405; any other path: 404 (OpenAI-shaped errors, as the API's). A query string
/// is ignored.
http_reply metrics_endpoint(const actors::metrics_registry& metrics, std::string_view method, std::string_view target);

}  // namespace llmesh::gateway
