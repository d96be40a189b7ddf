// TLS contexts for the HTTP server (tls_context.hpp), after uvicorn's: certificate chain and key
// from PEM files, client verification from a CA file with Python ssl's three verify modes.
#include "tls_context.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace llmesh::gateway {

namespace ssl = boost::asio::ssl;
using error_code = boost::system::error_code;

namespace {

/// The file's text, or an error naming the flag.
result<std::string> read_pem(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(errc::invalid_request, std::string(flag) + " " + path + ": cannot read it (" + std::strerror(errno) + ")");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

error failed(const char* flag, const std::string& path, const error_code& ec, const char* what) {
  return make_error(errc::invalid_request, std::string(flag) + " " + path + ": " + what + " (" + ec.message() + ")");
}

/// Without a certificate: an error for any other TLS flag given, else ok (plain HTTP).
status without_certificate(const tls_options& o) {
  if (!o.key_file.empty()) return make_error(errc::invalid_request, "--ssl-keyfile needs --ssl-certfile");
  if (!o.ca_file.empty() || o.cert_reqs != 0 || o.refresh || !o.ciphers.empty()) {
    return make_error(errc::invalid_request, "--ssl-ca-certs, --ssl-cert-reqs, --ssl-ciphers and --enable-ssl-refresh need --ssl-certfile");
  }
  return ok_status();
}

}  // namespace

result<std::shared_ptr<ssl_context>> make_tls_context(const tls_options& o) {
  if (!o.enabled()) LLMESH_TRY(without_certificate(o));
  if (o.cert_reqs < 0 || o.cert_reqs > 2) {
    return make_error(errc::invalid_request, "--ssl-cert-reqs " + std::to_string(o.cert_reqs) +
                                                 ": 0 (CERT_NONE), 1 (CERT_OPTIONAL) or 2 (CERT_REQUIRED)");
  }
  if (o.cert_reqs != 0 && o.ca_file.empty()) {
    return make_error(errc::invalid_request, "--ssl-cert-reqs " + std::to_string(o.cert_reqs) +
                                                 " needs --ssl-ca-certs: the CAs client certificates are checked against");
  }
  auto ctx = std::make_shared<ssl_context>(ssl::context::tls_server);
  SSL_CTX* native = ctx->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::single_dh_use);
  // An encrypted key must not make OpenSSL prompt on the terminal: it fails to load instead.
  ctx->set_password_callback([](std::size_t, ssl::context::password_purpose) { return std::string(); });
  error_code ec;
  auto cert = read_pem(o.cert_file, "--ssl-certfile");
  if (!cert) return cert.take_error();
  ctx->use_certificate_chain(boost::asio::buffer(*cert), ec);
  if (ec) return failed("--ssl-certfile", o.cert_file, ec, "not a PEM certificate chain");
  const bool own_key = !o.key_file.empty();
  const char* key_flag = own_key ? "--ssl-keyfile" : "--ssl-certfile";
  const std::string& key_path = own_key ? o.key_file : o.cert_file;
  auto key = own_key ? read_pem(o.key_file, key_flag) : std::move(cert);
  if (!key) return key.take_error();
  if (key->find("BEGIN ENCRYPTED PRIVATE KEY") != std::string::npos || key->find("Proc-Type: 4,ENCRYPTED") != std::string::npos) {
    return make_error(errc::invalid_request, std::string(key_flag) + " " + key_path +
                                                 ": the private key is encrypted; give it unencrypted (no key password is taken)");
  }
  ctx->use_private_key(boost::asio::buffer(*key), ssl::context::pem, ec);
  const auto code = static_cast<unsigned long>(ec.value());
  const bool mismatch = ec && ec.category() == boost::asio::error::get_ssl_category() && ERR_GET_LIB(code) == ERR_LIB_X509 &&
                        ERR_GET_REASON(code) == X509_R_KEY_VALUES_MISMATCH;
  if (mismatch ||
      (!ec && SSL_CTX_check_private_key(native) != 1)) {
    return make_error(errc::invalid_request, std::string(key_flag) + " " + key_path +
                                                 ": the private key does not match the certificate in " + o.cert_file);
  }
  if (ec) return failed(key_flag, key_path, ec, own_key ? "not a PEM private key" : "holds no PEM private key (give --ssl-keyfile)");
  if (!o.ciphers.empty() && SSL_CTX_set_cipher_list(native, o.ciphers.c_str()) != 1) {
    return make_error(errc::invalid_request, "--ssl-ciphers '" + o.ciphers + "': no cipher OpenSSL knows");
  }
  if (!o.ca_file.empty()) {
    auto ca = read_pem(o.ca_file, "--ssl-ca-certs");
    if (!ca) return ca.take_error();
    ctx->add_certificate_authority(boost::asio::buffer(*ca), ec);
    if (ec) return failed("--ssl-ca-certs", o.ca_file, ec, "not a PEM certificate list");
    // The names clients choose their certificate by (sent in the CertificateRequest).
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(o.ca_file.c_str())) SSL_CTX_set_client_CA_list(native, names);
  }
  // Sessions resumed by clients (tickets, ids: nginx upstreams and curl reuse them) need a
  // context id once client certificates are asked for, or OpenSSL fails those handshakes.
  static constexpr unsigned char session_context[] = "llmesh";
  SSL_CTX_set_session_id_context(native, session_context, sizeof session_context - 1);
  ctx->set_verify_mode(o.cert_reqs == 0   ? ssl::verify_none
                       : o.cert_reqs == 1 ? ssl::verify_peer
                                          : ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  return ctx;
}

status check_tls(const tls_options& o) {
  if (!o.enabled()) return without_certificate(o);
  auto ctx = make_tls_context(o);
  if (!ctx) return ctx.take_error();
  return ok_status();
}

result<tls_contexts> tls_contexts::open(tls_options o) {
  tls_contexts t(o);
  auto ctx = make_tls_context(t.opt_);
  if (!ctx) return ctx.take_error();
  t.ctx_ = std::move(*ctx);
  return t;
}

std::shared_ptr<ssl_context> tls_contexts::current() {
  if (!files_.changed()) return ctx_;
  auto ctx = make_tls_context(opt_);
  if (!ctx) {
    files_.failed();
    std::fprintf(stderr, "llmesh: TLS refresh: %s; new connections keep the previous certificate\n", ctx.err().message.c_str());
    return ctx_;
  }
  files_.loaded();
  ctx_ = std::move(*ctx);
  std::fprintf(stderr, "llmesh: TLS refresh: new connections get the certificate now in %s\n", opt_.cert_file.c_str());
  return ctx_;
}

tls_files::tls_files(const tls_options& o) : opt_(o), loaded_(stamps()) {}

bool tls_files::changed() {
  if (!opt_.refresh) return false;
  now_ = stamps();
  return now_ != loaded_ && now_ != failed_;
}

void tls_files::loaded() {
  loaded_ = now_;
  failed_.clear();
}

void tls_files::failed() { failed_ = now_; }

std::vector<tls_files::stamp> tls_files::stamps() const {
  std::vector<stamp> out;
  for (const std::string* path : {&opt_.cert_file, &opt_.key_file, &opt_.ca_file}) {
    stamp s;
    struct stat st {};
    if (!path->empty() && ::stat(path->c_str(), &st) == 0) {
      s.mtime_ns = static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
      s.ctime_ns = static_cast<long long>(st.st_ctim.tv_sec) * 1000000000LL + st.st_ctim.tv_nsec;
      s.size = static_cast<long long>(st.st_size);
      s.inode = static_cast<long long>(st.st_ino);
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace llmesh::gateway
