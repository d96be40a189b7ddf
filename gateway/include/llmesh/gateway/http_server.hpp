// The HTTP/1.1 front end (Boost.Beast on Asio, C++20 coroutines): one coroutine per
// connection reads requests under size and time limits, hands them to api_service, writes
// plain replies, and runs generation jobs — submitting to the mesh, streaming SSE chunks over
// chunked encoding as tokens arrive, and cancelling the request in the mesh when the client
// goes away (a readiness watch on the socket notices a disconnect while nothing is written).
// HTTPS with tls.hpp's options. With a tracer, each generation or pooling job it runs becomes
// a span (tracing.hpp), a child of the request's traceparent when it sent one. This and
// otlp_exporter.cpp are the translation units that include Beast (it compiles slowly).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "llmesh/common/error.hpp"
#include "llmesh/gateway/api_service.hpp"
#include "llmesh/gateway/cors.hpp"
#include "llmesh/gateway/tls.hpp"

namespace llmesh::gateway {

class otlp_exporter;

struct http_options {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;  ///< 0: any free port (see port())
  size_t max_body_bytes = 4u << 20;   ///< beyond: 413
  size_t max_header_bytes = 16u << 10;  ///< beyond: 431
  /// A connection that has not delivered a whole request within this long is closed (idle
  /// keep-alive and slow senders alike: each open connection is a slot of max_connections).
  std::chrono::seconds idle_timeout{15};
  std::chrono::seconds write_timeout{60};  ///< a client that reads nothing for this long is dropped
  /// Beyond: a new connection is answered 429 (Retry-After) at once, unread, and closed.
  size_t max_connections = 1024;
  /// Open connections one client address may hold (beyond: its new ones get the same 429),
  /// so that one client cannot take every slot of max_connections.
  size_t max_connections_per_client = 256;
  /// Cross-origin requests from browsers (vLLM's --allowed-origins ...; off by default).
  cors_options cors;
  /// HTTPS (vLLM's --ssl-certfile ...); off without a certificate. Refusals over a connection
  /// limit close before the handshake, with no 429 (it would take the handshake to send one).
  tls_options tls;
  /// vLLM's --enable-request-id-headers: every answer to a request carries X-Request-Id, the
  /// request's own (when it sent a printable one of at most 256 bytes) or a new random one.
  bool request_id_headers = false;
  /// vLLM's --otlp-traces-endpoint: the exporter that takes a span per job run (null: no
  /// tracing). A request whose traceparent says "not sampled" is not recorded.
  std::shared_ptr<otlp_exporter> tracer;
};

/// Thread affinity: run() on one thread; stop() from any thread (signal handlers excluded).
class http_server {
 public:
  /// Binds and listens (errors name the address). Serving starts with run().
  [[nodiscard]] static result<std::unique_ptr<http_server>> listen(api_service& api, http_options opt);
  /// A process's metrics endpoint alone (metrics_endpoint.hpp: GET /metrics and /health), with
  /// the same connection limits and timeouts; for nodes that have no API. Borrows `metrics`.
  [[nodiscard]] static result<std::unique_ptr<http_server>> listen_metrics(actors::metrics_registry& metrics,
                                                                           http_options opt);
  ~http_server();

  /// Serves until stop() and the drain have finished.
  void run();
  /// Stops accepting, lets generations in flight finish for up to `drain`, then ends run().
  void stop(std::chrono::milliseconds drain = std::chrono::milliseconds(10000));
  uint16_t port() const;

  struct impl;

 private:
  explicit http_server(std::unique_ptr<impl> p);
  static result<std::unique_ptr<http_server>> start(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace llmesh::gateway
