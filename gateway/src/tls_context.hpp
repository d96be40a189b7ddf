// The OpenSSL server context of tls.hpp's options, and the holder that hands new connections the
// current one, rebuilt when --enable-ssl-refresh is on and a file changed (a connection keeps
// the context it started with). Included by http_server.cpp and tls_context.cpp only.
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <memory>

#include "llmesh/gateway/tls.hpp"

namespace llmesh::gateway {

using ssl_context = boost::asio::ssl::context;

/// A server context for the options (TLS 1.2 and 1.3 only); errors as check_tls's.
[[nodiscard]] result<std::shared_ptr<ssl_context>> make_tls_context(const tls_options& o);

/// Thread affinity: one thread (the server's io thread).
class tls_contexts {
 public:
  [[nodiscard]] static result<tls_contexts> open(tls_options o);
  /// The context for a new connection, rebuilt first when tls_files says the files changed; a
  /// rebuild that fails (say, a certificate written before its key) keeps the previous context
  /// and logs one line.
  std::shared_ptr<ssl_context> current();

 private:
  explicit tls_contexts(const tls_options& o) : opt_(o), files_(o) {}
  tls_options opt_;
  tls_files files_;
  std::shared_ptr<ssl_context> ctx_;
};

}  // namespace llmesh::gateway
