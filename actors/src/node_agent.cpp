// The node agent (node_agent.hpp).
#include "llmesh/actors/node_agent.hpp"

#include <cstdio>

#include "llmesh/actors/bridge_actor.hpp"
#include "llmesh/actors/coordinator.hpp"
#include "llmesh/actors/join_auth.hpp"
#include "llmesh/actors/replica_actor.hpp"
#include "llmesh/actors/router_actor.hpp"
#include "llmesh/transport/fault_injector.hpp"
#include "node_agent_detail.hpp"


namespace llmesh::actors {
namespace agent_detail {

void to_coordinator(agent* self, transport::body b) {
  auto& st = self->state;
  if (st.coordinator) {
    auto e = std::make_shared<transport::envelope>();
    e->source = {st.opt.node, agent_actor_id};
    e->destination = {st.opt.node, coordinator_actor_id};
    e->msg = std::move(b);
    self->send(st.coordinator, wire_atom::value, transport::peer_id{0}, std::move(e));
  } else if (st.coord_peer) {
    self->send(st.bridge, out_atom::value, *st.coord_peer, coordinator_actor_id, std::move(b), caf::actor_cast<caf::actor>(self));
  }
}

void report(agent* self, uint64_t id, const std::string& model, transport::replica_phase phase, uint64_t actor,
            std::string reason) {
  to_coordinator(self, transport::replica_state_msg{id, self->state.opt.node, model, phase, actor, std::move(reason), ""});
}

uint64_t host_replica(agent* self, uint64_t id, const std::string& model, std::shared_ptr<model::engine> eng,
                      caf::actor r, std::vector<caf::actor> remote) {
  auto& st = self->state;
  auto& h = st.hosted[id];
  h.model = model;
  h.engine = std::move(eng);
  h.replica = r;
  h.alive = 1;
  h.remote = std::move(remote);
  self->monitor(r);
  st.by_actor[r.address()] = id;
  const uint64_t export_id = replica_actor_base + id;
  self->send(st.bridge, export_atom::value, r, export_id);
  // Its local shard actors hold the engine too: it is freed only when they are gone as well
  // (the stand-ins for shards in other processes do not).
  self->request(r, std::chrono::seconds(10), shards_atom::value).await([=](const std::vector<caf::actor>& shards) {
    auto it = self->state.hosted.find(id);
    if (it == self->state.hosted.end()) return;
    const auto& far = it->second.remote;
    for (const auto& s : shards) {
      if (!s || std::find(far.begin(), far.end(), s) != far.end()) continue;
      self->monitor(s);
      self->state.by_actor[s.address()] = id;
      ++it->second.alive;
    }
  });
  return export_id;
}

}  // namespace agent_detail

namespace {

using namespace agent_detail;
using namespace std::chrono_literals;

void send_hello(agent* self) {
  auto& st = self->state;
  auto n = join_auth::make_nonce();
  if (!n) return;
  st.nonce = *n;
  transport::resources res;
  res.cores = std::max(1u, std::thread::hardware_concurrency());
  res.slots = static_cast<uint32_t>(std::max(st.opt.slots, 0));
  to_coordinator(self, transport::hello_msg{st.opt.node, st.opt.roles, st.opt.listen, res, st.nonce});
}

void start_join(agent* self) {
  auto& st = self->state;
  if (st.quitting || st.joined) return;
  if (st.coordinator) return send_hello(self);
  self->request(st.bridge, 10s, connect_atom::value, st.opt.seed)
      .then(
          [=](transport::peer_id p) {
            self->state.coord_peer = p;
            send_hello(self);
          },
          [=](caf::error&) { self->delayed_send(self, 1s, join_atom::value); });  // the seed is not up yet
}

/// Loads the model and builds the engine on a detached helper (a large model takes seconds;
/// heartbeats must go on meanwhile), then reports back with `(loaded_atom, id, engine, error)`.
void load_replica(agent* self, const transport::assign_msg& a) {
  auto& st = self->state;
  const std::string key = model_key(a);
  std::shared_ptr<const model::model> cached = cached_model(self, key);
  model::engine_options eo = st.opt.engine;
  eo.tp = static_cast<int>(std::max<uint32_t>(a.tp, 1));
  eo.expert_parallel = a.expert_parallel;
  const size_t kv_mb = a.kv_cache_mb;
  st.loading[a.replica] = {a.model, false};
  auto load = load_options_of(a, eo.device);
  auto kv_type = kv_type_of(a, eo.device);
  if (kv_type) eo.kv_type = *kv_type;
  auto sp = speculation_of(a, st.opt.sched);
  if (a.max_model_len > 0) default_long_prefill_threshold(sp.sched, a.max_model_len);  // the served context's 4 %
  if ((sp.own || sp.limits) && sp.err.empty()) st.sched_of[a.replica] = sp.sched;
  const size_t max_seqs = sp.sched.max_seqs;
  self->spawn<caf::detached>([agent_handle = caf::actor_cast<caf::actor>(self), a, eo, cached, kv_mb, max_seqs, key,
                              load, kv_type, node = st.opt.node, sp](caf::event_based_actor* helper) mutable {
    std::shared_ptr<const model::model> m = cached;
    std::string err;
    std::shared_ptr<model::engine> eng;
    if (!load) {
      err = load.err().message;
    } else if (!kv_type) {
      err = kv_type.err().message;
    } else if (!m) {
      auto loaded = model::model::load(a.path, *load);
      if (loaded) m = held_model(*loaded, node, a.model);
      else err = loaded.err().message;
    }
    std::shared_ptr<const model::model> draft;
    if (m && err.empty()) draft = draft_for(sp, *m, a.path, a.max_model_len, err);
    if (m && err.empty()) {
      eo.kv_tokens = kv_tokens_for_budget(kv_sizing_config(m->config(), a), eo.tp, kv_mb, max_seqs, eo.kv_type);
      auto e = model::engine::create(m, eo);
      if (e) eng = std::move(*e);
      else err = e.err().message;
    }
    helper->send(agent_handle, loaded_atom::value, a.replica, key, m, eng, err, draft);
  });
}

}  // namespace

void agent_detail::loaded(agent* self, uint64_t id, const std::string& key, std::shared_ptr<const model::model> m,
            std::shared_ptr<model::engine> eng, const std::string& err) {
  auto& st = self->state;
  auto pending = st.loading.find(id);
  if (pending == st.loading.end()) {
    st.sched_of.erase(id);
    return;
  }
  const std::string model = pending->second.first;
  const bool cancelled = pending->second.second || st.quitting;
  if (m) recache(self, key, m);
  // LoRA updates that came while it loaded: applied first (then this runs again).
  if (auto q = st.lora_queue.find(id); q != st.lora_queue.end()) {
    auto ops = std::move(q->second);
    st.lora_queue.erase(q);
    if (!cancelled && eng) return apply_queued_loras(self, id, key, std::move(m), std::move(eng), std::move(ops));
  }
  st.loading.erase(pending);
  scheduler_config sched = st.opt.sched;  // or its assignment's own speculation and limits
  if (auto own = st.sched_of.find(id); own != st.sched_of.end()) {
    sched = std::move(own->second);
    st.sched_of.erase(own);
  }
  if (m) default_long_prefill_threshold(sched, m->config().max_positions);  // no max_model_len: the model's context
  if (cancelled) return report(self, id, model, transport::replica_phase::dead, 0, "stopped while loading");
  if (!eng) {
    std::fprintf(stderr, "llmesh: node %s: replica %llu of '%s' failed to load: %s\n", st.opt.node.c_str(),
                 static_cast<unsigned long long>(id), model.c_str(), err.c_str());
    return report(self, id, model, transport::replica_phase::dead, 0, err);
  }
  auto r = spawn_replica(*self, eng.get(), sched);
  const int tp = eng->tp();
  const uint64_t export_id = host_replica(self, id, model, std::move(eng), r, {});
  const std::string limits = prefill_limits_text(sched);
  std::fprintf(stderr, "llmesh: node %s: replica %llu of '%s' ready (tp %d%s%s)\n", st.opt.node.c_str(),
               static_cast<unsigned long long>(id), model.c_str(), tp, limits.empty() ? "" : "; ", limits.c_str());
  report(self, id, model, transport::replica_phase::ready, export_id);
}

namespace {

void stop_replica(agent* self, uint64_t id) {
  if (auto l = self->state.loading.find(id); l != self->state.loading.end()) {
    l->second.second = true;
    return;
  }
  if (self->state.forming.count(id)) return fail_forming(self, id, "stopped while forming its tensor group");
  auto it = self->state.hosted.find(id);
  if (it == self->state.hosted.end() || it->second.stopping) return;
  if (it->second.follower) return stop_hosted(self, it->second);  // its replica's node drained it already
  it->second.stopping = true;
  it->second.stop_since = std::chrono::steady_clock::now();
  self->send(it->second.replica, drain_atom::value);  // takes nothing new
  self->send(self, poll_atom::value, id);
}

/// A stopping replica is polled until its last request finished (or the drain timeout), then stopped.
void poll(agent* self, uint64_t id) {
  auto it = self->state.hosted.find(id);
  if (it == self->state.hosted.end() || !it->second.replica) return;
  const auto waited = std::chrono::steady_clock::now() - it->second.stop_since;
  if (waited > self->state.opt.drain_timeout) {
    self->send_exit(it->second.replica, caf::exit_reason::user_shutdown);
    return;
  }
  self->send(it->second.replica, status_atom::value, caf::actor_cast<caf::actor>(self));
  self->delayed_send(self, 50ms, poll_atom::value, id);
}

/// Every replica here stops now (without draining), and those still loading or forming are
/// dropped when they arrive. With `keep_models` their models stay loaded for kept_after_drop
/// (the coordinator is lost: it may place them here again after the rejoin).
void drop_all(agent* self, bool keep_models) {
  auto& st = self->state;
  if (keep_models) {  // the coordinator may place them here again after the rejoin: no reload then
    st.kept.clear();
    for (const auto& [key, m] : st.models) {
      if (auto held = m.lock()) st.kept.push_back(std::move(held));
    }
    self->delayed_send(self, kept_after_drop, release_kept_atom::value, ++st.kept_epoch);
  }
  for (auto& [id, h] : st.hosted) stop_hosted(self, h);
  for (auto& [id, l] : st.loading) l.second = true;
  std::vector<uint64_t> forming;
  for (auto& [id, f] : st.forming) {
    if (!st.loading.count(id)) forming.push_back(id);
  }
  for (uint64_t id : forming) fail_forming(self, id, "dropped");
  lora_reset(self, "");
}

void on_down(agent* self, const caf::down_msg& d) {
  auto& st = self->state;
  auto a = st.by_actor.find(d.source);
  if (a == st.by_actor.end()) {
    return;
  }
  const uint64_t id = a->second;
  st.by_actor.erase(a);
  auto it = st.hosted.find(id);
  if (it == st.hosted.end()) return;
  auto& h = it->second;
  if (h.replica && d.source == h.replica.address()) {
    h.replica = caf::actor{};
    for (auto& p : h.remote) self->send_exit(p, caf::exit_reason::user_shutdown);  // stand-ins for other nodes' shards
    h.remote.clear();
  }
  if (--h.alive > 0) return;
  // Replica and shards are gone: the engine can go. The coordinator learns it stopped.
  const bool planned = h.stopping;
  const bool follower = h.follower;
  const std::string model = h.model;
  std::fprintf(stderr, "llmesh: node %s: %s %llu of '%s' stopped%s\n", st.opt.node.c_str(),
               follower ? "shards of replica" : "replica", static_cast<unsigned long long>(id), model.c_str(),
               follower ? "" : planned ? " after draining" : (st.quitting ? "" : " unexpectedly"));
  st.hosted.erase(it);  // (its engine, and the model if no other replica here uses it: logged after)
  if (!st.quitting && !follower) {  // a follower's shards: the replica's node reports
    report(self, id, model, transport::replica_phase::dead, 0, planned ? "" : "the replica stopped unexpectedly");
  }
  if (st.quitting && st.hosted.empty()) self->quit();
}

/// What the coordinator tells a router node (one without the coordinator) about a replica: the
/// router here adds it (through a proxy over a connection to its node), drains it, or drops it.
/// Awaited, so the news of one replica is handled in the order it came.
void replica_news(agent* self, const transport::replica_state_msg& m) {
  auto& st = self->state;
  if (!st.router) return;
  const uint64_t id = m.replica;
  auto known = st.routed.find(id);
  if (m.phase == transport::replica_phase::ready) {
    if (known != st.routed.end()) return;
    const std::string name = m.node + "/" + std::to_string(id), model = m.prefill_for.empty() ? m.model : m.prefill_for;
    const replica_role role = m.prefill_for.empty() ? replica_role::decode : replica_role::prefill;
    const uint64_t max_local = m.max_local_prefill, max_queue = m.max_prefill_queue;
    auto add = [=](caf::actor r, bool proxy) {
      if (!r) return;
      self->state.routed[id] = {r, proxy};
      self->send(self->state.router, add_atom::value, r, name, model, role, max_local, max_queue);
    };
    if (m.node == st.opt.node) {  // hosted here
      self->request(st.bridge, 10s, lookup_atom::value, m.actor).await([=](caf::actor r) { add(r, false); });
      return;
    }
    auto proxy_on = [=](transport::peer_id p) {
      self->request(self->state.bridge, 10s, proxy_atom::value, p, m.actor).await([=](caf::actor r) { add(r, true); });
    };
    return with_peer(self, m.listen, proxy_on);
  }
  if (known == st.routed.end()) return;
  if (m.phase == transport::replica_phase::draining) {
    self->send(st.router, drain_atom::value, known->second.first.id());
    return;
  }
  if (m.phase == transport::replica_phase::dead) {
    self->send(st.router, dead_atom::value, known->second.first.id());
    if (known->second.second) self->send_exit(known->second.first, caf::exit_reason::user_shutdown);
    st.routed.erase(known);
  }
}

void on_wire(agent* self, transport::peer_id peer, const transport::envelope& e) {
  auto& st = self->state;
  // Between the nodes of a spread replica (checked against the group's key there).
  if (const auto* m = std::get_if<transport::shard_ready_msg>(&e.msg)) return on_shard_ready(self, peer, *m);
  if (const auto* m = std::get_if<transport::shard_group_msg>(&e.msg)) return on_shard_group(self, *m);
  if (!st.coordinator && (!st.coord_peer || peer != *st.coord_peer)) return;  // only the coordinator commands
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, transport::challenge_msg>) {
          to_coordinator(self, transport::proof_msg{join_auth::proof(st.opt.token, m.nonce, st.nonce, st.opt.node)});
        } else if constexpr (std::is_same_v<T, transport::welcome_msg>) {
          if (!m.accepted && m.reason == rejoin_reason) {
            if (!st.joined) return;  // a rejoin already under way
            // Declared dead while cut off: the replicas here were re-formed elsewhere and no
            // router knows them any more. Stop them, then join as a fresh node.
            std::fprintf(stderr, "llmesh: node %s was declared dead; dropping its replicas and joining again\n",
                         st.opt.node.c_str());
            st.joined = false;
            drop_all(self, true);
            return send_hello(self);
          }
          if (!m.accepted) {
            std::fprintf(stderr, "llmesh: node %s: the coordinator refused the join: %s\n", st.opt.node.c_str(),
                         m.reason.c_str());
            if (st.opt.on_fatal) st.opt.on_fatal("join refused: " + m.reason);
            return;
          }
          const bool first = !st.joined;
          st.joined = true;
          if (first) {
            std::fprintf(stderr, "llmesh: node %s joined the mesh (%zu member(s))\n", st.opt.node.c_str(), m.members.size());
            self->send(self, beat_atom::value);
          }
        } else if constexpr (std::is_same_v<T, transport::control_reply_msg>) {
          on_lora_reply(self, m);  // the answer to this node's gateway's LoRA update
        } else if constexpr (std::is_same_v<T, transport::control_msg>) {
          if (m.command == "lora") return on_lora_command(self, m);
          if (m.command == "lora-news") return on_lora_news(self, m);
          if (m.command == "fault" && m.args.size() == 1 && st.opt.set_fault) {
            std::fprintf(stderr, "llmesh: node %s: fault '%s' on its transport\n", st.opt.node.c_str(), m.args[0].c_str());
            st.opt.set_fault(m.args[0]);
            const uint64_t epoch = ++st.fault_epoch;  // any newer rule cancels an older one's timer
            // A rule with for=D is lifted here after D (a partition cannot be lifted through itself).
            if (auto rule = transport::parse_fault_rule(m.args[0]); rule && rule->lasts.count() > 0) {
              self->delayed_send(self, rule->lasts, fault_clear_atom::value, epoch);
            }
          }
        } else if constexpr (std::is_same_v<T, transport::replica_state_msg>) {
          replica_news(self, m);
        } else if constexpr (std::is_same_v<T, transport::assign_msg>) {
          if (m.op == transport::assign_op::start) {
            const bool known = st.hosted.count(m.replica) || st.loading.count(m.replica) || st.forming.count(m.replica);
            if (!known && m.ranks.empty()) load_replica(self, m);
            else if (!known) load_part(self, m);
          } else {
            stop_replica(self, m.replica);
          }
        }
      },
      e.msg);
}

}  // namespace

