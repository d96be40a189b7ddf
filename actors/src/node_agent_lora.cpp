// Runtime LoRA updates on a node (node_agent_detail.hpp): the coordinator's "lora" commands
// (apply to this node's copies of a model; answer), its "lora-news" for a gateway node, and the
// gateway's own requests (signed control commands to the coordinator, answered when the mesh
// has applied them). Adapters load on a helper: reading one takes long enough to miss beats.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "llmesh/actors/coordinator.hpp"
#include "llmesh/actors/join_auth.hpp"
#include "node_agent_detail.hpp"


namespace llmesh::actors::agent_detail {
namespace {

status apply_op_unguarded(const model::model& m, const lora_op& op) {
  if (!op.load) {
    (void)m.loras().remove(op.name);  // not there: nothing to undo
    return ok_status();
  }
  auto same = [&]() -> status {
    auto [at, had] = m.loras().find(op.name);
    if (!had) return make_error(errc::internal, "");
    if (had->path == op.path) return ok_status();
    return make_error(errc::invalid_request, "LoRA adapter '" + op.name + "' is loaded here from " + had->path + ", not " + op.path);
  };
  if (m.loras().find(op.name).second) return same();
  auto id = m.load_lora({op.name, op.path});
  if (id) return ok_status();
  if (m.loras().find(op.name).second) return same();  // loaded meanwhile by another helper
  return id.take_error();
}

/// Applies `op` to `m`. Idempotent: loading a name loaded from the same directory, or unloading
/// one that is not there, changes nothing; a name loaded from another directory is refused.
/// Never throws (a helper that did would leave the model busy for good).
status apply_op(const model::model& m, const lora_op& op) {
  try {
    return apply_op_unguarded(m, op);
  } catch (const std::exception& e) {
    return make_error(errc::internal, "LoRA adapter '" + op.name + "': " + e.what());
  } catch (...) {
    return make_error(errc::internal, "LoRA adapter '" + op.name + "': an unknown failure");
  }
}

/// Whether a command in [from, to) unloads `name`: a load refused before it was undone (the
/// coordinator's undo after a refusal elsewhere) does not fail a loading replica.
bool undone_in(std::vector<lora_op>::const_iterator from, std::vector<lora_op>::const_iterator to, const std::string& name) {
  return std::any_of(from, to, [&](const lora_op& o) { return !o.load && o.name == name; });
}

/// Runs a "lora" command now: queued for the replicas still loading, applied to the copies the
/// hosted replicas run (a load on a helper; the model is busy until it is done).
void start_lora(agent* self, const transport::control_msg& m) {
  auto& st = self->state;
  auto r = std::make_shared<lora_applied>();
  r->update = std::strtoull(m.args[0].c_str(), nullptr, 10);
  r->model = m.args[2];
  r->op = {m.args[1] == "load", m.args[3], m.args[4], r->update};
  // A replica still loading applies it before it is ready (or fails to start): answered now, as
  // its model may take minutes to load.
  for (const auto& [id, l] : st.loading) {
    if (l.first == r->model && !st.forming.count(id) && !st.assigned.count(id)) st.lora_queue[id].push_back(r->op);
  }
  for (const auto& [id, h] : st.hosted) {
    if (h.model != r->model || h.follower || !h.engine) continue;
    const auto& mine = h.engine->shared_model();
    if (std::find(r->targets.begin(), r->targets.end(), mine) == r->targets.end()) r->targets.push_back(mine);
  }
  if (!r->op.load || r->targets.empty()) {  // an unload is quick
    for (const auto& t : r->targets) (void)apply_op(*t, r->op);
    return lora_done(self, r);
  }
  st.lora_busy.insert(r->model);
  self->spawn<caf::detached>([agent_handle = caf::actor_cast<caf::actor>(self), r](caf::event_based_actor* helper) {
    size_t done = 0;
    status s = ok_status();
    for (; done < r->targets.size() && s; ++done) s = apply_op(*r->targets[done], r->op);
    if (!s) {  // all or nothing on this node
      r->code = s.err().code;
      r->err = s.err().message;
      for (size_t i = 0; i + 1 < done; ++i) (void)apply_op(*r->targets[i], {false, r->op.name, r->op.path});
    }
    helper->send(agent_handle, lora_done_atom::value, r);
  });
}

/// The coordinator learns how a "lora" command went here (an undo, update 0, is answered to nobody).
void answer(agent* self, const lora_applied& r) {
  if (r.update == 0) return;
  nlohmann::json j{{"lora_update", r.update}, {"applied", r.err.empty() ? r.targets.size() : 0}};
  if (!r.err.empty()) j["code"] = static_cast<int>(r.code);
  to_coordinator(self, transport::control_reply_msg{r.err.empty(), r.err.empty() ? "applied" : r.err, j.dump()});
}

uint64_t wall_ms() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

}  // namespace

std::shared_ptr<const model::model> held_model(std::shared_ptr<const model::model> m, const std::string& node,
                                               const std::string& model) {
  const model::model* p = m.get();
  return std::shared_ptr<const model::model>(p, [m = std::move(m), node, model](const model::model*) mutable {
    auto release = [node, model](std::shared_ptr<const model::model> held) {
      if (!held) return;
      const double mb = static_cast<double>(held->resident_weight_bytes()) / (1 << 20);
      held.reset();
      std::fprintf(stderr, "llmesh: node %s: '%s' unloaded (%.1f MiB of weights released): no replica here uses it\n",
                   node.c_str(), model.c_str(), mb);
    };
    try {
      std::thread(release, std::move(m)).detach();
    } catch (...) {  // no thread to be had: here, then (unless the failed start already let it go)
      try {
        release(std::move(m));
      } catch (...) {  // no memory for the count
        m.reset();
      }
    }
  });
}

std::shared_ptr<const model::model> cached_model(agent* self, const std::string& key) {
  auto& models = self->state.models;
  std::erase_if(models, [](const auto& e) { return e.second.expired(); });
  auto it = models.find(key);
  return it == models.end() ? nullptr : it->second.lock();
}

void recache(agent* self, const std::string& key, const std::shared_ptr<const model::model>& m) {
  auto& models = self->state.models;
  for (auto it = models.begin(); it != models.end();) {
    const auto cached = it->second.lock();
    it = !cached || cached == m ? models.erase(it) : std::next(it);  // expired entries go too
  }
  models[model_key(key, *m)] = m;
}

void recache(agent* self, const std::shared_ptr<const model::model>& m) {
  for (const auto& [key, cached] : self->state.models) {
    if (cached.lock() == m) return recache(self, std::string(key), m);  // (a copy: the entry goes)
  }
}

void on_lora_command(agent* self, const transport::control_msg& m) {
  auto& st = self->state;
  if (m.args.size() != 5 || (m.args[1] != "load" && m.args[1] != "unload")) return;
  // One command of a model at a time: an undo or a later update never overtakes a load.
  if (st.lora_busy.count(m.args[2])) return st.lora_backlog[m.args[2]].push_back(m);
  start_lora(self, m);
}

void lora_done(agent* self, const std::shared_ptr<lora_applied>& r) {
  auto& st = self->state;
  for (const auto& t : r->targets) recache(self, t);
  if (!r->targets.empty() && r->err.empty()) {
    std::fprintf(stderr, "llmesh: node %s: LoRA adapter '%s' of '%s' %s\n", st.opt.node.c_str(), r->op.name.c_str(),
                 r->model.c_str(), r->op.load ? "loaded" : "unloaded");
  }
  answer(self, *r);
  if (!r->err.empty() && r->op.load) {
    // Refused here: the coordinator undoes it everywhere, so a replica still loading skips it.
    for (auto& [id, ops] : st.lora_queue) {
      std::erase_if(ops, [&](const lora_op& o) { return o.load && o.update == r->update && o.name == r->op.name; });
    }
  }
  st.lora_busy.erase(r->model);
  // The next command of the model, if one waits (a quick one comes back here for the one after).
  auto backlog = st.lora_backlog.find(r->model);
  if (backlog == st.lora_backlog.end()) return;
  auto next = std::move(backlog->second.front());
  backlog->second.pop_front();
  if (backlog->second.empty()) st.lora_backlog.erase(backlog);
  start_lora(self, next);
}

void apply_queued_loras(agent* self, uint64_t id, const std::string& key, std::shared_ptr<const model::model> m,
                        std::shared_ptr<model::engine> eng, std::vector<lora_op> ops) {
  self->spawn<caf::detached>([agent_handle = caf::actor_cast<caf::actor>(self), id, key, m, eng, ops](caf::event_based_actor* helper) {
    std::string failed, err;
    for (auto op = ops.cbegin(); op != ops.cend(); ++op) {
      auto s = apply_op(*m, *op);
      if (!s && !undone_in(op + 1, ops.cend(), op->name)) {
        failed = op->name;
        err = "LoRA adapter '" + failed + "', loaded while the replica started: " + s.err().message;
        break;
      }
    }
    helper->send(agent_handle, lora_queued_atom::value, id, key, m, eng, failed, err);
  });
}

void queued_loras_applied(agent* self, uint64_t id, const std::string& key, std::shared_ptr<const model::model> m,
                          std::shared_ptr<model::engine> eng, const std::string& failed, const std::string& err) {
  auto& st = self->state;
  if (!failed.empty()) {
    // Fatal, unless the coordinator's undo came meanwhile (it is applied next).
    auto q = st.lora_queue.find(id);
    if (q == st.lora_queue.end() || !undone_in(q->second.cbegin(), q->second.cend(), failed)) eng.reset();
  }
  loaded(self, id, key, std::move(m), std::move(eng), err);
}

void lora_reset(agent* self, const std::string& why) {
  auto& st = self->state;
  st.lora_queue.clear();  // (their replicas are dropped too)
  st.lora_backlog.clear();
  if (why.empty()) return;
  for (auto& [request, rp] : st.lora_requests) rp.deliver(false, static_cast<int32_t>(errc::replica_unavailable), why);
  st.lora_requests.clear();
}

void on_lora_news(agent* self, const transport::control_msg& m) {
  if (m.args.empty() || m.args.size() % 2 != 1 || !self->state.opt.on_lora_news) return;
  std::vector<model::lora_source> adapters;
  for (size_t i = 1; i + 1 < m.args.size(); i += 2) adapters.push_back({m.args[i], m.args[i + 1]});
  self->state.opt.on_lora_news(m.args[0], adapters);
}

void request_lora(agent* self, caf::response_promise rp, bool load, const std::string& model, const std::string& name,
                  const std::string& path) {
  auto& st = self->state;
  if (!st.joined) {
    rp.deliver(false, static_cast<int32_t>(errc::replica_unavailable), std::string("this node has not joined the mesh yet; retry"));
    return;
  }
  auto nonce = join_auth::make_nonce();
  if (!nonce) {
    rp.deliver(false, static_cast<int32_t>(nonce.err().code), nonce.err().message);
    return;
  }
  std::vector<std::string> args{model, name};
  if (load) args.push_back(path);
  const std::string cmd = load ? "load-lora" : "unload-lora";
  const uint64_t now = wall_ms();
  const std::string request = join_auth::hex(*nonce);
  st.lora_requests[request] = std::move(rp);
  to_coordinator(self, transport::control_msg{cmd, args, *nonce, now, join_auth::control_mac(st.opt.token, *nonce, now, cmd, args)});
  self->delayed_send(self, st.opt.lora_request_timeout, lora_late_atom::value, request);
}

void lora_late(agent* self, const std::string& request) {
  auto it = self->state.lora_requests.find(request);
  if (it == self->state.lora_requests.end()) return;
  it->second.deliver(false, static_cast<int32_t>(errc::deadline_exceeded),
                     std::string("the mesh did not answer the LoRA adapter update in time"));
  self->state.lora_requests.erase(it);
}

void on_lora_reply(agent* self, const transport::control_reply_msg& m) {
  auto j = nlohmann::json::parse(m.json, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("request") || !j["request"].is_string()) return;
  auto it = self->state.lora_requests.find(j["request"].get<std::string>());
  if (it == self->state.lora_requests.end()) return;
  int32_t code = static_cast<int32_t>(errc::invalid_request);
  if (auto c = j.find("code"); c != j.end() && c->is_number_unsigned() && c->get<uint64_t>() <= static_cast<uint64_t>(errc::internal)) {
    code = c->get<int32_t>();
  }
  it->second.deliver(m.ok, code, m.text);
  self->state.lora_requests.erase(it);
}

}  // namespace llmesh::actors::agent_detail
