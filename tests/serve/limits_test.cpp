// `llmesh serve`'s HTTP limits and lifecycle over real HTTP: the error paths (401, 404, 405,
// 413, 431, 400, 429); connections past a limit, or past one client's share, get 429; a client
// that hangs up mid-stream frees its slot; idle connections close; keep-alive works; /metrics
// passes promtool; SIGTERM stops the server cleanly. (serve_test.cpp: what it generates.)
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../cli/subprocess.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";

json completion(int port, const json& body, int* status = nullptr, const std::string& headers = "") {
  auto r = http_request(port, "POST", "/v1/completions", body.dump(), headers);
  if (status) *status = r.status;
  auto j = json::parse(r.body, nullptr, false);
  return j.is_discarded() ? json{{"raw", r.body}} : j;
}

TEST(Serve, HttpErrorPaths) {
  server_process s(bin, {"--model", model_dir, "--api-key", "k3y", "--max-body-kb", "1"});
  ASSERT_GT(s.port(), 0) << s.log();
  const std::string auth = "Authorization: Bearer k3y\r\n";
  const json ok_body = {{"model", "kjv-tiny"}, {"prompt", "Let there be"}, {"max_tokens", 2}};
  int status = 0;
  auto j = completion(s.port(), ok_body, &status);
  EXPECT_EQ(status, 401);
  EXPECT_EQ(j["error"]["type"], "authentication_error");
  completion(s.port(), ok_body, &status, auth);
  EXPECT_EQ(status, 200);
  j = completion(s.port(), {{"model", "nope"}, {"prompt", "x"}}, &status, auth);
  EXPECT_EQ(status, 404);
  EXPECT_EQ(j["error"]["code"], "not_found");
  EXPECT_EQ(http_request(s.port(), "GET", "/v1/nothing", "", auth).status, 404);
  EXPECT_EQ(http_request(s.port(), "DELETE", "/v1/completions", "", auth).status, 405);
  j = completion(s.port(), {{"model", "kjv-tiny"}, {"prompt", "x"}, {"temperature", "hot"}}, &status, auth);
  EXPECT_EQ(status, 400);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("temperature"), std::string::npos);
  EXPECT_EQ(http_request(s.port(), "POST", "/v1/completions", std::string(2000, ' '), auth).status, 413);
  EXPECT_EQ(http_request(s.port(), "GET", "/health", "", "X-Big: " + std::string(20000, 'a') + "\r\n").status, 431);
  int fd = connect_local(s.port());
  ASSERT_TRUE(send_all(fd, "NONSENSE\r\n\r\n"));
  EXPECT_EQ(parse_response(read_all(fd, 10)).status, 400);
  close(fd);
  // The server is still healthy after all of that.
  EXPECT_EQ(http_request(s.port(), "GET", "/health").status, 200);
}

/// Opens a streaming request (n choices) and reads until its first chunk arrived; returns the socket.
int start_stream(int port, int max_tokens, int n = 1) {
  int fd = connect_local(port);
  const std::string body = json{{"model", "kjv-tiny"}, {"prompt", "And God said"}, {"max_tokens", max_tokens},
                                {"ignore_eos", true}, {"stream", true}, {"n", n}}.dump();
  send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return fd;
}

TEST(Serve, OverloadAnswers429AndAHangUpFreesTheSlot) {
  // One slot and a slow client (1-token steps cannot outrun a stream we do not read fast).
  server_process s(bin, {"--model", model_dir, "--max-concurrent", "1"});
  ASSERT_GT(s.port(), 0) << s.log();
  int fd = start_stream(s.port(), 250);
  auto busy = http_request(s.port(), "POST", "/v1/completions", R"({"model":"kjv-tiny","prompt":"x","max_tokens":1})");
  EXPECT_EQ(busy.status, 429);
  EXPECT_EQ(busy.headers["retry-after"], "1");
  close(fd);  // the client goes away mid-stream
  int status = 0;
  for (int i = 0; i < 100 && status != 200; ++i) {
    completion(s.port(), {{"model", "kjv-tiny"}, {"prompt", "x"}, {"max_tokens", 1}}, &status);
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status, 200);
  auto metrics = http_request(s.port(), "GET", "/metrics").body;
  EXPECT_NE(metrics.find("llmesh_requests_total{status=\"429\"}"), std::string::npos);
}

// A request's choices take a slot each, and a client that hangs up frees them all.
TEST(Serve, ChoicesTakeASlotEachAndAHangUpFreesThemAll) {
  server_process s(bin, {"--model", model_dir, "--max-concurrent", "3"});
  ASSERT_GT(s.port(), 0) << s.log();
  int fd = start_stream(s.port(), 250, 2);
  const json two = {{"model", "kjv-tiny"}, {"prompt", "x"}, {"max_tokens", 1}, {"n", 2}};
  int status = 0;
  auto j = completion(s.port(), two, &status);  // 2 choices, 1 slot free: refused whole
  EXPECT_EQ(status, 429) << j;
  close(fd);
  for (int i = 0; i < 100 && status != 200; ++i) {
    j = completion(s.port(), {{"model", "kjv-tiny"}, {"prompt", "x"}, {"max_tokens", 1}, {"n", 3}}, &status);
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status, 200) << j;
  EXPECT_EQ(j["choices"].size(), 3u) << j;
}

