// The mesh bridge (bridge_actor.hpp): frames in -> local messages; proxies' messages -> frames.
#include "llmesh/actors/bridge_actor.hpp"

#include <cstdio>

#include "llmesh/actors/shard_actor.hpp"
#include "llmesh/actors/wire_convert.hpp"
#include "llmesh/transport/codec.hpp"

namespace llmesh::actors {
namespace {

using bridge = caf::stateful_actor<bridge_state>;

struct proxy_state {
  static inline const char* name = "remote";
};

/// A remote actor's stand-in: everything local actors send it goes to the bridge as a frame;
/// what the bridge delivers through it reaches local actors with the proxy as their sender.
caf::behavior proxy_actor(caf::stateful_actor<proxy_state>* self, caf::actor bridge_handle, transport::peer_id peer,
                          uint64_t remote) {
  auto out = [=](transport::body b, caf::actor from) { self->send(bridge_handle, out_atom::value, peer, remote, std::move(b), from); };
  return {
      [=](generate_atom, const replica_request& r, caf::actor reply_to) { out(to_wire(r), reply_to); },
      [=](cancel_atom, uint64_t id) { out(transport::cancel_msg{id}, caf::actor{}); },
      // Disaggregated prefill: a prompt for a prefill replica, its blocks back, blocks to import.
      [=](prefill_atom, const replica_request& r, caf::actor reply_to) {
        auto m = to_wire(r);
        m.prefill_only = true;
        out(std::move(m), reply_to);
      },
      [=](const prefill_reply& r) { out(to_wire(r), caf::actor_cast<caf::actor>(self->current_sender())); },
      [=](kvimport_atom, const kv_prefix& p) { out(to_wire(p, true), caf::actor{}); },
      [=](deliver_atom, caf::actor dest, const prefill_reply& r) { self->send(dest, r); },
      [=](status_atom, caf::actor reply_to) { out(transport::status_request{}, reply_to); },
      [=](reset_atom, caf::actor reply_to) { out(transport::reset_prefix_cache_msg{}, reply_to); },
      [=](kv_events_atom, caf::actor reply_to, uint64_t since) { out(transport::kv_events_request{since}, reply_to); },
      [=](const kv_events& e) { out(to_wire(e), caf::actor_cast<caf::actor>(self->current_sender())); },
      [=](deliver_atom, caf::actor dest, kv_events e) {
        e.replica = self->id();  // the router knows the replica by its proxy
        self->send(dest, std::move(e));
      },
      [=](const token_msg& t) { out(to_wire(t), caf::actor_cast<caf::actor>(self->current_sender())); },
      [=](const replica_load& l) { out(to_wire(l), caf::actor_cast<caf::actor>(self->current_sender())); },
      // A replica's step for a shard in another process (told, not asked: replica_actor.cpp).
      [=](shard_step_atom, const shard_step& s) { out(to_wire(s), caf::actor_cast<caf::actor>(self->current_sender())); },
      [=](deliver_atom, caf::actor dest, const token_msg& t) { self->send(dest, t); },
      [=](deliver_atom, caf::actor dest, replica_load l) {
        l.replica = self->id();  // the router knows the replica by its proxy
        self->send(dest, l);
      },
  };
}

/// The id under which peers address `a` (exported on first use; forgotten when it stops).
uint64_t export_id(bridge* self, const caf::actor& a) {
  if (!a) return 0;
  auto& st = self->state;
  auto it = st.export_ids.find(a.address());
  if (it != st.export_ids.end()) return it->second;
  const uint64_t id = st.next_export++;
  st.exports[id] = a;
  st.export_ids[a.address()] = id;
  self->monitor(a);
  return id;
}

caf::actor proxy_for(bridge* self, transport::peer_id peer, uint64_t remote) {
  auto& st = self->state;
  auto& p = st.proxies[{peer, remote}];
  if (!p) {
    p = self->spawn(proxy_actor, caf::actor_cast<caf::actor>(self), peer, remote);
    st.proxy_refs->push_back(caf::actor_cast<caf::weak_actor_ptr>(p));
    self->monitor(p);  // a proxy stopped by its user (a replica's shard) is made anew when asked again
  }
  return p;
}

/// KV blocks (disaggregated prefill) take at most half of the transport's send queue, so that
/// tokens and requests always find room: beyond it a prefill replica's answer goes as a refusal
/// (the request's replica computes the prompt; a refusal carries no blocks, so it always goes)
/// and blocks to import are not sent (the request actor counted them moved: the serving
/// replica's llmesh_kv_imported_blocks_total says what arrived).
bool kv_room(const bridge_state& st, const transport::body& b) {
  const auto* kv = std::get_if<transport::kv_blocks_msg>(&b);
  const size_t bound = st.net->max_pending_send_bytes();
  return !kv || kv->data_size() == 0 || bound == 0 || st.net->pending_send_bytes() + kv->data_size() <= bound / 2;
}

/// Encodes `b` from local actor `from` to actor `remote` on `peer`, and sends it.
void send_out(bridge* self, transport::peer_id peer, uint64_t remote, const transport::body& b, const caf::actor& from) {
  auto& st = self->state;
  if (!kv_room(st, b)) {
    const auto& kv = std::get<transport::kv_blocks_msg>(b);
    ++st.dropped;
    if (kv.import) return;  // the request that follows computes its prompt
    transport::kv_blocks_msg refusal;
    refusal.id = kv.id;
    refusal.code = errc::overloaded;
    refusal.message = "the mesh's send queue is too full for KV blocks";
    return send_out(self, peer, remote, refusal, from);
  }
  transport::envelope e{{st.node, export_id(self, from)}, {"", remote}, 0, 0, b};
  if (auto s = st.net->send(peer, transport::encode(e)); !s) {
    ++st.dropped;  // the peer is gone: its down report stops the proxies
    return;
  }
  ++st.frames_out;
}

/// A step for a shard here from its replica in another process: run; only a failure is
/// answered (for the replica node's log: its own rank fails the same step, since a failing
/// rank aborts the group). A malformed step still reaches the shard, as an empty one it
/// refuses: refusing aborts its tensor group, so the replica's other ranks fail at once.
void serve_shard_step(bridge* self, transport::peer_id peer, uint64_t reply_to, const caf::actor& shard,
                      const transport::shard_step_msg& m) {
  auto s = from_wire(m);
  if (!s) {
    std::fprintf(stderr, "llmesh: bridge: a malformed shard step from peer %llu: %s\n",
                 static_cast<unsigned long long>(peer), s.err().message.c_str());
    s = shard_step{m.step, std::make_shared<step_data>()};
  }
  const uint64_t step = m.step;
  self->request(shard, caf::infinite, shard_step_atom::value, *s)
      .then([=](const shard_result& r) {
              if (!r.ok) send_out(self, peer, reply_to, to_wire(r), shard);
            },
            [=](caf::error& err) {
              shard_result r{step, -1, false, make_error(errc::shard_failed, "shard gone: " + self->system().render(err)), {}, {}};
              send_out(self, peer, reply_to, to_wire(r), shard);
            });
}

void deliver(bridge* self, transport::peer_id peer, const std::shared_ptr<transport::envelope>& env) {
  const transport::envelope& e = *env;
  auto& st = self->state;
  auto dest_it = st.exports.find(e.destination.actor);
  if (dest_it == st.exports.end()) {  // an actor that stopped, or a confused peer
    ++st.dropped;
    return;
  }
  const caf::actor& dest = dest_it->second;
  const caf::actor from = proxy_for(self, peer, e.source.actor);
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, transport::generate_msg>) {
          if (m.prefill_only) self->send(dest, prefill_atom::value, from_wire(m), from);
          else self->send(dest, generate_atom::value, from_wire(m), from);
        } else if constexpr (std::is_same_v<T, transport::kv_blocks_msg>) {
          if (m.import) self->send(dest, kvimport_atom::value, prefix_from_wire(m));  // before the request that follows it
          else self->send(from, deliver_atom::value, dest, reply_from_wire(m));
        } else if constexpr (std::is_same_v<T, transport::cancel_msg>) {
          self->send(dest, cancel_atom::value, m.id);
        } else if constexpr (std::is_same_v<T, transport::status_request>) {
          self->send(dest, status_atom::value, from);
        } else if constexpr (std::is_same_v<T, transport::reset_prefix_cache_msg>) {
          self->send(dest, reset_atom::value, from);
        } else if constexpr (std::is_same_v<T, transport::kv_events_request>) {
          self->send(dest, kv_events_atom::value, from, m.since);
        } else if constexpr (std::is_same_v<T, transport::kv_events_msg>) {
          self->send(from, deliver_atom::value, dest, from_wire(m));
        } else if constexpr (std::is_same_v<T, transport::token_body>) {
          self->send(from, deliver_atom::value, dest, from_wire(m));
        } else if constexpr (std::is_same_v<T, transport::load_msg>) {
          self->send(from, deliver_atom::value, dest, from_wire(m));
        } else if constexpr (std::is_same_v<T, transport::shard_step_msg>) {
          serve_shard_step(self, peer, e.source.actor, dest, m);
        } else if constexpr (std::is_same_v<T, transport::shard_result_msg>) {
          std::fprintf(stderr, "llmesh: bridge: step %llu failed on rank %u in another process: %s\n",
                       static_cast<unsigned long long>(m.step), m.rank, m.message.c_str());
        } else {
          self->send(dest, wire_atom::value, peer, env);  // membership and control: the agent or coordinator
        }
      },
      e.msg);
}

}  // namespace

