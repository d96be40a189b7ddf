// A tiny random model, engines over it, a mixed set of requests (shared system prompt,
// greedy and sampled, some with EOS ids) and what model::generate gives each one alone: the
// reference the replica tests compare with.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include <caf/all.hpp>

#include "../model/temp_dir.hpp"
#include "llmesh/actors/replica_core.hpp"
#include "llmesh/actors/token_stream.hpp"
#include "llmesh/model/generate.hpp"
#include "llmesh/model/random_model.hpp"

namespace llmesh::actors::testing {

/// Submits `reqs` to `rc` and steps it until idle: each request's tokens, in order.
inline std::map<uint64_t, std::vector<int32_t>> serve_tokens(replica_core& rc, const std::vector<replica_request>& reqs) {
  std::map<uint64_t, std::vector<int32_t>> out;
  for (const auto& r : reqs) EXPECT_TRUE(rc.submit(r).ok());
  for (int guard = 0; !rc.idle() && guard < 10000; ++guard) {
    auto ev = rc.step();
    EXPECT_TRUE(ev.ok()) << (ev.ok() ? "" : ev.err().message);
    if (!ev.ok()) break;
    for (const auto& e : *ev) out[e.id].push_back(e.token);
  }
  EXPECT_TRUE(rc.idle());
  return out;
}

class replica_test_base : public ::testing::Test {
 protected:
  void SetUp() override {
    model::random_model_spec spec;
    spec.hidden = 64;
    spec.intermediate = 128;
    spec.n_layers = 2;
    spec.n_heads = 4;
    spec.n_kv_heads = 2;
    spec.vocab = 300;
    spec.max_positions = 512;
    spec.seed = 5;
    ASSERT_TRUE(model::write_random_model(spec, dir_.path()).ok());
    auto m = model::model::load(dir_.path());
    ASSERT_TRUE(m.ok());
    model_ = *m;
  }

  std::unique_ptr<model::engine> engine(int tp, size_t kv_tokens) {
    model::engine_options o;
    o.tp = tp;
    o.threads = 2;
    o.kv_tokens = kv_tokens;
    o.block_size = 8;
    auto e = model::engine::create(model_, o);
    EXPECT_TRUE(e.ok());
    return std::move(*e);
  }

  std::vector<replica_request> requests(size_t n) {
    std::mt19937 rng(99);
    std::vector<int32_t> shared(24);  // a system prompt several requests share (prefix cache)
    for (auto& t : shared) t = static_cast<int32_t>(rng() % 300);
    std::vector<replica_request> out;
    for (uint64_t id = 0; id < n; ++id) {
      replica_request r;
      r.id = id;
      if (id % 3 == 0) r.prompt = shared;
      const size_t extra = 1 + rng() % 40;
      for (size_t i = 0; i < extra; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % 300));
      r.max_tokens = 1 + rng() % 24;
      if (id % 2 == 1) {  // sampled requests
        r.sampling.temperature = 0.9f;
        r.sampling.top_k = 20;
        r.sampling.top_p = 0.95f;
      }
      r.sampling.seed = 1000 + id;
      if (id % 5 == 4) r.eos_ids = {7, 8, 9, 10, 11, 12, 13, 14};
      out.push_back(r);
    }
    return out;
  }

  /// What generate() produces for each request alone, on a fresh engine.
  std::map<uint64_t, std::vector<int32_t>> alone(const std::vector<replica_request>& reqs, int tp) {
    auto e = engine(tp, 512);
    std::map<uint64_t, std::vector<int32_t>> out;
    for (const auto& r : reqs) {
      model::generate_request g;
      g.prompt = r.prompt;
      g.max_tokens = r.max_tokens;
      g.sampling = r.sampling;
      g.stop_ids = r.eos_ids;
      g.logit_bias = r.logit_bias;
      g.lora = model_->loras().find(r.lora).first;  // -1 for none
      EXPECT_TRUE(r.lora.empty() || g.lora >= 0) << r.lora;
      auto res = model::generate(*e, g);
      EXPECT_TRUE(res.ok());
      out[r.id] = res->tokens;
    }
    return out;
  }

  model::testing::temp_dir dir_;
  std::shared_ptr<const model::model> model_;
};

/// Kills the actors it holds when it goes out of scope. Declare it after their actor system, so
/// that it runs first: an actor system's destructor waits for every running actor, so a failed
/// ASSERT (an early return) would otherwise hang the test instead of failing it.
class actor_reaper {
 public:
  actor_reaper() = default;
  actor_reaper(const actor_reaper&) = delete;
  actor_reaper& operator=(const actor_reaper&) = delete;
  ~actor_reaper() {
    for (const auto& a : actors_) caf::anon_send_exit(a, caf::exit_reason::kill);
  }
  const caf::actor& operator()(const caf::actor& a) {
    actors_.push_back(a);
    return a;
  }

 private:
  std::vector<caf::actor> actors_;
};

/// Collects request streams from sinks called on actor threads.
struct collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, token_msg> ends;

  token_sink sink() {
    return [this](const token_msg& t) {
      std::lock_guard lock(mu);
      if (!t.failed) tokens[t.id].push_back(t.token);
      if (t.failed || t.finish != finish_reason::none) ends[t.id] = t;
      cv.notify_all();
    };
  }
  /// Waits (up to a minute) until pred() holds, evaluated under the lock.
  bool wait(const std::function<bool()>& pred) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60), pred);
  }
  bool wait_ends(size_t n) {
    return wait([&] { return ends.size() >= n; });
  }
  size_t count(uint64_t id) {
    std::lock_guard lock(mu);
    return tokens[id].size();
  }
  /// "id: tokens[, ended|failed: why]" per request, for a failed wait's message.
  std::string describe() {
    std::lock_guard lock(mu);
    std::string out;
    for (const auto& [id, t] : tokens) {
      out += std::to_string(id) + ": " + std::to_string(t.size()) + " tokens";
      if (auto e = ends.find(id); e != ends.end()) out += e->second.failed ? ", failed: " + e->second.err.message : ", ended";
      out += "\n";
    }
    return out;
  }
};

}  // namespace llmesh::actors::testing
