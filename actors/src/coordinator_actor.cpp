// The coordinator's actor (coordinator_actor.hpp).
#include "llmesh/actors/coordinator_actor.hpp"

#include <chrono>

#include "llmesh/actors/bridge_actor.hpp"
#include "llmesh/actors/node_agent.hpp"
#include "llmesh/actors/replica_actor.hpp"
#include "llmesh/actors/router_actor.hpp"

namespace llmesh::actors {
namespace {

using coord = caf::stateful_actor<coordinator_state>;
using namespace std::chrono_literals;
using tick_timer_atom = caf::atom_constant<caf::atom("ctick")>;

uint64_t wall_ms() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

void run(coord* self, const coordinator::actions& actions) {
  auto& st = self->state;
  for (const auto& a : actions) {
    switch (a.k) {
      case coordinator_action::send:
        if (a.peer == 0) {
          if (!st.local_agent) break;
          auto e = std::make_shared<transport::envelope>();
          e->source = {st.node, coordinator_actor_id};
          e->destination = {st.node, a.remote};
          e->msg = a.msg;
          self->send(st.local_agent, wire_atom::value, transport::peer_id{0}, std::move(e));
        } else {
          self->send(st.bridge, out_atom::value, a.peer, a.remote, a.msg, caf::actor_cast<caf::actor>(self));
        }
        break;
      case coordinator_action::replica_ready: {
        // The replica's actor: local (the bridge's export) or a proxy of the remote one. Awaited,
        // so a drain or loss that follows finds it.
        const uint64_t id = a.replica;
        const std::string name = a.name, model = a.prefill_for.empty() ? a.model : a.prefill_for;
        const replica_role role = a.prefill_for.empty() ? replica_role::decode : replica_role::prefill;
        const uint64_t max_local = a.max_local_prefill, max_queue = a.max_prefill_queue;
        auto add = [=](caf::actor r, bool proxy) {
          self->state.replicas[id] = {r, proxy};
          if (self->state.router) self->send(self->state.router, add_atom::value, r, name, model, role, max_local, max_queue);
        };
        if (a.peer == 0) {
          self->request(st.bridge, 10s, lookup_atom::value, a.remote).await([=](caf::actor r) { add(r, false); });
        } else {
          self->request(st.bridge, 10s, proxy_atom::value, a.peer, a.remote).await([=](caf::actor r) { add(r, true); });
        }
        break;
      }
      case coordinator_action::replica_drain: {
        auto it = st.replicas.find(a.replica);
        if (it != st.replicas.end() && st.router) self->send(st.router, drain_atom::value, it->second.first.id());
        break;
      }
      case coordinator_action::replica_gone: {
        auto it = st.replicas.find(a.replica);
        if (it == st.replicas.end()) break;
        if (st.router) self->send(st.router, dead_atom::value, it->second.first.id());
        // A proxy stops: request actors still on it fail over (its node is gone or done).
        if (it->second.second) self->send_exit(it->second.first, caf::exit_reason::user_shutdown);
        st.replicas.erase(it);
        break;
      }
    }
  }
}

}  // namespace

caf::behavior coordinator_actor(coord* self, std::shared_ptr<coordinator> core, caf::actor bridge, caf::actor router,
                                std::string node, std::chrono::milliseconds tick) {
  auto& st = self->state;
  st.core = std::move(core);
  st.bridge = std::move(bridge);
  st.router = std::move(router);
  st.node = std::move(node);
  self->send(self, tick_timer_atom::value);
  return {
      [=](agent_atom, caf::actor a) { self->state.local_agent = std::move(a); },
      [=](wire_atom, transport::peer_id peer, const std::shared_ptr<transport::envelope>& e) {
        run(self, self->state.core->on_message(peer, *e, mesh_clock::now(), wall_ms()));
      },
      [=](peerdown_atom, transport::peer_id peer, const std::string&) { run(self, self->state.core->on_peer_down(peer)); },
      [=](tick_timer_atom) {
        run(self, self->state.core->on_tick(mesh_clock::now()));
        self->delayed_send(self, tick, tick_timer_atom::value);
      },
  };
}

}  // namespace llmesh::actors
