// The coordinator's membership: the join handshake accepts the token's holder and refuses
// everyone else (wrong token, no hello, a taken name, bad fields); heartbeats keep a member;
// silence past the failure timeout or a lost connection removes it; pending handshakes are
// bounded and expire.
#include <gtest/gtest.h>

#include "llmesh/actors/join_auth.hpp"
#include "llmesh/actors/membership.hpp"

namespace llmesh::actors {
namespace {

using namespace std::chrono_literals;
const std::string token = "local-cluster-token-0123456789";

transport::hello_msg hello(const std::string& name, const std::string& listen = "127.0.0.1:7101") {
  return {name, {transport::role::replica}, listen, {2, 1ull << 30, 0}, *join_auth::make_nonce()};
}

/// The joiner's side of the handshake; returns the coordinator's answer.
membership::join_result join(membership& m, transport::peer_id peer, const transport::hello_msg& h,
                             mesh_clock::time_point now, const std::string& key = token) {
  auto c = m.on_hello(peer, h, now);
  if (!c) return {{false, c.err().message, {}}, std::nullopt};
  return m.on_proof(peer, {join_auth::proof(key, c->nonce, h.nonce, h.node)}, now);
}

TEST(Membership, TheTokensHolderJoinsOthersAreRefused) {
  membership m(token, 3000ms);
  const auto t0 = mesh_clock::now();
  auto a = join(m, 1, hello("replica-a"), t0);
  ASSERT_TRUE(a.welcome.accepted) << a.welcome.reason;
  EXPECT_EQ(a.joined, "replica-a");
  ASSERT_EQ(a.welcome.members.size(), 1u);
  EXPECT_EQ(a.welcome.members[0].listen, "127.0.0.1:7101");

  auto wrong = join(m, 2, hello("replica-b"), t0, token + "!");
  EXPECT_FALSE(wrong.welcome.accepted);
  EXPECT_EQ(wrong.welcome.reason, "wrong cluster token");
  EXPECT_FALSE(m.on_proof(3, {std::string(32, 'x')}, t0).welcome.accepted);  // no hello
  EXPECT_FALSE(join(m, 4, hello("replica-a"), t0).welcome.accepted);          // name taken
  EXPECT_FALSE(m.on_hello(5, hello("bad name!"), t0).ok());
  EXPECT_FALSE(m.on_hello(5, hello("ok", "nowhere"), t0).ok());
  auto no_roles = hello("ok");
  no_roles.roles.clear();
  EXPECT_FALSE(m.on_hello(5, no_roles, t0).ok());
  auto short_nonce = hello("ok");
  short_nonce.nonce = "abc";
  EXPECT_FALSE(m.on_hello(5, short_nonce, t0).ok());
  // A proof replayed on another connection fails: the challenge is per connection and fresh.
  auto h = hello("replica-c");
  auto c1 = m.on_hello(6, h, t0);
  ASSERT_TRUE(c1.ok());
  const std::string mac = join_auth::proof(token, c1->nonce, h.nonce, h.node);
  ASSERT_TRUE(m.on_hello(7, h, t0).ok());
  EXPECT_FALSE(m.on_proof(7, {mac}, t0).welcome.accepted);
  EXPECT_TRUE(m.on_proof(6, {mac}, t0).welcome.accepted);
  EXPECT_EQ(m.members().size(), 2u);
}

TEST(Membership, HeartbeatsKeepMembersSilenceAndLostConnectionsRemoveThem) {
  membership m(token, 1000ms);
  const auto t0 = mesh_clock::now();
  ASSERT_TRUE(join(m, 1, hello("a"), t0).welcome.accepted);
  ASSERT_TRUE(join(m, 2, hello("b", "127.0.0.1:7102"), t0).welcome.accepted);
  ASSERT_TRUE(join(m, 3, hello("c", "127.0.0.1:7103"), t0).welcome.accepted);
  m.on_heartbeat(1, {"a", 1}, t0 + 800ms);
  m.on_heartbeat(2, {"a", 2}, t0 + 900ms);  // from another connection: ignored
  m.on_heartbeat(1, {"a", 1}, t0 + 1500ms); // a stale sequence number: ignored
  EXPECT_TRUE(m.expire(t0 + 900ms).empty());
  auto dead = m.expire(t0 + 1200ms);
  EXPECT_EQ(dead, (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(m.members().size(), 1u);
  EXPECT_EQ(m.on_peer_down(1), "a");
  EXPECT_FALSE(m.on_peer_down(1).has_value());
  EXPECT_TRUE(m.members().empty());
  // A dead member's name is free again.
  EXPECT_TRUE(join(m, 9, hello("b", "127.0.0.1:7102"), t0 + 2000ms).welcome.accepted);
}

TEST(Membership, PendingHandshakesAreBoundedAndExpire) {
  membership m(token, 1000ms, 4);
  const auto t0 = mesh_clock::now();
  for (transport::peer_id p = 1; p <= 10; ++p) ASSERT_TRUE(m.on_hello(p, hello("n" + std::to_string(p)), t0 + std::chrono::milliseconds(p)).ok());
  EXPECT_EQ(m.pending(), 4u);
  m.expire(t0 + 2000ms);
  EXPECT_EQ(m.pending(), 0u);
}

}  // namespace
}  // namespace llmesh::actors
