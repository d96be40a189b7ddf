// The node agent's spread replicas (node_agent_detail.hpp): a replica whose tensor-parallel
// ranks run on several nodes. Every node of the replica loads its ranks (an engine part, each
// rank with a tensor_communicator listening on the tensor plane). The other nodes ("followers")
// export a shard actor per rank and report ShardReady to rank 0's node; rank 0's node sends them
// all ShardGroup (every rank's tensor address), every rank joins the group, and rank 0's node
// starts the replica actor with the bridge's stand-ins for the remote shards, exports it and
// reports it ready. Steps then travel as ShardStep/ShardResult frames (mesh plane) while the
// activations go rank to rank (tensor plane).
#include <algorithm>
#include <cstdio>
#include <set>

#include "llmesh/actors/bridge_actor.hpp"
#include "llmesh/actors/coordinator.hpp"
#include "llmesh/actors/replica_actor.hpp"
#include "llmesh/actors/shard_actor.hpp"
#include "node_agent_detail.hpp"

namespace llmesh::actors::agent_detail {
namespace {

using namespace std::chrono_literals;

/// Sends `b` to the node agent on connection `peer`.
void to_agent(agent* self, transport::peer_id peer, transport::body b) {
  self->send(self->state.bridge, out_atom::value, peer, agent_actor_id, std::move(b), caf::actor_cast<caf::actor>(self));
}

bool is_leader(const transport::assign_msg& a) { return !a.ranks.empty() && a.ranks.front() == 0; }

/// Rank 0's node: every rank known and the engine loaded: the group forms.
void maybe_form(agent* self, uint64_t id) {
  auto it = self->state.forming.find(id);
  if (it == self->state.forming.end()) return;
  auto& f = it->second;
  if (!f.engine || f.joining) return;
  for (const auto& t : f.tensors) {
    if (t.empty()) return;
  }
  // Each rank's setting as rank 0's, or why not: "rank R's <holds> X, rank 0's <as>W: ... <key>".
  auto disagreement = [](const std::map<int, std::string>& got, const std::string& want, const char* holds, const char* as,
                         const char* key) -> std::string {
    for (const auto& [rank, v] : got) {
      if (v != want) {
        return "rank " + std::to_string(rank) + "'s " + holds + " " + v + ", rank 0's " + as + want +
               ": every node of the replica must run a build that knows the model's " + key;
      }
    }
    return {};
  };
  // A node of an older build ignores the model's settings. The same KV cache elements as rank 0
  // first (before the block counts, which such a node's cache also changes); then the weights
  // held as rank 0 holds them (quantization, --dtype), or the ranks' partial sums would not add up.
  for (const std::string& why :
       {disagreement(f.kv_types, std::string(model::kv_cache_dtype_name(f.engine->kv_type())), "KV cache holds", "",
                     "kv_cache_dtype"),
        disagreement(f.quantization, f.a.quantization.empty() ? "none" : f.a.quantization, "node holds the weights as", "as ",
                     "quantization"),
        disagreement(f.dtypes, f.a.dtype.empty() ? "auto" : f.a.dtype, "node holds the weights in", "in ", "dtype")}) {
    if (!why.empty()) return fail_forming(self, id, why);
  }
  // And the same LoRA adapters in the same order (a step names them by index; a node of an
  // older build loads none and would add no deltas).
  for (const auto& [rank, names] : f.loras) {
    if (names != lora_names(f.a)) {
      return fail_forming(self, id, "rank " + std::to_string(rank) + "'s node loaded other LoRA adapters than the assignment's: "
                                        "every node of the replica must run a build that serves them");
    }
  }
  // Rank 0 hands out block ids for every rank's KV cache: they must be the same size (nodes
  // whose --max-seqs differ size them differently).
  for (const auto& [rank, blocks] : f.kv_blocks) {
    if (blocks != f.engine->kv_blocks()) {
      return fail_forming(self, id, "rank " + std::to_string(rank) + "'s KV cache has " + std::to_string(blocks) +
                                        " blocks, rank 0's " + std::to_string(f.engine->kv_blocks()) +
                                        ": the nodes must run with the same scheduler settings");
    }
  }
  f.joining = true;
  std::set<transport::peer_id> told;
  for (const auto& [rank, where] : f.remote) {
    if (told.insert(where.first).second) to_agent(self, where.first, transport::shard_group_msg{id, f.a.group_key, f.tensors});
  }
  self->spawn<caf::detached>([agent_handle = caf::actor_cast<caf::actor>(self), id, eng = f.engine, comms = f.comms,
                              tensors = f.tensors](caf::event_based_actor* helper) {
    std::string err;
    for (auto* c : comms) {  // ascending ranks: each waits only for greetings others send unasked
      if (auto s = c->join(tensors); !s) {
        err = s.err().message;
        break;
      }
    }
    helper->send(agent_handle, joined_atom::value, id, err);
  });
}

/// Rank 0's node: asks the bridge for the stand-ins of the remote shards one by one, then
/// `done` with them (rank → actor).
void gather_proxies(agent* self, std::vector<std::pair<int, std::pair<transport::peer_id, uint64_t>>> left,
                    std::map<int, caf::actor> got, std::function<void(std::map<int, caf::actor>)> done) {
  if (left.empty()) return done(std::move(got));
  auto [rank, where] = left.back();
  left.pop_back();
  self->request(self->state.bridge, 10s, proxy_atom::value, where.first, where.second)
      .await([=](caf::actor p) mutable {
        got[rank] = p;
        gather_proxies(self, std::move(left), std::move(got), done);
      });
}

}  // namespace

void with_peer(agent* self, const std::string& listen, std::function<void(transport::peer_id)> then) {
  if (auto p = self->state.node_peers.find(listen); p != self->state.node_peers.end()) return then(p->second);
  self->request(self->state.bridge, 10s, connect_atom::value, listen).await([=](transport::peer_id p) {
    self->state.node_peers[listen] = p;
    then(p);
  });
}

void load_part(agent* self, const transport::assign_msg& a) {
  auto& st = self->state;
  const uint32_t tp = std::max<uint32_t>(a.tp, 1);
  bool valid = a.shard_nodes.size() == tp && a.group_key.size() >= 16 && !a.shard_nodes.front().empty();
  for (uint32_t r : a.ranks) valid = valid && r < tp;
  std::string err;
  if (!valid) err = "a malformed assignment for a replica spread over nodes";
  if (!st.opt.make_tensor_transport) err = "this node cannot host shards of a replica spread over nodes";
  st.loading[a.replica] = {a.model, false};
  if (!is_leader(a)) st.assigned[a.replica] = a;
  if (is_leader(a)) {
    forming_replica f;
    f.a = a;
    f.tensors.assign(tp, "");
    st.forming[a.replica] = std::move(f);
  }
  std::shared_ptr<const model::model> cached = cached_model(self, model_key(a, true));
  model::engine_options eo = st.opt.engine;
  eo.tp = static_cast<int>(tp);
  eo.expert_parallel = a.expert_parallel;
  auto settings = speculation_of(a, st.opt.sched);  // the node's, with the assignment's limits and speculation
  const size_t max_seqs = settings.sched.max_seqs;
  tensor_group_options go;
  go.size = static_cast<int>(tp);
  go.key = a.group_key;
  go.timeout = st.opt.tensor_timeout;
  self->spawn<caf::detached>([agent_handle = caf::actor_cast<caf::actor>(self), a, eo, cached, max_seqs, go, err,
                              make = st.opt.make_tensor_transport, node = st.opt.node,
                              host = st.opt.tensor_host,
                              load = load_options_of(a, eo.device),
                              kv_type = kv_type_of(a, eo.device),
                              sp = std::move(settings)](caf::event_based_actor* helper) mutable {
    auto p = std::make_shared<loaded_part>();
    p->id = a.replica;
    p->path = model_key(a, true);
    p->err = err;
    p->m = cached;
    if (p->err.empty() && !load) p->err = load.err().message;
    if (p->err.empty() && !kv_type) p->err = kv_type.err().message;
    if (kv_type) eo.kv_type = *kv_type;
    if (p->err.empty() && !p->m) {
      load->ranks = ranks_of(a);  // only what this node's ranks read of the matrices written at load
      auto loaded = model::model::load(a.path, *load);
      if (loaded) p->m = held_model(*loaded, node, a.model);
      else p->err = loaded.err().message;
    }
    // Rank 0's node runs the replica (and its draft model, if any).
    if (p->err.empty() && p->m && is_leader(a)) {
      auto draft = draft_for(sp, *p->m, a.path, a.max_model_len, p->err);  // the assignment's draft, or the node's checked
      p->sched = sp.sched;
      if (sp.own) p->sched.draft_model = std::move(draft);
      default_long_prefill_threshold(p->sched, kv_sizing_config(p->m->config(), a).max_positions);
    }
    if (p->m) p->resident_mb = p->m->resident_weight_bytes() >> 20;
    std::vector<std::unique_ptr<kernels::communicator>> comms;
    for (uint32_t r : a.ranks) {
      if (!p->err.empty()) break;
      auto net = make();
      if (!net) {
        p->err = "tensor plane: " + net.err().message;
        break;
      }
      go.rank = static_cast<int>(r);
      auto c = tensor_communicator::create(std::move(*net), host + ":0", go);
      if (!c) {
        p->err = "tensor plane: " + c.err().message;
        break;
      }
      p->comms.push_back(c->get());
      comms.push_back(std::move(*c));
    }
    if (p->err.empty()) {
      eo.kv_tokens = kv_tokens_for_budget(kv_sizing_config(p->m->config(), a), eo.tp, a.kv_cache_mb, max_seqs, eo.kv_type);
      auto e = model::engine::create_part(p->m, eo, std::move(comms));
      if (e) p->engine = std::move(*e);
      else p->err = e.err().message;
    }
    if (!p->engine) p->comms.clear();
    helper->send(agent_handle, part_atom::value, p);
  });
}

void part_loaded(agent* self, const std::shared_ptr<loaded_part>& p) {
  auto& st = self->state;
  auto pending = st.loading.find(p->id);
  if (pending == st.loading.end()) return;
  const std::string model = pending->second.first;
  const bool cancelled = pending->second.second || st.quitting;
  st.loading.erase(pending);
  if (p->m) st.models[p->path] = p->m;
  auto f = st.forming.find(p->id);
  if (f != st.forming.end()) {  // rank 0's node
    if (cancelled) return fail_forming(self, p->id, "stopped while loading");
    if (!p->engine) {
      std::fprintf(stderr, "llmesh: node %s: replica %llu of '%s' failed to load: %s\n", st.opt.node.c_str(),
                   static_cast<unsigned long long>(p->id), model.c_str(), p->err.c_str());
      return fail_forming(self, p->id, p->err);
    }
    std::fprintf(stderr, "llmesh: node %s: rank 0's part of replica %llu of '%s' loaded (%zu MiB of weights in memory)\n",
                 st.opt.node.c_str(), static_cast<unsigned long long>(p->id), model.c_str(), p->resident_mb);
    f->second.engine = p->engine;
    f->second.comms = p->comms;
    f->second.sched = p->sched;
    for (auto* c : p->comms) f->second.tensors[static_cast<size_t>(c->rank())] = c->address();
    self->delayed_send(self, st.opt.form_timeout, form_timeout_atom::value, p->id);
    return maybe_form(self, p->id);
  }
  // Another rank's node: it hosts shard actors for rank 0's replica and tells that node.
  if (cancelled) {
    st.assigned.erase(p->id);
    return;
  }
  // Which assignment: the loading entry kept only the model; the ranks come with the part.
  auto leader_listen = std::make_shared<std::string>();
  auto key = std::make_shared<std::string>();
  {
    auto a = st.assigned.find(p->id);
    if (a == st.assigned.end()) return;
    if (a->second.shard_nodes.empty()) {  // malformed (load_part refused it): nobody to tell
      st.assigned.erase(a);
      return;
    }
    *leader_listen = a->second.shard_nodes.front();
    *key = a->second.group_key;
    if (!p->engine) {
      std::fprintf(stderr, "llmesh: node %s: shards of replica %llu failed to load: %s\n", st.opt.node.c_str(),
                   static_cast<unsigned long long>(p->id), p->err.c_str());
      const auto ranks = a->second.ranks;
      st.assigned.erase(a);
      return with_peer(self, *leader_listen, [=](transport::peer_id peer) {
        for (uint32_t r : ranks) to_agent(self, peer, transport::shard_ready_msg{p->id, r, "", 0, *key, false, p->err, 0, {}, {}, {}, {}});
      });
    }
    st.assigned.erase(a);
  }
  auto& h = st.hosted[p->id];
  h.model = model;
  h.engine = p->engine;
  h.follower = true;
  h.group_key = *key;
  h.comms = p->comms;
  std::vector<transport::shard_ready_msg> ready;
  for (auto* c : p->comms) {
    const int rank = c->rank();
    auto s = self->spawn<caf::detached>(remote_shard_actor, p->engine.get(), rank);
    self->monitor(s);
    st.by_actor[s.address()] = p->id;
    h.shards.push_back(s);
    ++h.alive;
    const uint64_t sid = shard_actor_id(p->id, static_cast<uint32_t>(rank));
    self->send(st.bridge, export_atom::value, s, sid);
    ready.push_back({p->id, static_cast<uint32_t>(rank), c->address(), sid, *key, true, "", p->engine->kv_blocks(),
                     std::string(model::quantization_name(p->m->quant())), lora_names(*p->m),
                     std::string(model::kv_cache_dtype_name(p->engine->kv_type())),
                     std::string(model::weight_dtype_name(p->m->cast_type()))});
    // The group failing (rank 0's node lost, a peer's abort) ends these shards.
    c->set_on_failed([me = caf::actor_cast<caf::actor>(self), id = p->id](const error&) {
      caf::anon_send(me, group_lost_atom::value, id);
    });
  }
  std::fprintf(stderr, "llmesh: node %s: shards of replica %llu of '%s' loaded (%zu MiB of weights in memory); telling rank 0's node\n",
               st.opt.node.c_str(), static_cast<unsigned long long>(p->id), model.c_str(), p->resident_mb);
  with_peer(self, *leader_listen, [=](transport::peer_id peer) {
    for (const auto& r : ready) to_agent(self, peer, r);
  });
}

void on_shard_ready(agent* self, transport::peer_id peer, const transport::shard_ready_msg& m) {
  auto& st = self->state;
  auto it = st.forming.find(m.replica);
  if (it == st.forming.end() || m.key != it->second.a.group_key) return;  // stale, or a stranger
  auto& f = it->second;
  if (m.rank == 0 || m.rank >= f.tensors.size()) return;
  if (!m.ok) return fail_forming(self, m.replica, "rank " + std::to_string(m.rank) + ": " + m.reason);
  f.tensors[m.rank] = m.tensor;
  f.remote[static_cast<int>(m.rank)] = {peer, m.actor};
  f.kv_blocks[static_cast<int>(m.rank)] = m.kv_blocks;
  f.quantization[static_cast<int>(m.rank)] = m.quantization.empty() ? "none" : m.quantization;
  f.loras[static_cast<int>(m.rank)] = m.loras;
  f.kv_types[static_cast<int>(m.rank)] = m.kv_cache_dtype.empty() ? "float32" : m.kv_cache_dtype;
  f.dtypes[static_cast<int>(m.rank)] = m.dtype.empty() ? "auto" : m.dtype;
  maybe_form(self, m.replica);
}

void on_shard_group(agent* self, const transport::shard_group_msg& m) {
  auto& st = self->state;
  auto it = st.hosted.find(m.replica);
  if (it == st.hosted.end() || !it->second.follower || m.key != it->second.group_key) return;
  // The helper holds the engine (and so the communicators) until it is done.
  self->spawn<caf::detached>([agent_handle = caf::actor_cast<caf::actor>(self), id = m.replica, eng = it->second.engine,
                              comms = it->second.comms, tensors = m.tensors](caf::event_based_actor* helper) {
    for (auto* c : comms) {
      if (auto s = c->join(tensors); !s) {
        std::fprintf(stderr, "llmesh: shards of replica %llu could not join their group: %s\n",
                     static_cast<unsigned long long>(id), s.err().message.c_str());
        helper->send(agent_handle, group_lost_atom::value, id);
        return;
      }
    }
  });
}

void joined(agent* self, uint64_t id, const std::string& err) {
  auto& st = self->state;
  auto it = st.forming.find(id);
  if (it == st.forming.end()) return;
  if (!err.empty()) return fail_forming(self, id, "tensor group: " + err);
  std::vector<std::pair<int, std::pair<transport::peer_id, uint64_t>>> left(it->second.remote.begin(), it->second.remote.end());
  gather_proxies(self, std::move(left), {}, [=](std::map<int, caf::actor> remote) {
    auto& st = self->state;
    auto f = st.forming.find(id);
    if (f == st.forming.end()) {  // stopped meanwhile
      for (auto& [r, p] : remote) self->send_exit(p, caf::exit_reason::user_shutdown);
      return;
    }
    const std::string model = f->second.a.model;
    auto eng = f->second.engine;
    const scheduler_config sched = f->second.sched;
    st.forming.erase(f);
    auto r = spawn_replica(*self, eng.get(), sched, remote);
    std::vector<caf::actor> stand_ins;
    for (auto& [rank, p] : remote) stand_ins.push_back(p);
    const uint64_t export_id = host_replica(self, id, model, eng, r, std::move(stand_ins));
    std::fprintf(stderr, "llmesh: node %s: replica %llu of '%s' ready (tp %d over %zu node(s))\n", st.opt.node.c_str(),
                 static_cast<unsigned long long>(id), model.c_str(), eng->tp(), 1 + remote.size());
    report(self, id, model, transport::replica_phase::ready, export_id);
  });
}

void fail_forming(agent* self, uint64_t id, const std::string& why) {
  auto& st = self->state;
  auto it = st.forming.find(id);
  if (it == st.forming.end()) return;
  const std::string model = it->second.a.model;
  // A join in progress fails at once instead of waiting out its deadline (the helper holds
  // the engine until then).
  if (it->second.engine) it->second.engine->abort();
  st.forming.erase(it);
  if (!st.quitting) report(self, id, model, transport::replica_phase::dead, 0, why);
}

void stop_hosted(agent* self, hosted_replica& h) {
  h.stopping = true;
  // A follower's group fails first, so rank 0's node learns at once (its collectives fail)
  // instead of waiting out a collective's timeout for shards that are gone.
  if (h.follower && h.engine) h.engine->abort();
  if (h.replica) self->send_exit(h.replica, caf::exit_reason::user_shutdown);
  for (auto& s : h.shards) self->send_exit(s, caf::exit_reason::user_shutdown);
}

}  // namespace llmesh::actors::agent_detail
