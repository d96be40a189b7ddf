// What the api_service tests share: a mesh that only records (ready replicas as told), the
// bundled tiny model as a gateway serves it, and a gateway with an API key and 2 slots.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "llmesh/gateway/api_service.hpp"

// Not in an anonymous namespace: the fixture is one class in both files (gtest wants one per suite).
namespace llmesh::gateway {

struct fake_mesh : actors::mesh_client {
  void submit(actors::replica_request, actors::token_sink) override {}
  void cancel(uint64_t) override {}
  size_t ready_replicas() const override { return ready; }
  size_t ready_replicas(std::string_view model) const override {
    auto it = ready_of.find(std::string(model));
    return it == ready_of.end() ? ready : it->second;
  }
  result<size_t> reset_prefix_cache() override {
    ++resets;
    if (!can_reset) return mesh_client::reset_prefix_cache();  // the default: unsupported
    return size_t{3};
  }
  size_t ready = 1;
  std::map<std::string, size_t> ready_of;  ///< per model, where set
  bool can_reset = true;
  size_t resets = 0;
};

/// A pooling request's end, as a replica sends it: its vector (an embedding, or a classifier's logits).
inline actors::token_msg end_of(uint64_t id, std::vector<float> v) {
  actors::token_msg t;
  t.id = id;
  t.finish = actors::finish_reason::length;
  t.embedding = std::move(v);
  return t;
}

/// The bundled tiny model as a gateway serves it, named `name`.
inline served_model kjv_tiny(const std::string& name) {
  const std::string dir = LLMESH_SOURCE_DIR "/models/kjv-tiny";
  auto t = model::tokenizer::load(dir);
  auto c = model::load_config(dir);
  auto chat = model::chat_template::load(dir);
  if (!(t.ok() && c.ok() && chat.ok())) {
    ADD_FAILURE() << "models/kjv-tiny did not load";
    return {name, nullptr, std::nullopt, {}};
  }
  return {name, *t, *chat, *c};
}

/// An api_service over `mesh` serving the bundled tiny model as "m" with `o`'s other options;
/// `tok` gets its tokenizer. nullptr when the model did not load.
inline std::unique_ptr<api_service> kjv_service(api_options o, actors::mesh_client& mesh, actors::metrics_registry& metrics,
                                                std::shared_ptr<const model::tokenizer>& tok) {
  served_model m = kjv_tiny("m");
  tok = m.tok;
  if (!m.tok) return nullptr;
  o.model_name = "m";
  return std::make_unique<api_service>(o, std::vector{std::move(m)}, mesh, metrics);
}

class ApiService : public ::testing::Test {
 protected:
  void SetUp() override {
    served_model m = kjv_tiny("kjv");
    ASSERT_TRUE(m.tok);
    cfg_ = m.cfg;
    api_options o;
    o.model_name = "kjv";
    o.api_key = "sekret";
    o.max_concurrent = 2;
    api_ = std::make_unique<api_service>(o, m.tok, m.chat, cfg_, mesh_, metrics_);
  }
  api_outcome call(const std::string& method, const std::string& path, const std::string& body = "",
                   const std::string& auth = "Bearer sekret") {
    return api_->handle(method, path, auth, body);
  }
  static int status(const api_outcome& o) {
    return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o).status : 0;
  }
  static generation_job& job(api_outcome& o) { return std::get<generation_job>(o); }
  /// The mesh request of a job's first (for n = 1: only) choice.
  static actors::replica_request& req(api_outcome& o) { return job(o).requests.at(0); }

  fake_mesh mesh_;
  actors::metrics_registry metrics_;
  model::model_config cfg_;
  std::unique_ptr<api_service> api_;
};

}  // namespace llmesh::gateway