caf::behavior bridge_actor(bridge* self, std::shared_ptr<transport::transport> net, std::string node) {
  auto& st = self->state;
  st.net = net;
  st.node = node;
  self->set_down_handler([=](const caf::down_msg& d) {
    auto& st = self->state;
    for (auto p = st.proxies.begin(); p != st.proxies.end(); ++p) {
      if (p->second.address() == d.source) {
        st.proxies.erase(p);
        break;
      }
    }
    auto it = st.export_ids.find(d.source);
    if (it == st.export_ids.end()) return;
    st.exports.erase(it->second);
    st.export_ids.erase(it);
  });
  // However the bridge ends (even killed: no exit handler runs then), its proxies stop with it.
  self->attach_functor([proxies = self->state.proxy_refs](const caf::error&) {
    for (const auto& weak : *proxies) {
      if (auto p = caf::actor_cast<caf::actor>(weak)) caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
    }
  });
  return {
      [=](export_atom, caf::actor a, uint64_t id) {
        auto& st = self->state;
        st.exports[id] = a;
        st.export_ids[a.address()] = id;
        self->monitor(a);
      },
      [=](connect_atom, const std::string& where) -> caf::result<transport::peer_id> {
        auto p = self->state.net->connect(where);
        if (!p) return caf::make_error(caf::sec::cannot_connect_to_node, p.err().message);
        return *p;
      },
      [=](proxy_atom, transport::peer_id peer, uint64_t remote) { return proxy_for(self, peer, remote); },
      [=](watch_atom, caf::actor a) { self->state.watchers.push_back(std::move(a)); },
      [=](lookup_atom, uint64_t id) {
        auto it = self->state.exports.find(id);
        return it == self->state.exports.end() ? caf::actor{} : it->second;
      },
      [=](frame_atom, transport::peer_id peer, const std::shared_ptr<transport::envelope>& e) {
        ++self->state.frames_in;
        deliver(self, peer, e);
      },
      [=](out_atom, transport::peer_id peer, uint64_t remote, const transport::body& b, caf::actor from) {
        send_out(self, peer, remote, b, from);
      },
      [=](peerdown_atom, transport::peer_id peer, const std::string& why) {
        // The peer's actors are gone: their proxies stop, so monitors fire.
        auto& st = self->state;
        for (const auto& w : st.watchers) self->send(w, peerdown_atom::value, peer, why);
        for (auto it = st.proxies.begin(); it != st.proxies.end();) {
          if (it->first.first != peer) {
            ++it;
            continue;
          }
          self->send_exit(it->second, caf::exit_reason::remote_link_unreachable);
          it = st.proxies.erase(it);
        }
      },
  };
}

