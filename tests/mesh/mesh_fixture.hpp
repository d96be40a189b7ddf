// What the mesh tests share: `llmesh node` processes, a cluster config of the repository on
// free ports, `llmesh ctl` in JSON, greedy completions through the gateway, and a steady load
// of clients that checks every answer.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <mutex>
#include <sstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "../cli/subprocess.hpp"
#include "../serve/reference.hpp"
#include "../serve/server_process.hpp"

namespace llmesh::testing {

inline const std::string bin = LLMESH_BINARY;
inline const std::string source_dir = LLMESH_SOURCE_DIR;
inline const std::string model_dir = source_dir + "/models/kjv-tiny";

/// A `llmesh node` process (stderr collected; SIGTERM, then SIGKILL, when destroyed).
struct node_process : child_process {
  explicit node_process(const std::vector<std::string>& args) : child_process(argv(args)) {}
  static std::vector<std::string> argv(const std::vector<std::string>& args) {
    std::vector<std::string> all{bin, "node"};
    all.insert(all.end(), args.begin(), args.end());
    return all;
  }
};

/// A cluster config of the repository (local.yaml unless named) with every port replaced by a
/// free one and the model path made absolute.
struct mesh_files {
  temp_dir dir;
  std::string config;
  std::string token_;
  int seed_port = 0, http_port = 0;

  /// `failure_timeout`: a replacement for local.yaml's failure_timeout_ms line, if given.
  explicit mesh_files(const std::string& failure_timeout = "")
      : mesh_files("local.yaml", {"7100", "7101", "7102", "8080", "8081"}, "local-dev-token-change-me", failure_timeout) {}
  /// `ports`: the file's seed, two more mesh ports, HTTP and RPC, in that order.
  mesh_files(const std::string& file, const std::array<std::string, 5>& ports, std::string token,
             const std::string& failure_timeout = "")
      : token_(std::move(token)) {
    std::ifstream in(source_dir + "/cluster-configs/" + file);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string yaml = ss.str();
    if (!failure_timeout.empty()) yaml = std::regex_replace(yaml, std::regex("failure_timeout_ms: 3000"), failure_timeout);
    // Five different ports (the system may hand the same free port out twice in a row).
    std::set<int> taken;
    auto fresh = [&] {
      int p = free_local_port();
      while (!taken.insert(p).second) p = free_local_port();
      return p;
    };
    seed_port = fresh();
    http_port = fresh();
    const std::map<std::string, int> moved{{ports[0], seed_port}, {ports[1], fresh()}, {ports[2], fresh()},
                                           {ports[3], http_port}, {ports[4], fresh()}};
    for (const auto& [from, to] : moved) yaml = std::regex_replace(yaml, std::regex("127\\.0\\.0\\.1:" + from), "127.0.0.1:" + std::to_string(to));
    yaml = std::regex_replace(yaml, std::regex("path: models/kjv-tiny"), "path: " + model_dir);
    config = dir.path() + "/" + file;
    std::ofstream(config) << yaml;
  }
  /// Adds a second gateway node (with its own router) to the config; returns its HTTP port.
  int add_gateway(const std::string& name) {
    std::ifstream in(config);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string yaml = ss.str();
    const int http = free_local_port();
    const std::string entry = "  - name: " + name + "\n    roles: [gateway, router]\n    listen: 127.0.0.1:" +
                              std::to_string(free_local_port()) + "\n    http: 127.0.0.1:" + std::to_string(http) + "\n\n";
    yaml.insert(yaml.find("\n# The models the mesh serves.") + 1, entry);
    std::ofstream(config) << yaml;
    return http;
  }
  /// Replaces the first `from` in the config with `to` (the text must be there).
  void rewrite(const std::string& from, const std::string& to) {
    std::ifstream in(config);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string yaml = ss.str();
    const size_t at = yaml.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    yaml.replace(at, from.size(), to);
    std::ofstream(config) << yaml;
  }
  std::vector<std::string> node(const std::string& name) const { return {"--config", config, "--name", name}; }
  std::string token() const { return token_; }
};

inline nlohmann::json ctl_json(const mesh_files& m, const std::string& command) {
  auto r = run_command(bin + " ctl --config " + m.config + " --json " + command);
  if (r.exit_code != 0) return nlohmann::json{{"error", r.err}};
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  return j.is_discarded() ? nlohmann::json{{"error", r.out}} : j;
}

/// Waits (up to a minute) until the coordinator's replica list satisfies `pred`.
inline bool wait_replicas(const mesh_files& m, const std::function<bool(const nlohmann::json&)>& pred, nlohmann::json* last) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    *last = ctl_json(m, "replicas");
    if (last->is_array() && pred(*last)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

inline size_t count_ready(const nlohmann::json& replicas, const std::string& node = "") {
  size_t n = 0;
  for (const auto& r : replicas) n += r["phase"] == "ready" && (node.empty() || r["node"] == node);
  return n;
}

/// local.yaml's three processes; ready() waits until the gateway serves and each replica node
/// has its replica.
struct three_nodes {
  node_process seed, a, b;
  /// `a_flags`: more flags for replica-a's process.
  explicit three_nodes(const mesh_files& m, const std::vector<std::string>& a_flags = {})
      : seed(m.node("seed")), a(with(m.node("replica-a"), a_flags)), b(m.node("replica-b")) {}
  static std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }
  ::testing::AssertionResult ready(const mesh_files& m) {
    if (!seed.wait_for("serving 'kjv-tiny' on http://")) return ::testing::AssertionFailure() << seed.log();
    nlohmann::json reps;
    if (!wait_replicas(m, [](const nlohmann::json& j) {
          return count_ready(j, "replica-a") == 1 && count_ready(j, "replica-b") == 1;
        }, &reps)) {
      return ::testing::AssertionFailure() << reps.dump() << "\n" << seed.log() << a.log() << b.log();
    }
    return ::testing::AssertionSuccess();
  }
};

/// A node added at run time (`--join`), with a replica role.
inline node_process joiner(const mesh_files& m, const std::string& name, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"--join", "127.0.0.1:" + std::to_string(m.seed_port), "--name", name, "--listen",
                                "127.0.0.1:" + std::to_string(free_local_port()), "--token", m.token()};
  args.insert(args.end(), extra.begin(), extra.end());
  return node_process(args);
}

