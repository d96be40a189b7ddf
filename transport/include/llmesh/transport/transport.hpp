// What the mesh needs from a network: frames (opaque bytes: codec.hpp makes them) between
// this process and its peers, in order per peer, and a bounded-time signal when a peer is
// gone. Implementations: ucx_transport (between processes), loopback (in one process, for
// deterministic tests), and fault_injector (wraps either, for fault tests and `llmesh ctl
// fault`). Peer ids are local to one transport object.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::transport {

using peer_id = uint64_t;

/// Callbacks, run on the transport's own thread, one at a time; they must not block. A frame's
/// bytes are valid only during the call.
struct transport_handlers {
  std::function<void(peer_id, std::span<const uint8_t> frame)> on_frame;
  /// A peer connected to our listener (`address`: where it came from, for logs).
  std::function<void(peer_id, const std::string& address)> on_accept;
  /// A peer is gone (closed, failed, timed out): nothing more arrives from it and sends to it
  /// fail. Called once per peer.
  std::function<void(peer_id, const error& why)> on_peer_down;
};

struct transport_stats {
  uint64_t frames_sent = 0, frames_received = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t send_errors = 0, peers_lost = 0;
  uint64_t frames_dropped = 0;  ///< by limits or fault rules
};

/// Thread affinity: any thread; handlers run on the transport's thread.
class transport {
 public:
  virtual ~transport() = default;
  /// Install before listen/connect.
  virtual void set_handlers(transport_handlers h) = 0;
  /// Starts accepting on "HOST:PORT" (port 0: any); returns the bound "HOST:PORT".
  [[nodiscard]] virtual result<std::string> listen(const std::string& host_port) = 0;
  /// Opens a connection to a listener. It may complete later: a failure shows as on_peer_down.
  [[nodiscard]] virtual result<peer_id> connect(const std::string& host_port) = 0;
  /// Queues a frame; frames to one peer arrive in order. An unknown or lost peer is an error
  /// (transport_disconnected); a later failure shows as on_peer_down.
  [[nodiscard]] virtual status send(peer_id peer, std::vector<uint8_t> frame) = 0;
  /// Closes a connection (on_peer_down follows).
  virtual void close(peer_id peer) = 0;
  virtual transport_stats stats() const = 0;
  /// Bytes queued to send and not sent yet, and the most there may be (0: no bound): a sender
  /// of bulk frames (KV blocks) leaves room for the small ones (tokens, requests).
  virtual size_t pending_send_bytes() const { return 0; }
  virtual size_t max_pending_send_bytes() const { return 0; }
};

}  // namespace llmesh::transport