caf::actor spawn_bridge(caf::actor_system& sys, std::shared_ptr<transport::transport> net, std::string node,
                        metrics_registry::counter* decode_errors) {
  transport::transport* t = net.get();
  auto bridge = sys.spawn(bridge_actor, std::move(net), std::move(node));
  // The handlers are set here, on the caller's thread, before the caller listens or connects:
  // set in the actor's body, they waited for its first run, and frames that came sooner (a
  // peer's first requests, a join's Hello) were dropped.
  caf::actor_addr me = bridge.address();
  // Transport callbacks run on its thread: they hand over to the actor by message. A weak
  // handle, so the transport (owned by the actor) does not keep its owner alive.
  transport::transport_handlers h;
  h.on_frame = [me, decode_errors](transport::peer_id peer, std::span<const uint8_t> frame) {
    auto e = transport::decode(frame);
    auto a = caf::actor_cast<caf::actor>(me);
    if (!a) return;
    if (!e) {
      if (decode_errors) decode_errors->add();
      std::fprintf(stderr, "llmesh: dropped a frame from peer %llu: %s\n", static_cast<unsigned long long>(peer),
                   e.err().message.c_str());
      return;
    }
    caf::anon_send(a, frame_atom::value, peer, std::make_shared<transport::envelope>(std::move(*e)));
  };
  h.on_peer_down = [me](transport::peer_id peer, const error& why) {
    if (auto a = caf::actor_cast<caf::actor>(me)) caf::anon_send(a, peerdown_atom::value, peer, why.message);
  };
  t->set_handlers(std::move(h));
  return bridge;
}

}  // namespace llmesh::actors
