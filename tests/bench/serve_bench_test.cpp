// `llmesh bench serve` against a real `llmesh serve` (kjv-tiny on a free port), its error
// paths through the binary, and its workload helpers (URL, arrivals, prompts).
#include "llmesh/bench/serve_bench.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/subprocess.hpp"
#include "model/temp_dir.hpp"
#include "serve/server_process.hpp"
#include "serve/tls_client.hpp"

namespace llmesh::testing {
namespace {

const std::string llmesh_bin = LLMESH_BINARY;
const std::string source_dir = LLMESH_SOURCE_DIR;

/// The one stdout line that starts with '{', parsed (null when there is none).
nlohmann::json json_line(const std::string& out) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("{")) return nlohmann::json::parse(line, nullptr, false);
  }
  return nullptr;
}

size_t count_lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(ServeBench, MeasuresARealServer) {
  server_process server(llmesh_bin, {"--model", source_dir + "/models/kjv-tiny"});
  ASSERT_NE(server.port(), 0) << server.log();
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());

  auto r = run_command(llmesh_bin + " bench serve --url " + url +
                       " --num-prompts 8 --max-concurrency 4 --input-len 16 --output-len 8");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("Serving Benchmark Result"), std::string::npos) << r.out;
  const auto j = json_line(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["model"], "kjv-tiny");
  EXPECT_EQ(j["completed"], 8);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["total_input_tokens"], 8 * 16);
  EXPECT_EQ(j["total_output_tokens"], 64);
  EXPECT_EQ(j["max_concurrency"], 4);
  EXPECT_GT(j["mean_ttft_ms"].get<double>(), 0);
  EXPECT_GT(j["mean_e2el_ms"].get<double>(), 0);
  EXPECT_GE(j["mean_e2el_ms"].get<double>(), j["mean_ttft_ms"].get<double>());
  EXPECT_GT(j["mean_tpot_ms"].get<double>(), 0);
  EXPECT_GT(j["output_throughput"].get<double>(), 0);

  // Poisson arrivals and a named model.
  r = run_command(llmesh_bin + " bench serve --url " + url +
                  "/ --model kjv-tiny --num-prompts 4 --request-rate 50 --input-len 8 --output-len 4 --seed 3");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const auto k = json_line(r.out);
  ASSERT_TRUE(k.is_object()) << r.out;
  EXPECT_EQ(k["completed"], 4);
  EXPECT_EQ(k["total_output_tokens"], 16);
  EXPECT_EQ(k["request_rate"], 50.0);

  // A request the server refuses (context too long is caught before sending; a wrong model
  // name is not): every request fails, the report still prints, the exit is non-zero.
  r = run_command(llmesh_bin + " bench serve --url " + url + " --model nope --num-prompts 2 --input-len 4 --output-len 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(count_lines(r.err), 2u) << r.err;  // the start line and the error
  EXPECT_NE(r.err.find("all 2 requests failed"), std::string::npos) << r.err;
  EXPECT_EQ(json_line(r.out)["failed"], 2) << r.out;

  r = run_command(llmesh_bin + " bench serve --url " + url + " --num-prompts 1 --input-len 250 --output-len 10");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("max_model_len 256"), std::string::npos) << r.err;
}

// Over HTTPS: the server's certificate checked against --cacert (a client trusting another CA
// fails every request before sending one; --insecure does not check).
TEST(ServeBench, MeasuresAServerOverHttps) {
  model::testing::temp_dir dir;
  const test_cert ca = make_cert("llmesh test CA");
  make_cert("server", &ca).write(dir.path() + "/cert.pem", dir.path() + "/key.pem");
  std::ofstream(dir.path() + "/ca.pem") << ca.cert_pem;
  std::ofstream(dir.path() + "/other.pem") << make_cert("another CA").cert_pem;
  server_process server(llmesh_bin, {"--model", source_dir + "/models/kjv-tiny", "--ssl-certfile", dir.path() + "/cert.pem",
                                     "--ssl-keyfile", dir.path() + "/key.pem"});
  ASSERT_NE(server.port(), 0) << server.log();
  const std::string url = "https://127.0.0.1:" + std::to_string(server.port());
  const std::string flags = " --num-prompts 6 --max-concurrency 3 --input-len 16 --output-len 8";
  auto r = run_command(llmesh_bin + " bench serve --url " + url + " --cacert " + dir.path() + "/ca.pem" + flags);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const auto j = json_line(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["total_output_tokens"], 48);
  r = run_command(llmesh_bin + " bench serve --url " + url + " --cacert " + dir.path() + "/other.pem" + flags);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cannot connect to " + url), std::string::npos) << r.err;
  r = run_command(llmesh_bin + " bench serve --url " + url + " --insecure" + flags);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(ServeBench, BadFlagsAndUnreachableServersGiveOneLine) {
  const std::string base = llmesh_bin + " bench serve --num-prompts 2 --input-len 4 --output-len 2 ";
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--url http://127.0.0.1:" + std::to_string(free_local_port()), "cannot connect"},
           {"--url ftp://x", "must start with http:// or https://"},
           {"--url https://127.0.0.1:" + std::to_string(free_local_port()), "cannot connect"},
           {"--url https://127.0.0.1:1 --cacert /nonexistent.pem", "--cacert /nonexistent.pem"},
           {"--url http://127.0.0.1:99999", "bad port"},
           {"--url http://127.0.0.1:1 --request-rate 0", "--request-rate"},
           {"--url http://127.0.0.1:1 --num-prompts 0", "--num-prompts"},
           {"--url http://127.0.0.1:1 --tokenizer-dir /nonexistent", "nonexistent"},
           {"--num-prompts x", "num-prompts"},
       }) {
    const auto r = run_command(base + args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_LT(r.exit_code, 128) << args << ": killed by a signal";
    EXPECT_EQ(count_lines(r.err), 1u) << args << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
  }
}

