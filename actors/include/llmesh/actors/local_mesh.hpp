// The mesh in one process (`llmesh serve`): a CAF actor system with one router and N replica
// actors, each replica over its own engine (a tensor-parallel group), and a request actor per
// submitted request. The gateway sees only `mesh_client` — plain C++, no CAF — so the HTTP
// layer is tested against a fake and the multi-process mesh can implement the same interface.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "llmesh/actors/balancer.hpp"
#include "llmesh/actors/batch_scheduler.hpp"
#include "llmesh/actors/metrics.hpp"
#include "llmesh/actors/replica_core.hpp"
#include "llmesh/actors/token_stream.hpp"
#include "llmesh/model/engine.hpp"

namespace llmesh::actors {

/// What the gateway needs from a mesh. Thread affinity: any thread.
class mesh_client {
 public:
  virtual ~mesh_client() = default;
  /// Starts a request (its id unique among live ones); its tokens and its end go to `sink`.
  virtual void submit(replica_request r, token_sink sink) = 0;
  /// The client went away: the request's sequence is freed at the replica's next step and the
  /// sink gets nothing more. Unknown ids are ignored.
  virtual void cancel(uint64_t id) = 0;
  /// Replicas ready to take requests now, of every model.
  virtual size_t ready_replicas() const = 0;
  /// Replicas of one model ready now (a client of one model's replicas: all of them).
  virtual size_t ready_replicas(std::string_view model) const {
    (void)model;
    return ready_replicas();
  }
  /// vLLM's runtime LoRA updates: adds the adapter `src` to every replica of `model` (loaded
  /// once where they share the weights), or removes the adapter `name` from them (requests
  /// running with it finish with it). local_mesh does it in its process; a gateway node's
  /// router_client through the coordinator, on every node of the model. By default
  /// unsupported (runtime_lora() false: the gateway refuses the routes before touching its list).
  virtual bool runtime_lora() const { return false; }
  [[nodiscard]] virtual status load_lora(std::string_view model, const model::lora_source& src) {
    (void)model;
    (void)src;
    return make_error(errc::unsupported, no_runtime_lora);
  }
  [[nodiscard]] virtual status unload_lora(std::string_view model, std::string_view name) {
    (void)model;
    (void)name;
    return make_error(errc::unsupported, no_runtime_lora);
  }
  /// vLLM's reset_prefix_cache, SGLang's flush_cache: every replica (and its router's memory of
  /// where prefixes went) lets go of its cached prefixes; requests running keep their blocks.
  /// Returns how many replicas were told (each empties its cache between two steps, before any
  /// request this client submits afterwards). By default unsupported.
  [[nodiscard]] virtual result<size_t> reset_prefix_cache() {
    return make_error(errc::unsupported, "this mesh cannot reset its replicas' prefix caches");
  }
  /// Why a mesh without a way to its replicas refuses runtime LoRA updates.
  static constexpr const char* no_runtime_lora =
      "this mesh takes no runtime LoRA updates: its replicas serve the adapters they started with";
};

struct mesh_options {
  int replicas = 1;
  model::engine_options engine;  ///< per replica: tp, kernel threads, KV capacity, device
  scheduler_config sched;
  balance_policy policy = balance_policy::least_load;
  size_t max_migrations = 3;
  int actor_threads = 2;  ///< CAF scheduler threads (replicas run detached, on their own)
  std::string model_name;  ///< the model the replicas serve: requests must name it (replica_request::model)
  /// Disaggregated prefill: replicas beside `replicas` that only compute prompts of which more
  /// than `max_local_prefill` tokens are not cached on their replica, while one of them has fewer
  /// than `max_prefill_queue` requests (0: no limit); their KV blocks then move to the request's
  /// replica (router_options). Needs prefix caching and the CPU backend.
  int prefill_replicas = 0;
  size_t max_local_prefill = 1000;
  size_t max_prefill_queue = 0;
  std::chrono::milliseconds prefill_timeout{60000};  ///< request_options::prefill_timeout
  bool kv_events = true;  ///< router_options::kv_events (Dynamo's --no-kv-events: false)
};

/// Thread affinity: any thread. Destruction stops every actor (in-flight requests end without
/// a final message: the gateway cancels its own first).
class local_mesh final : public mesh_client {
 public:
  /// Builds the engines (loading weights), spawns the replicas and the router.
  [[nodiscard]] static result<std::unique_ptr<local_mesh>> create(std::shared_ptr<const model::model> m,
                                                                  mesh_options opt, metrics_registry* metrics);
  ~local_mesh() override;

  void submit(replica_request r, token_sink sink) override;
  void cancel(uint64_t id) override;
  size_t ready_replicas() const override;
  size_t ready_replicas(std::string_view model) const override;
  /// Loads the adapter once into the model every replica shares (model::load_lora).
  bool runtime_lora() const override { return true; }
  [[nodiscard]] status load_lora(std::string_view model, const model::lora_source& src) override;
  [[nodiscard]] status unload_lora(std::string_view model, std::string_view name) override;
  [[nodiscard]] result<size_t> reset_prefix_cache() override;

  /// Replicas, decode ones first (indices below mesh_options::replicas), then prefill ones.
  size_t replica_count() const;
  const model::engine& engine(size_t i) const;
  /// Fault injection: replica i crashes as if its process had died (its requests move on),
  /// now or after `after_steps` more engine steps.
  void kill_replica(size_t i, int64_t after_steps = 0);
  /// Replica i finishes its requests and the router sends it no new ones.
  void drain_replica(size_t i);
  /// Requests in flight (submitted, not yet finished or cancelled).
  size_t inflight() const;

  struct impl;

 private:
  explicit local_mesh(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace llmesh::actors
