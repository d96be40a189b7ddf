// The native API's listening socket (rpc_server.cpp): accepts connections on the calling
// thread's kj event loop and serves the bootstrap capability on each with Cap'n Proto's
// two-party protocol, over plain TCP or, with tls.hpp's options, TLS: the HTTP server's
// certificate, key, cipher list and CAs, rebuilt for new connections on --enable-ssl-refresh.
// Client certificates: kj's TLS asks for them all or not at all, so --ssl-cert-reqs 1 (optional
// over HTTPS) requires one here, as 2 does.
#pragma once

#include <capnp/capability.h>
#include <kj/async-io.h>

#include <memory>
#include <string>

#include "llmesh/gateway/tls.hpp"

namespace llmesh::gateway {

class rpc_listener {
 public:
  /// Binds host:port (0: any free port); throws kj::Exception when it cannot. `io` outlives it.
  rpc_listener(kj::AsyncIoContext& io, capnp::Capability::Client bootstrap, const std::string& host, uint16_t port,
               const tls_options& tls);
  ~rpc_listener();
  uint16_t port() const;
  /// Accepts connections until the promise is dropped (a failed TLS handshake, or one not done
  /// within 15 s, closes that connection only).
  kj::Promise<void> run();

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

}  // namespace llmesh::gateway
