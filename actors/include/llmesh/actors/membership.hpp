// The coordinator's membership table, a plain class (the coordinator actor is its shell): the
// join handshake per connection (Hello → Challenge → Proof → Welcome, join_auth.hpp), then
// heartbeats; a member silent for longer than the failure timeout, or whose connection the
// transport reports lost, is dead. Time is passed in, so tests drive it.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "llmesh/transport/transport.hpp"
#include "llmesh/transport/wire.hpp"

namespace llmesh::actors {

using mesh_clock = std::chrono::steady_clock;

struct member_info {
  transport::member who;  ///< name, roles, listen address
  transport::resources res;
  transport::peer_id peer = 0;
  mesh_clock::time_point last_seen;
  uint64_t last_seq = 0;
};

/// Thread affinity: the coordinator's.
class membership {
 public:
  membership(std::string token, std::chrono::milliseconds failure_timeout, size_t max_pending = 64);

  /// A connection says hello: a challenge to answer, or why not (a bad or taken name, bad
  /// roles or address). Pending handshakes are bounded: the oldest is dropped.
  [[nodiscard]] result<transport::challenge_msg> on_hello(transport::peer_id peer, const transport::hello_msg& h,
                                                          mesh_clock::time_point now);
  /// The answer: a welcome (accepted, with the roster) or a refusal (reason set). `joined`
  /// names the new member.
  struct join_result {
    transport::welcome_msg welcome;
    std::optional<std::string> joined;
  };
  join_result on_proof(transport::peer_id peer, const transport::proof_msg& p, mesh_clock::time_point now);

  /// A member's heartbeat (from its own connection only; stale sequence numbers ignored).
  void on_heartbeat(transport::peer_id peer, const transport::heartbeat_msg& h, mesh_clock::time_point now);
  /// Members silent for longer than the failure timeout: removed and returned.
  std::vector<std::string> expire(mesh_clock::time_point now);
  /// The transport lost this connection: its member (if any) is removed and returned.
  std::optional<std::string> on_peer_down(transport::peer_id peer);

  const std::map<std::string, member_info>& members() const { return members_; }
  std::vector<transport::member> roster() const;
  size_t pending() const { return pending_.size(); }
  /// Whether a handshake is under way on this connection.
  bool pending_on(transport::peer_id peer) const { return pending_.count(peer) != 0; }

 private:
  struct pending_join {
    transport::hello_msg hello;
    std::string nonce;  ///< ours
    mesh_clock::time_point since;
  };
  std::string token_;
  std::chrono::milliseconds failure_timeout_;
  size_t max_pending_;
  std::map<transport::peer_id, pending_join> pending_;
  std::map<std::string, member_info> members_;
};

}  // namespace llmesh::actors
