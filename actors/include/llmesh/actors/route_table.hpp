// The router's replicas grouped by model, a plain class: each model has its own balancer (and
// policy), so a request for one model is only ever routed to a replica of that model; a model's
// prefill replicas (disaggregated prefill) have a balancer of their own beside it. Also
// `ready_counts`, the ready replicas per model that a router publishes for gateways (/ready,
// the native API's early 503) to read from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "llmesh/actors/balancer.hpp"
#include "llmesh/common/error.hpp"

namespace llmesh::actors {

using model_counts = std::map<std::string, size_t, std::less<>>;

/// What a replica does for its model's requests: serve them (decode; the default: it computes a
/// prompt itself unless a prefill replica did), or only compute long prompts whose KV blocks
/// then move to the decode replica (disaggregated prefill: Dynamo's prefill workers, vLLM's
/// kv_producer).
enum class replica_role : uint8_t { decode, prefill };
/// "decode" or "prefill".
[[nodiscard]] result<replica_role> parse_replica_role(std::string_view name);
std::string_view replica_role_name(replica_role r);

/// Thread affinity: the router's. Deterministic for a given sequence of calls.
class route_table {
 public:
  /// `policies`: a model's policy by name; models not listed get `fallback`.
  route_table(balance_policy fallback, std::map<std::string, balance_policy, std::less<>> policies,
              size_t block_size);

  /// Adds a replica of `model`, ready with no load. A known id moves to `model` (a replica
  /// never changes model; an id reused by the caller is a new replica).
  void add(uint64_t replica, std::string model, replica_role role = replica_role::decode);
  /// Forgets a replica; unknown ids are ignored.
  void remove(uint64_t replica);
  /// A replica's report; reports of unknown replicas are ignored (false).
  bool update(const replica_load& load);
  bool has(uint64_t replica) const { return model_of_.count(replica) != 0; }
  /// A replica's KV events, to its balancer (balancer::apply); unknown replicas are ignored.
  void apply(const kv_events& e);
  /// Whether a replica's balancer tracks prefixes (its KV events are worth asking for).
  bool tracks(uint64_t replica);
  /// Blocks a replica's KV events report cached (balancer::reported_blocks; 0 for unknown ones).
  size_t reported_blocks(uint64_t replica);

  /// A ready replica of `model` by its policy, counted against it until finished();
  /// replica_unavailable naming the model when it has none ready. `cached_tokens`, when given:
  /// the prompt's leading tokens this table sent to that replica before (balancer::cached_tokens;
  /// tracked for models with prefill replicas and under prefix-aware routing, else 0).
  [[nodiscard]] result<uint64_t> pick(std::string_view model, std::span<const int32_t> prompt, uint64_t salt = 0, uint64_t key = 0,
                                      size_t* cached_tokens = nullptr);
  /// A ready prefill replica of `model` by its policy (counted until finished()), or
  /// replica_unavailable when it has none. With `max_queue` (0: no limit), one with fewer than
  /// that many requests (running, waiting and routed since its report — Dynamo's prefill queue):
  /// the policy's pick, else the least busy; overloaded when every one has that many.
  [[nodiscard]] result<uint64_t> pick_prefill(std::string_view model, std::span<const int32_t> prompt, uint64_t salt = 0,
                                              uint64_t key = 0, size_t max_queue = 0);
  /// Every balancer forgets where prefixes went (balancer::forget_prefixes).
  void forget_prefixes();
  /// Whether `model` has prefill replicas, ready or not.
  bool has_prefill(std::string_view model) const;
  /// One request routed to `replica` ended.
  void finished(uint64_t replica);

  /// Ready decode replicas per model (those that serve requests), every model that has a replica
  /// listed (0 included).
  model_counts ready() const;

 private:
  balancer& of(const std::string& model, replica_role role);
  /// The balancer a known replica is in; null for unknown ones.
  balancer* balancer_of(uint64_t replica);
  result<uint64_t> pick_in(std::map<std::string, std::unique_ptr<balancer>, std::less<>>& pool, std::string_view model,
                           std::span<const int32_t> prompt, uint64_t salt, uint64_t key, const char* what,
                           size_t* cached_tokens = nullptr, size_t max_queue = 0);

  balance_policy fallback_;
  std::map<std::string, balance_policy, std::less<>> policies_;
  size_t block_size_;
  std::map<std::string, std::unique_ptr<balancer>, std::less<>> balancers_, prefill_;
  std::map<uint64_t, std::string> model_of_;
  std::map<uint64_t, replica_role> role_of_;
  std::map<uint64_t, bool> ready_;
};

/// Ready replicas per model as a router last published them. Thread affinity: any thread.
class ready_counts {
 public:
  void set(model_counts counts);
  /// All models together.
  size_t total() const;
  /// One model (0 for a model without replicas).
  size_t of(std::string_view model) const;

 private:
  mutable std::mutex mu_;
  model_counts counts_;
};

}  // namespace llmesh::actors
