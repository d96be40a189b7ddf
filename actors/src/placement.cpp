// The coordinator's placement: see placement.hpp for the rules. Every event edits the node or
// model table, then `reconcile` brings the plan back to the wanted counts; the changes it
// makes are appended in the order the coordinator must apply them.
#include "llmesh/actors/placement.hpp"

#include <algorithm>
#include <set>
#include <tuple>

namespace llmesh::actors {
namespace {

bool hosts(const replica_assignment& r, std::string_view node) {
  return std::find(r.shards.begin(), r.shards.end(), node) != r.shards.end();
}

}  // namespace

const model_spec* placement_planner::find_model(std::string_view name) const {
  for (const auto& m : models_)
    if (m.name == name) return &m;
  return nullptr;
}

int placement_planner::placed_count(std::string_view model) const {
  int n = 0;
  for (const auto& [id, r] : replicas_) n += r.model == model ? 1 : 0;
  return n;
}

std::vector<std::string> placement_planner::choose_nodes(const model_spec& m) const {
  // Preference key, smallest first: shards of this model already there (so replicas of one
  // model land on different nodes when possible: a node's loss then costs it one replica),
  // then used slots (least loaded first), then the name (deterministic ties).
  using key = std::tuple<int, int, std::string_view>;
  std::vector<key> candidates;
  for (const auto& [name, n] : nodes_) {
    if (n.state != node_state::ready) continue;
    const int free = n.slots - n.used;
    if (free < (m.place == placement::packed ? m.tp : 1)) continue;
    int same = 0;
    for (const auto& [id, r] : replicas_)
      if (r.model == m.name) same += static_cast<int>(std::count(r.shards.begin(), r.shards.end(), name));
    candidates.emplace_back(same, n.used, name);
  }
  std::sort(candidates.begin(), candidates.end());
  if (m.place == placement::packed) {
    if (candidates.empty()) return {};
    return std::vector<std::string>(static_cast<size_t>(m.tp), std::string(std::get<2>(candidates.front())));
  }
  if (candidates.size() < static_cast<size_t>(m.tp)) return {};
  std::vector<std::string> shards;
  for (int rank = 0; rank < m.tp; ++rank) shards.emplace_back(std::get<2>(candidates[static_cast<size_t>(rank)]));
  // Ranks follow node names among the chosen nodes, so a plan reads the same way every time
  // (local-split-shards.yaml: rank 0 on shard-0, rank 1 on shard-1).
  std::sort(shards.begin(), shards.end());
  return shards;
}

void placement_planner::start(const model_spec& m, std::vector<std::string> shards, std::vector<change>& out) {
  replica_assignment r{next_id_++, m.name, std::move(shards)};
  for (const auto& node : r.shards) nodes_.find(node)->second.used += 1;
  out.push_back({change::start_replica, r});
  replicas_.emplace(r.id, std::move(r));
}

void placement_planner::stop(uint64_t id, std::vector<change>& out) {
  auto it = replicas_.find(id);
  for (const auto& node : it->second.shards)
    if (auto n = nodes_.find(node); n != nodes_.end()) n->second.used -= 1;
  out.push_back({change::stop_replica, std::move(it->second)});
  replicas_.erase(it);
}

void placement_planner::drop_node(std::string_view node, std::vector<change>& out) {
  std::vector<uint64_t> dead;
  for (const auto& [id, r] : replicas_)
    if (hosts(r, node)) dead.push_back(id);
  for (uint64_t id : dead) stop(id, out);
  nodes_.erase(nodes_.find(node));
}

void placement_planner::reconcile(std::vector<change>& out) {
  auto on_draining = [&](const replica_assignment& r) {
    return std::any_of(r.shards.begin(), r.shards.end(),
                       [&](const std::string& n) { return nodes_.find(n)->second.state == node_state::draining; });
  };

  // Shrink: replicas on draining nodes first (they would have moved anyway), then the newest.
  for (const auto& m : models_) {
    for (int excess = placed_count(m.name) - m.replicas; excess > 0; --excess) {
      uint64_t victim = 0;
      bool victim_draining = false;
      for (const auto& [id, r] : replicas_) {  // ascending ids: the last match is the newest
        if (r.model != m.name) continue;
        const bool d = on_draining(r);
        if (d || !victim_draining) victim = id, victim_draining = d;
      }
      stop(victim, out);
    }
  }

  // Grow and move until nothing changes. Growing goes round-robin over the models, one
  // replica each per round, so scarce capacity is shared rather than taken by the first
  // model. Pending replicas come before moves: a model short of replicas is worse off than a
  // replica still serving on a draining node. A move can free slots on ready nodes (a spread
  // replica's other shards), hence the outer loop; it ends because every move takes one
  // replica off the draining nodes for good.
  for (bool changed = true; changed;) {
    changed = false;
    for (bool grew = true; grew;) {
      grew = false;
      for (const auto& m : models_) {
        if (placed_count(m.name) >= m.replicas) continue;
        auto shards = choose_nodes(m);
        if (shards.empty()) continue;
        start(m, std::move(shards), out);
        grew = changed = true;
      }
    }
    std::vector<uint64_t> leaving;
    for (const auto& [id, r] : replicas_)
      if (on_draining(r)) leaving.push_back(id);
    for (uint64_t id : leaving) {
      const model_spec& m = *find_model(replicas_.at(id).model);
      auto shards = choose_nodes(m);
      if (shards.empty()) continue;
      start(m, std::move(shards), out);  // the replacement serves before the old one stops
      stop(id, out);
      changed = true;
    }
  }
}

result<std::vector<change>> placement_planner::set_models(const std::vector<model_spec>& models) {
  std::set<std::string_view> names;
  for (const auto& m : models) {
    if (m.name.empty()) return make_error(errc::invalid_request, "placement: a model has an empty name");
    if (!names.insert(m.name).second)
      return make_error(errc::invalid_request, "placement: model '" + m.name + "' is listed twice");
    if (m.tp < 1)
      return make_error(errc::invalid_request,
                        "placement: model '" + m.name + "': tp must be >= 1, got " + std::to_string(m.tp));
    if (m.replicas < 0)
      return make_error(errc::invalid_request,
                        "placement: model '" + m.name + "': replicas must be >= 0, got " + std::to_string(m.replicas));
  }
  std::vector<change> out;
  std::vector<uint64_t> obsolete;
  for (const auto& [id, r] : replicas_) {
    const model_spec* old_spec = find_model(r.model);
    auto now = std::find_if(models.begin(), models.end(), [&](const model_spec& m) { return m.name == r.model; });
    if (now == models.end() || now->tp != old_spec->tp || now->place != old_spec->place) obsolete.push_back(id);
  }
  for (uint64_t id : obsolete) stop(id, out);
  models_ = models;
  reconcile(out);
  return out;
}

result<std::vector<change>> placement_planner::scale(std::string_view model, int n) {
  auto it = std::find_if(models_.begin(), models_.end(), [&](const model_spec& m) { return m.name == model; });
  if (it == models_.end()) return make_error(errc::not_found, "placement: no model '" + std::string(model) + "'");
  if (n < 0)
    return make_error(errc::invalid_request,
                      "placement: model '" + std::string(model) + "': replicas must be >= 0, got " + std::to_string(n));
  it->replicas = n;
  std::vector<change> out;
  reconcile(out);
  return out;
}

result<std::vector<change>> placement_planner::node_up(std::string_view name, int slots) {
  if (name.empty()) return make_error(errc::invalid_request, "placement: a node has an empty name");
  if (slots < 0)
    return make_error(errc::invalid_request,
                      "placement: node '" + std::string(name) + "': slots must be >= 0, got " + std::to_string(slots));
  std::vector<change> out;
  auto [it, added] = nodes_.try_emplace(std::string(name));
  it->second.slots = slots;
  it->second.state = node_state::ready;
  while (it->second.used > slots) {  // capacity shrank: newest replicas on this node go
    uint64_t newest = 0;
    for (const auto& [id, r] : replicas_)
      if (hosts(r, name)) newest = id;
    stop(newest, out);
  }
  reconcile(out);
  return out;
}

std::vector<change> placement_planner::node_down(std::string_view name) {
  std::vector<change> out;
  if (nodes_.find(name) == nodes_.end()) return out;
  drop_node(name, out);
  reconcile(out);
  return out;
}

std::vector<change> placement_planner::replica_failed(uint64_t id) {
  std::vector<change> out;
  if (replicas_.find(id) == replicas_.end()) return out;
  stop(id, out);
  reconcile(out);
  return out;
}

result<std::vector<change>> placement_planner::drain(std::string_view name) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return make_error(errc::not_found, "placement: no node '" + std::string(name) + "'");
  it->second.state = node_state::draining;
  std::vector<change> out;
  reconcile(out);
  return out;
}

result<std::vector<change>> placement_planner::remove(std::string_view name) {
  if (nodes_.find(name) == nodes_.end())
    return make_error(errc::not_found, "placement: no node '" + std::string(name) + "'");
  return node_down(name);
}

std::vector<replica_assignment> placement_planner::replicas() const {
  std::vector<replica_assignment> out;
  out.reserve(replicas_.size());
  for (const auto& [id, r] : replicas_) out.push_back(r);
  return out;
}

std::map<std::string, int, std::less<>> placement_planner::pending() const {
  std::map<std::string, int, std::less<>> out;
  for (const auto& m : models_)
    if (int short_by = m.replicas - placed_count(m.name); short_by > 0) out[m.name] = short_by;
  return out;
}

int placement_planner::used_slots(std::string_view node) const {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? 0 : it->second.used;
}

std::vector<placement_node> placement_planner::nodes() const {
  std::vector<placement_node> out;
  for (const auto& [name, n] : nodes_) out.push_back({name, n.slots, n.used, n.state});
  return out;
}

}  // namespace llmesh::actors