TEST(ParseBaseUrl, SplitsHostPortAndPrefix) {
  auto u = bench::parse_base_url("http://127.0.0.1:8080");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, "8080");
  EXPECT_EQ(u->prefix, "");
  u = bench::parse_base_url("http://example.org/api/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->port, "80");
  EXPECT_EQ(u->prefix, "/api");
  u = bench::parse_base_url("http://[::1]:9000/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, "9000");
  for (const char* bad : {"", "127.0.0.1:80", "http://", "http://:80", "http://h:", "http://h:0", "http://[::1",
                          "http://h:8x", "https://", "https://h:"}) {
    EXPECT_FALSE(bench::parse_base_url(bad).ok()) << bad;
  }
  u = bench::parse_base_url("https://h/p");
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->tls);
  EXPECT_EQ(u->port, "443");
  EXPECT_EQ(u->prefix, "/p");
}

TEST(PoissonArrivals, AreSeededExponentialGaps) {
  const auto a = bench::poisson_arrivals(20000, 10.0, 7);
  EXPECT_EQ(a[0], 0.0);
  for (size_t i = 1; i < a.size(); ++i) ASSERT_GE(a[i], a[i - 1]);
  EXPECT_NEAR(a.back() / static_cast<double>(a.size() - 1), 0.1, 0.005);  // mean gap 1/rate
  EXPECT_EQ(a, bench::poisson_arrivals(20000, 10.0, 7));
  EXPECT_NE(a, bench::poisson_arrivals(20000, 10.0, 8));
  const auto all = bench::poisson_arrivals(3, std::numeric_limits<double>::infinity(), 7);
  EXPECT_EQ(all, std::vector<double>(3, 0.0));
}

TEST(RandomPrompts, HaveExactLengthAndStayInTheVocabulary) {
  const auto p = bench::random_prompts(50, 33, 5, 1);
  ASSERT_EQ(p.size(), 50u);
  std::vector<int> seen(5, 0);
  for (const auto& ids : p) {
    ASSERT_EQ(ids.size(), 33u);
    for (int32_t t : ids) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, 5);
      ++seen[static_cast<size_t>(t)];
    }
  }
  for (int n : seen) EXPECT_GT(n, 0);
  EXPECT_EQ(p, bench::random_prompts(50, 33, 5, 1));
  EXPECT_EQ(p, bench::random_prompts(50, 33, 5, 1, 0));
}

// vLLM's --random-prefix-len: the same random ids before every prompt's own.
TEST(RandomPrompts, ShareTheirPrefix) {
  const auto p = bench::random_prompts(20, 16, 1000, 3, 40);
  ASSERT_EQ(p.size(), 20u);
  const std::vector<int32_t> prefix(p[0].begin(), p[0].begin() + 40);
  std::set<std::vector<int32_t>> tails;
  for (const auto& ids : p) {
    ASSERT_EQ(ids.size(), 56u);
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 40), prefix);
    tails.emplace(ids.begin() + 40, ids.end());
  }
  EXPECT_EQ(tails.size(), 20u);  // each its own input
  std::set<int32_t> distinct(prefix.begin(), prefix.end());
  EXPECT_GT(distinct.size(), 30u);  // random ids, not one repeated
  EXPECT_NE(bench::random_prompts(20, 16, 1000, 4, 40)[0], p[0]);
}

// vLLM's prefix repetition: several prefixes, taken in turn; one is --random-prefix-len's.
TEST(RandomPrompts, TakeSeveralPrefixesInTurn) {
  const auto p = bench::random_prompts(10, 8, 1000, 3, 24, 3);
  ASSERT_EQ(p.size(), 10u);
  auto prefix = [&](size_t i) { return std::vector<int32_t>(p[i].begin(), p[i].begin() + 24); };
  for (size_t i = 0; i < p.size(); ++i) {
    ASSERT_EQ(p[i].size(), 32u);
    EXPECT_EQ(prefix(i), prefix(i % 3)) << i;
  }
  EXPECT_NE(prefix(0), prefix(1));
  EXPECT_NE(prefix(1), prefix(2));
  EXPECT_NE(prefix(0), prefix(2));
  EXPECT_EQ(bench::random_prompts(10, 8, 1000, 3, 24, 1), bench::random_prompts(10, 8, 1000, 3, 24));
  const auto one = bench::random_prompts(1, 8, 1000, 3, 24);  // the first prefix: the single one's
  EXPECT_EQ(prefix(0), std::vector<int32_t>(one[0].begin(), one[0].begin() + 24));
}

}  // namespace
}  // namespace llmesh::testing
