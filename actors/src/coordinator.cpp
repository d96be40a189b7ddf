// The coordinator's logic (coordinator.hpp).
#include "llmesh/actors/coordinator.hpp"

#include <algorithm>
#include <random>
#include <nlohmann/json.hpp>

#include "llmesh/actors/join_auth.hpp"
#include "llmesh/transport/fault_injector.hpp"

namespace llmesh::actors {
namespace {

using transport::replica_phase;

const char* phase_name(replica_phase p) {
  switch (p) {
    case replica_phase::loading: return "loading";
    case replica_phase::ready: return "ready";
    case replica_phase::draining: return "draining";
    case replica_phase::dead: return "dead";
  }
  return "?";
}

std::string role_list(const std::vector<transport::role>& roles) {
  static constexpr const char* names[] = {"coordinator", "gateway", "router", "replica"};
  std::string out;
  for (auto r : roles) out.append(out.empty() ? "" : ",").append(names[static_cast<int>(r)]);  // (g++ 12 misreports "+": -Wrestrict)
  return out;
}

bool has_role(const std::vector<transport::role>& roles, transport::role r) {
  return std::find(roles.begin(), roles.end(), r) != roles.end();
}

coordinator_action send_to(transport::peer_id peer, uint64_t remote, transport::body b) {
  return {coordinator_action::send, peer, remote, std::move(b), 0, {}, {}};
}

}  // namespace

result<coordinator> coordinator::create(coordinator_options opt) {
  coordinator c(std::move(opt));
  if (auto s = c.plan_.set_models(c.opt_.models); !s) return s.take_error();
  return c;
}

coordinator::coordinator(coordinator_options opt)
    : opt_(std::move(opt)), members_(opt_.token, opt_.failure_timeout), next_lora_update_((uint64_t{std::random_device{}()} << 20) + 1) {}

coordinator::actions coordinator::on_message(transport::peer_id peer, const transport::envelope& e,
                                             mesh_clock::time_point now, uint64_t wall_ms) {
  actions out;
  now_ = now;
  bool told = false;  ///< routers elsewhere already told of this message's effects
  const uint64_t reply_to = e.source.actor;
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, transport::hello_msg>) {
          auto ch = members_.on_hello(peer, m, now);
          if (ch) {
            out.push_back(send_to(peer, reply_to, *ch));
          } else {
            out.push_back(send_to(peer, reply_to, transport::welcome_msg{false, ch.err().message, {}}));
          }
        } else if constexpr (std::is_same_v<T, transport::proof_msg>) {
          auto j = members_.on_proof(peer, m, now);
          out.push_back(send_to(peer, reply_to, j.welcome));
          if (j.joined) {
            const auto& info = members_.members().at(*j.joined);
            if (peer != 0 && has_role(info.who.roles, transport::role::router)) brief_router(peer, out);
            if (has_role(info.who.roles, transport::role::gateway)) {  // adapters added while serving
              for (const auto& s : plan_.models()) {
                if (s.enable_lora) lora_news(s.name, out, peer);
              }
            }
            if (has_role(info.who.roles, transport::role::replica)) {
              const uint32_t slots = std::min<uint32_t>(info.res.slots, 1024);  // 0: not said; 1024 as in configs
              if (auto ch = plan_.node_up(*j.joined, slots > 0 ? static_cast<int>(slots) : placement_planner::default_slots); ch) {
                auto more = apply(*ch);
                out.insert(out.end(), more.begin(), more.end());
              }
            }
          }
        } else if constexpr (std::is_same_v<T, transport::heartbeat_msg>) {
          auto known = members_.members().find(m.node);
          if (known == members_.members().end() || known->second.peer != peer) {
            // A node declared dead (silent too long: a partition that healed) still beats:
            // it must join again, and drop the replicas it kept (they were re-formed elsewhere).
            if (!members_.pending_on(peer)) {
              out.push_back(send_to(peer, reply_to, transport::welcome_msg{false, rejoin_reason, {}}));
            }
            return;
          }
          members_.on_heartbeat(peer, m, now);
        } else if constexpr (std::is_same_v<T, transport::replica_state_msg>) {
          auto it = replicas_.find(m.replica);
          if (it == replicas_.end() || it->second.peer != peer) return;  // stale or confused
          auto& r = it->second;
          if (m.phase == replica_phase::ready && r.phase == replica_phase::loading) {
            r.phase = replica_phase::ready;
            r.actor = m.actor;
            const auto* spec = spec_of(r.a.model);
            out.push_back({coordinator_action::replica_ready, peer, m.actor, {}, m.replica,
                           r.a.shards.front() + "/" + std::to_string(m.replica), r.a.model,
                           spec ? spec->prefill_for : std::string(),
                           spec && !spec->prefill_for.empty() ? spec->max_local_prefill_length : 0,
                           spec && !spec->prefill_for.empty() ? spec->max_prefill_queue_size : 0});
            settled(m.replica, out);
          } else if (m.phase == replica_phase::dead) {
            const replica_phase was = r.phase;
            stop_shards(r, r.a.shards.front(), false, out);  // its shards on other nodes go with it
            if (was == replica_phase::ready || was == replica_phase::draining) {
              out.push_back({coordinator_action::replica_gone, peer, 0, {}, m.replica, {}, {}});
            }
            if (was == replica_phase::draining) {
              replicas_.erase(it);  // a planned stop, done
            } else if (was == replica_phase::ready) {
              // It crashed after serving: re-formed, where capacity allows (its node may be it).
              replicas_.erase(it);
              auto more = apply(plan_.replica_failed(m.replica));
              out.insert(out.end(), more.begin(), more.end());
            } else {
              // It never loaded (a bad path, no memory): kept, with the reason, for ctl to show;
              // re-placing it would only fail again. Scaling or draining clears it.
              r.phase = replica_phase::dead;
              r.reason = m.reason;
            }
            settled(m.replica, out);
          }
        } else if constexpr (std::is_same_v<T, transport::control_msg>) {
          auto reply = control(peer, reply_to, m, wall_ms, out);
          tell_routers(out);
          told = true;
          if (reply) out.push_back(send_to(peer, reply_to, std::move(*reply)));  // the reply comes last
        } else if constexpr (std::is_same_v<T, transport::control_reply_msg>) {
          lora_answer(peer, m, out);  // a node's answer to a LoRA update
        }
      },
      e.msg);
  if (!told) tell_routers(out);
  return out;
}

