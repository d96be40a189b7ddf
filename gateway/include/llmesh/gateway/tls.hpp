// HTTPS for the gateway, as vLLM's --ssl-certfile, --ssl-keyfile, --ssl-ca-certs,
// --ssl-cert-reqs, --ssl-ciphers and --enable-ssl-refresh (uvicorn's TLS over Python's ssl
// module): the server's certificate chain and key in PEM, optional client certificates checked
// against a CA file, and certificates reloaded when their files change, for rotation without a
// restart. The OpenSSL context itself lives in src/tls_context.hpp (only the Beast unit sees it).
#pragma once

#include <string>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::gateway {

struct tls_options {
  std::string cert_file;  ///< PEM: the server's certificate, then its chain; empty: plain HTTP
  std::string key_file;   ///< PEM private key (unencrypted); empty: the key is in cert_file
  std::string ca_file;    ///< PEM CAs that client certificates are checked against
  /// Python ssl's verify modes: 0 CERT_NONE (no client certificate asked for), 1 CERT_OPTIONAL
  /// (asked for; one sent must verify), 2 CERT_REQUIRED (a connection without one is refused).
  int cert_reqs = 0;
  std::string ciphers;  ///< OpenSSL cipher list for TLS 1.2 ("": OpenSSL's default); TLS 1.3 keeps its suites
  bool refresh = false;  ///< reload the files for new connections when one of them changes
  bool enabled() const { return !cert_file.empty(); }
};

/// Loads the options once as the server would (errors name the flag and the file: unreadable,
/// not PEM, a key that does not match the certificate, an encrypted key, a cipher list OpenSSL
/// does not know, --ssl-cert-reqs without --ssl-ca-certs), so that a bad certificate fails a
/// start before the model loads. Disabled options: ok.
[[nodiscard]] status check_tls(const tls_options& o);

/// The files of tls_options as last loaded (size, times, inode of each), for --enable-ssl-refresh:
/// a server asks changed() before a new connection, rebuilds its context when so, and reports
/// loaded() or failed() (a failed set of files is not tried again until they change again).
/// Thread affinity: one thread.
class tls_files {
 public:
  explicit tls_files(const tls_options& o);  ///< as they are now: the server loads them next
  /// Refresh on, and the files differ from the last load and from the last failed attempt.
  bool changed();
  void loaded();
  void failed();

 private:
  struct stamp {
    long long mtime_ns = -1, ctime_ns = -1, size = -1, inode = -1;
    bool operator==(const stamp&) const = default;
  };
  std::vector<stamp> stamps() const;
  tls_options opt_;
  std::vector<stamp> loaded_, failed_, now_;
};

}  // namespace llmesh::gateway
