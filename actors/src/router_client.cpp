// Requests into a router (router_client.hpp).
#include "llmesh/actors/router_client.hpp"

#include "llmesh/actors/node_agent.hpp"
#include "llmesh/actors/replica_actor.hpp"
#include "llmesh/actors/request_actor.hpp"

#include <caf/logger.hpp>

namespace llmesh::actors {

struct router_client::live {
  mutable std::mutex mu;
  std::unordered_map<uint64_t, caf::actor> requests;  ///< live request actors by request id
};

router_client::router_client(caf::actor_system& sys, caf::actor router, std::shared_ptr<const ready_counts> ready,
                             size_t max_migrations, metrics_registry* metrics)
    : sys_(sys),
      router_(std::move(router)),
      ready_(ready ? std::move(ready) : std::make_shared<const ready_counts>()),
      max_migrations_(max_migrations),
      metrics_(metrics),
      live_(std::make_shared<live>()) {}

router_client::~router_client() {
  std::lock_guard lock(live_->mu);
  for (auto& [id, a] : live_->requests) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  live_->requests.clear();
}

void router_client::submit(replica_request r, token_sink sink) {
  const uint64_t id = r.id;
  // The sink wrapper forgets the request once its final message has gone out.
  token_sink wrapped = [l = live_, id, sink = std::move(sink)](const token_msg& t) {
    if (t.failed || t.finish != finish_reason::none) {
      std::lock_guard lock(l->mu);
      l->requests.erase(id);
    }
    sink(t);
  };
  request_options ro;
  ro.router = router_;
  ro.max_migrations = max_migrations_;
  ro.metrics = metrics_;
  ro.prefill_timeout = prefill_timeout_;
  // CAF's spawn leaves the calling thread holding the system's logger (a thread-local strong
  // reference), and ~actor_system waits for it: a thread that is not CAF's and outlives the
  // system (an HTTP worker, where a background response is submitted) would hang its shutdown.
  // Such a thread (it had no logger before) lets go of it again.
  const bool foreign_thread = caf::logger::current_logger() == nullptr;
  {
    std::lock_guard lock(live_->mu);
    live_->requests[id] = sys_.spawn(request_actor, std::move(r), std::move(wrapped), ro);
  }
  if (foreign_thread) caf::logger::set_current_actor_system(nullptr);
}

void router_client::cancel(uint64_t id) {
  caf::actor a;
  {
    std::lock_guard lock(live_->mu);
    auto it = live_->requests.find(id);
    if (it == live_->requests.end()) return;
    a = it->second;
    live_->requests.erase(it);
  }
  caf::anon_send(a, cancel_atom::value);
}

void router_client::set_lora_agent(caf::actor agent, std::chrono::milliseconds timeout) {
  lora_agent_ = std::move(agent);
  lora_timeout_ = timeout;
}

status router_client::load_lora(std::string_view model, const model::lora_source& src) {
  return lora_update(true, model, src.name, src.path);
}

status router_client::unload_lora(std::string_view model, std::string_view name) { return lora_update(false, model, name, ""); }

namespace {

/// A request of the gateway's to the mesh that got no answer: not in time, or not at all.
error no_answer(caf::actor_system& sys, const caf::error& e, const std::string& what) {
  if (e == caf::sec::request_timeout) return make_error(errc::deadline_exceeded, "the mesh did not answer " + what + " in time");
  return make_error(errc::replica_unavailable, "this node cannot reach the mesh (" + what + "): " + sys.render(e));
}

}  // namespace

status router_client::lora_update(bool load, std::string_view model, std::string_view name, std::string_view path) {
  if (!lora_agent_) return mesh_client::unload_lora(model, name);  // unsupported, with the reason
  const bool foreign_thread = caf::logger::current_logger() == nullptr;  // as in submit()
  status out = ok_status();
  {
    caf::scoped_actor self{sys_};
    self->request(lora_agent_, lora_timeout_, lora_atom::value, load, std::string(model), std::string(name), std::string(path))
        .receive(
            [&](bool ok, int32_t code, const std::string& text) {
              if (!ok) out = make_error(static_cast<errc>(code), text);
            },
            [&](caf::error& e) { out = no_answer(sys_, e, "the LoRA adapter update"); });
  }
  if (foreign_thread) caf::logger::set_current_actor_system(nullptr);
  return out;
}

result<size_t> router_client::reset_prefix_cache() {
  const bool foreign_thread = caf::logger::current_logger() == nullptr;  // as in submit()
  result<size_t> out = make_error(errc::internal, "no answer");
  {
    caf::scoped_actor self{sys_};
    self->request(router_, std::chrono::seconds(10), reset_atom::value)
        .receive([&](uint64_t told) { out = static_cast<size_t>(told); },
                 [&](caf::error& e) { out = no_answer(sys_, e, "the prefix cache reset"); });
  }
  if (foreign_thread) caf::logger::set_current_actor_system(nullptr);
  return out;
}

size_t router_client::inflight() const {
  std::lock_guard lock(live_->mu);
  return live_->requests.size();
}

}  // namespace llmesh::actors
