// The coordinator (DESIGN.md §2), a plain class; coordinator_actor.hpp is its CAF shell. It
// joins membership (the handshake, heartbeats, failure detection) to placement (which node
// hosts which replica) and turns both into actions: frames to node agents (assign start/stop,
// the handshake's replies), and what the routers must learn (a replica ready, draining, gone).
// Operator commands (`llmesh ctl`) arrive as authenticated control messages.
//
// Peers: a node agent is reached by its connection (peer id) and actor id 1; peer 0 is this
// process (the coordinator's own node joins without a connection). Routers in other processes
// hear of replicas through their node agents (ReplicaState frames).
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "llmesh/actors/cluster_config.hpp"
#include "llmesh/actors/membership.hpp"
#include "llmesh/actors/placement.hpp"
#include "llmesh/transport/wire.hpp"

namespace llmesh::actors {

/// Well-known actor ids on every node.
inline constexpr uint64_t agent_actor_id = 1;
inline constexpr uint64_t coordinator_actor_id = 2;
/// A replica actor is exported as this plus its replica id.
inline constexpr uint64_t replica_actor_base = 1000;
/// The refusal a node gets when it beats without being a member (declared dead meanwhile):
/// its agent drops its replicas and joins again.
inline constexpr const char* rejoin_reason = "not a member (declared dead): join again";

struct coordinator_options {
  std::string token;
  std::chrono::milliseconds failure_timeout{3000};
  std::vector<model_spec> models;
  std::chrono::milliseconds control_clock_skew{60000};  ///< how old (or new) a command may be
  std::chrono::milliseconds lora_timeout{60000};        ///< nodes answer a LoRA update within this
};

/// Something the coordinator's actor must do.
struct coordinator_action {
  enum kind {
    send,           ///< `msg` to actor `remote` on connection `peer`
    replica_ready,  ///< routers add replica `replica` (actor `remote` on `peer`), labelled `name`
    replica_drain,  ///< routers stop sending new requests to `replica`
    replica_gone,   ///< routers forget `replica`; requests still on it fail over
  } k;
  transport::peer_id peer = 0;
  uint64_t remote = 0;
  transport::body msg;
  uint64_t replica = 0;
  std::string name;
  std::string model;  ///< replica_ready: the model it serves (routers route by it)
  /// replica_ready: its model's prefill_for (a prefill replica for that model's requests; "": none)
  std::string prefill_for = {};
  uint64_t max_local_prefill = 0;  ///< replica_ready of a prefill replica: its max_local_prefill_length
  uint64_t max_prefill_queue = 0;  ///< ... and its max_prefill_queue_size (0: none)
};

/// A replica as the coordinator tracks it.
struct replica_record {
  replica_assignment a;
  transport::replica_phase phase = transport::replica_phase::loading;
  transport::peer_id peer = 0;  ///< the hosting node's connection
  uint64_t actor = 0;           ///< the replica actor's id there, once ready
  std::string reason;           ///< why it died, when it did
  /// A stop decided while its replacement(s) were still loading: it serves on until these
  /// replicas are ready (or have failed), so capacity never dips during a drain.
  std::set<uint64_t> stop_after;
  bool stop_pending = false;
};

/// A runtime LoRA update under way (`load-lora`, `unload-lora`): sent to the nodes hosting the
/// model's replicas, answered to its requester once every one of them has applied it (or any
/// failed: then the others undo it).
struct lora_update {
  std::string model;
  bool load = true;
  model::lora_source src;  ///< the adapter (unload: as it was loaded, to load it again on a failure)
  transport::peer_id reply_peer = 0;
  uint64_t reply_actor = 0;
  std::string request;            ///< the command's nonce, hex: the requester matches the reply by it
  std::set<std::string> waiting;  ///< nodes yet to answer
  size_t applied = 0;             ///< the hosted copies the nodes applied it to
  std::string failure;            ///< the first node's refusal
  errc failure_code = errc::invalid_request;
  mesh_clock::time_point deadline;
};

/// Thread affinity: the coordinator actor's.
class coordinator {
 public:
  using actions = std::vector<coordinator_action>;

  /// invalid_request for models placement refuses.
  [[nodiscard]] static result<coordinator> create(coordinator_options opt);

