// The replica actor (replica_actor.hpp): messages in, calls on replica_core, messages out.
#include "llmesh/actors/replica_actor.hpp"

namespace llmesh::actors {
namespace {

void kick(caf::stateful_actor<replica_state>* self) {
  if (self->state.step_pending || self->state.dead || self->state.core->idle()) return;
  self->state.step_pending = true;
  self->send(self, step_atom::value);
}

}  // namespace

caf::behavior replica_actor(caf::stateful_actor<replica_state>* self, model::engine* eng, scheduler_config cfg) {
  self->state.core = std::make_unique<replica_core>(*eng, cfg);
  return {
      [=](generate_atom, replica_request r, caf::actor reply_to) {
        auto& st = self->state;
        const uint64_t id = r.id;
        if (st.dead) {
          self->send(reply_to, token_msg{id, -1, finish_reason::none, true,
                                         make_error(errc::replica_unavailable, "replica is dead")});
          return;
        }
        if (auto s = st.core->submit(std::move(r)); !s) {
          self->send(reply_to, token_msg{id, -1, finish_reason::none, true, s.err()});
          return;
        }
        st.owners[id] = reply_to;
        kick(self);
      },
      [=](cancel_atom, uint64_t id) {
        self->state.core->cancel(id);
        self->state.owners.erase(id);
      },
      [=](status_atom, caf::actor reply_to) {
        const auto& st = self->state;
        const auto& b = st.core->blocks();
        self->send(reply_to, replica_load{self->id(), !st.dead, st.core->running(), st.core->waiting(),
                                          b.total_blocks() - b.free_blocks(), b.total_blocks()});
      },
      [=](fault_atom, int64_t steps) { self->state.crash_after = steps; },
      [=](step_atom) {
        auto& st = self->state;
        st.step_pending = false;
        auto events = st.core->step();
        if (!events) {  // the engine failed: the replica is dead
          st.dead = true;
          for (auto& [id, owner] : st.owners) self->send(owner, token_msg{id, -1, finish_reason::none, true, events.err()});
          st.owners.clear();
          return;
        }
        for (const auto& e : *events) {
          auto it = st.owners.find(e.id);
          if (it == st.owners.end()) continue;
          self->send(it->second, token_msg{e.id, e.token, e.finish, false, {}});
          if (e.finish != finish_reason::none) st.owners.erase(it);
        }
        if (st.crash_after > 0 && --st.crash_after == 0) return self->quit(caf::exit_reason::kill);
        kick(self);
      },
  };
}

}  // namespace llmesh::actors