coordinator::actions coordinator::on_peer_down(transport::peer_id peer) {
  actions out;
  if (auto name = members_.on_peer_down(peer)) node_lost(*name, out);
  tell_routers(out);
  return out;
}

coordinator::actions coordinator::on_tick(mesh_clock::time_point now) {
  actions out;
  now_ = now;
  for (const auto& name : members_.expire(now)) node_lost(name, out);
  lora_expire(now, out);
  tell_routers(out);
  return out;
}

void coordinator::tell_routers(actions& out) const {
  std::vector<transport::peer_id> routers;
  for (const auto& [name, info] : members_.members()) {
    if (info.peer != 0 && has_role(info.who.roles, transport::role::router)) routers.push_back(info.peer);
  }
  if (routers.empty()) return;
  const size_t n = out.size();
  for (size_t i = 0; i < n; ++i) {
    const auto& a = out[i];
    transport::replica_state_msg news;
    news.replica = a.replica;
    if (a.k == coordinator_action::replica_ready) {
      auto r = replicas_.find(a.replica);
      if (r == replicas_.end()) continue;
      auto host = members_.members().find(r->second.a.shards.front());
      if (host == members_.members().end()) continue;
      news.node = host->first;
      news.model = r->second.a.model;
      news.phase = replica_phase::ready;
      news.actor = r->second.actor;
      news.listen = host->second.who.listen;
      news.prefill_for = a.prefill_for;
      news.max_local_prefill = a.max_local_prefill;
      news.max_prefill_queue = a.max_prefill_queue;
    } else if (a.k == coordinator_action::replica_drain) {
      news.phase = replica_phase::draining;
    } else if (a.k == coordinator_action::replica_gone) {
      news.phase = replica_phase::dead;
    } else {
      continue;
    }
    for (auto p : routers) out.push_back(send_to(p, agent_actor_id, news));
  }
}