  /// A frame from a node agent (or ctl) on connection `peer`.
  actions on_message(transport::peer_id peer, const transport::envelope& e, mesh_clock::time_point now,
                     uint64_t wall_ms);
  /// The transport lost connection `peer`.
  actions on_peer_down(transport::peer_id peer);
  /// Periodic: members silent past the failure timeout are dead.
  actions on_tick(mesh_clock::time_point now);

  const membership& members() const { return members_; }
  const std::map<uint64_t, replica_record>& replicas() const { return replicas_; }
  /// Adapters added to each model while serving, in the order they came (the config's loras not
  /// included); a replica started later loads them with the config's.
  const std::map<std::string, std::vector<model::lora_source>>& runtime_loras() const { return runtime_loras_; }

 private:
  explicit coordinator(coordinator_options opt);
  actions apply(const std::vector<change>& changes);
  /// Stops replica `id` now: routers first, then its node drains and stops it.
  void stop_now(uint64_t id, actions& out);
  /// Replica `id` became ready, or will never be: stops waiting on it may go ahead.
  void settled(uint64_t id, actions& out);
  /// Routers in other processes learn what the router here learns: for every replica_ready,
  /// replica_drain and replica_gone in `out`, a ReplicaState frame to each router node's agent.
  void tell_routers(actions& out) const;
  /// A router node that just joined learns every ready replica.
  void brief_router(transport::peer_id peer, actions& out) const;
  void node_lost(const std::string& name, actions& out);
  /// Tells every node of `r`'s shards but `except` (and but rank 0's unless `leader_too`) to
  /// stop them now (spread placement; nothing for a packed replica).
  void stop_shards(const replica_record& r, const std::string& except, bool leader_too, actions& out) const;
  /// The reply to an operator command; nullopt when it comes later (a LoRA update's).
  std::optional<transport::control_reply_msg> control(transport::peer_id peer, uint64_t reply_to,
                                                      const transport::control_msg& c, uint64_t wall_ms, actions& out);
  transport::control_reply_msg run_command(const std::string& cmd, const std::vector<std::string>& args, actions& out);
  // Runtime LoRA updates (coordinator_lora.cpp).
  /// `load-lora MODEL NAME PATH` / `unload-lora MODEL NAME`: checked, then sent to the nodes of
  /// the model's replicas (nullopt: the reply comes when they have answered).
  std::optional<transport::control_reply_msg> lora_command(transport::peer_id peer, uint64_t reply_to,
                                                           const transport::control_msg& c, actions& out);
  /// A node's answer to a LoRA update.
  void lora_answer(transport::peer_id peer, const transport::control_reply_msg& m, actions& out);
  /// The update is over (answered, failed, timed out): commit or undo it, then reply.
  void lora_finish(uint64_t id, actions& out);
  /// The nodes (by name) hosting replicas of `model` that are not dead.
  std::set<std::string> nodes_of(const std::string& model) const;
  /// Tells every gateway node (or only `peer`'s) the adapters added to `model` while serving.
  void lora_news(const std::string& model, actions& out, std::optional<transport::peer_id> only = std::nullopt) const;
  /// `node` is gone: pending updates stop waiting for it.
  void lora_node_lost(const std::string& node, actions& out);
  /// Updates whose nodes stayed silent past their deadline fail.
  void lora_expire(mesh_clock::time_point now, actions& out);
  const model_spec* spec_of(const std::string& model) const;
  std::string nodes_json() const;
  std::string replicas_json() const;

  coordinator_options opt_;
  membership members_;
  placement_planner plan_;
  std::map<uint64_t, replica_record> replicas_;
  std::map<std::string, std::vector<model::lora_source>> runtime_loras_;  ///< see runtime_loras()
  std::map<uint64_t, lora_update> lora_updates_;                          ///< under way, by id; one per model
  uint64_t next_lora_update_;  ///< from a random start: a new coordinator never takes a stale answer for its own update's
  mesh_clock::time_point now_{};  ///< the latest clock reading (on_message, on_tick)
  std::deque<std::string> recent_nonces_;  ///< control nonces seen (bounded): no replays
  std::set<std::string> nonce_set_;
};

}  // namespace llmesh::actors
