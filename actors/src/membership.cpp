// The coordinator's membership table (membership.hpp).
#include "llmesh/actors/membership.hpp"

#include "llmesh/actors/cluster_config.hpp"
#include "llmesh/actors/join_auth.hpp"

namespace llmesh::actors {
namespace {

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  }
  return true;
}

}  // namespace

membership::membership(std::string token, std::chrono::milliseconds failure_timeout, size_t max_pending)
    : token_(std::move(token)), failure_timeout_(failure_timeout), max_pending_(std::max<size_t>(1, max_pending)) {}

result<transport::challenge_msg> membership::on_hello(transport::peer_id peer, const transport::hello_msg& h,
                                                      mesh_clock::time_point now) {
  auto refuse = [&](const std::string& why) { return make_error(errc::unauthorized, "join refused for '" + h.node + "': " + why); };
  if (!valid_name(h.node)) return refuse("a node name is 1-64 characters of [A-Za-z0-9._-]");
  if (h.roles.empty()) return refuse("no roles");
  if (!parse_endpoint(h.listen)) return refuse("listen address '" + h.listen + "' is not HOST:PORT");
  if (h.nonce.size() != join_auth::nonce_bytes) return refuse("bad nonce");
  if (auto it = members_.find(h.node); it != members_.end() && it->second.peer != peer) {
    return refuse("a live member already has this name");
  }
  auto nonce = join_auth::make_nonce();
  if (!nonce) return nonce.take_error();
  if (pending_.size() >= max_pending_ && !pending_.count(peer)) {  // drop the oldest handshake
    auto oldest = pending_.begin();
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->second.since < oldest->second.since) oldest = it;
    }
    pending_.erase(oldest);
  }
  pending_[peer] = {h, *nonce, now};
  return transport::challenge_msg{*nonce};
}

membership::join_result membership::on_proof(transport::peer_id peer, const transport::proof_msg& p,
                                             mesh_clock::time_point now) {
  join_result r;
  auto it = pending_.find(peer);
  if (it == pending_.end()) {
    r.welcome.reason = "no hello on this connection";
    return r;
  }
  const pending_join j = std::move(it->second);
  pending_.erase(it);
  if (!join_auth::verify(token_, j.nonce, j.hello.nonce, j.hello.node, p.mac)) {
    r.welcome.reason = "wrong cluster token";
    return r;
  }
  if (auto m = members_.find(j.hello.node); m != members_.end() && m->second.peer != peer) {
    r.welcome.reason = "a live member already has this name";
    return r;
  }
  member_info& m = members_[j.hello.node];
  m.who = {j.hello.node, j.hello.roles, j.hello.listen};
  m.res = j.hello.res;
  m.peer = peer;
  m.last_seen = now;
  m.last_seq = 0;
  r.welcome.accepted = true;
  r.welcome.members = roster();
  r.joined = j.hello.node;
  return r;
}

void membership::on_heartbeat(transport::peer_id peer, const transport::heartbeat_msg& h, mesh_clock::time_point now) {
  auto it = members_.find(h.node);
  if (it == members_.end() || it->second.peer != peer || h.seq <= it->second.last_seq) return;
  it->second.last_seen = now;
  it->second.last_seq = h.seq;
}

std::vector<std::string> membership::expire(mesh_clock::time_point now) {
  std::vector<std::string> dead;
  for (auto it = members_.begin(); it != members_.end();) {
    if (now - it->second.last_seen > failure_timeout_) {
      dead.push_back(it->first);
      it = members_.erase(it);
    } else {
      ++it;
    }
  }
  // Handshakes do not linger either.
  for (auto it = pending_.begin(); it != pending_.end();) {
    it = now - it->second.since > failure_timeout_ ? pending_.erase(it) : std::next(it);
  }
  return dead;
}

std::optional<std::string> membership::on_peer_down(transport::peer_id peer) {
  pending_.erase(peer);
  for (auto it = members_.begin(); it != members_.end(); ++it) {
    if (it->second.peer != peer) continue;
    std::string name = it->first;
    members_.erase(it);
    return name;
  }
  return std::nullopt;
}

std::vector<transport::member> membership::roster() const {
  std::vector<transport::member> out;
  for (const auto& [name, m] : members_) out.push_back(m.who);
  return out;
}

}  // namespace llmesh::actors
