// The bridge between this process's actors and other processes (DESIGN.md §1, mesh plane): a
// CAF actor that owns a transport. Local actors that peers may address are exported under an
// id; a remote actor is represented here by a proxy actor (one per peer and remote id) that
// local actors talk to as if it were the actor itself. What a proxy receives is encoded once
// into a Cap'n Proto frame and sent; what arrives is decoded once and delivered to the local
// destination with the sender's proxy as its sender (so monitors and sender checks work
// across processes). When a peer is lost, its proxies stop: whoever monitors them — a request
// actor monitoring its replica — sees the death, exactly as in one process.
#pragma once

#include <map>
#include <memory>

#include <caf/all.hpp>

#include "llmesh/actors/metrics.hpp"
#include "llmesh/actors/replica_actor.hpp"
#include "llmesh/transport/transport.hpp"
#include "llmesh/transport/wire.hpp"

namespace llmesh::actors {

using frame_atom = caf::atom_constant<caf::atom("frame")>;
using peerdown_atom = caf::atom_constant<caf::atom("peerdown")>;
using proxy_atom = caf::atom_constant<caf::atom("proxy")>;
using export_atom = caf::atom_constant<caf::atom("export")>;
using out_atom = caf::atom_constant<caf::atom("out")>;
using deliver_atom = caf::atom_constant<caf::atom("deliver")>;
using connect_atom = caf::atom_constant<caf::atom("connect")>;
using wire_atom = caf::atom_constant<caf::atom("wire")>;
using watch_atom = caf::atom_constant<caf::atom("watch")>;
using lookup_atom = caf::atom_constant<caf::atom("lookup")>;

struct bridge_state {
  std::shared_ptr<transport::transport> net;
  std::string node;
  std::map<uint64_t, caf::actor> exports;               ///< id -> local actor
  std::map<caf::actor_addr, uint64_t> export_ids;
  uint64_t next_export = uint64_t{1} << 32;             ///< ids below are given by export (well-known ones)
  std::vector<caf::actor> watchers;                     ///< told when a peer is lost
  std::map<std::pair<transport::peer_id, uint64_t>, caf::actor> proxies;
  /// Every proxy ever made, weakly: stopped when the bridge ends, however it ends.
  std::shared_ptr<std::vector<caf::weak_actor_ptr>> proxy_refs = std::make_shared<std::vector<caf::weak_actor_ptr>>();
  uint64_t frames_in = 0, frames_out = 0, dropped = 0;
  static inline const char* name = "bridge";
};

/// `(export_atom, caf::actor, uint64_t id)`: peers may address `actor` as `id` (ids below 2^32;
/// the bridge numbers other local senders from 2^32 up).
/// Membership and control messages are not actor messages: an exported actor receives them as
/// `(wire_atom, peer_id, std::shared_ptr<transport::envelope>)`, and sends them with
/// `(out_atom, peer_id, uint64_t remote_id, transport::body, caf::actor from)`.
/// `(lookup_atom, uint64_t id)` → caf::actor: the local actor exported as `id` (invalid if none).
/// `(watch_atom, caf::actor)`: that actor gets `(peerdown_atom, peer_id, std::string why)`
/// whenever a connection is lost.
/// `(connect_atom, std::string host_port)` → peer_id: opens a connection.
/// `(proxy_atom, peer_id, uint64_t remote_id)` → caf::actor: the local stand-in for a remote
/// actor (a replica: it takes generate / cancel / status and answers with token_msg and
/// replica_load like a local one; disaggregated prefill's prefill / kvimport and prefill_reply
/// too, a prefix over transport::max_kv_bytes cut to the leading blocks that fit). Owns the transport (pass the only reference: the transport's
/// callbacks must not outlive the actor system); listen on it before spawning.
caf::behavior bridge_actor(caf::stateful_actor<bridge_state>* self, std::shared_ptr<transport::transport> net,
                           std::string node);

/// Spawns a bridge over `net` and sets the transport's handlers at once, so that nothing that
/// arrives is lost while the actor waits for its first run. Use this, not spawn(bridge_actor):
/// listen and connect only after it returned. A frame that does not decode is dropped with a
/// log line and counted in `decode_errors` when given (it must outlive the transport).
caf::actor spawn_bridge(caf::actor_system& sys, std::shared_ptr<transport::transport> net, std::string node,
                        metrics_registry::counter* decode_errors = nullptr);

}  // namespace llmesh::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<llmesh::transport::envelope>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::transport::body)