void coordinator::brief_router(transport::peer_id peer, actions& out) const {
  for (const auto& [id, r] : replicas_) {
    if (r.phase != replica_phase::ready) continue;
    auto host = members_.members().find(r.a.shards.front());
    if (host == members_.members().end()) continue;
    const auto* spec = spec_of(r.a.model);
    out.push_back(send_to(peer, agent_actor_id,
                          transport::replica_state_msg{id, host->first, r.a.model, replica_phase::ready, r.actor, "",
                                                       host->second.who.listen, spec ? spec->prefill_for : std::string(),
                                                       spec && !spec->prefill_for.empty() ? spec->max_local_prefill_length : 0,
                                                       spec && !spec->prefill_for.empty() ? spec->max_prefill_queue_size : 0}));
  }
}

void coordinator::node_lost(const std::string& name, actions& out) {
  // Replicas with a shard on the lost node cannot answer any more (one dead shard kills its
  // group): routers forget them now, and the nodes of their other shards stop them.
  std::vector<uint64_t> lost;
  for (auto it = replicas_.begin(); it != replicas_.end();) {
    const auto& shards = it->second.a.shards;
    if (std::find(shards.begin(), shards.end(), name) == shards.end()) {
      ++it;
      continue;
    }
    if (it->second.phase != replica_phase::dead) out.push_back({coordinator_action::replica_gone, 0, 0, {}, it->first, {}, {}});
    stop_shards(it->second, name, true, out);
    lost.push_back(it->first);
    it = replicas_.erase(it);
  }
  for (uint64_t id : lost) settled(id, out);
  lora_node_lost(name, out);
  auto more = apply(plan_.node_down(name));
  out.insert(out.end(), more.begin(), more.end());
}

void coordinator::stop_shards(const replica_record& r, const std::string& except, bool leader_too, actions& out) const {
  std::set<std::string> told{except};
  for (size_t i = leader_too ? 0 : 1; i < r.a.shards.size(); ++i) {
    const std::string& node = r.a.shards[i];
    if (!told.insert(node).second) continue;
    auto m = members_.members().find(node);
    if (m == members_.members().end()) continue;
    out.push_back(send_to(m->second.peer, agent_actor_id,
                          transport::assign_msg{r.a.id, r.a.model, "", 0, 0, transport::assign_op::stop, {}, {}, {}, {}, {}, {}, 0, {}}));
  }
}

