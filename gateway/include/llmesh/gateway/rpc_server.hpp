// The native client API (schemas/rpc.capnp): Cap'n Proto RPC over TCP, next to the HTTP API and
// over the same api_service (API key, model, limits, concurrency slots, seeds) and mesh. One kj
// event loop on its own thread serves every connection; tokens from the mesh (actor threads)
// reach it through the loop's executor, and go to the client's sink as flow-controlled
// streaming calls. A client that cancels its call or drops its connection cancels the
// generation in the mesh. With a certificate (tls.hpp) the port speaks TLS (rpc_listener.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "llmesh/gateway/api_service.hpp"
#include "llmesh/gateway/tls.hpp"

namespace llmesh::gateway {

class otlp_exporter;

struct rpc_options {
  std::string host = "127.0.0.1";
  uint16_t port = 8081;  ///< 0: any free port (see port())
  /// TLS with the HTTP server's certificate (rpc_listener.hpp); off without one.
  tls_options tls;
  /// --otlp-traces-endpoint's exporter (null: none): a span per generate call, a child of its
  /// request's traceparent field when it has one.
  std::shared_ptr<otlp_exporter> tracer = nullptr;
};

/// Thread affinity: create and destroy on one thread; port() from any.
class rpc_server {
 public:
  /// Binds and starts serving; an error (io_error) when the address cannot be bound. Borrows
  /// `api`, which must outlive the server.
  [[nodiscard]] static result<std::unique_ptr<rpc_server>> start(api_service& api, rpc_options opt);
  /// Stops: open calls are cancelled (their generations too), connections close.
  ~rpc_server();
  rpc_server(const rpc_server&) = delete;
  rpc_server& operator=(const rpc_server&) = delete;

  uint16_t port() const;

  struct impl;

 private:
  explicit rpc_server(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace llmesh::gateway
