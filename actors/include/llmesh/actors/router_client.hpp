// The gateway's side of a mesh whose router lives in an actor system the caller owns: each
// submitted request becomes a request actor that routes through `router` (DESIGN.md §3). Used
// by the in-process mesh (local_mesh) and by a gateway node of a multi-process mesh, where the
// router's replicas are proxies of remote ones.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <caf/all.hpp>

#include "llmesh/actors/local_mesh.hpp"
#include "llmesh/actors/route_table.hpp"

namespace llmesh::actors {

/// Thread affinity: any thread. Must be destroyed before its actor system; destruction stops
/// the request actors still running (their sinks get nothing more).
class router_client final : public mesh_client {
 public:
  /// `ready`: what the router publishes (router_options::ready). Requests go to the replicas of
  /// their `model`.
  router_client(caf::actor_system& sys, caf::actor router, std::shared_ptr<const ready_counts> ready,
                size_t max_migrations, metrics_registry* metrics);
  ~router_client() override;
  router_client(const router_client&) = delete;
  router_client& operator=(const router_client&) = delete;

  void submit(replica_request r, token_sink sink) override;
  void cancel(uint64_t id) override;
  size_t ready_replicas() const override { return ready_->total(); }
  size_t ready_replicas(std::string_view model) const override { return ready_->of(model); }
  /// Requests in flight (submitted, not yet finished or cancelled).
  size_t inflight() const;
  /// How long a request waits for a prefill replica's blocks before its replica computes the
  /// prompt (request_options::prefill_timeout). Set before the first submit.
  void set_prefill_timeout(std::chrono::milliseconds t) { prefill_timeout_ = t; }
  /// A gateway node: runtime LoRA updates go through its node agent to the coordinator, which
  /// applies them on every node of the model's replicas (node_agent.hpp, lora_atom). Set before
  /// the gateway serves.
  void set_lora_agent(caf::actor agent, std::chrono::milliseconds timeout = std::chrono::seconds(120));
  bool runtime_lora() const override { return static_cast<bool>(lora_agent_); }
  [[nodiscard]] status load_lora(std::string_view model, const model::lora_source& src) override;
  [[nodiscard]] status unload_lora(std::string_view model, std::string_view name) override;
  /// Through the router (router_actor's reset_atom): the replicas it knows, here and elsewhere.
  [[nodiscard]] result<size_t> reset_prefix_cache() override;

 private:
  status lora_update(bool load, std::string_view model, std::string_view name, std::string_view path);
  struct live;  ///< shared with the sinks, which may run after this object is gone
  caf::actor_system& sys_;
  caf::actor router_;
  std::shared_ptr<const ready_counts> ready_;
  size_t max_migrations_;
  metrics_registry* metrics_;
  std::shared_ptr<live> live_;
  caf::actor lora_agent_;
  std::chrono::milliseconds lora_timeout_{120000};
  std::chrono::milliseconds prefill_timeout_{60000};
};

}  // namespace llmesh::actors
