// The node agent (DESIGN.md §2): one per `llmesh node` process. It joins the mesh (Hello →
// Challenge → Proof → Welcome with the cluster token, join_auth.hpp), sends heartbeats, rejoins
// when the coordinator's connection is lost, and hosts the replicas the coordinator assigns:
// it loads the model (off its own thread), spawns the replica actor, exports it through the
// bridge, and reports it ready; on a stop it drains the replica (in-flight requests finish),
// stops it, and frees its engine once the replica and its shard actors are gone.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "llmesh/actors/batch_scheduler.hpp"
#include "llmesh/actors/tensor_communicator.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/transport/transport.hpp"
#include "llmesh/transport/wire.hpp"

namespace llmesh::actors {

using join_atom = caf::atom_constant<caf::atom("join")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;
using loaded_atom = caf::atom_constant<caf::atom("loaded")>;
using poll_atom = caf::atom_constant<caf::atom("poll")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using agent_atom = caf::atom_constant<caf::atom("agent")>;
using fault_clear_atom = caf::atom_constant<caf::atom("unfault")>;
using router_atom = caf::atom_constant<caf::atom("router")>;
/// `(lora_atom, bool load, model, name, path)`: a runtime LoRA update this node's gateway asks
/// of the mesh (through the coordinator); answered `(bool ok, int32_t errc, std::string text)`.
using lora_atom = caf::atom_constant<caf::atom("lora")>;

struct node_agent_options {
  std::string node;  ///< this node's name
  std::vector<transport::role> roles;
  std::string listen;  ///< this node's mesh address
  int slots = 0;       ///< shards this node may host, announced in its Hello (0: the coordinator's default)
  std::string seed;    ///< the coordinator's mesh address (unused when the coordinator is local)
  std::string token;
  std::chrono::milliseconds heartbeat{500};
  std::chrono::milliseconds drain_timeout{60000};  ///< a stopping replica's in-flight requests get this long
  model::engine_options engine;                    ///< threads and device; tp and KV come with each assignment
  scheduler_config sched;
  /// Sets a fault rule on this node's transport (`llmesh ctl fault`; fault_injector.hpp syntax).
  std::function<void(const std::string&)> set_fault;
  /// Called (on an actor thread) when the node cannot go on: its join was refused.
  std::function<void(const std::string&)> on_fatal;
  /// A fresh transport for one rank's tensor plane (spread placement: a replica's shards on
  /// several nodes); it listens on `tensor_host`:0. Unset: this node cannot host such shards.
  std::function<result<std::shared_ptr<transport::transport>>()> make_tensor_transport;
  std::string tensor_host = "127.0.0.1";
  std::chrono::milliseconds tensor_timeout{60000};  ///< joining a tensor group, one collective
  std::chrono::milliseconds form_timeout{120000};   ///< rank 0's node waits this long for the other ranks' nodes
  /// A gateway node: the adapters added to `model` while the mesh serves, all of them, whenever
  /// they change and when the node joins (called on an actor thread).
  std::function<void(const std::string& model, const std::vector<model::lora_source>& adapters)> on_lora_news;
  std::chrono::milliseconds lora_request_timeout{90000};  ///< a gateway's LoRA update waits this long for the mesh
};

/// A runtime LoRA update a node applies to its copies of a model (idempotent: loading a name
/// loaded already, or unloading one that is not, changes nothing).
struct lora_op {
  bool load = true;
  std::string name, path;
  uint64_t update = 0;  ///< the coordinator's update it belongs to (0: an undo, answered to nobody)
};

/// Replicas this agent hosts, by replica id. The engine outlives the replica and its shards.
/// A spread replica's other node hosts only shards: `follower`, no replica actor, and
/// `shards` are the actors its replica's node reaches through the bridge.
struct hosted_replica {
  std::string model;
  std::shared_ptr<model::engine> engine;
  caf::actor replica;
  std::vector<caf::actor> shards;  ///< follower: the shard actors here
  std::vector<caf::actor> remote;  ///< rank 0's node: stand-ins for the shards on other nodes
  bool follower = false;
  std::string group_key;    ///< spread: the tensor group's key
  std::vector<tensor_communicator*> comms;  ///< follower: its ranks' (inside engine)
  size_t alive = 0;         ///< the replica and its shards not yet down
  bool stopping = false;    ///< asked to stop (drain, then exit)
  std::chrono::steady_clock::time_point stop_since;
};

/// A spread replica on rank 0's node, between its assignment and its replica actor: the engine
/// part loads here while the other ranks' nodes load theirs and report (ShardReady); then the
/// tensor group forms (ShardGroup, join), and the replica starts with stand-ins for them.
struct forming_replica {
  transport::assign_msg a;
  std::shared_ptr<model::engine> engine;  ///< once loaded
  std::vector<std::string> tensors;       ///< by rank, as they become known
  std::map<int, std::pair<transport::peer_id, uint64_t>> remote;  ///< rank → (connection, shard actor id)
  std::map<int, uint64_t> kv_blocks;                              ///< rank → its KV cache's blocks
  std::map<int, std::string> quantization;                        ///< rank → how its node holds the weights
  std::map<int, std::string> kv_types;                            ///< rank → its KV cache's elements
  std::map<int, std::string> dtypes;                              ///< rank → the type its node holds the weights in
  std::map<int, std::string> loras;                               ///< rank → the adapters its node loaded (lora_names)
  std::vector<tensor_communicator*> comms;  ///< inside engine: the ranks here
  bool joining = false;
  /// The replica's scheduler settings: the node's, or its assignment's speculative_config with
  /// the draft model it names (set when rank 0's part has loaded).
  scheduler_config sched;
};

struct node_agent_state {
  node_agent_options opt;
  caf::actor bridge, coordinator;  ///< coordinator: set when it lives in this process
  caf::actor router;               ///< this node's router when the coordinator is elsewhere
  std::map<uint64_t, std::pair<caf::actor, bool>> routed;  ///< replica id → (actor or proxy, is a proxy)
  std::map<std::string, transport::peer_id> node_peers;   ///< connections to replica nodes, by address
  std::optional<transport::peer_id> coord_peer;
  bool joined = false;
  bool quitting = false;
  uint64_t seq = 0;
  uint64_t fault_epoch = 0;  ///< the fault rule set last (a timed one is lifted only if still current)
  std::string nonce;
  std::map<uint64_t, hosted_replica> hosted;
  std::map<uint64_t, std::pair<std::string, bool>> loading;  ///< replica id → (model, stop asked)
  /// Replicas loading whose assignment brings its own speculative_config: the scheduler
  /// settings they start with (its draft model set once loaded), in place of opt.sched.
  std::map<uint64_t, scheduler_config> sched_of;
  std::map<uint64_t, forming_replica> forming;
  std::map<uint64_t, transport::assign_msg> assigned;  ///< a follower's assignments while loading
  std::map<caf::actor_addr, uint64_t> by_actor;  ///< replica and shard actors → replica id
  /// Loaded models, by model_key(): shared by the replicas (and spread parts) here that use
  /// one; it goes, its memory released, when the last of them stops (held_model logs it).
  std::map<std::string, std::weak_ptr<const model::model>> models;
  /// The models of the replicas dropped when the coordinator was lost (or declared this node
  /// dead), held for a while: placed here again after the rejoin, they need no reload.
  std::vector<std::shared_ptr<const model::model>> kept;
  uint64_t kept_epoch = 0;  ///< which drop `kept` is from (a later one's timer releases it)
  std::map<uint64_t, std::vector<lora_op>> lora_queue;  ///< replica id → LoRA updates that came while it loaded
  std::set<std::string> lora_busy;                      ///< models whose hosted copies a helper is updating
  std::map<std::string, std::deque<transport::control_msg>> lora_backlog;  ///< "lora" commands waiting for it
  std::map<std::string, caf::response_promise> lora_requests;  ///< the gateway's updates, by command nonce (hex)
  static inline const char* name = "node-agent";
};

/// KV positions per replica from a per-shard budget in MiB: K and V of `kv_type` (f32, bf16 or fp8), a
/// shard's KV heads (no more than `max_seqs` full contexts, which could never be used).
size_t kv_tokens_for_budget(const model::model_config& c, int tp, size_t budget_mb, size_t max_seqs, kernels::dtype kv_type);

/// `(join_atom)` starts (and after a lost coordinator, restarts) the join. `(stop_atom)`: stop
/// every hosted replica now, then quit once their engines are free. The bridge delivers the
/// coordinator's frames as `(wire_atom, peer, envelope)`; a local coordinator sends the same
/// with peer 0. `(agent_atom, caf::actor coordinator)` names a coordinator in this process;
/// `(router_atom, caf::actor)` this node's router, when the coordinator is in another process:
/// the agent then adds, drains and drops replicas there as the coordinator's ReplicaState
/// frames say.
caf::behavior node_agent(caf::stateful_actor<node_agent_state>* self, node_agent_options opt, caf::actor bridge);

}  // namespace llmesh::actors
