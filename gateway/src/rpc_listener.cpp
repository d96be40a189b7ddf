#include "rpc_listener.hpp"

#include <capnp/rpc-twoparty.h>
#include <kj/compat/tls.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace llmesh::gateway {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// A kj TLS server context and what its options point at (check_tls vetted the files at start;
/// a refresh that finds them broken throws, and the caller keeps the previous one).
struct kj_tls {
  std::string ciphers;
  kj::TlsKeypair keypair;
  kj::Vector<kj::TlsCertificate> cas;
  kj::Own<kj::TlsContext> ctx;

  explicit kj_tls(const tls_options& o)
      : ciphers(o.ciphers),
        keypair{kj::TlsPrivateKey(read_text(o.key_file.empty() ? o.cert_file : o.key_file).c_str()),
                kj::TlsCertificate(read_text(o.cert_file).c_str())} {
    kj::TlsContext::Options opt;
    opt.useSystemTrustStore = false;
    opt.defaultKeypair = keypair;
    if (!ciphers.empty()) opt.cipherList = ciphers.c_str();
    if (!o.ca_file.empty()) {
      cas.add(kj::TlsCertificate(read_text(o.ca_file).c_str()));
      opt.trustedCertificates = cas.asPtr();
    }
    opt.verifyClients = o.cert_reqs != 0;
    ctx = kj::heap<kj::TlsContext>(kj::mv(opt));
  }
};

class ignore_errors final : public kj::TaskSet::ErrorHandler {
 public:
  void taskFailed(kj::Exception&&) override {}  // a handshake that failed or timed out: that connection only
};

}  // namespace

struct rpc_listener::impl {
  kj::AsyncIoContext& io;
  capnp::TwoPartyServer server;
  kj::Own<kj::ConnectionReceiver> listener;
  tls_options tls;
  tls_files files;
  std::shared_ptr<kj_tls> context;  ///< null: plain TCP
  ignore_errors errors;
  kj::TaskSet handshakes{errors};

  impl(kj::AsyncIoContext& i, capnp::Capability::Client bootstrap, const tls_options& t)
      : io(i), server(kj::mv(bootstrap)), tls(t), files(t) {}

  std::shared_ptr<kj_tls> current() {
    if (files.changed()) {
      try {
        context = std::make_shared<kj_tls>(tls);
        files.loaded();
      } catch (const kj::Exception& e) {
        files.failed();
        std::fprintf(stderr, "llmesh: TLS refresh (RPC): %s; new connections keep the previous certificate\n",
                     e.getDescription().cStr());
      }
    }
    return context;
  }

  kj::Promise<void> accept_loop() {
    return listener->accept().then([this](kj::Own<kj::AsyncIoStream>&& s) {
      if (!context) {
        server.accept(kj::mv(s));
      } else {
        auto t = current();
        handshakes.add(io.provider->getTimer()
                           .timeoutAfter(15 * kj::SECONDS, t->ctx->wrapServer(kj::mv(s)))
                           .then([this, t](kj::Own<kj::AsyncIoStream>&& secure) { server.accept(secure.attach(t)); }));
      }
      return accept_loop();
    });
  }
};

rpc_listener::rpc_listener(kj::AsyncIoContext& io, capnp::Capability::Client bootstrap, const std::string& host,
                           uint16_t port, const tls_options& tls)
    : p_(std::make_unique<impl>(io, kj::mv(bootstrap), tls)) {
  if (tls.enabled()) p_->context = std::make_shared<kj_tls>(tls);
  auto addr = io.provider->getNetwork().parseAddress(host.c_str(), port).wait(io.waitScope);
  p_->listener = addr->listen();
}

rpc_listener::~rpc_listener() = default;

uint16_t rpc_listener::port() const { return static_cast<uint16_t>(p_->listener->getPort()); }

kj::Promise<void> rpc_listener::run() { return p_->accept_loop(); }

}  // namespace llmesh::gateway
