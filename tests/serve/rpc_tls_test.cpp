// The native API over TLS: with --ssl-certfile the RPC port speaks TLS with the HTTP server's
// certificate (a kj TLS client that trusts the CA lists the models and generates; one trusting
// another CA, or speaking plain Cap'n Proto, gets nothing), and client certificates are
// required there whenever --ssl-cert-reqs asks for them (1 included: kj's TLS cannot take them
// optionally).
#include <capnp/ez-rpc.h>
#include <capnp/rpc-twoparty.h>
#include <gtest/gtest.h>
#include <kj/compat/tls.h>

#include <filesystem>

#include "../model/temp_dir.hpp"
#include "rpc_client.hpp"
#include "tls_client.hpp"

namespace llmesh::testing {
namespace {

int tls_rpc_port(server_process& s) {
  const std::string marker = "(Cap'n Proto RPC over TLS, schemas/rpc.capnp) on 127.0.0.1:";
  const auto at = s.log().find(marker);
  return at == std::string::npos ? 0 : std::atoi(s.log().c_str() + at + marker.size());
}

/// One connection's result: the model names, and a greedy generation's text ("" when refused).
struct tls_rpc_result {
  bool connected = false;
  std::vector<std::string> models;
  std::string text;
};

tls_rpc_result call_over_tls(int port, const test_cert& ca, const test_cert* client = nullptr) {
  tls_rpc_result out;
  auto io = kj::setupAsyncIo();
  auto& ws = io.waitScope;
  kj::TlsCertificate trusted(ca.cert_pem.c_str());
  kj::Maybe<kj::TlsKeypair> keypair;
  kj::TlsContext::Options opt;
  opt.useSystemTrustStore = false;
  opt.trustedCertificates = kj::arrayPtr(&trusted, 1);
  if (client) {
    keypair = kj::TlsKeypair{kj::TlsPrivateKey(client->key_pem.c_str()), kj::TlsCertificate(client->cert_pem.c_str())};
    KJ_IF_MAYBE(k, keypair) { opt.defaultKeypair = *k; }
  }
  kj::TlsContext tls(kj::mv(opt));
  try {
    auto addr = io.provider->getNetwork().parseAddress("127.0.0.1", static_cast<uint>(port)).wait(ws);
    auto secure = tls.wrapClient(addr->connect().wait(ws), "localhost").wait(ws);
    out.connected = true;
    capnp::TwoPartyClient rpc_client(*secure);
    auto main = rpc_client.bootstrap().castAs<rpc::Llmesh>();
    auto names = main.modelsRequest().send().wait(ws);
    for (auto n : names.getNames()) out.models.emplace_back(n.cStr());
    auto req = main.generateRequest();
    auto r = req.initRequest();
    r.setModel("kjv-tiny");
    r.getPrompt().setText("In the beginning");
    r.setMaxTokens(4);
    r.setTemperature(0);
    std::vector<int32_t> ids;
    std::string streamed;
    req.setSink(kj::heap<sink>(ids, streamed));
    auto resp = req.send().wait(ws);
    if (resp.getResult().getOk()) out.text = resp.getResult().getText().cStr();
  } catch (const kj::Exception&) {
  }
  return out;
}

TEST(RpcTls, TheNativeApiSpeaksTlsWithTheHttpCertificate) {
  model::testing::temp_dir dir;
  const test_cert ca = make_cert("llmesh test CA");
  make_cert("server", &ca).write(dir.path() + "/cert.pem", dir.path() + "/key.pem");
  server_process s(bin, {"--model", model_dir, "--ssl-certfile", dir.path() + "/cert.pem", "--ssl-keyfile", dir.path() + "/key.pem"});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = tls_rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  auto got = call_over_tls(port, ca);
  ASSERT_TRUE(got.connected);
  EXPECT_EQ(got.models, std::vector<std::string>{"kjv-tiny"});
  // The same greedy text as /v1/completions gives over HTTPS.
  auto https = https_request(s.port(), ca, "POST", "/v1/completions",
                             R"({"model": "kjv-tiny", "prompt": "In the beginning", "max_tokens": 4, "temperature": 0})");
  ASSERT_EQ(https.response.status, 200) << https.response.body;
  EXPECT_EQ(got.text, nlohmann::json::parse(https.response.body)["choices"][0]["text"].get<std::string>());
  EXPECT_FALSE(call_over_tls(port, make_cert("another CA")).connected);
  // A plain Cap'n Proto client gets no answer (the call fails, it does not hang).
  bool plain_failed = false;
  try {
    capnp::EzRpcClient plain("127.0.0.1", static_cast<uint>(port));
    plain.getMain<rpc::Llmesh>().modelsRequest().send().wait(plain.getWaitScope());
  } catch (const kj::Exception&) {
    plain_failed = true;
  }
  EXPECT_TRUE(plain_failed);
}

TEST(RpcTls, ClientCertificatesAreRequiredWhenAskedFor) {
  model::testing::temp_dir dir;
  const test_cert ca = make_cert("llmesh test CA");
  make_cert("server", &ca).write(dir.path() + "/cert.pem", dir.path() + "/key.pem");
  const test_cert client_ca = make_cert("client CA");
  // A bundle: the client CA second (every certificate of it is trusted, as over HTTPS).
  std::ofstream(dir.path() + "/clients.pem") << make_cert("unrelated CA").cert_pem << client_ca.cert_pem;
  const test_cert client = make_cert("a client", &client_ca), stranger = make_cert("a stranger", &ca);
  server_process s(bin, {"--model", model_dir, "--ssl-certfile", dir.path() + "/cert.pem", "--ssl-keyfile", dir.path() + "/key.pem",
                         "--ssl-ca-certs", dir.path() + "/clients.pem", "--ssl-cert-reqs", "1"});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = tls_rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  EXPECT_FALSE(call_over_tls(port, ca, &client).text.empty()) << "a client certificate from the CA is served";
  EXPECT_TRUE(call_over_tls(port, ca).models.empty()) << "none: refused (required here, optional over HTTPS)";
  EXPECT_TRUE(call_over_tls(port, ca, &stranger).models.empty());
  EXPECT_EQ(https_request(s.port(), ca, "GET", "/health").response.status, 200) << "HTTPS keeps it optional";
}

// --enable-log-requests and --enable-log-outputs cover the native API: a line for the request and
// one for its choice, with the call's text.
TEST(RpcLogs, RequestsAndOutputsAreLoggedAsOverHttp) {
  server_process s(bin, {"--model", model_dir, "--enable-log-requests", "--enable-log-outputs"});
  ASSERT_GT(s.port(), 0) << s.log();
  capnp::EzRpcClient c("127.0.0.1", static_cast<uint>(rpc_port(s)));
  auto o = generate(c, [](auto r) {
    r.setModel("kjv-tiny");
    r.getPrompt().setText("In the beginning");
    r.setMaxTokens(3);
    r.setIgnoreEos(true);
  });
  ASSERT_TRUE(o.ok) << o.message;
  ASSERT_TRUE(s.wait_for(" choice 0: finish length, output " + nlohmann::json(o.text).dump(), std::chrono::seconds(10))) << s.log();
  const auto at = s.log().find("llmesh: request cmpl-");
  ASSERT_NE(at, std::string::npos) << s.log();
  const std::string id = s.log().substr(at + 16, s.log().find(' ', at + 16) - at - 16);
  EXPECT_NE(s.log().find("llmesh: response " + id + " choice 0: finish length"), std::string::npos) << s.log();
}

// --enable-ssl-refresh: new RPC connections get the rotated certificate (a client trusting only
// the new CA connects once the files changed; one trusting only the old CA no longer does).
TEST(RpcTls, RefreshGivesNewConnectionsTheRotatedCertificate) {
  model::testing::temp_dir dir;
  const std::string cert = dir.path() + "/cert.pem", key = dir.path() + "/key.pem";
  const test_cert old_ca = make_cert("old CA"), new_ca = make_cert("new CA");
  make_cert("server", &old_ca).write(cert, key);
  server_process s(bin, {"--model", model_dir, "--ssl-certfile", cert, "--ssl-keyfile", key, "--enable-ssl-refresh"});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = tls_rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  EXPECT_TRUE(call_over_tls(port, old_ca).connected);
  EXPECT_FALSE(call_over_tls(port, new_ca).connected);
  // A key that does not match the certificate: new connections keep the previous pair.
  const test_cert mismatched = make_cert("server", &new_ca), other = make_cert("other", &new_ca);
  std::ofstream(cert) << mismatched.cert_pem;
  std::ofstream(key) << other.key_pem;
  EXPECT_TRUE(call_over_tls(port, old_ca).connected);
  EXPECT_NE(s.log().find("TLS refresh (RPC): --ssl-keyfile " + key + ": the private key does not match"), std::string::npos)
      << s.log();
  make_cert("server", &new_ca).write(cert + ".new", key + ".new");
  std::filesystem::rename(key + ".new", key);
  std::filesystem::rename(cert + ".new", cert);
  EXPECT_TRUE(call_over_tls(port, new_ca).connected) << s.log();
  EXPECT_FALSE(call_over_tls(port, old_ca).connected);
}

}  // namespace
}  // namespace llmesh::testing
