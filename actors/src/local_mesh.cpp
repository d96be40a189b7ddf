// The in-process mesh (local_mesh.hpp): spawns and wires the actors; submit/cancel are
// messages into the actor system.
#include "llmesh/actors/local_mesh.hpp"

#include "llmesh/actors/replica_actor.hpp"
#include "llmesh/actors/router_actor.hpp"
#include "llmesh/actors/router_client.hpp"

namespace llmesh::actors {

struct local_mesh::impl {
  // Declaration order is destruction order reversed: the actor system (and so every actor)
  // goes before the engines the replicas borrow.
  std::vector<std::unique_ptr<model::engine>> engines;
  mesh_options opt;
  metrics_registry* metrics = nullptr;
  std::shared_ptr<ready_counts> ready = std::make_shared<ready_counts>();
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::actor router;
  std::vector<caf::actor> replicas;
  std::unique_ptr<router_client> client;
};

local_mesh::local_mesh(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

result<std::unique_ptr<local_mesh>> local_mesh::create(std::shared_ptr<const model::model> m, mesh_options opt,
                                                       metrics_registry* metrics) {
  if (opt.replicas < 1) return make_error(errc::invalid_request, "a mesh needs at least one replica");
  if (opt.prefill_replicas < 0) return make_error(errc::invalid_request, "prefill replicas cannot be negative");
  if (opt.prefill_replicas > 0 && !opt.sched.prefix_caching) {
    return make_error(errc::invalid_request, "prefill replicas hand their KV blocks over through the prefix cache: they need "
                                             "prefix caching (drop --no-enable-prefix-caching)");
  }
  auto p = std::make_unique<impl>();
  p->opt = opt;
  p->metrics = metrics;
  for (int i = 0; i < opt.replicas + opt.prefill_replicas; ++i) {
    auto e = model::engine::create(m, opt.engine);
    if (!e) return e.take_error();
    if (opt.prefill_replicas > 0 && std::string_view((*e)->backend_name()) != "cpu") {
      return make_error(errc::unsupported, "prefill replicas run on the CPU backend only for now: moving KV blocks on a GPU "
                                           "is not yet verified on one (this replica runs on " +
                                               std::string((*e)->backend_name()) + ")");
    }
    p->engines.push_back(std::move(*e));
  }
  p->cfg = std::make_unique<caf::actor_system_config>();
  p->cfg->set("scheduler.max-threads", std::max(1, opt.actor_threads));
  // A shared queue with a condition variable: idle workers sleep. (The default work-stealing
  // workers poll, ~10% of a core at idle on this machine; DESIGN.md §5: no busy idle.)
  p->cfg->set("scheduler.policy", caf::atom("sharing"));
  p->sys = std::make_unique<caf::actor_system>(*p->cfg);
  router_options ro;
  ro.policy = opt.policy;
  ro.block_size = p->engines[0]->kv_block_size();
  ro.metrics = metrics;
  ro.ready = p->ready;
  ro.max_local_prefill = opt.max_local_prefill;
  ro.max_prefill_queue = opt.max_prefill_queue;
  ro.kv_events = opt.kv_events;
  p->router = p->sys->spawn(router_actor, ro);
  for (auto& e : p->engines) {
    auto r = spawn_replica(*p->sys, e.get(), opt.sched);
    const bool prefill = p->replicas.size() >= static_cast<size_t>(opt.replicas);
    caf::anon_send(p->router, add_atom::value, r, std::to_string(p->replicas.size()), opt.model_name,
                   prefill ? replica_role::prefill : replica_role::decode, uint64_t{0}, uint64_t{0});
    p->replicas.push_back(r);
  }
  p->ready->set({{opt.model_name, static_cast<size_t>(opt.replicas)}});  // the router confirms with its first poll
  p->client = std::make_unique<router_client>(*p->sys, p->router, p->ready, opt.max_migrations, metrics);
  p->client->set_prefill_timeout(opt.prefill_timeout);
  return std::unique_ptr<local_mesh>(new local_mesh(std::move(p)));
}

local_mesh::~local_mesh() {
  impl_->client.reset();  // stops the live request actors
  for (auto& r : impl_->replicas) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(impl_->router, caf::exit_reason::user_shutdown);
  // CAF waits for a detached actor's thread until the last handle to the actor is gone.
  impl_->replicas.clear();
  impl_->router = caf::actor{};
  impl_->sys.reset();  // waits for every actor
}

void local_mesh::submit(replica_request r, token_sink sink) { impl_->client->submit(std::move(r), std::move(sink)); }
void local_mesh::cancel(uint64_t id) { impl_->client->cancel(id); }
size_t local_mesh::ready_replicas() const { return impl_->ready->total(); }
size_t local_mesh::ready_replicas(std::string_view model) const { return impl_->ready->of(model); }
namespace {

status serves(const mesh_options& opt, std::string_view model) {
  if (model == opt.model_name) return ok_status();
  return make_error(errc::not_found, "this mesh serves '" + opt.model_name + "', not '" + std::string(model) + "'");
}

}  // namespace

result<size_t> local_mesh::reset_prefix_cache() { return impl_->client->reset_prefix_cache(); }

status local_mesh::load_lora(std::string_view model, const model::lora_source& src) {
  LLMESH_TRY(serves(impl_->opt, model));
  auto id = impl_->engines[0]->loaded_model().load_lora(src);  // every engine holds this model
  if (!id) return id.take_error();
  return ok_status();
}

status local_mesh::unload_lora(std::string_view model, std::string_view name) {
  LLMESH_TRY(serves(impl_->opt, model));
  return impl_->engines[0]->loaded_model().loras().remove(name);
}

size_t local_mesh::replica_count() const { return impl_->replicas.size(); }
const model::engine& local_mesh::engine(size_t i) const { return *impl_->engines.at(i); }

void local_mesh::kill_replica(size_t i, int64_t after_steps) {
  if (after_steps <= 0) return caf::anon_send_exit(impl_->replicas.at(i), caf::exit_reason::kill);
  caf::anon_send(impl_->replicas.at(i), fault_atom::value, after_steps);
}

void local_mesh::drain_replica(size_t i) {
  const auto& r = impl_->replicas.at(i);
  caf::anon_send(impl_->router, drain_atom::value, r.id());  // first: no request is routed there any more
  caf::anon_send(r, drain_atom::value);
}

size_t local_mesh::inflight() const { return impl_->client->inflight(); }

}  // namespace llmesh::actors
