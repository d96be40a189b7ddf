// Runtime LoRA updates on a node (node_agent_detail.hpp): the coordinator's "lora" commands
// (apply to this node's copies of a model; answer), its "lora-news" for a gateway node, and the
// gateway's own requests (signed control commands to the coordinator, answered when the mesh
// has applied them). Adapters load on a helper: reading one takes long enough to miss beats.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "llmesh/actors/coordinator.hpp"
#include "llmesh/actors/join_auth.hpp"
#include "node_agent_detail.hpp"


namespace llmesh::actors::agent_detail {
namespace {

/// Applies `op` to `m`: "" or why not. Idempotent; an adapter another helper loaded meanwhile
/// under the same name and path counts as loaded.
std::string apply_op(const model::model& m, const lora_op& op) {
  if (!op.load) {
    (void)m.loras().remove(op.name);  // not there: nothing to undo
    return {};
  }
  if (m.loras().find(op.name).second) return {};
  auto id = m.load_lora({op.name, op.path});
  if (id) return {};
  if (auto [at, had] = m.loras().find(op.name); had && had->path == op.path) return {};
  return id.err().message;
}

/// The coordinator learns how a "lora" command went here (update 0: an undo; nobody waits).
void answer(agent* self, uint64_t update, const std::string& err) {
  if (update == 0) return;
  nlohmann::json j{{"lora_update", update}};
  if (!err.empty()) j["code"] = static_cast<int>(errc::invalid_request);
  to_coordinator(self, transport::control_reply_msg{err.empty(), err.empty() ? "applied" : err, j.dump()});
}

uint64_t wall_ms() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

}  // namespace

void recache(agent* self, const std::string& key, const std::shared_ptr<const model::model>& m) {
  auto& models = self->state.models;
  for (auto it = models.begin(); it != models.end();) it = it->second == m ? models.erase(it) : std::next(it);
  models[model_key(key, *m)] = m;
}

void on_lora_command(agent* self, const transport::control_msg& m) {
  auto& st = self->state;
  if (m.args.size() != 5 || (m.args[1] != "load" && m.args[1] != "unload")) return;
  auto r = std::make_shared<lora_applied>();
  r->update = std::strtoull(m.args[0].c_str(), nullptr, 10);
  r->model = m.args[2];
  r->op = {m.args[1] == "load", m.args[3], m.args[4]};
  // The replicas still loading apply it once loaded (their assignment predates it).
  for (const auto& [id, l] : st.loading) {
    if (l.first == r->model) st.lora_queue[id].push_back(r->op);
  }
  // The copies of the model the replicas here run (replicas may share one).
  for (const auto& [id, h] : st.hosted) {
    if (h.model != r->model || h.follower || !h.engine) continue;
    const model::model* p = &h.engine->loaded_model();
    bool seen = false;
    for (const auto& t : r->targets) seen = seen || t.second.get() == p;
    if (seen) continue;
    for (const auto& [key, cached] : st.models) {
      if (cached.get() == p) r->targets.emplace_back(key, cached);
    }
    r->engines.push_back(h.engine);
  }
  if (!r->op.load || r->targets.empty()) {  // an unload is quick
    for (const auto& [key, t] : r->targets) (void)apply_op(*t, r->op);
    return lora_done(self, r);
  }
  self->spawn<caf::detached>([agent_handle = caf::actor_cast<caf::actor>(self), r](caf::event_based_actor* helper) {
    size_t done = 0;
    for (; done < r->targets.size() && r->err.empty(); ++done) r->err = apply_op(*r->targets[done].second, r->op);
    if (!r->err.empty()) {  // all or nothing on this node
      for (size_t i = 0; i + 1 < done; ++i) (void)apply_op(*r->targets[i].second, {false, r->op.name, r->op.path});
    }
    helper->send(agent_handle, lora_done_atom::value, r);
  });
}

void lora_done(agent* self, const std::shared_ptr<lora_applied>& r) {
  for (const auto& [key, t] : r->targets) recache(self, key, t);
  if (!r->targets.empty() && r->err.empty()) {
    std::fprintf(stderr, "llmesh: node %s: LoRA adapter '%s' of '%s' %s\n", self->state.opt.node.c_str(), r->op.name.c_str(),
                 r->model.c_str(), r->op.load ? "loaded" : "unloaded");
  }
  answer(self, r->update, r->err);
}

void apply_queued_loras(agent* self, uint64_t id, const std::string& key, std::shared_ptr<const model::model> m,
                        std::shared_ptr<model::engine> eng, std::vector<lora_op> ops) {
  self->spawn<caf::detached>([agent_handle = caf::actor_cast<caf::actor>(self), id, key, m, eng, ops](caf::event_based_actor* helper) {
    std::string err;
    for (const auto& op : ops) {
      if (err.empty()) err = apply_op(*m, op);
    }
    helper->send(agent_handle, loaded_atom::value, id, key, m, err.empty() ? eng : nullptr, err);
  });
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
