// The transport between processes: frames as UCX active messages over TCP (UCX 1.13).
//
// One progress thread owns the UCX worker; other threads hand it work through a queue and an
// eventfd. When there is nothing to do the thread sleeps in epoll on the worker's event fd and
// the eventfd: an idle transport costs no CPU. Frames to one peer arrive in order, whether they
// travelled eagerly or by rendezvous (large frames are received into an owned buffer and
// delivered when complete, behind nothing and ahead of nothing). Endpoints use UCX's peer error
// mode: a closed, killed or unreachable peer shows as one on_peer_down, bounded in time.
//
// Environment: create() puts defaults into the process environment (setenv without overwriting:
// a value the user set wins) before UCX reads its configuration: UCX_NET_DEVICES=lo,
// UCX_TLS=tcp, and no zero-copy on TCP (UCX_ZCOPY_THRESH=inf, UCX_TCP_PUT_ENABLE=n: UCX 1.13
// aborts the process when a peer dies during a zero-copy send; see the .cpp). A mesh that spans
// hosts must set UCX_NET_DEVICES (for example "eth0" or "all"). Call create() before starting
// threads that read the environment.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/transport/transport.hpp"

namespace llmesh::transport {

struct ucx_options {
  /// A connect() not answered by the listener within this time is reported as on_peer_down
  /// (deadline_exceeded). Also bounds close()'s flush before the endpoint is closed forcibly.
  std::chrono::milliseconds connect_timeout{3000};
  /// Frames larger than this are dropped (counted in stats().frames_dropped, one stderr line):
  /// send() refuses them, and received ones are discarded without being read.
  size_t max_frame_bytes = size_t{64} << 20;  // the codec's own limit (frame_limits)
  /// Frames larger than this go by rendezvous; 0 lets UCX decide (UCX_RNDV_THRESH, "auto").
  size_t rndv_threshold = 0;
  /// Bytes accepted by send() but not yet completed, all peers together; beyond it send()
  /// answers overloaded. Why 256 MiB: four maximal frames, so a slow peer cannot grow memory
  /// without bound while bulk transfers still pipeline.
  size_t max_pending_send_bytes = size_t{256} << 20;
  /// Bytes received from one peer that wait for an earlier frame (UCX may reorder active
  /// messages; see the .cpp), counting waiting rendezvous frames at 8 KiB until their receive
  /// starts; a peer that needs more is failed (protocol_violation). Why 256 MiB: as much as a
  /// sender's default max_pending_send_bytes.
  size_t max_reorder_bytes = size_t{256} << 20;
  /// After any activity, the progress thread keeps polling this long before it sleeps in
  /// epoll: a reply that comes back within it is seen without a wake-up (the round trip's
  /// largest cost). Idle costs nothing; a busy link spins. 0 (the default): always sleep — on
  /// 2 cores the spinning threads of both ends took the CPU the reply needed (bench transport
  /// --spin-us).
  std::chrono::microseconds spin{0};
  /// A send() from another thread goes out on the caller's thread when the progress thread is
  /// idle (asleep in epoll) and nothing is queued before it, instead of waking the progress
  /// thread to send it: one thread hand-off less per message (the worker runs in UCX's
  /// SERIALIZED mode, one thread at a time). Off: every send goes through the queue.
  bool direct_send = true;
};

/// Frames between processes over UCX active messages.
/// Thread affinity: any thread may call the public functions; handlers run on the transport's
/// progress thread, one at a time, and no handler runs once the destructor has started.
/// Ownership: owns its UCX context, worker, listener and endpoints; the destructor closes them
/// (forcibly, so dead peers cannot hang it) and joins the thread.
class ucx_transport final : public transport {
 public:
  /// Reads the UCX configuration, creates the context and worker, starts the progress thread.
  [[nodiscard]] static result<std::unique_ptr<ucx_transport>> create(ucx_options options = {});
  /// REQUIRES: not called from a handler (it joins the progress thread).
  ~ucx_transport() override;
  ucx_transport(const ucx_transport&) = delete;
  ucx_transport& operator=(const ucx_transport&) = delete;

  /// REQUIRES: called before listen() and connect().
  void set_handlers(transport_handlers h) override;
  /// Listens on "HOST:PORT" (a numeric or resolvable host; port 0 picks one); returns the
  /// bound "HOST:PORT". One listener per transport.
  [[nodiscard]] result<std::string> listen(const std::string& host_port) override;
  /// Starts connecting and returns the peer's id at once; frames may be sent right away (UCX
  /// queues them until the connection is up). A refused or unanswered connection shows as
  /// on_peer_down, which may run before connect() has returned.
  [[nodiscard]] result<peer_id> connect(const std::string& host_port) override;
  /// Queues a frame. Errors: transport_disconnected (unknown or lost peer), invalid_request
  /// (larger than max_frame_bytes), overloaded (max_pending_send_bytes reached).
  [[nodiscard]] status send(peer_id peer, std::vector<uint8_t> frame) override;
  /// Sends to the peer fail from now on; what was sent before is flushed, then the endpoint is
  /// closed (forcibly after connect_timeout). on_peer_down (transport_disconnected) follows
  /// without waiting for the flush; the remote side sees its own.
  void close(peer_id peer) override;
  /// peers_lost counts peers that failed or timed out (not close()); frames_dropped counts
  /// oversized frames both ways, frames from unknown peers, and frames left undelivered when a
  /// peer failed.
  transport_stats stats() const override;
  size_t pending_send_bytes() const override;
  size_t max_pending_send_bytes() const override;

  /// Frames that arrived by rendezvous (so tests and benchmarks can tell the protocols apart).
  uint64_t rndv_frames_received() const;

 private:
  struct impl;  // UCX types stay in the .cpp
  explicit ucx_transport(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace llmesh::transport
