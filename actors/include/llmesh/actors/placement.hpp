// The coordinator's placement (DESIGN §2), a plain class: which replica-capable nodes host the
// tensor-parallel shards of each model's replicas. It keeps the plan and answers every event
// (models set or scaled, a node up, down, draining or removed) with the list of replicas to
// start and stop; the coordinator's actor turns those changes into messages. No CAF, no I/O.
//
// Rules:
// - A replica is a unit: `packed` puts all its tp shards on one node, `spread` each shard on a
//   different node. A node hosts at most `slots` shards.
// - Every start gets a fresh id, never reused: a replica re-formed after a failure or moved off
//   a draining node is a new replica (routers and request actors see a new actor).
// - A node going down (or removed) stops every replica with a shard on it — one dead shard
//   kills its group — and they are re-placed elsewhere when capacity allows; otherwise the
//   model is short (`pending`) until capacity comes back.
// - A draining node gets nothing new; each of its replicas is moved (the new one started
//   before the old one is stopped, so capacity never dips) when room exists elsewhere, and
//   keeps running there until then.
// - Deterministic: a node is chosen by (shards of the same model already on it, used slots,
//   name), so replicas of one model go to different nodes when possible and otherwise to the
//   least-loaded ones; ties go by node name.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "llmesh/actors/cluster_config.hpp"
#include "llmesh/common/error.hpp"

namespace llmesh::actors {

/// Whether a node takes new replicas.
enum class node_state {
  ready,     ///< takes new replicas
  draining,  ///< takes nothing new; its replicas move away when room exists elsewhere
};

/// One replica of a model and where its shards run.
struct replica_assignment {
  uint64_t id = 0;                  ///< unique over the planner's life, never reused
  std::string model;                ///< model_spec::name
  std::vector<std::string> shards;  ///< rank → node name; size is the model's tp

  bool operator==(const replica_assignment&) const = default;
};

/// One step for the coordinator's actor: start or stop a replica (all of its shards).
struct change {
  enum kind { start_replica, stop_replica } k;
  replica_assignment r;

  bool operator==(const change&) const = default;
};

/// A replica-capable node as the planner sees it.
struct placement_node {
  std::string name;
  int slots = 0;  ///< shards it can host
  int used = 0;   ///< shards it hosts now
  node_state state = node_state::ready;
};

/// The plan and the rules above. Thread affinity: the coordinator actor's; owns its state.
/// Named `placement_planner` because `placement` is the packed/spread enum of cluster_config.
class placement_planner {
 public:
  /// Shards a node hosts when its agent does not say: until node agents report their devices,
  /// a replica node is assumed to run two CPU shards (local.yaml's tp 2 packed replica).
  static constexpr int default_slots = 2;

  /// Replaces the models the mesh serves and reconciles. A model no longer listed has its
  /// replicas stopped; a model whose tp or placement changed has its replicas stopped and
  /// placed anew (a running group cannot change shape). invalid_request for an empty or
  /// repeated name, tp < 1 or replicas < 0; nothing changes then.
  [[nodiscard]] result<std::vector<change>> set_models(const std::vector<model_spec>& models);

  /// Sets a model's wanted replica count. Growing places what fits (the rest is pending);
  /// shrinking stops replicas on draining nodes first (they were leaving anyway), then the
  /// newest. not_found for an unknown model, invalid_request for n < 0.
  [[nodiscard]] result<std::vector<change>> scale(std::string_view model, int n);

  /// A node joined (or rejoined, or changed its capacity): it becomes ready with `slots`
  /// shards, and pending replicas and draining nodes' replicas are placed where they now fit.
  /// A known node keeps its replicas; if `slots` is below what it hosts, its newest replicas
  /// are stopped until it fits. invalid_request for an empty name or slots < 0.
  [[nodiscard]] result<std::vector<change>> node_up(std::string_view name, int slots = default_slots);

  /// A node died: it is forgotten, every replica with a shard on it is stopped, then they are
  /// re-placed where capacity allows (stops come first in the list). Unknown nodes are
  /// ignored, so a failure reported twice is harmless.
  std::vector<change> node_down(std::string_view name);

  /// A running replica died on its own (its node lives on): it is stopped (the stop comes
  /// first in the list) and placed anew where capacity allows. Unknown ids are ignored.
  std::vector<change> replica_failed(uint64_t id);

  /// The operator drains a node: see the class comment. Draining twice is harmless.
  /// not_found for an unknown node.
  [[nodiscard]] result<std::vector<change>> drain(std::string_view name);

  /// The operator removes a node: as node_down. not_found for an unknown node.
  [[nodiscard]] result<std::vector<change>> remove(std::string_view name);

  /// Every placed replica, by id (oldest first).
  std::vector<replica_assignment> replicas() const;
  /// model name → replicas wanted but not placed (only models that are short).
  std::map<std::string, int, std::less<>> pending() const;
  /// Shards hosted by this node (0 for an unknown one).
  int used_slots(std::string_view node) const;
  /// Every known node, by name.
  std::vector<placement_node> nodes() const;
  /// The models as last set (with scaled replica counts), in the order given.
  const std::vector<model_spec>& models() const { return models_; }

 private:
  struct node_entry {
    int slots = 0;
    int used = 0;
    node_state state = node_state::ready;
  };

  const model_spec* find_model(std::string_view name) const;
  int placed_count(std::string_view model) const;
  /// Nodes for one new replica of `m` on ready nodes, or empty when it does not fit.
  std::vector<std::string> choose_nodes(const model_spec& m) const;
  void start(const model_spec& m, std::vector<std::string> shards, std::vector<change>& out);
  void stop(uint64_t id, std::vector<change>& out);
  /// Stops every replica with a shard on `node`, then forgets the node.
  void drop_node(std::string_view node, std::vector<change>& out);
  /// Brings the plan to the wanted counts: shrink, grow, then move replicas off draining nodes.
  void reconcile(std::vector<change>& out);

  std::vector<model_spec> models_;
  std::map<std::string, node_entry, std::less<>> nodes_;
  std::map<uint64_t, replica_assignment> replicas_;  ///< ordered: oldest first, ids grow
  uint64_t next_id_ = 1;
};

}  // namespace llmesh::actors
