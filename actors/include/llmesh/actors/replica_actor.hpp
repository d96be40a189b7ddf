// The replica actor (CAF): a thin shell over replica_core. Requests arrive as messages; each
// engine step is one message the actor sends itself, so new requests and cancellations are
// taken between steps (continuous batching); the step itself is fanned out to the replica's
// shard actors (one per tensor-parallel rank, spawned and linked here; shard_actor.hpp) and
// completed when all have answered; every new token goes straight to the actor that submitted
// the request. The replica never blocks, so it needs no thread of its own.
#pragma once

#include <caf/all.hpp>
#include <functional>
#include <map>
#include <set>
#include <optional>

#include "llmesh/actors/balancer.hpp"
#include "llmesh/actors/replica_core.hpp"
#include "llmesh/actors/token_stream.hpp"

namespace llmesh::actors {

using generate_atom = caf::atom_constant<caf::atom("generate")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using status_atom = caf::atom_constant<caf::atom("status")>;
using fault_atom = caf::atom_constant<caf::atom("fault")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using shards_atom = caf::atom_constant<caf::atom("shards")>;
using prefill_atom = caf::atom_constant<caf::atom("prefill")>;
using kvimport_atom = caf::atom_constant<caf::atom("kvimport")>;
using reset_atom = caf::atom_constant<caf::atom("reset")>;
using kv_events_atom = caf::atom_constant<caf::atom("kvevents")>;

/// A prefill replica's answer to `(prefill_atom, ...)`: the prompt's whole blocks of KV, or why
/// there are none (the requester then lets its decode replica compute the prompt).
struct prefill_reply {
  uint64_t id = 0;
  bool ok = false;
  error err = {};
  kv_prefix prefix = {};
};

struct replica_state {
  std::unique_ptr<replica_core> core;
  std::unordered_map<uint64_t, caf::actor> owners;
  std::vector<caf::actor> shards;  ///< rank order; linked (those here) or monitored (remote)
  std::set<int> remote;            ///< ranks whose shard is in another process
  bool step_pending = false;
  bool dead = false;
  bool draining = false;  ///< finishes what it has, takes nothing new, reports not ready
  // The step in flight: answers still due, the merged outcome, submits and cancels held back.
  uint64_t step_no = 0;
  size_t pending = 0;
  std::optional<error> step_error;
  std::vector<int32_t> sampled;
  model::step_logprobs logprobs;  ///< rank 0's, for the step in flight
  std::vector<std::function<void()>> deferred;
  int64_t crash_after = -1;  ///< fault injection: steps left before the replica crashes
  /// Disaggregated prefill: the prompts this replica computes for another's request, by id
  /// (their owners are in `owners`); and the blocks it took in from others.
  struct prefill_job {
    std::vector<int32_t> prompt;
    uint64_t cache_salt = 0;
    std::string lora;
  };
  std::unordered_map<uint64_t, prefill_job> prefills;
  size_t kv_imported = 0, kv_refused = 0;
  static inline const char* name = "replica";
};

/// `(shards_atom)` → std::vector<caf::actor>: its shard actors (whoever frees the engine waits
/// for them to stop, not only for the replica).
/// `(generate_atom, replica_request, caf::actor reply_to)` queues a request whose tokens go to
/// reply_to as token_msg; `(cancel_atom, uint64_t id)` drops one; `(status_atom, caf::actor
/// reply_to)` sends reply_to a replica_load; `(fault_atom, int64_t steps)` makes the replica crash
/// (stop without a word, as a dead process would) after that many more steps; `(drain_atom)`
/// reports the replica not ready from then on (routers stop sending it work; the router is told
/// first) while it finishes what it has, including requests routed to it just before (the router's report; ready is false once dead). If the engine fails, every
/// live request gets a failed token_msg and the actor refuses further work (the replica is
/// dead; its tensor-parallel group fails as a unit). Disaggregated prefill: `(prefill_atom,
/// replica_request, caf::actor reply_to)` computes the request's prompt (as a one-token request
/// of its prompt, salt, adapter and priority; `(cancel_atom, id)` drops it) and answers reply_to
/// a prefill_reply with its whole blocks (replica_core::export_prefix); `(kvimport_atom,
/// kv_prefix)` takes such blocks into the prefix cache (replica_core::import_prefix; a refusal
/// only means the request that follows computes its prompt here). `(reset_atom, caf::actor
/// reply_to)` empties the prefix cache between steps (replica_core::reset_prefix_cache) and
/// then sends reply_to its replica_load. `(kv_events_atom, caf::actor reply_to, uint64_t since)`
/// sends reply_to its prefix cache's kv_events after cursor `since`
/// (block_manager::events_since; kv_events::replica is its id). Borrows the engine.
caf::behavior replica_actor(caf::stateful_actor<replica_state>* self, model::engine* eng, scheduler_config cfg);

/// A replica whose engine holds only some ranks (engine::create_part): those run in shard
/// actors here, the others are `remote_shards` (rank → the bridge's stand-in for a shard actor
/// in another process). Rank 0 must be local (it samples). A remote shard that goes away kills
/// the replica (the group fails as a unit): its requests fail over.
caf::behavior split_replica_actor(caf::stateful_actor<replica_state>* self, model::engine* eng, scheduler_config cfg,
                                  std::map<int, caf::actor> remote_shards);

/// Spawns a replica (split_replica_actor; no `remote_shards`: every rank here) with `spawner`
/// (an actor system or an actor): on a thread of its own when its scheduler has a draft model
/// (it runs the draft's kernels while planning a step), else on the actor scheduler (it never
/// blocks; its shard actors run the kernels).
template <class Spawner>
caf::actor spawn_replica(Spawner& spawner, model::engine* eng, const scheduler_config& cfg,
                         std::map<int, caf::actor> remote_shards = {}) {
  if (cfg.draft_model) return spawner.template spawn<caf::detached>(split_replica_actor, eng, cfg, std::move(remote_shards));
  return spawner.spawn(split_replica_actor, eng, cfg, std::move(remote_shards));
}

}  // namespace llmesh::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::actors::replica_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::actors::token_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::actors::replica_load)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::actors::prefill_reply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::actors::kv_prefix)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::actors::kv_events)
