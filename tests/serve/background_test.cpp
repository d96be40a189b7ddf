// `llmesh serve` over real HTTP, the Responses API's background mode: a background response
// polled to its end says what the same request says in the foreground; its stream read whole,
// and read again from a sequence number; a client that leaves mid-stream leaves it running;
// one cancelled while it waits for the replica ends cancelled and the replica serves on.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";

json post(int port, const json& body, int* status = nullptr) {
  auto r = http_request(port, "POST", "/v1/responses", body.dump());
  if (status) *status = r.status;
  auto j = json::parse(r.body, nullptr, false);
  return j.is_discarded() ? json{{"raw", r.body}} : j;
}

json get(int port, const std::string& id) {
  auto j = json::parse(http_request(port, "GET", "/v1/responses/" + id).body, nullptr, false);
  return j.is_discarded() ? json() : j;
}

/// Polls until the response is no longer queued or in progress (at most ~60 s).
json wait_for_end(int port, const std::string& id) {
  for (int i = 0; i < 6000; ++i) {
    json r = get(port, id);
    if (!r.is_object() || (r["status"] != "queued" && r["status"] != "in_progress")) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return json();
}

/// POSTs `body` to `path` on a connection of its own and reads until `until` has come; the
/// open socket (the caller closes it; -1 on failure) and what came.
std::pair<int, std::string> open_stream(int port, const std::string& path, const std::string& body, const std::string& until) {
  int fd = connect_local(port);
  if (fd < 0) return {-1, ""};
  if (!send_all(fd, "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body)) {
    close(fd);
    return {-1, ""};
  }
  std::string got;
  char buf[4096];
  while (got.find(until) == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      close(fd);
      return {-1, got};
    }
    got.append(buf, static_cast<size_t>(n));
  }
  return {fd, got};
}

std::vector<json> events(const std::string& body) {
  std::vector<json> out;
  for (const auto& p : sse_payloads(body)) out.push_back(json::parse(p));
  return out;
}

TEST(ServeBackground, PolledStreamedAndResumedAsTheForegroundAnswers) {
  server_process s(bin, {"--model", model_dir});
  ASSERT_GT(s.port(), 0) << s.log();
  const json req = {{"model", "kjv-tiny"}, {"input", "Who is the LORD?"}, {"max_output_tokens", 24}, {"temperature", 0}};
  int status = 0;
  const json fg = post(s.port(), req, &status);
  ASSERT_EQ(status, 200) << fg;
  json bg_req = req;
  bg_req["background"] = true;
  const json queued = post(s.port(), bg_req, &status);
  ASSERT_EQ(status, 200) << queued;
  EXPECT_EQ(queued["background"], true);
  EXPECT_EQ(queued["status"], "queued");  // as it was before its request went out
  const json done = wait_for_end(s.port(), queued["id"]);
  ASSERT_TRUE(done.is_object());
  EXPECT_EQ(done["status"], fg["status"]);
  EXPECT_EQ(done["output"][0]["content"][0]["text"], fg["output"][0]["content"][0]["text"]);
  EXPECT_EQ(done["usage"]["output_tokens"], fg["usage"]["output_tokens"]);

  // Streamed: the events of the foreground stream, with response.queued after the first.
  bg_req["stream"] = true;
  auto streamed = http_request(s.port(), "POST", "/v1/responses", bg_req.dump());
  ASSERT_EQ(streamed.status, 200);
  EXPECT_EQ(streamed.headers["content-type"], "text/event-stream");
  const auto all = events(streamed.body);
  ASSERT_GT(all.size(), 6u);
  EXPECT_EQ(all[1]["type"], "response.queued");
  const json final_response = all.back()["response"];
  EXPECT_EQ(final_response["output"][0]["content"][0]["text"], fg["output"][0]["content"][0]["text"]);
  const std::string id = final_response["id"];
  EXPECT_EQ(get(s.port(), id), final_response);
  // Again from after event 3: the same events from 4 on.
  auto resumed = http_request(s.port(), "GET", "/v1/responses/" + id + "?stream=true&starting_after=3");
  ASSERT_EQ(resumed.status, 200) << resumed.body;
  const auto tail = events(resumed.body);
  ASSERT_EQ(tail.size(), all.size() - 4);
  for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(tail[i], all[i + 4]);
}

TEST(ServeBackground, AClientThatLeavesMidStreamLeavesItRunning) {
  server_process s(bin, {"--model", model_dir});
  ASSERT_GT(s.port(), 0) << s.log();
  const json req = {{"model", "kjv-tiny"}, {"input", "Who"}, {"max_output_tokens", 200}, {"ignore_eos", true},
                    {"background", true}, {"stream", true}};
  // Read until the response's id has come, then hang up.
  auto [fd, got] = open_stream(s.port(), "/v1/responses", req.dump(), "\"id\":\"resp_");
  ASSERT_GE(fd, 0) << got;
  close(fd);
  const size_t at = got.find("\"id\":\"resp_") + 6;
  const std::string id = got.substr(at, got.find('"', at) - at);
  const json done = wait_for_end(s.port(), id);
  ASSERT_TRUE(done.is_object()) << id;
  EXPECT_EQ(done["status"], "incomplete");  // it ran to max_output_tokens
  EXPECT_EQ(done["usage"]["output_tokens"], 200);
  // SIGTERM stops it (not the SIGKILL after 20 s) with the background response kept: its
  // request was submitted from an HTTP worker thread, which outlives the mesh.
  EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST(ServeBackground, OneCancelledWhileItWaitsEndsCancelledAndTheReplicaServesOn) {
  // One sequence at a time: the background request waits behind a running one and two waiting.
  server_process s(bin, {"--model", model_dir, "--max-seqs", "1"});
  ASSERT_GT(s.port(), 0) << s.log();
  const json long_one = {{"model", "kjv-tiny"}, {"prompt", "Who"}, {"max_tokens", 240}, {"ignore_eos", true}};
  json streamed_one = long_one;
  streamed_one["stream"] = true;
  auto [fd, got] = open_stream(s.port(), "/v1/completions", streamed_one.dump(), "data: ");  // running once a chunk came
  ASSERT_GE(fd, 0) << got;
  std::vector<std::thread> ahead;
  std::vector<int> statuses(2, 0);
  for (size_t i = 0; i < 2; ++i) {
    ahead.emplace_back([&, i] { statuses[i] = http_request(s.port(), "POST", "/v1/completions", long_one.dump()).status; });
  }
  auto waiting = [&] {
    const std::string m = http_request(s.port(), "GET", "/metrics").body;
    const size_t at = m.find("\nllmesh_requests_waiting{");
    return at == std::string::npos ? -1 : std::atoi(m.c_str() + m.find("} ", at) + 2);
  };
  for (int i = 0; i < 2000 && waiting() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  int status = 0;
  const json queued = post(s.port(), {{"model", "kjv-tiny"}, {"input", "Who"}, {"max_output_tokens", 8}, {"background", true}}, &status);
  ASSERT_EQ(status, 200) << queued;
  EXPECT_EQ(queued["status"], "queued");
  const std::string id = queued["id"];
  auto c = http_request(s.port(), "POST", "/v1/responses/" + id + "/cancel");
  ASSERT_EQ(c.status, 200) << c.body;
  const json cancelled = json::parse(c.body);
  EXPECT_EQ(cancelled["status"], "cancelled");
  EXPECT_EQ(cancelled["background"], true);
  EXPECT_EQ(get(s.port(), id), cancelled);
  auto again = http_request(s.port(), "POST", "/v1/responses/" + id + "/cancel");
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(json::parse(again.body), cancelled);
  close(fd);
  for (auto& t : ahead) t.join();
  EXPECT_EQ(statuses, (std::vector<int>{200, 200}));
  // The replica serves on, and a background response after it ends as usual.
  const json next = post(s.port(), {{"model", "kjv-tiny"}, {"input", "Who"}, {"max_output_tokens", 4}, {"background", true}}, &status);
  ASSERT_EQ(status, 200) << next;
  EXPECT_EQ(wait_for_end(s.port(), next["id"])["status"], "incomplete");
}

}  // namespace
}  // namespace llmesh::testing