size_t kv_tokens_for_budget(const model::model_config& c, int tp, size_t budget_mb, size_t max_seqs, kernels::dtype kv_type) {
  const size_t heads = std::max<size_t>(1, c.n_kv_heads / static_cast<size_t>(std::max(tp, 1)));
  const size_t per_token = 2 * c.n_layers * heads * c.head_dim * kernels::dtype_size(kv_type);
  const size_t tokens = budget_mb * (size_t{1} << 20) / std::max<size_t>(per_token, 1);
  return std::min(tokens, max_seqs * c.max_positions);  // more could never be used
}

caf::behavior node_agent(agent* self, node_agent_options opt, caf::actor bridge) {
  self->state.opt = std::move(opt);
  self->state.bridge = std::move(bridge);
  self->set_down_handler([=](const caf::down_msg& d) { on_down(self, d); });
  return {
      [=](agent_atom, caf::actor coordinator) { self->state.coordinator = std::move(coordinator); },
      [=](router_atom, caf::actor router) { self->state.router = std::move(router); },
      [=](join_atom) { start_join(self); },
      [=](beat_atom) {
        auto& st = self->state;
        if (!st.joined || st.quitting) return;
        to_coordinator(self, transport::heartbeat_msg{st.opt.node, ++st.seq});
        self->delayed_send(self, st.opt.heartbeat, beat_atom::value);
      },
      [=](wire_atom, transport::peer_id peer, const std::shared_ptr<transport::envelope>& e) { on_wire(self, peer, *e); },
      [=](peerdown_atom, transport::peer_id peer, const std::string& why) {
        auto& st = self->state;
        for (auto it = st.node_peers.begin(); it != st.node_peers.end();) {  // its proxies stop with it
          it = it->second == peer ? st.node_peers.erase(it) : std::next(it);
        }
        if (!st.coord_peer || *st.coord_peer != peer) return;
        std::fprintf(stderr, "llmesh: node %s lost the coordinator (%s); dropping its replicas and rejoining\n",
                     st.opt.node.c_str(), why.c_str());
        st.coord_peer.reset();
        st.joined = false;
        lora_reset(self, "this node lost its coordinator before the LoRA adapter update was answered; retry");
        // The coordinator forgot this node's replicas with the connection (and re-formed them
        // elsewhere); kept, they would be orphans no router knows. Their models stay a while.
        drop_all(self, true);
        self->delayed_send(self, 1s, join_atom::value);
      },
      [=](loaded_atom, uint64_t id, const std::string& path, std::shared_ptr<const model::model> m,
          std::shared_ptr<model::engine> eng, const std::string& err, std::shared_ptr<const model::model> draft) {
        // Its own speculation's draft model; prompt lookup has none already, and limits alone keep the node's.
        auto own = self->state.sched_of.find(id);
        if (own != self->state.sched_of.end() && draft) own->second.draft_model = std::move(draft);
        loaded(self, id, path, std::move(m), std::move(eng), err);
      },
      [=](poll_atom, uint64_t id) { poll(self, id); },
      [=](lora_atom, bool load, const std::string& model, const std::string& name, const std::string& path) {
        request_lora(self, self->make_response_promise(), load, model, name, path);
      },
      [=](lora_done_atom, const std::shared_ptr<lora_applied>& r) { lora_done(self, r); },
      [=](lora_late_atom, const std::string& request) { lora_late(self, request); },
      [=](lora_queued_atom, uint64_t id, const std::string& key, std::shared_ptr<const model::model> m,
          std::shared_ptr<model::engine> eng, const std::string& failed, const std::string& err) {
        queued_loras_applied(self, id, key, std::move(m), std::move(eng), failed, err);
      },
      [=](part_atom, const std::shared_ptr<loaded_part>& p) { part_loaded(self, p); },
      [=](joined_atom, uint64_t id, const std::string& err) { joined(self, id, err); },
      [=](form_timeout_atom, uint64_t id) {
        if (self->state.forming.count(id)) fail_forming(self, id, "the other ranks' nodes did not report in time");
      },
      [=](group_lost_atom, uint64_t id) {  // a follower's tensor group failed: its shards end
        auto it = self->state.hosted.find(id);
        if (it != self->state.hosted.end() && it->second.follower) stop_hosted(self, it->second);
      },
      [=](release_kept_atom, uint64_t epoch) {
        if (epoch == self->state.kept_epoch) self->state.kept.clear();  // those not placed here again go
      },
      [=](fault_clear_atom, uint64_t epoch) {
        auto& st = self->state;
        if (epoch != st.fault_epoch || !st.opt.set_fault) return;  // a newer rule replaced it
        std::fprintf(stderr, "llmesh: node %s: fault lifted\n", st.opt.node.c_str());
        st.opt.set_fault("none");
      },
      [=](const replica_load& l) {
        for (auto& [id, h] : self->state.hosted) {
          if (h.stopping && h.replica && h.replica.id() == l.replica && l.running + l.waiting == 0) {
            self->send_exit(h.replica, caf::exit_reason::user_shutdown);
          }
        }
      },
      [=](stop_atom) {
        auto& st = self->state;
        st.quitting = true;
        lora_reset(self, "this node is stopping; retry on another gateway");
        st.kept.clear();
        drop_all(self, false);
        if (st.hosted.empty()) return self->quit();  // (a replica still loading is dropped when it arrives)
      },
  };
}

}  // namespace llmesh::actors