TEST(Serve, KeepAliveIdleTimeoutMetricsAndCleanStop) {
  server_process s(bin, {"--model", model_dir, "--idle-timeout", "1"});
  ASSERT_GT(s.port(), 0) << s.log();
  // Two requests on one connection, then the idle timeout closes it.
  int fd = connect_local(s.port());
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(send_all(fd, get + get));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string both = read_all(fd, 10);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));  // closed by the server, not us
  size_t count = 0;
  for (size_t at = 0; (at = both.find("HTTP/1.1 200", at)) != std::string::npos; ++at) ++count;
  EXPECT_EQ(count, 2u);
  close(fd);

  completion(s.port(), {{"model", "kjv-tiny"}, {"prompt", "Let there be"}, {"max_tokens", 4}});
  const std::string metrics = http_request(s.port(), "GET", "/metrics").body;
  for (const char* name : {"llmesh_time_to_first_token_seconds_count 1", "llmesh_generation_tokens_total 4",
                           "llmesh_replicas_ready 1", "llmesh_kv_cache_usage_ratio{replica="}) {
    EXPECT_NE(metrics.find(name), std::string::npos) << name;
  }
  if (std::system("command -v promtool > /dev/null") == 0) {
    temp_dir tmp;
    std::ofstream(tmp.path() + "/m.txt") << metrics;
    auto check = run_command("promtool check metrics < " + tmp.path() + "/m.txt");
    EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  }
  EXPECT_EQ(s.stop(), 0);
  EXPECT_NE(s.log().find("llmesh: stopped"), std::string::npos) << s.log();
}

/// What a connection opened past a connection limit gets: sends a request, reads to the close.
http_response over_the_limit(int port) {
  int c = connect_local(port);
  if (c < 0) return {};
  send_all(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  auto r = parse_response(read_all(c, 10));
  close(c);
  return r;
}

/// A 429 refusal of a connection, shaped as DESIGN.md §HTTP asks; `limit` is named in the message.
void expect_connection_refusal(const http_response& r, const std::string& limit) {
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.headers.count("retry-after") ? r.headers.at("retry-after") : "", "1");
  EXPECT_EQ(r.headers.count("connection") ? r.headers.at("connection") : "", "close");
  auto j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.body;
  EXPECT_EQ(j["error"]["type"], "rate_limit_error");
  EXPECT_EQ(j["error"]["code"], "overloaded");
  EXPECT_NE(j["error"]["message"].get<std::string>().find(limit + " open connections"), std::string::npos) << r.body;
}

TEST(Serve, OverTheConnectionLimitANewConnectionGets429) {
  server_process s(bin, {"--model", model_dir, "--max-connections", "2"});
  ASSERT_GT(s.port(), 0) << s.log();
  // Two idle connections take every slot: the next one is answered 429 at once and closed.
  int a = connect_local(s.port()), b = connect_local(s.port());
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // both accepted
  for (int i = 0; i < 3; ++i) expect_connection_refusal(over_the_limit(s.port()), "2");
  // A client that only connects and reads (sends nothing) gets the same answer: nothing is read first.
  int quiet = connect_local(s.port());
  ASSERT_GE(quiet, 0);
  expect_connection_refusal(parse_response(read_all(quiet, 10)), "2");
  close(quiet);
  // The held connections still work; a freed slot serves again, and the refusals were counted.
  ASSERT_TRUE(send_all(a, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  EXPECT_NE(read_all(a, 10).find("HTTP/1.1 200"), std::string::npos);
  close(a);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the server saw the close
  auto metrics = http_request(s.port(), "GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("llmesh_requests_total{status=\"429\"} 4"), std::string::npos) << metrics.body;
  close(b);
  EXPECT_EQ(s.stop(), 0);
}

TEST(Serve, OneClientCannotHoldMoreThanItsShareOfConnections) {
  server_process s(bin, {"--model", model_dir, "--max-connections-per-client", "2"});
  ASSERT_GT(s.port(), 0) << s.log();
  // Two idle connections from this address hold its share: a third is answered 429 and closed.
  int a = connect_local(s.port()), b = connect_local(s.port());
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // both accepted
  expect_connection_refusal(over_the_limit(s.port()), "2");
  // The held connections still work, and a freed slot is usable again.
  ASSERT_TRUE(send_all(a, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  EXPECT_NE(read_all(a, 10).find("HTTP/1.1 200"), std::string::npos);
  close(a);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the server saw the close
  EXPECT_EQ(http_request(s.port(), "GET", "/health").status, 200);
  close(b);
  EXPECT_EQ(s.stop(), 0);
}

}  // namespace
}  // namespace llmesh::testing
