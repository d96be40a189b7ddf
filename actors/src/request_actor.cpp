// The request actor (request_actor.hpp): messages in, calls on request_tracker, messages out.
#include "llmesh/actors/request_actor.hpp"

#include "llmesh/actors/replica_actor.hpp"
#include "llmesh/actors/router_actor.hpp"
#include "llmesh/actors/serving_metrics.hpp"

namespace llmesh::actors {
namespace {

using prefill_timeout_atom = caf::atom_constant<caf::atom("pftimeout")>;

using request = caf::stateful_actor<request_state>;

/// The salt the router's prefix-aware policy hashes with: the request's cache_salt, mixed with
/// its LoRA adapter's name (its blocks hold that adapter's keys and values).
uint64_t route_salt(const replica_request& r) {
  if (r.lora.empty()) return r.cache_salt;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : r.lora) h = (h ^ ch) * 1099511628211ull;
  h ^= r.cache_salt + 0x9e3779b97f4a7c15ull;
  return h == 0 ? 1 : h;
}

/// Ends the request with a failure the client sees.
void fail(request* self, error e) {
  auto& st = self->state;
  st.sink(token_msg{st.tracker->original().id, -1, finish_reason::none, true, std::move(e), std::nullopt, {}});
  self->quit();
}

/// Lets go of `which` (the state's replica or prefill replica): the router uncounts the request there.
void let_go(request* self, caf::actor& which) {
  if (!which) return;
  self->demonitor(which);
  self->send(self->state.opt.router, done_atom::value, which.id());
  which = caf::actor{};
}

void release(request* self) { let_go(self, self->state.replica); }
void release_prefill(request* self) { let_go(self, self->state.prefill); }

/// The prefill is over (blocks or not): the request goes to its replica.
void start_held(request* self) {
  auto& st = self->state;
  release_prefill(self);
  if (!st.held || !st.replica) return;
  auto r = std::move(*st.held);
  st.held.reset();
  self->send(st.replica, generate_atom::value, std::move(r), caf::actor{self});
}

/// Whether prefilled blocks can serve `r`: a request that scores its prompt or pools over every
/// position computes the prompt whole on its replica (no prefix-cache hit), so a prefill
/// replica's work would be lost.
bool takes_prefilled_blocks(const replica_request& r) {
  return r.sampling.prompt_logprobs < 0 && (r.pool == pooling::none || r.pool == pooling::last);
}

void count_transfer(request* self, const char* outcome, size_t bytes) {
  auto* m = self->state.opt.metrics;
  if (!m) return;
  m->get_counter(metric::kv_transfers, {outcome})->add(1);
  if (bytes) m->get_counter(metric::kv_transfer_bytes)->add(static_cast<double>(bytes));
}

void route(request* self, replica_request r) {
  auto prompt = r.prompt;
  auto model = r.model;
  self->request(self->state.opt.router, self->state.opt.route_timeout, route_atom::value, std::move(model),
                std::move(prompt), route_salt(r), r.route_key, takes_prefilled_blocks(r))
      .then(
          [=](const route_reply& reply) {
            auto& st = self->state;
            if (!reply.replica) return fail(self, reply.err);
            st.replica = reply.replica;
            if (st.cancelled) {  // the client left while we were routing
              if (reply.prefill) self->send(st.opt.router, done_atom::value, reply.prefill.id());
              release(self);
              return self->quit();
            }
            self->monitor(st.replica);
            if (reply.prefill && reply.prefill != st.replica) {  // disaggregated prefill: the prompt there first
              st.prefill = reply.prefill;
              self->monitor(st.prefill);
              st.held = r;
              self->send(st.prefill, prefill_atom::value, r, caf::actor{self});
              self->delayed_send(self, st.opt.prefill_timeout, prefill_timeout_atom::value, ++st.prefill_attempt);
              return;
            }
            if (reply.prefill) self->send(st.opt.router, done_atom::value, reply.prefill.id());
            self->send(st.replica, generate_atom::value, r, caf::actor{self});
          },
          [=](caf::error& e) {
            fail(self, make_error(errc::replica_unavailable, "no answer from the router: " + self->system().render(e)));
          });
}

/// The replica is gone: continue elsewhere, or fail once the migrations are spent.
void failover(request* self, const error& why) {
  auto& st = self->state;
  if (st.prefill) self->send(st.prefill, cancel_atom::value, st.tracker->original().id);
  release_prefill(self);
  st.held.reset();
  if (st.replica) self->send(st.opt.router, dead_atom::value, st.replica.id());
  release(self);
  auto next = st.tracker->failover();
  if (!next) {
    error e = next.err();
    e.message += " (last failure: " + why.message + ")";
    return fail(self, std::move(e));
  }
  if (st.opt.metrics) st.opt.metrics->get_counter(metric::migrations)->add();
  route(self, std::move(*next));
}

}  // namespace

caf::behavior request_actor(request* self, replica_request req, token_sink sink, request_options opt) {
  auto& st = self->state;
  st.tracker = std::make_unique<request_tracker>(req, opt.max_migrations);
  st.sink = std::move(sink);
  st.opt = opt;
  if (opt.metrics) metric::declare_serving(*opt.metrics);
  self->set_down_handler([=](const caf::down_msg& d) {
    if (self->state.prefill && d.source == self->state.prefill.address()) {
      count_transfer(self, "fallback", 0);
      return start_held(self);  // the prefill replica died: the request's replica computes the prompt
    }
    if (self->state.replica && d.source == self->state.replica.address()) {
      failover(self, make_error(errc::replica_unavailable, "replica stopped"));
    }
  });
  route(self, std::move(req));
  return {
      [=](const token_msg& t) {
        auto& st = self->state;
        // Only the current replica speaks for this request (a dead one may still have mail).
        if (!st.replica || caf::actor_cast<caf::actor_addr>(self->current_sender()) != st.replica.address()) return;
        if (t.failed) {
          if (t.err.code == errc::replica_unavailable || t.err.code == errc::shard_failed) return failover(self, t.err);
          release(self);
          return fail(self, t.err);
        }
        const bool final = t.finish != finish_reason::none;
        st.tracker->on_token(t.token, final);
        st.sink(t);
        if (final) {
          release(self);
          self->quit();
        }
      },
      [=](prefill_reply& p) {
        auto& st = self->state;
        if (!st.prefill || caf::actor_cast<caf::actor_addr>(self->current_sender()) != st.prefill.address()) return;
        if (p.ok && p.prefix.blocks() > 0 && p.prefix.data) {
          count_transfer(self, "moved", p.prefix.data->size());
          self->send(st.replica, kvimport_atom::value, std::move(p.prefix));  // before the request: mailboxes keep order
        } else {
          count_transfer(self, "fallback", 0);
        }
        start_held(self);
      },
      [=](prefill_timeout_atom, uint64_t attempt) {
        auto& st = self->state;
        if (!st.prefill || attempt != st.prefill_attempt) return;  // answered, or an earlier prefill's
        self->send(st.prefill, cancel_atom::value, st.tracker->original().id);
        count_transfer(self, "fallback", 0);
        start_held(self);
      },
      [=](cancel_atom) {
        auto& st = self->state;
        st.cancelled = true;
        if (st.prefill) self->send(st.prefill, cancel_atom::value, st.tracker->original().id);
        release_prefill(self);
        if (!st.replica) return;  // routing: handled when the reply comes
        self->send(st.replica, cancel_atom::value, st.tracker->original().id);
        release(self);
        self->quit();
      },
  };
}

}  // namespace llmesh::actors