inline std::vector<int32_t> generate_ids(const std::vector<int32_t>& prompt, int max_tokens, const std::string& extra = "") {
  return testing::generate_ids(bin, model_dir, "--prompt-ids " + id_list(prompt) + extra, max_tokens);
}

/// One greedy completion through the gateway: its token ids, or empty with `why` set.
inline std::vector<int32_t> complete(int port, const std::vector<int32_t>& prompt, int max_tokens, std::string* why) {
  nlohmann::json body{{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
                      {"ignore_eos", true}, {"return_token_ids", true}};
  auto r = http_request(port, "POST", "/v1/completions", body.dump());
  if (r.status != 200) {
    *why = std::to_string(r.status) + " " + r.body;
    return {};
  }
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded()) {
    *why = "bad JSON: " + r.body;
    return {};
  }
  return j["choices"][0]["token_ids"].get<std::vector<int32_t>>();
}

inline double metric_value(int port, const std::string& series) {
  auto r = http_request(port, "GET", "/metrics");
  const auto at = r.body.find("\n" + series + " ");  // a sample line, not the # HELP line
  return at == std::string::npos ? 0.0 : std::atof(r.body.c_str() + at + series.size() + 2);
}

/// The sum of every labelled sample of `name` (`name{...} value` lines).
inline double metric_sum(int port, const std::string& name) {
  const std::string body = http_request(port, "GET", "/metrics").body;
  const std::string series = "\n" + name + "{";
  double sum = 0;
  for (size_t at = body.find(series); at != std::string::npos; at = body.find(series, at + 1)) {
    sum += std::atof(body.c_str() + body.find("} ", at) + 2);
  }
  return sum;
}

/// Clients sending greedy completions in a loop, checking every answer against `want`.
struct load {
  load(int port_, const std::vector<std::vector<int32_t>>& prompts_, const std::vector<std::vector<int32_t>>& want_, int max_tokens_)
      : port(port_), prompts(prompts_), want(want_), max_tokens(max_tokens_) {}
  int port;
  const std::vector<std::vector<int32_t>>& prompts;
  const std::vector<std::vector<int32_t>>& want;
  int max_tokens;
  std::atomic<bool> stop{false};
  std::atomic<size_t> done{0}, failed{0}, wrong{0};
  std::mutex mu;
  std::string first_failure;
  std::vector<std::thread> clients;
  std::array<std::atomic<int64_t>, 16> started{};  ///< per client: when its request began (ms), 0 between
  std::atomic<int64_t> total_ms{0};                 ///< summed request latency

  int64_t mean_ms() const { return done ? total_ms / static_cast<int64_t>(done) : 0; }

  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  /// Whether some client's request has been running for longer than `ms`.
  bool some_request_older_than(int64_t ms) const {
    for (const auto& s : started) {
      const int64_t t = s.load();
      if (t != 0 && now_ms() - t > ms) return true;
    }
    return false;
  }
  void start(int n) {
    for (int c = 0; c < n && c < 16; ++c) {
      clients.emplace_back([this, c] {
        for (size_t i = static_cast<size_t>(c); !stop; ++i) {
          std::string why;
          const size_t k = i % prompts.size();
          const int64_t t0 = now_ms();
          started[static_cast<size_t>(c)] = t0;
          auto got = complete(port, prompts[k], max_tokens, &why);
          started[static_cast<size_t>(c)] = 0;
          total_ms += now_ms() - t0;
          if (got.empty()) {
            ++failed;
            std::lock_guard l(mu);
            if (first_failure.empty()) first_failure = why;
          } else if (got != want[k]) {
            ++wrong;
          }
          ++done;
        }
      });
    }
  }
  /// Lets at least `n` more requests finish (or 30 s pass).
  void more(size_t n) {
    const size_t before = done;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (done < before + n && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  void finish() {
    stop = true;
    for (auto& t : clients) t.join();
    clients.clear();
  }
  ~load() { finish(); }
};

}  // namespace llmesh::testing
