// vLLM's CORS flags on `llmesh serve`, over real HTTP: with --allowed-origins a browser's
// preflight from that origin gets 200 and its headers, its completions (plain and streamed)
// carry Access-Control-Allow-Origin, another origin gets none; without the flag nothing does.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../cli/subprocess.hpp"
#include "../model/temp_dir.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;

std::string header(const http_response& r, const std::string& name) {
  auto it = r.headers.find(name);
  return it == r.headers.end() ? "(none)" : it->second;
}

TEST(ServeCors, AllowedOriginsGetTheirHeadersOthersNone) {
  model::testing::temp_dir dir;
  const std::string m = dir.path() + "/m";
  ASSERT_EQ(std::system((bin + " model random --out " + m +
                         " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --seed 4 2>/dev/null")
                            .c_str()),
            0);
  const std::string body = json({{"model", "m"}, {"prompt", "In the"}, {"max_tokens", 3}}).dump();
  json streamed = json::parse(body);
  streamed["stream"] = true;
  {
    server_process s(bin, {"--model", m, "--allowed-origins", R"(["http://ui.example"])", "--api-key", "k", "--max-body-kb", "1"});
    ASSERT_GT(s.port(), 0) << s.log();
    const std::string auth0 = "Authorization: Bearer k\r\n";
    auto pre = http_request(s.port(), "OPTIONS", "/v1/completions", "",
                            "Origin: http://ui.example\r\nAccess-Control-Request-Method: POST\r\n"
                            "Access-Control-Request-Headers: authorization, content-type\r\n");
    EXPECT_EQ(pre.status, 200) << "a preflight needs no API key: " << pre.body;
    EXPECT_EQ(header(pre, "access-control-allow-origin"), "http://ui.example");
    EXPECT_EQ(header(pre, "access-control-allow-headers"), "authorization, content-type");
    auto refused = http_request(s.port(), "OPTIONS", "/v1/completions", "",
                                "Origin: http://evil.example\r\nAccess-Control-Request-Method: POST\r\n");
    EXPECT_EQ(refused.status, 400);
    EXPECT_EQ(refused.body, "Disallowed CORS origin");
    EXPECT_EQ(header(refused, "access-control-allow-origin"), "(none)");
    // A preflight, then the request, on one kept-alive connection.
    {
      int fd = connect_local(s.port());
      ASSERT_GE(fd, 0);
      const std::string both = "OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://ui.example\r\n"
                               "Access-Control-Request-Method: POST\r\n\r\n"
                               "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nOrigin: http://ui.example\r\n"
                               "Authorization: Bearer k\r\nContent-Type: application/json\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body;
      ASSERT_TRUE(send_all(fd, both));
      const std::string raw = read_all(fd);
      close(fd);
      EXPECT_EQ(raw.rfind("HTTP/1.1 200", 0), 0u) << raw;
      const auto second = raw.find("HTTP/1.1 200", 1);
      ASSERT_NE(second, std::string::npos) << "the completion follows on the same connection: " << raw;
      EXPECT_NE(raw.find("\"text_completion\"", second), std::string::npos) << raw;
    }
    // A body over the limit: the 413 carries the origin, so the page can read it.
    auto big = http_request(s.port(), "POST", "/v1/completions", std::string(2000, ' '), auth0 + "Origin: http://ui.example\r\n");
    EXPECT_EQ(big.status, 413);
    EXPECT_EQ(header(big, "access-control-allow-origin"), "http://ui.example");
    const std::string auth = auth0;
    auto plain = http_request(s.port(), "POST", "/v1/completions", body, auth + "Origin: http://ui.example\r\n");
    EXPECT_EQ(plain.status, 200) << plain.body;
    EXPECT_EQ(header(plain, "access-control-allow-origin"), "http://ui.example");
    EXPECT_EQ(header(plain, "vary"), "Origin");
    auto stream = http_request(s.port(), "POST", "/v1/completions", streamed.dump(), auth + "Origin: http://ui.example\r\n");
    EXPECT_EQ(stream.status, 200);
    EXPECT_EQ(header(stream, "content-type"), "text/event-stream");
    EXPECT_EQ(header(stream, "access-control-allow-origin"), "http://ui.example");
    auto denied = http_request(s.port(), "POST", "/v1/completions", body, "Origin: http://ui.example\r\n");
    EXPECT_EQ(denied.status, 401);
    EXPECT_EQ(header(denied, "access-control-allow-origin"), "http://ui.example") << "errors carry it too: the page reads them";
    auto other = http_request(s.port(), "POST", "/v1/completions", body, auth + "Origin: http://evil.example\r\n");
    EXPECT_EQ(other.status, 200);
    EXPECT_EQ(header(other, "access-control-allow-origin"), "(none)");
  }
  server_process off(bin, {"--model", m});
  ASSERT_GT(off.port(), 0) << off.log();
  auto r = http_request(off.port(), "POST", "/v1/completions", body, "Origin: http://ui.example\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(header(r, "access-control-allow-origin"), "(none)") << "off unless origins are given";
  auto bad = run_command(bin + " serve --model " + m + " --http 127.0.0.1:0 --rpc none --allowed-origins '[1]'");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--allowed-origins must be a JSON list of strings"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace llmesh::testing
