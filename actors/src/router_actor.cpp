// The router actor (router_actor.hpp): messages in, calls on balancer, messages out.
#include "llmesh/actors/router_actor.hpp"

#include <algorithm>
#include <string>

#include "llmesh/actors/replica_actor.hpp"
#include "llmesh/actors/serving_metrics.hpp"

namespace llmesh::actors {
namespace {

using router = caf::stateful_actor<router_state>;

void publish(router* self) {
  auto& st = self->state;
  model_counts by_model = st.routes->ready();
  size_t ready = 0;
  for (const auto& [model, n] : by_model) ready += n;
  if (st.opt.ready) st.opt.ready->set(std::move(by_model));
  auto* m = st.opt.metrics;
  if (m == nullptr) return;
  m->get_gauge(metric::replicas_ready)->set(static_cast<double>(ready));
  for (const auto& [id, l] : st.loads) {
    const label_values replica{st.names[id]};
    m->get_gauge(metric::running, replica)->set(static_cast<double>(l.running));
    m->get_gauge(metric::waiting, replica)->set(static_cast<double>(l.waiting));
    m->get_gauge(metric::kv_usage, replica)
        ->set(l.kv_total ? static_cast<double>(l.kv_used) / static_cast<double>(l.kv_total) : 0.0);
    m->get_counter(metric::spec_drafted, replica)->set_total(static_cast<double>(l.drafted));
    m->get_counter(metric::spec_accepted, replica)->set_total(static_cast<double>(l.accepted));
    m->get_counter(metric::preemptions, replica)->set_total(static_cast<double>(l.preemptions));
    if (l.kv_imported || l.kv_refused) {  // replicas that take prefilled blocks
      m->get_counter(metric::kv_imported, replica)->set_total(static_cast<double>(l.kv_imported));
      m->get_counter(metric::kv_refused, replica)->set_total(static_cast<double>(l.kv_refused));
    }
  }
}

/// The llmesh_router_cached_blocks series of a replica.
void set_cached_blocks(router* self, uint64_t id, size_t blocks) {
  auto& st = self->state;
  if (st.opt.metrics) st.opt.metrics->get_gauge(metric::kv_reported, {st.names[id]})->set(static_cast<double>(blocks));
}

void forget(router* self, uint64_t id) {
  auto& st = self->state;
  if (st.replicas.erase(id) == 0) return;
  st.routes->remove(id);
  if (auto p = st.kv.find(id); p != st.kv.end()) {
    if (p->second.answered) set_cached_blocks(self, id, 0);
    st.kv.erase(p);
  }
  const auto& was = st.loads[id];  // its counters stay where they were
  st.loads[id] = replica_load{id, false, 0, 0, 0, was.kv_total, was.drafted, was.accepted, was.preemptions, was.kv_imported,
                              was.kv_refused};
  publish(self);
}

/// A replica of `model` joins (a prefill replica may bring its model's max_local_prefill and
/// max_prefill_queue; 0: none).
void add(router* self, const caf::actor& replica, const std::string& name, const std::string& model, replica_role role,
         uint64_t max_local_prefill, uint64_t max_prefill_queue) {
  auto& st = self->state;
  st.names[replica.id()] = name;
  self->monitor(replica);
  const uint64_t id = replica.id();
  st.replicas[id] = replica;
  st.loads[id] = replica_load{id, true, 0, 0, 0, 0};
  st.kv.erase(id);  // its balancer entry starts empty: so does its cursor
  st.routes->add(id, model, role);
  if (role == replica_role::prefill && max_local_prefill > 0) st.opt.max_local_prefill_by_model[model] = max_local_prefill;
  if (role == replica_role::prefill && max_prefill_queue > 0) st.opt.max_prefill_queue_by_model[model] = max_prefill_queue;
  publish(self);
}

size_t of_model(const std::map<std::string, size_t, std::less<>>& by_model, const std::string& model, size_t fallback) {
  auto it = by_model.find(model);
  return it == by_model.end() ? fallback : it->second;
}

/// Whether a prompt routed to a replica that caches `cached` of its tokens is computed on a
/// prefill replica first (Dynamo's conditional disaggregation): names it in `out` when so,
/// counts why not when the prompt is long but stays.
void maybe_prefill(router* self, const std::string& model, const std::vector<int32_t>& prompt, uint64_t salt, uint64_t key,
                   size_t cached, route_reply& out) {
  auto& st = self->state;
  const size_t limit = of_model(st.opt.max_local_prefill_by_model, model, st.opt.max_local_prefill);
  if (prompt.size() <= limit || !st.routes->has_prefill(model)) return;
  auto local = [&](const char* reason) {
    if (st.opt.metrics) st.opt.metrics->get_counter(metric::prefill_local, {reason})->add(1);
  };
  if (prompt.size() - std::min(cached, prompt.size()) <= limit) return local("cached");
  const size_t max_queue = of_model(st.opt.max_prefill_queue_by_model, model, st.opt.max_prefill_queue);
  auto p = st.routes->pick_prefill(model, prompt, salt, key, max_queue);
  if (!p) return local(p.err().code == errc::overloaded ? "queue" : "unavailable");
  if (st.opt.metrics) st.opt.metrics->get_counter(metric::routed, {st.names[*p]})->add(1);
  out.prefill = st.replicas.at(*p);
}

}  // namespace

caf::behavior router_actor(router* self, router_options opt) {
  self->state.routes = std::make_unique<route_table>(opt.policy, opt.policies, opt.block_size);
  self->state.opt = opt;
  if (opt.metrics) metric::declare_serving(*opt.metrics);
  self->set_down_handler([=](const caf::down_msg& d) {
    for (const auto& [id, r] : self->state.replicas) {
      if (r.address() == d.source) return forget(self, id);
    }
  });
  self->send(self, tick_atom::value);
  return {
      [=](add_atom, caf::actor replica, const std::string& name, const std::string& model) {
        add(self, replica, name, model, replica_role::decode, 0, 0);
      },
      [=](add_atom, caf::actor replica, const std::string& name, const std::string& model, replica_role role,
          uint64_t max_local_prefill, uint64_t max_prefill_queue) {
        add(self, replica, name, model, role, max_local_prefill, max_prefill_queue);
      },
      [=](route_atom, const std::string& model, const std::vector<int32_t>& prompt, uint64_t salt, uint64_t key,
          bool prefill_ok) -> route_reply {
        auto& st = self->state;
        size_t cached = 0;
        auto picked = st.routes->pick(model, prompt, salt, key, &cached);
        if (!picked) return route_reply{caf::actor{}, picked.err()};
        if (st.opt.metrics) st.opt.metrics->get_counter(metric::routed, {st.names[*picked]})->add(1);
        route_reply out{st.replicas.at(*picked), {}};
        if (prefill_ok) maybe_prefill(self, model, prompt, salt, key, cached, out);
        return out;
      },
      [=](done_atom, uint64_t replica) { self->state.routes->finished(replica); },
      [=](reset_atom) -> uint64_t {
        auto& st = self->state;
        st.routes->forget_prefixes();
        for (auto& [id, p] : st.kv) {  // whatever was known is gone: learn it all again
          p.seq = 0;
          if (p.answered) set_cached_blocks(self, id, 0);
        }
        for (const auto& [id, r] : st.replicas) self->send(r, reset_atom::value, caf::actor{self});
        return st.replicas.size();
      },
      [=](dead_atom, uint64_t replica) { forget(self, replica); },
      [=](drain_atom, uint64_t replica) {
        auto& st = self->state;
        if (st.replicas.count(replica) == 0) return;
        st.draining.insert(replica);
        st.loads[replica].ready = false;
        st.routes->update(st.loads[replica]);
        publish(self);
      },
      [=](replica_load l) {
        auto& st = self->state;
        if (st.replicas.count(l.replica) == 0) return;  // a report that crossed the replica's death
        if (st.draining.count(l.replica)) l.ready = false;
        st.loads[l.replica] = l;
        st.routes->update(l);
        publish(self);
      },
      [=](kv_events& e) {
        auto& st = self->state;
        if (st.replicas.count(e.replica) == 0) return;  // crossed the replica's death
        auto& p = st.kv[e.replica];
        p.seq = e.seq;
        p.waiting = false;
        p.answered = true;
        p.backoff = 1;
        st.routes->apply(e);
        set_cached_blocks(self, e.replica, st.routes->reported_blocks(e.replica));
      },
      [=](tick_atom) {
        auto& st = self->state;
        for (const auto& [id, r] : st.replicas) {
          self->send(r, status_atom::value, caf::actor{self});
          if (!st.opt.kv_events || !st.routes->tracks(id)) continue;
          auto& p = st.kv[id];
          if (p.waiting) {
            if (++p.ticks < p.backoff) continue;
            p.backoff = std::min<uint32_t>(2 * p.backoff, 1024);
          }
          p.waiting = true;
          p.ticks = 0;
          self->send(r, kv_events_atom::value, caf::actor{self}, p.seq);
        }
        self->delayed_send(self, self->state.opt.poll, tick_atom::value);
      },
  };
}

}  // namespace llmesh::actors
