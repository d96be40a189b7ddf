// HTTPS for the serve tests, on OpenSSL directly: certificates made on the spot (an EC key, a
// self-signed CA or a certificate it signs, for 127.0.0.1 and localhost) and one request over
// TLS that checks the server's certificate against a given CA, optionally presenting a client
// certificate. Nothing here is shared with the server's code (gateway/src/tls_context.cpp).
#pragma once

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <fstream>
#include <memory>
#include <string>

#include "server_process.hpp"

namespace llmesh::testing {

struct test_cert {
  std::string cert_pem, key_pem;
  void write(const std::string& cert_path, const std::string& key_path) const {
    std::ofstream(cert_path, std::ios::binary) << cert_pem;
    std::ofstream(key_path, std::ios::binary) << key_pem;
  }
};

namespace tls_detail {

inline std::string bio_text(BIO* b) {
  char* p = nullptr;
  const long n = BIO_get_mem_data(b, &p);
  return std::string(p, static_cast<size_t>(n));
}

inline void add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

template <class T, void (*F)(T*)>
struct freer {
  void operator()(T* p) const { F(p); }
};
using x509_ptr = std::unique_ptr<X509, freer<X509, X509_free>>;
using pkey_ptr = std::unique_ptr<EVP_PKEY, freer<EVP_PKEY, EVP_PKEY_free>>;
using bio_ptr = std::unique_ptr<BIO, freer<BIO, BIO_free_all>>;
using ctx_ptr = std::unique_ptr<SSL_CTX, freer<SSL_CTX, SSL_CTX_free>>;

inline x509_ptr read_cert(const std::string& pem) {
  bio_ptr b(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return x509_ptr(PEM_read_bio_X509(b.get(), nullptr, nullptr, nullptr));
}
inline pkey_ptr read_key(const std::string& pem) {
  bio_ptr b(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return pkey_ptr(PEM_read_bio_PrivateKey(b.get(), nullptr, nullptr, nullptr));
}

/// A client context that checks the server's certificate against `ca`.
inline ctx_ptr client_context(const test_cert& ca) {
  ctx_ptr ctx(SSL_CTX_new(TLS_client_method()));
  X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx.get()), read_cert(ca.cert_pem).get());
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  return ctx;
}

}  // namespace tls_detail

/// A P-256 key and a certificate for `cn` (valid from an hour ago for a day; names 127.0.0.1 and
/// localhost): signed by `ca` when given, else self-signed as a CA. `key_password`: the key PEM
/// encrypted with it (AES-256-CBC).
inline test_cert make_cert(const std::string& cn, const test_cert* ca = nullptr, const std::string& key_password = "") {
  using namespace tls_detail;
  pkey_ptr key(EVP_EC_gen("P-256"));
  x509_ptr cert(X509_new());
  X509_set_version(cert.get(), 2);
  static long serial = 1;
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), ++serial);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 86400);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  x509_ptr ca_cert = ca ? read_cert(ca->cert_pem) : nullptr;
  pkey_ptr ca_key = ca ? read_key(ca->key_pem) : nullptr;
  X509* issuer = ca ? ca_cert.get() : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(issuer));
  add_ext(cert.get(), issuer, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
  add_ext(cert.get(), issuer, NID_basic_constraints, ca ? "critical,CA:FALSE" : "critical,CA:TRUE");
  X509_sign(cert.get(), ca ? ca_key.get() : key.get(), EVP_sha256());
  bio_ptr cb(BIO_new(BIO_s_mem())), kb(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(cb.get(), cert.get());
  if (key_password.empty()) {
    PEM_write_bio_PrivateKey(kb.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  } else {
    PEM_write_bio_PKCS8PrivateKey(kb.get(), key.get(), EVP_aes_256_cbc(), key_password.data(),
                                  static_cast<int>(key_password.size()), nullptr, nullptr);
  }
  return {bio_text(cb.get()), bio_text(kb.get())};
}

struct https_result {
  bool handshake = false;    ///< the TLS handshake completed (the server's certificate verified)
  std::string server_cn;     ///< the CN of the certificate the server presented
  http_response response;    ///< status 0: no HTTP response came
  bool resumed = false;      ///< the handshake resumed the session given
};

/// One request over HTTPS on its own connection ("Connection: close"), the server's certificate
/// checked against `ca` for 127.0.0.1; `client`: a certificate to present. `session`: one to
/// resume (when set), replaced by this connection's (the caller frees it with SSL_SESSION_free).
inline https_result https_request(int port, const test_cert& ca, const std::string& method, const std::string& path,
                                  const std::string& body = "", const std::string& extra_headers = "",
                                  const test_cert* client = nullptr, SSL_SESSION** session = nullptr) {
  using namespace tls_detail;
  https_result out;
  auto ctx = client_context(ca);
  if (client) {
    SSL_CTX_use_certificate(ctx.get(), read_cert(client->cert_pem).get());
    SSL_CTX_use_PrivateKey(ctx.get(), read_key(client->key_pem).get());
  }
  const int fd = connect_local(port);
  if (fd < 0) return out;
  std::unique_ptr<SSL, freer<SSL, SSL_free>> ssl(SSL_new(ctx.get()));
  X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), "127.0.0.1");
  SSL_set_fd(ssl.get(), fd);
  if (session && *session) SSL_set_session(ssl.get(), *session);
  if (SSL_connect(ssl.get()) == 1) {
    out.handshake = true;
    if (X509* peer = SSL_get0_peer_certificate(ssl.get())) {
      char cn[256] = {};
      X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName, cn, sizeof cn);
      out.server_cn = cn;
    }
    std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
    if (!body.empty() || method == "POST") {
      req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    }
    req += "\r\n" + body;
    std::string raw;
    if (SSL_write(ssl.get(), req.data(), static_cast<int>(req.size())) > 0) {
      char buf[8192];
      int n;
      while ((n = SSL_read(ssl.get(), buf, sizeof buf)) > 0) raw.append(buf, static_cast<size_t>(n));
    }
    out.response = parse_response(raw);
    out.resumed = SSL_session_reused(ssl.get()) == 1;
    if (session) {
      if (*session) SSL_SESSION_free(*session);
      *session = SSL_get1_session(ssl.get());
    }
    SSL_shutdown(ssl.get());
  }
  ERR_clear_error();
  close(fd);
  return out;
}

/// Sends a request over HTTPS, reads until its first SSE event when `wait_for_event`, then hangs
/// up (TLS close_notify, then the socket closed). Returns whether the request went out (and the
/// event came, when waited for).
inline bool https_send_then_hang_up(int port, const test_cert& ca, const std::string& body, bool wait_for_event) {
  using namespace tls_detail;
  auto ctx = client_context(ca);
  const int fd = connect_local(port);
  if (fd < 0) return false;
  std::unique_ptr<SSL, freer<SSL, SSL_free>> ssl(SSL_new(ctx.get()));
  SSL_set_fd(ssl.get(), fd);
  bool got = false;
  if (SSL_connect(ssl.get()) == 1) {
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
    std::string raw;
    if (SSL_write(ssl.get(), req.data(), static_cast<int>(req.size())) > 0) {
      char buf[4096];
      int n;
      while (wait_for_event && raw.find("data: ") == std::string::npos && (n = SSL_read(ssl.get(), buf, sizeof buf)) > 0) {
        raw.append(buf, static_cast<size_t>(n));
      }
      got = !wait_for_event || raw.find("data: ") != std::string::npos;
    }
    SSL_shutdown(ssl.get());
  }
  ERR_clear_error();
  close(fd);
  return got;
}

}  // namespace llmesh::testing
