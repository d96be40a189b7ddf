// The OpenSSL server context of tls.hpp's options, and the holder that hands new connections the
// current one, rebuilt when --enable-ssl-refresh is on and a file changed (a connection keeps
// the context it started with). Included by http_server.cpp and tls_context.cpp only.
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <memory>
#include <vector>

#include "llmesh/gateway/tls.hpp"

namespace llmesh::gateway {

using ssl_context = boost::asio::ssl::context;

/// A server context for the options (TLS 1.2 and 1.3 only); errors as check_tls's.
[[nodiscard]] result<std::shared_ptr<ssl_context>> make_tls_context(const tls_options& o);

/// Thread affinity: one thread (the server's io thread).
class tls_contexts {
 public:
  [[nodiscard]] static result<tls_contexts> open(tls_options o);
  /// The context for a new connection. With refresh on, a change to a file's size, times or inode
  /// (a file renamed over it) since the last load rebuilds it first; a rebuild that fails (say, a certificate written
  /// before its key) keeps the previous context, logs one line, and is tried again on the next change.
  std::shared_ptr<ssl_context> current();

 private:
  struct stamp {
    long long mtime_ns = -1, ctime_ns = -1, size = -1, inode = -1;
    bool operator==(const stamp&) const = default;
  };
  std::vector<stamp> stamps() const;
  tls_options opt_;
  std::shared_ptr<ssl_context> ctx_;
  std::vector<stamp> loaded_, failed_;
};

}  // namespace llmesh::gateway