coordinator::actions coordinator::apply(const std::vector<change>& changes) {
  actions out;
  std::map<std::string, std::set<uint64_t>> started;  ///< model → replicas started by these changes
  for (const auto& c : changes) {
    const std::string& node = c.r.shards.front();  // packed: every shard on one node
    auto m = members_.members().find(node);
    if (c.k == change::start_replica) {
      if (m == members_.members().end()) continue;  // cannot happen: placement only uses members
      const model_spec* spec = spec_of(c.r.model);
      if (!spec) continue;
      replicas_[c.r.id] = {c.r, replica_phase::loading, m->second.peer, 0, {}, {}, false};
      started[c.r.model].insert(c.r.id);
      transport::assign_msg a{c.r.id, spec->name, spec->path, static_cast<uint32_t>(spec->tp), spec->kv_cache_mb,
                              transport::assign_op::start, {}, {}, {},
                              spec->quantization == "none" ? std::string() : spec->quantization, {},
                              spec->kv_cache_dtype == "float32" ? std::string() : spec->kv_cache_dtype, spec->max_model_len,
                              spec->dtype == "auto" ? std::string() : spec->dtype};
      for (const auto& l : spec->loras) a.loras.push_back({l.name, l.path});
      if (auto rt = runtime_loras_.find(spec->name); rt != runtime_loras_.end()) {
        for (const auto& l : rt->second) a.loras.push_back({l.name, l.path});  // added while serving
      }
      a.enable_lora = spec->enable_lora;
      a.max_loras = static_cast<uint32_t>(spec->max_loras);
      a.expert_parallel = spec->expert_parallel;
      a.speculative_config = spec->speculative_config;
      a.max_batch_tokens = spec->max_num_batched_tokens;
      a.max_seqs = spec->max_num_seqs;
      a.long_prefill_threshold = spec->long_prefill_token_threshold;
      a.max_partial_prefills = static_cast<uint32_t>(spec->max_num_partial_prefills);
      a.max_long_partial_prefills = static_cast<uint32_t>(spec->max_long_partial_prefills);
      const bool spread = std::any_of(c.r.shards.begin(), c.r.shards.end(), [&](const auto& n) { return n != node; });
      if (!spread) {
        out.push_back(send_to(m->second.peer, agent_actor_id, a));
        continue;
      }
      // Shards on several nodes: each node runs its ranks; rank 0's node runs the replica and
      // forms the tensor group (the key keeps strangers out of it).
      auto key = join_auth::make_nonce();
      if (!key) continue;
      a.group_key = *key;
      std::map<std::string, std::vector<uint32_t>> ranks;
      for (size_t r = 0; r < c.r.shards.size(); ++r) {
        auto sm = members_.members().find(c.r.shards[r]);
        a.shard_nodes.push_back(sm == members_.members().end() ? "" : sm->second.who.listen);
        ranks[c.r.shards[r]].push_back(static_cast<uint32_t>(r));
      }
      for (const auto& [n, rs] : ranks) {
        auto sm = members_.members().find(n);
        if (sm == members_.members().end()) continue;
        transport::assign_msg part = a;
        part.ranks = rs;
        out.push_back(send_to(sm->second.peer, agent_actor_id, std::move(part)));
      }
    } else {
      auto it = replicas_.find(c.r.id);
      if (it == replicas_.end()) continue;  // already forgotten (its node was lost, or it crashed)
      if (it->second.phase == replica_phase::dead) {  // never loaded: nothing runs, nothing to tell
        replicas_.erase(it);
        continue;
      }
      if (m == members_.members().end()) {
        out.push_back({coordinator_action::replica_gone, 0, 0, {}, c.r.id, {}, {}});
        replicas_.erase(it);
        continue;
      }
      // A replica moving (a drain): it keeps serving until its replacement is ready.
      if (auto s = started.find(c.r.model); s != started.end() && it->second.phase == replica_phase::ready) {
        it->second.stop_pending = true;
        it->second.stop_after = s->second;
        continue;
      }
      stop_now(c.r.id, out);
    }
  }
  return out;
}

void coordinator::stop_now(uint64_t id, actions& out) {
  auto it = replicas_.find(id);
  if (it == replicas_.end()) return;
  auto m = members_.members().find(it->second.a.shards.front());
  if (m == members_.members().end()) return;
  it->second.stop_pending = false;
  it->second.stop_after.clear();
  if (it->second.phase == replica_phase::ready) out.push_back({coordinator_action::replica_drain, 0, 0, {}, id, {}, {}});
  it->second.phase = replica_phase::draining;
  out.push_back(send_to(m->second.peer, agent_actor_id,
                        transport::assign_msg{id, it->second.a.model, "", 0, 0, transport::assign_op::stop, {}, {}, {}, {}, {}, {}, 0, {}}));
}

void coordinator::settled(uint64_t id, actions& out) {
  std::vector<uint64_t> go;
  for (auto& [rid, r] : replicas_) {
    if (!r.stop_pending || r.stop_after.erase(id) == 0) continue;
    if (r.stop_after.empty()) go.push_back(rid);
  }
  for (uint64_t rid : go) stop_now(rid, out);
}

