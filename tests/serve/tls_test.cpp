// vLLM's HTTPS flags on `llmesh serve`, over real TLS (tls_client.hpp makes the certificates and
// is the client): completions plain and streamed over HTTPS, a plain-HTTP or wrong-CA client
// refused, a client that hangs up mid-stream noticed; client certificates (--ssl-ca-certs,
// --ssl-cert-reqs 1 and 2); --enable-ssl-refresh serving a rotated certificate to new
// connections (and keeping the last good one through a broken write); bad files refused at start.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "../cli/subprocess.hpp"
#include "../model/temp_dir.hpp"
#include "server_process.hpp"
#include "tls_client.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";
const std::string body = json({{"model", "kjv-tiny"}, {"prompt", "In the beginning"}, {"max_tokens", 4}, {"temperature", 0}}).dump();

TEST(ServeTls, CompletionsOverHttpsAndOnlyOverHttps) {
  model::testing::temp_dir dir;
  const test_cert ca = make_cert("llmesh test CA");
  const test_cert server = make_cert("server one", &ca);
  server.write(dir.path() + "/cert.pem", dir.path() + "/key.pem");
  server_process s(bin, {"--model", model_dir, "--ssl-certfile", dir.path() + "/cert.pem", "--ssl-keyfile",
                         dir.path() + "/key.pem"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_NE(s.log().find("on https://127.0.0.1:"), std::string::npos) << s.log();

  auto health = https_request(s.port(), ca, "GET", "/health");
  ASSERT_TRUE(health.handshake);
  EXPECT_EQ(health.server_cn, "server one");
  EXPECT_EQ(health.response.status, 200);
  auto plain = https_request(s.port(), ca, "POST", "/v1/completions", body);
  ASSERT_EQ(plain.response.status, 200) << plain.response.body;
  const json j = json::parse(plain.response.body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 4) << j;
  json streamed = json::parse(body);
  streamed["stream"] = true;
  auto stream = https_request(s.port(), ca, "POST", "/v1/completions", streamed.dump());
  ASSERT_EQ(stream.response.status, 200);
  const auto events = sse_payloads(stream.response.body);
  ASSERT_GE(events.size(), 2u) << stream.response.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) text += json::parse(events[i])["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, j["choices"][0]["text"].get<std::string>()) << "streamed and whole agree";

  // Plain HTTP to the HTTPS port: no HTTP answer; a client trusting another CA: no handshake.
  EXPECT_EQ(http_request(s.port(), "GET", "/health").status, 0);
  const test_cert other_ca = make_cert("another CA");
  EXPECT_FALSE(https_request(s.port(), other_ca, "GET", "/health").handshake);

  // Without --enable-ssl-refresh new files change nothing.
  make_cert("server two", &ca).write(dir.path() + "/cert.pem", dir.path() + "/key.pem");
  EXPECT_EQ(https_request(s.port(), ca, "GET", "/health").server_cn, "server one");
}

/// The count of requests the server answered (or closed) with `status`, from /metrics over HTTPS.
int requests_with(int port, const test_cert& ca, int status) {
  const std::string metrics = https_request(port, ca, "GET", "/metrics").response.body;
  const std::string key = "llmesh_requests_total{status=\"" + std::to_string(status) + "\"} ";
  const auto at = metrics.find(key);
  return at == std::string::npos ? 0 : std::atoi(metrics.c_str() + at + key.size());
}

// A TLS client's goodbye is close_notify, then its FIN: a request whose client left is cancelled
// while it generates (counted 499), streamed or not. Not streamed, nothing is written before the
// end, so only the watch can notice: a missed goodbye would run the generation out (a 200).
TEST(ServeTls, AClientHangingUpMidRequestIsNoticed) {
  model::testing::temp_dir dir;
  const std::string m = dir.path() + "/m";
  ASSERT_EQ(std::system((bin + " model random --out " + m + " --hidden 256 --intermediate 512 --layers 4 --heads 4 --kv-heads 2"
                               " --vocab 4096 --max-positions 4096 --seed 4 2>/dev/null")
                            .c_str()),
            0);
  const test_cert ca = make_cert("llmesh test CA");
  make_cert("server", &ca).write(dir.path() + "/cert.pem", dir.path() + "/key.pem");
  server_process s(bin, {"--model", m, "--ssl-certfile", dir.path() + "/cert.pem", "--ssl-keyfile", dir.path() + "/key.pem"});
  ASSERT_GT(s.port(), 0) << s.log();
  json long_one = {{"model", "m"}, {"prompt", "In the beginning"}, {"max_tokens", 3500}, {"ignore_eos", true}};
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    long_one["stream"] = stream;
    const int before = requests_with(s.port(), ca, 499);
    ASSERT_TRUE(https_send_then_hang_up(s.port(), ca, long_one.dump(), stream));
    int gone = before;
    for (int i = 0; i < 200 && gone == before; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      gone = requests_with(s.port(), ca, 499);
    }
    EXPECT_EQ(gone, before + 1);
  }
}

TEST(ServeTls, ClientCertificatesRequiredOrOptional) {
  model::testing::temp_dir dir;
  const test_cert ca = make_cert("llmesh test CA");
  make_cert("server", &ca).write(dir.path() + "/cert.pem", dir.path() + "/key.pem");
  const test_cert client_ca = make_cert("client CA");
  std::ofstream(dir.path() + "/clients.pem") << client_ca.cert_pem;
  const test_cert client = make_cert("a client", &client_ca);
  const test_cert stranger = make_cert("a stranger", &ca);  // signed by a CA the server does not take for clients
  for (const char* reqs : {"2", "1"}) {
    SCOPED_TRACE(std::string("--ssl-cert-reqs ") + reqs);
    server_process s(bin, {"--model", model_dir, "--ssl-certfile", dir.path() + "/cert.pem", "--ssl-keyfile",
                           dir.path() + "/key.pem", "--ssl-ca-certs", dir.path() + "/clients.pem", "--ssl-cert-reqs", reqs});
    ASSERT_GT(s.port(), 0) << s.log();
    EXPECT_EQ(https_request(s.port(), ca, "POST", "/v1/completions", body, "", &client).response.status, 200);
    EXPECT_EQ(https_request(s.port(), ca, "GET", "/health", "", "", &stranger).response.status, 0);
    EXPECT_EQ(https_request(s.port(), ca, "GET", "/health").response.status, std::string(reqs) == "2" ? 0 : 200);
    // A client resuming its session (curl and nginx upstreams do) is served, resumed.
    SSL_SESSION* session = nullptr;
    EXPECT_EQ(https_request(s.port(), ca, "GET", "/health", "", "", &client, &session).response.status, 200);
    ASSERT_NE(session, nullptr);
    auto again = https_request(s.port(), ca, "GET", "/health", "", "", &client, &session);
    EXPECT_EQ(again.response.status, 200);
    EXPECT_TRUE(again.resumed);
    SSL_SESSION_free(session);
  }
}

TEST(ServeTls, RefreshGivesNewConnectionsTheRotatedCertificate) {
  model::testing::temp_dir dir;
  const std::string cert = dir.path() + "/cert.pem", key = dir.path() + "/key.pem";
  const test_cert ca = make_cert("llmesh test CA");
  make_cert("first", &ca).write(cert, key);
  server_process s(bin, {"--model", model_dir, "--ssl-certfile", cert, "--ssl-keyfile", key, "--enable-ssl-refresh"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_EQ(https_request(s.port(), ca, "GET", "/health").server_cn, "first");
  // Rotated as a deployment would: new files renamed over the old ones.
  make_cert("second", &ca).write(cert + ".new", key + ".new");
  std::filesystem::rename(key + ".new", key);
  std::filesystem::rename(cert + ".new", cert);
  auto second = https_request(s.port(), ca, "GET", "/health");
  EXPECT_EQ(second.server_cn, "second") << s.log();
  EXPECT_EQ(second.response.status, 200);
  // A broken certificate: new connections keep the last good one, and the log says why.
  std::ofstream(cert) << "not a certificate";
  auto kept = https_request(s.port(), ca, "GET", "/health");
  EXPECT_EQ(kept.server_cn, "second");
  EXPECT_EQ(kept.response.status, 200);
  EXPECT_NE(s.log().find("TLS refresh: --ssl-certfile " + cert), std::string::npos) << s.log();
  make_cert("third", &ca).write(cert, key);
  EXPECT_EQ(https_request(s.port(), ca, "GET", "/health").server_cn, "third");
}

TEST(ServeTls, BadFilesAndFlagsFailTheStartNamingThem) {
  model::testing::temp_dir dir;
  const test_cert ca = make_cert("llmesh test CA");
  const test_cert a = make_cert("a", &ca), b = make_cert("b", &ca);
  a.write(dir.path() + "/a.pem", dir.path() + "/a.key");
  b.write(dir.path() + "/b.pem", dir.path() + "/b.key");
  std::ofstream(dir.path() + "/enc.key") << make_cert("c", &ca, "secret").key_pem;
  std::ofstream(dir.path() + "/junk.pem") << "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n";
  std::ofstream(dir.path() + "/both.pem") << a.cert_pem << a.key_pem;
  const std::string serve = bin + " serve --model " + model_dir + " --http 127.0.0.1:0 --rpc none ";
  const std::string d = dir.path();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--ssl-certfile " + d + "/missing.pem", "--ssl-certfile " + d + "/missing.pem: cannot read it"},
      {"--ssl-certfile " + d + "/junk.pem --ssl-keyfile " + d + "/a.key", "--ssl-certfile " + d + "/junk.pem: not a PEM certificate chain"},
      {"--ssl-certfile " + d + "/a.pem", "--ssl-certfile " + d + "/a.pem: holds no PEM private key (give --ssl-keyfile)"},
      {"--ssl-certfile " + d + "/a.pem --ssl-keyfile " + d + "/b.key", "the private key does not match the certificate"},
      {"--ssl-certfile " + d + "/a.pem --ssl-keyfile " + d + "/enc.key", "the private key is encrypted"},
      {"--ssl-keyfile " + d + "/a.key", "--ssl-keyfile needs --ssl-certfile"},
      {"--ssl-certfile " + d + "/a.pem --ssl-keyfile " + d + "/a.key --ssl-cert-reqs 2", "--ssl-cert-reqs 2 needs --ssl-ca-certs"},
      {"--ssl-certfile " + d + "/a.pem --ssl-keyfile " + d + "/a.key --ssl-ciphers NOPE", "--ssl-ciphers 'NOPE': no cipher OpenSSL knows"},
      {"--ssl-certfile " + d + "/a.pem --ssl-keyfile " + d + "/a.key --ssl-ca-certs " + d + "/junk.pem", "--ssl-ca-certs " + d + "/junk.pem: not a PEM"},
  };
  for (const auto& [flags, want] : cases) {
    auto r = run_command(serve + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.err.find(want), std::string::npos) << flags << "\n" << r.err;
    EXPECT_EQ(r.err.find("loading"), std::string::npos) << "refused before the model loads: " << r.err;
  }
  // A key inside the certificate file is taken.
  server_process s(bin, {"--model", model_dir, "--ssl-certfile", d + "/both.pem"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_EQ(https_request(s.port(), ca, "GET", "/health").response.status, 200);
}

}  // namespace
}  // namespace llmesh::testing
