// Runtime LoRA updates across the mesh (coordinator.hpp): vLLM's /v1/load_lora_adapter and
// /v1/unload_lora_adapter on a gateway node, or `llmesh ctl load-lora` / `unload-lora`, arrive
// here as signed control commands. The coordinator checks them, records the model's new adapter
// list at once (a replica assigned meanwhile loads it with the config's), sends a "lora" command
// to every node hosting a replica of the model, and answers its requester once each has
// answered: all applied — the gateways learn the model's adapters ("lora-news"); one refused or
// stayed silent — the list goes back and the nodes undo it. One update per model at a time.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "llmesh/actors/coordinator.hpp"
#include "llmesh/actors/join_auth.hpp"
#include "llmesh/model/lora_set.hpp"

namespace llmesh::actors {
namespace {

using reply = transport::control_reply_msg;

reply refuse(errc code, std::string text, const std::string& request = {}) {
  nlohmann::json j{{"ok", false}, {"code", static_cast<int>(code)}};
  if (!request.empty()) j["request"] = request;
  return {false, std::move(text), j.dump()};
}

coordinator_action send_to(transport::peer_id peer, uint64_t remote, transport::body b) {
  return {coordinator_action::send, peer, remote, std::move(b), 0, {}, {}};
}

}  // namespace

std::optional<transport::control_reply_msg> coordinator::lora_command(transport::peer_id peer, uint64_t reply_to,
                                                                      const transport::control_msg& c, actions& out) {
  const bool load = c.command == "load-lora";
  const std::string request = join_auth::hex(c.nonce);
  if (c.args.size() != (load ? 3u : 2u)) {
    return refuse(errc::invalid_request, load ? "load-lora: give MODEL NAME PATH" : "unload-lora: give MODEL NAME", request);
  }
  const std::string& model = c.args[0];
  const std::string& name = c.args[1];
  const model_spec* spec = spec_of(model);
  if (!spec) return refuse(errc::not_found, "the base model '" + model + "' is not served here", request);
  if (!spec->enable_lora) {
    return refuse(errc::invalid_request,
                  "'" + model + "' does not take LoRA adapters while serving: set 'enable_lora: true' in its cluster config entry",
                  request);
  }
  if (spec->place == placement::spread) {
    return refuse(errc::unsupported,
                  "'" + model + "' is spread over nodes: its adapters are its cluster config's 'loras' (a spread replica's "
                  "ranks name them by their place there)",
                  request);
  }
  if (!model::valid_lora_name(name)) {
    return refuse(errc::invalid_request, "'lora_name' must be 1 to 128 letters, digits and -_.:/", request);
  }
  for (const auto& [id, u] : lora_updates_) {
    if (u.model == model) return refuse(errc::overloaded, "another LoRA adapter update of '" + model + "' is in progress; retry", request);
  }
  auto& rt = runtime_loras_[model];
  auto at = std::find_if(rt.begin(), rt.end(), [&](const model::lora_source& l) { return l.name == name; });
  const bool in_config = std::any_of(spec->loras.begin(), spec->loras.end(), [&](const auto& l) { return l.name == name; });
  lora_update u;
  if (load) {
    if (c.args[2].empty()) return refuse(errc::invalid_request, "Both 'lora_name' and 'lora_path' must be provided.", request);
    for (const auto& s : plan_.models()) {
      if (s.name == name) return refuse(errc::invalid_request, "'" + name + "' names a served model; an adapter needs a name of its own", request);
      const auto& mine = runtime_loras_[s.name];
      const bool taken = std::any_of(s.loras.begin(), s.loras.end(), [&](const auto& l) { return l.name == name; }) ||
                         std::any_of(mine.begin(), mine.end(), [&](const auto& l) { return l.name == name; });
      if (taken) return refuse(errc::invalid_request, "The lora adapter '" + name + "' has already been loaded.", request);
    }
    const size_t held = spec->loras.size() + rt.size(), most = spec->max_loras ? spec->max_loras : model::lora_set::default_capacity;
    if (held >= most) {
      return refuse(errc::invalid_request,
                    "'" + model + "' holds its most LoRA adapters (" + std::to_string(most) +
                        ", the cluster config's max_loras); unload one first",
                    request);
    }
    const bool ready = std::any_of(replicas_.begin(), replicas_.end(), [&](const auto& r) {
      return r.second.a.model == model && r.second.phase == transport::replica_phase::ready;
    });
    // The adapter is checked where it loads: with no replica to load it, a bad path would only
    // show as every later replica failing to start.
    if (!ready) return refuse(errc::replica_unavailable, "no replica of '" + model + "' is ready to load the adapter; retry once one is", request);
    u.src = {name, c.args[2]};
    rt.push_back(u.src);
  } else {
    if (in_config) {
      return refuse(errc::invalid_request,
                    "'" + name + "' is one of '" + model + "''s loras in the cluster config: it is served while the mesh runs",
                    request);
    }
    if (at == rt.end()) return refuse(errc::not_found, "The lora adapter '" + name + "' cannot be found.", request);
    u.src = *at;
    rt.erase(at);
  }
  // Recorded at once: a replica assigned from now on loads the new list; one loading now is
  // among the nodes told (its node applies the update once it has loaded).
  u.model = model;
  u.load = load;
  u.reply_peer = peer;
  u.reply_actor = reply_to;
  u.request = request;
  u.waiting = nodes_of(model);
  u.deadline = now_ + opt_.lora_timeout;
  const uint64_t id = next_lora_update_++;
  for (const auto& node : u.waiting) {
    auto m = members_.members().find(node);
    out.push_back(send_to(m->second.peer, agent_actor_id,
                          transport::control_msg{"lora", {std::to_string(id), load ? "load" : "unload", model, name, u.src.path}, "", 0, ""}));
  }
  const bool nobody = u.waiting.empty();
  lora_updates_.emplace(id, std::move(u));
  if (nobody) lora_finish(id, out);  // (an unload with no replica running: only the list changes)
  return std::nullopt;
}

void coordinator::lora_answer(transport::peer_id peer, const transport::control_reply_msg& m, actions& out) {
  auto j = nlohmann::json::parse(m.json, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("lora_update") || !j["lora_update"].is_number_unsigned()) return;
  auto it = lora_updates_.find(j["lora_update"].get<uint64_t>());
  if (it == lora_updates_.end()) return;  // an undo's answer, or one past its deadline
  std::string node;
  for (const auto& [name, info] : members_.members()) {
    if (info.peer == peer) node = name;
  }
  auto& u = it->second;
  if (node.empty() || u.waiting.erase(node) == 0) return;
  if (m.ok) {  // (a node of an earlier build does not say: one copy)
    auto n = j.find("applied");
    u.applied += n != j.end() && n->is_number_unsigned() ? n->get<uint64_t>() : 1;
  }
  if (!m.ok && u.failure.empty()) {
    u.failure = "node " + node + ": " + m.text;
    if (auto code = j.find("code"); code != j.end() && code->is_number_unsigned() && code->get<uint64_t>() <= static_cast<uint64_t>(errc::internal)) {
      u.failure_code = static_cast<errc>(code->get<int>());
    }
  }
  if (u.waiting.empty()) lora_finish(it->first, out);
}

void coordinator::lora_finish(uint64_t id, actions& out) {
  auto it = lora_updates_.find(id);
  if (it == lora_updates_.end()) return;
  lora_update u = std::move(it->second);
  lora_updates_.erase(it);
  if (u.load && u.failure.empty() && u.applied == 0) {  // its replicas' nodes left (or stopped them) before loading it
    u.failure = "no replica of '" + u.model + "' loaded the adapter: the nodes hosting them left or stopped them meanwhile; retry";
    u.failure_code = errc::replica_unavailable;
  }
  reply r;
  if (u.failure.empty()) {
    lora_news(u.model, out);
    r = {true,
         "Success: LoRA adapter '" + u.src.name + "' " + (u.load ? "added" : "removed") + " successfully.",
         nlohmann::json{{"ok", true}, {"request", u.request}}.dump()};
  } else {
    // Undone: the list as it was, and every node of the model told the reverse (a node that
    // never applied it finds nothing to undo).
    auto& rt = runtime_loras_[u.model];
    if (u.load) {
      rt.erase(std::remove_if(rt.begin(), rt.end(), [&](const auto& l) { return l.name == u.src.name; }), rt.end());
    } else {
      rt.push_back(u.src);
    }
    for (const auto& node : nodes_of(u.model)) {
      auto m = members_.members().find(node);
      out.push_back(send_to(m->second.peer, agent_actor_id,
                            transport::control_msg{"lora", {"0", u.load ? "unload" : "load", u.model, u.src.name, u.src.path}, "", 0, ""}));
    }
    r = refuse(u.failure_code, u.failure, u.request);
  }
  out.push_back(send_to(u.reply_peer, u.reply_actor, std::move(r)));
}

std::set<std::string> coordinator::nodes_of(const std::string& model) const {
  std::set<std::string> out;
  for (const auto& [id, r] : replicas_) {
    if (r.a.model != model || r.phase == transport::replica_phase::dead) continue;
    for (const auto& n : r.a.shards) {
      if (members_.members().count(n)) out.insert(n);
    }
  }
  return out;
}

void coordinator::lora_news(const std::string& model, actions& out, std::optional<transport::peer_id> only) const {
  transport::control_msg news{"lora-news", {model}, "", 0, ""};
  if (auto rt = runtime_loras_.find(model); rt != runtime_loras_.end()) {
    for (const auto& l : rt->second) {
      news.args.push_back(l.name);
      news.args.push_back(l.path);
    }
  }
  for (const auto& [name, info] : members_.members()) {
    const auto& roles = info.who.roles;
    if (std::find(roles.begin(), roles.end(), transport::role::gateway) == roles.end()) continue;
    if (only && info.peer != *only) continue;
    out.push_back(send_to(info.peer, agent_actor_id, news));
  }
}

void coordinator::lora_node_lost(const std::string& node, actions& out) {
  std::vector<uint64_t> done;
  for (auto& [id, u] : lora_updates_) {
    if (u.waiting.erase(node) > 0 && u.waiting.empty()) done.push_back(id);  // its replicas are gone with it
  }
  for (uint64_t id : done) lora_finish(id, out);
}

void coordinator::lora_expire(mesh_clock::time_point now, actions& out) {
  std::vector<uint64_t> late;
  for (auto& [id, u] : lora_updates_) {
    if (now < u.deadline || u.waiting.empty()) continue;
    std::string who;
    for (const auto& n : u.waiting) who += (who.empty() ? "" : ", ") + n;
    if (u.failure.empty()) {  // a node's refusal says more than another's silence
      u.failure = "node(s) " + who + " did not answer within " +
                  std::to_string(std::chrono::duration_cast<std::chrono::seconds>(opt_.lora_timeout).count()) + " s";
      u.failure_code = errc::deadline_exceeded;
    }
    u.waiting.clear();
    late.push_back(id);
  }
  for (uint64_t id : late) lora_finish(id, out);
}

}  // namespace llmesh::actors