std::optional<transport::control_reply_msg> coordinator::control(transport::peer_id peer, uint64_t reply_to,
                                                                 const transport::control_msg& c, uint64_t wall_ms,
                                                                 actions& out) {
  const uint64_t skew = static_cast<uint64_t>(opt_.control_clock_skew.count());
  // A refusal names the command's nonce, so that a requester waiting on several (a gateway
  // node's LoRA updates) knows which one it answers.
  auto refused = [&](std::string why) {
    const std::string j = nlohmann::json{{"ok", false}, {"code", static_cast<int>(errc::unauthorized)}, {"request", join_auth::hex(c.nonce)}}.dump();
    return transport::control_reply_msg{false, std::move(why), j};
  };
  if (!join_auth::verify_control(opt_.token, c.nonce, c.timestamp_ms, c.command, c.args, c.mac)) {
    return refused("refused: bad credentials (check the cluster token)");
  }
  if (c.timestamp_ms + skew < wall_ms || c.timestamp_ms > wall_ms + skew) {
    return refused("refused: the command's clock is more than " + std::to_string(skew / 1000) + " s off");
  }
  if (!nonce_set_.insert(c.nonce).second) return refused("refused: a replayed command");
  recent_nonces_.push_back(c.nonce);
  if (recent_nonces_.size() > 4096) {
    nonce_set_.erase(recent_nonces_.front());
    recent_nonces_.pop_front();
  }
  if (c.command == "load-lora" || c.command == "unload-lora") return lora_command(peer, reply_to, c, out);
  return run_command(c.command, c.args, out);
}

