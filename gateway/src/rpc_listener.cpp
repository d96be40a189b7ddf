#include "rpc_listener.hpp"

#include <capnp/rpc-twoparty.h>
#include <kj/compat/tls.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

namespace llmesh::gateway {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Each certificate of a PEM bundle (kj reads a file as one chain and would trust its first only).
std::vector<std::string> pem_certificates(const std::string& text) {
  static const std::string begin = "-----BEGIN CERTIFICATE-----", end = "-----END CERTIFICATE-----";
  std::vector<std::string> out;
  for (size_t at = text.find(begin); at != std::string::npos; at = text.find(begin, at + 1)) {
    const size_t stop = text.find(end, at);
    if (stop == std::string::npos) break;
    out.push_back(text.substr(at, stop + end.size() - at) + "\n");
  }
  return out;
}

/// A kj TLS server context and what its options point at. The files are vetted first by
/// check_tls (as HTTPS loads them: kj would take a key that does not match its certificate);
/// broken files throw, and the caller keeps the previous context.
struct kj_tls {
  std::string ciphers;
  kj::TlsKeypair keypair;
  kj::Vector<kj::TlsCertificate> cas;
  kj::Own<kj::TlsContext> ctx;

  explicit kj_tls(const tls_options& o)
      : ciphers(vetted(o)),
        keypair{kj::TlsPrivateKey(read_text(o.key_file.empty() ? o.cert_file : o.key_file).c_str()),
                kj::TlsCertificate(read_text(o.cert_file).c_str())} {
    kj::TlsContext::Options opt;
    opt.useSystemTrustStore = false;
    opt.defaultKeypair = keypair;
    if (!ciphers.empty()) opt.cipherList = ciphers.c_str();
    if (!o.ca_file.empty()) {
      for (const auto& pem : pem_certificates(read_text(o.ca_file))) cas.add(kj::TlsCertificate(pem.c_str()));
      opt.trustedCertificates = cas.asPtr();
    }
    opt.minVersion = kj::TlsVersion::TLS_1_2;  // as HTTPS
    opt.verifyClients = o.cert_reqs != 0;
    ctx = kj::heap<kj::TlsContext>(kj::mv(opt));
  }

  static std::string vetted(const tls_options& o) {
    if (auto ok = check_tls(o); !ok) {
      kj::throwFatalException(kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::heapString(ok.err().message.c_str())));
    }
    return o.ciphers;
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
        std::fprintf(stderr, "llmesh: TLS refresh (RPC): new connections get the certificate now in %s\n", tls.cert_file.c_str());
      } catch (const kj::Exception& e) {
        files.failed();
        std::fprintf(stderr, "llmesh: TLS refresh (RPC): %s; new connections keep the previous certificate\n",
                     e.getDescription().cStr());
      }
    }
    return context;
  }

  /// Handshakes in progress at most (each holds a descriptor up to 15 s): beyond, a new
  /// connection is closed at once, so a flood of idle sockets cannot take every descriptor.
  static constexpr size_t max_handshakes = 256;
  size_t handshaking = 0;

  kj::Promise<void> accept_loop() {
    // Both continuations loop (one .then with an error branch, so kj folds the chain: a
    // .catch_ after it would add a node per connection).
    return listener->accept().then(
        [this](kj::Own<kj::AsyncIoStream>&& s) {
          on_accept(kj::mv(s));
          return accept_loop();
        },
        [this](kj::Exception&& e) -> kj::Promise<void> {
          // Out of descriptors and the like: kj's accept throws; wait, then accept again (the
          // port must not stay bound with nobody accepting).
          std::fprintf(stderr, "llmesh: the native API could not accept a connection: %s; retrying in 1 s\n",
                       e.getDescription().cStr());
          return io.provider->getTimer().afterDelay(1 * kj::SECONDS).then([this] { return accept_loop(); });
        });
  }

  void on_accept(kj::Own<kj::AsyncIoStream>&& s) {
    if (!context) {
      server.accept(kj::mv(s));
      return;
    }
    if (handshaking >= max_handshakes) return;  // closed at once
    auto t = current();
    ++handshaking;
    handshakes.add(io.provider->getTimer()
                       .timeoutAfter(15 * kj::SECONDS, t->ctx->wrapServer(kj::mv(s)))
                       .then(
                           [this, t](kj::Own<kj::AsyncIoStream>&& secure) {
                             --handshaking;
                             server.accept(secure.attach(t));
                           },
                           [this](kj::Exception&& e) -> void {
                             --handshaking;
                             kj::throwFatalException(kj::mv(e));
                           }));
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
