// The router actor (CAF): a thin shell over `route_table` (a balancer per model). It knows its
// replicas and the model each serves (added by message, monitored, dropped when they die),
// asks each for its load every `poll` interval (and, for models whose policy follows prefixes,
// for its KV events since the last answer: what its prefix cache gained and lost), and answers a route request for a model with
// the replica of that model its policy picks. Requesters report when a
// request they were routed ends, so load estimates between polls stay honest.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <memory>

#include <caf/all.hpp>

#include "llmesh/actors/balancer.hpp"
#include "llmesh/actors/metrics.hpp"
#include "llmesh/actors/replica_actor.hpp"
#include "llmesh/actors/route_table.hpp"

namespace llmesh::actors {

using add_atom = caf::atom_constant<caf::atom("add")>;
using route_atom = caf::atom_constant<caf::atom("route")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using dead_atom = caf::atom_constant<caf::atom("dead")>;

/// The answer to a route request: a replica, or (replica invalid) why there is none; and, for a
/// long prompt when the model has prefill replicas, the one to compute it first (invalid: none).
struct route_reply {
  caf::actor replica;
  error err;
  caf::actor prefill = {};
};

struct router_options {
  balance_policy policy = balance_policy::least_load;  ///< models without an entry in `policies`
  std::map<std::string, balance_policy, std::less<>> policies;  ///< by model name
  size_t block_size = 16;                   ///< the replicas' KV block size (prefix-aware policy)
  std::chrono::milliseconds poll{50};       ///< how often replicas are asked for their load
  metrics_registry* metrics = nullptr;      ///< optional: per-replica gauges (see serving_metrics)
  std::shared_ptr<ready_counts> ready;  ///< optional: ready replicas per model, for /ready
  /// Disaggregated prefill, conditional as Dynamo's: a prompt goes to one of the model's prefill
  /// replicas first when the part of it its decode replica does not cache (as far as this router
  /// sent it there: route_table::pick's cached_tokens) is longer than this
  /// (max_local_prefill_length)...
  size_t max_local_prefill = 1000;
  /// ...and the least busy ready prefill replica has fewer than this many requests
  /// (max_prefill_queue_size; 0: no limit) — else the decode replica computes it.
  size_t max_prefill_queue = 0;
  /// Whether replicas are asked for their KV events (what they cache, exactly); without them
  /// (Dynamo's --no-kv-events) only predictions from this router's own routing count.
  bool kv_events = true;
  /// The same per model (a cluster config's prefill entries), over them.
  std::map<std::string, size_t, std::less<>> max_local_prefill_by_model, max_prefill_queue_by_model;
};

/// The router's KV events poll of one replica: one ask in flight at a time; one unanswered
/// (a lost frame, a node of an older version that drops the ask) is asked again after 1, 2, 4,
/// ... up to 1024 polls.
struct kv_poll {
  uint64_t seq = 0;  ///< the cursor (kv_events::seq of the last answer)
  bool waiting = false;
  bool answered = false;  ///< an answer was applied (its llmesh_router_cached_blocks series exists)
  uint32_t ticks = 0, backoff = 1;
};

struct router_state {
  std::unique_ptr<route_table> routes;
  std::map<uint64_t, caf::actor> replicas;
  std::map<uint64_t, replica_load> loads;
  std::map<uint64_t, kv_poll> kv;         ///< each replica's KV events poll
  std::map<uint64_t, std::string> names;  ///< the replica label in metrics
  std::set<uint64_t> draining;            ///< never picked again, whatever a stale report says
  router_options opt;
  static inline const char* name = "router";
};

/// `(add_atom, caf::actor replica, std::string name, std::string model)` adds a replica of
/// `model` (name: its metrics label); with a replica_role, a uint64_t max_local_prefill and a
/// uint64_t max_prefill_queue (0: none) after the model, one of that role (prefill replicas are
/// never a request's replica, only its route_reply::prefill; a prefill replica's limits become its
/// model's); `(route_atom, std::string model, std::vector<int32_t> prompt, uint64_t cache_salt,
/// uint64_t route_key, bool prefill_ok)` replies a route_reply (a replica of that model;
/// balancer::pick) and counts the request against it (and, when prefill_ok — the request can
/// start from prefilled blocks — and the part of its prompt that replica does not cache is long,
/// against a prefill replica it names too: router_options::max_local_prefill);
/// `(done_atom, uint64_t replica_id)` uncounts it. A replica that stops is forgotten (its down message, or
/// `(dead_atom, uint64_t replica_id)` from a requester that saw it die first: that requester's
/// next route request must not get the dead replica back). `(drain_atom, uint64_t replica_id)`:
/// the replica is draining; it gets no new requests from here on. `(reset_atom)` → size_t: every
/// replica it knows (prefill ones too) is told to empty its prefix cache (reset_atom, replying
/// its load here) and the router forgets where prefixes went; replies how many were told.
/// Each poll asks a replica whose balancer tracks prefixes `(kv_events_atom, caf::actor self,
/// uint64_t since)` (kv_poll) and applies the kv_events it answers (route_table::apply); a
/// reset or a replica added again starts its cursor over (the next answer: its whole cache).
caf::behavior router_actor(caf::stateful_actor<router_state>* self, router_options opt);

}  // namespace llmesh::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::actors::route_reply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::actors::replica_role)
