// Beam search through the in-process mesh (api_service → local_mesh: router, replicas,
// request actors) with the bundled model: a replica killed mid-search is invisible in the
// response — every choice's tokens, text and log-probabilities are those of the search on a
// mesh that lost nothing — and so is the replica count.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "llmesh/actors/local_mesh.hpp"
#include "llmesh/gateway/api_service.hpp"
#include "llmesh/actors/serving_metrics.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;
const std::string dir = LLMESH_SOURCE_DIR "/models/kjv-tiny";

/// Runs a job as http_server's run_job does (without a socket): submits its requests and
/// each follow-up the group hands out, feeds it every message, returns the reply.
http_reply run(actors::mesh_client& mesh, generation_job& job) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<actors::token_msg> queue;
  auto submit = [&](actors::replica_request r) {
    mesh.submit(std::move(r), [&](const actors::token_msg& t) {
      std::lock_guard lock(mu);
      queue.push_back(t);
      cv.notify_one();
    });
  };
  for (auto& r : job.requests) submit(std::move(r));
  auto& out = *job.output;
  for (auto& r : out.take_submissions()) submit(std::move(r));
  while (!out.done()) {
    actors::token_msg t;
    {
      std::unique_lock lock(mu);
      if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return !queue.empty(); })) {
        ADD_FAILURE() << "no message for 60 s";
        break;
      }
      t = queue.front();
      queue.pop_front();
    }
    out.on_message(t);
    for (auto& r : out.take_submissions()) submit(std::move(r));
  }
  return out.reply();
}

class BeamFailover : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = model::model::load(dir);
    ASSERT_TRUE(m.ok()) << m.err().message;
    model_ = *m;
  }
  std::unique_ptr<actors::local_mesh> mesh(int replicas) {
    actors::mesh_options o;
    o.replicas = replicas;
    o.engine.threads = 1;
    o.engine.block_size = 8;
    o.model_name = "kjv";
    auto m = actors::local_mesh::create(model_, o, &metrics_);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
    return m.ok() ? std::move(*m) : nullptr;
  }
  /// `ready`: replicas that must be ready first (a replica still starting takes no step request,
  /// so a kill there would catch none: on a busy machine that was every kill point).
  json search(actors::local_mesh& m, const std::string& body, size_t ready = 1) {
    auto t = model::tokenizer::load(dir);
    auto c = model::load_config(dir);
    EXPECT_TRUE(t.ok() && c.ok());
    api_options o;
    o.model_name = "kjv";
    api_service api(o, *t, std::nullopt, *c, m, metrics_);
    for (int i = 0; i < 3000 && m.ready_replicas() < ready; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto outcome = api.handle("POST", "/v1/completions", "", body);
    if (!std::holds_alternative<generation_job>(outcome)) {
      ADD_FAILURE() << std::get<http_reply>(outcome).body;
      return {};
    }
    const http_reply r = run(m, std::get<generation_job>(outcome));
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
  }
  static inline std::shared_ptr<const model::model> model_;
  actors::metrics_registry metrics_;
};

TEST_F(BeamFailover, AReplicaKilledMidSearchIsInvisibleInTheBeams) {
  const std::string body = R"({"model":"kjv","prompt":["In the beginning God created","Blessed are the"],)"
                           R"("max_tokens":12,"n":3,"use_beam_search":true,"logprobs":2,"return_token_ids":true,)"
                           R"("ignore_eos":true})";
  auto whole = mesh(1);
  ASSERT_TRUE(whole);
  const json want = search(*whole, body);
  ASSERT_EQ(want["choices"].size(), 6u) << want;

  // A replica that dies between two steps holds no request: retried at other points until
  // one death caught step requests in flight (nearly always the first).
  for (int64_t after : {8, 5, 11, 3, 14}) {
    auto m = mesh(2);
    ASSERT_TRUE(m);
    const double before = metrics_.get_counter(actors::metric::migrations)->value();
    m->kill_replica(0, after);  // dies a few steps into the search, its step requests move on
    const json got = search(*m, body, 2);
    ASSERT_EQ(got["choices"].size(), 6u) << got;
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(got["choices"][i]["token_ids"], want["choices"][i]["token_ids"]) << i;
      EXPECT_EQ(got["choices"][i]["text"], want["choices"][i]["text"]) << i;
      EXPECT_EQ(got["choices"][i]["logprobs"], want["choices"][i]["logprobs"]) << i;
    }
    EXPECT_EQ(got["usage"], want["usage"]);
    if (metrics_.get_counter(actors::metric::migrations)->value() > before) return;
  }
  ADD_FAILURE() << "no kill point caught a step request in flight";
}

}  // namespace
}  // namespace llmesh::gateway