transport::control_reply_msg coordinator::run_command(const std::string& cmd, const std::vector<std::string>& args,
                                                      actions& out) {
  auto need = [&](size_t n) { return args.size() == n; };
  auto applied = [&](result<std::vector<change>> r, const std::string& done) -> transport::control_reply_msg {
    if (!r) return {false, r.err().message, ""};
    auto more = apply(*r);
    out.insert(out.end(), more.begin(), more.end());
    return {true, done, nlohmann::json{{"ok", true}, {"changes", r->size()}}.dump()};
  };
  if (cmd == "status" && need(0)) {
    size_t ready = 0, total = replicas_.size();
    for (const auto& [id, r] : replicas_) ready += r.phase == replica_phase::ready;
    nlohmann::json pending = nlohmann::json::object();
    for (const auto& [model, n] : plan_.pending()) pending[model] = n;
    nlohmann::json j{{"nodes", members_.members().size()}, {"replicas", total}, {"ready", ready}, {"pending", pending}};
    std::string text = std::to_string(members_.members().size()) + " node(s), " + std::to_string(ready) + "/" +
                       std::to_string(total) + " replica(s) ready";
    for (const auto& [model, n] : plan_.pending()) text += ", " + model + " short of " + std::to_string(n);
    return {true, text, j.dump()};
  }
  if (cmd == "nodes" && need(0)) {
    std::string text;
    for (const auto& [name, info] : members_.members()) {
      const auto pn = plan_.nodes();
      const auto p = std::find_if(pn.begin(), pn.end(), [&](const placement_node& n) { return n.name == name; });
      text += name + "  " + info.who.listen + "  " + role_list(info.who.roles) +
              (p == pn.end() ? "" : std::string("  ") + (p->state == node_state::draining ? "draining" : "ready") +
                                        "  shards " + std::to_string(p->used) + "/" + std::to_string(p->slots)) +
              "\n";
    }
    return {true, text, nodes_json()};
  }
  if (cmd == "replicas" && need(0)) {
    std::string text;
    for (const auto& [id, r] : replicas_) {
      std::string where = r.a.shards.front();
      for (size_t k = 1; k < r.a.shards.size(); ++k) {
        if (r.a.shards[k] != r.a.shards.front()) where += "," + r.a.shards[k];  // spread: every rank's node, by rank
      }
      text += std::to_string(id) + "  " + r.a.model + "  " + where + "  " + phase_name(r.phase) +
              (r.stop_pending ? "  (moving: stops once its replacement is ready)" : "") +
              (r.reason.empty() ? "" : "  (" + r.reason + ")") + "\n";
    }
    return {true, text, replicas_json()};
  }
  if (cmd == "drain" && need(1)) return applied(plan_.drain(args[0]), "draining " + args[0]);
  if (cmd == "remove" && need(1)) return applied(plan_.remove(args[0]), "removed " + args[0]);
  if (cmd == "scale" && need(2)) {
    char* end = nullptr;
    const long n = std::strtol(args[1].c_str(), &end, 10);
    if (args[1].empty() || *end != '\0' || n < 0 || n > 1024) return {false, "scale: N must be 0..1024", ""};
    return applied(plan_.scale(args[0], static_cast<int>(n)), args[0] + " scaled to " + args[1]);
  }
  if (cmd == "fault" && need(2)) {
    // Fault injection on a node's transport (every connection of that node): checked here, so
    // a typo is answered; applied by the node's agent.
    auto m = members_.members().find(args[0]);
    if (m == members_.members().end()) return {false, "fault: no node '" + args[0] + "'", ""};
    if (auto rule = transport::parse_fault_rule(args[1]); !rule) return {false, "fault: " + rule.err().message, ""};
    out.push_back(send_to(m->second.peer, agent_actor_id, transport::control_msg{"fault", {args[1]}, "", 0, ""}));
    return {true, "fault '" + args[1] + "' set on " + args[0], nlohmann::json{{"ok", true}}.dump()};
  }
  if (cmd == "loras" && need(0)) {
    std::string text;
    nlohmann::json j = nlohmann::json::object();
    for (const auto& s : plan_.models()) {
      if (!s.enable_lora) continue;
      nlohmann::json list = nlohmann::json::array();
      auto line = s.name + ":";
      auto add = [&](const model::lora_source& l, bool runtime) {
        list.push_back({{"name", l.name}, {"path", l.path}, {"runtime", runtime}});
        line += " " + l.name + (runtime ? "" : " (config)");
      };
      for (const auto& l : s.loras) add(l, false);
      if (auto rt = runtime_loras_.find(s.name); rt != runtime_loras_.end()) {
        for (const auto& l : rt->second) add(l, true);
      }
      j[s.name] = list;
      text += line + "\n";
    }
    return {true, text.empty() ? "no model takes LoRA adapters (enable_lora)\n" : text, j.dump()};
  }
  return {false, "unknown command '" + cmd + "' with " + std::to_string(args.size()) +
                     " argument(s) (status, nodes, replicas, loras, drain NODE, remove NODE, scale MODEL N, fault NODE "
                     "RULE, load-lora MODEL NAME PATH, unload-lora MODEL NAME)",
          ""};
}

const model_spec* coordinator::spec_of(const std::string& model) const {
  for (const auto& s : plan_.models()) {
    if (s.name == model) return &s;
  }
  return nullptr;
}

std::string coordinator::nodes_json() const {
  nlohmann::json j = nlohmann::json::array();
  const auto pn = plan_.nodes();
  for (const auto& [name, info] : members_.members()) {
    nlohmann::json n{{"name", name}, {"listen", info.who.listen}, {"roles", role_list(info.who.roles)}};
    for (const auto& p : pn) {
      if (p.name != name) continue;
      n["state"] = p.state == node_state::draining ? "draining" : "ready";
      n["shards"] = p.used;
      n["slots"] = p.slots;
    }
    j.push_back(n);
  }
  return j.dump();
}

std::string coordinator::replicas_json() const {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [id, r] : replicas_) {
    j.push_back({{"id", id}, {"model", r.a.model}, {"node", r.a.shards.front()}, {"shards", r.a.shards},
                 {"phase", phase_name(r.phase)}, {"moving", r.stop_pending}, {"reason", r.reason}});
  }
  return j.dump();
}

}  // namespace llmesh::actors
