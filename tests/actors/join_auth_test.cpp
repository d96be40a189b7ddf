// The join challenge: the right token verifies; a wrong token, a replayed proof under a new
// nonce, another node's name, short nonces or a truncated mac do not; RFC 4231's HMAC-SHA256
// test vector pins the primitive. Operator commands: the MAC binds token, nonce, timestamp,
// command and every argument; a wrong-sized nonce never verifies.
#include <gtest/gtest.h>

#include <cstring>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "llmesh/actors/join_auth.hpp"

namespace llmesh::actors {
namespace {

TEST(JoinAuth, ProofVerifiesOnlyWithTheTokenNoncesAndName) {
  const std::string token = "local-cluster-token-0123456789";
  auto c = join_auth::make_nonce(), j = join_auth::make_nonce();
  ASSERT_TRUE(c.ok() && j.ok());
  EXPECT_EQ(c->size(), join_auth::nonce_bytes);
  EXPECT_NE(*c, *j);
  const std::string mac = join_auth::proof(token, *c, *j, "replica-a");
  EXPECT_EQ(mac.size(), 32u);
  EXPECT_TRUE(join_auth::verify(token, *c, *j, "replica-a", mac));
  EXPECT_FALSE(join_auth::verify(token + "x", *c, *j, "replica-a", mac));
  EXPECT_FALSE(join_auth::verify(token, *c, *j, "replica-b", mac));
  auto c2 = join_auth::make_nonce();
  EXPECT_FALSE(join_auth::verify(token, *c2, *j, "replica-a", mac));  // a replay under a fresh challenge
  EXPECT_FALSE(join_auth::verify(token, *c, *j, "replica-a", mac.substr(0, 16)));
  EXPECT_FALSE(join_auth::verify(token, c->substr(0, 8), *j, "replica-a", join_auth::proof(token, c->substr(0, 8), *j, "replica-a")));
  // Fields are length-prefixed: moving bytes between nonce and name changes the proof.
  EXPECT_NE(join_auth::proof(token, *c, *j, "ab"), join_auth::proof(token, *c, *j + "a", "b"));
}

TEST(JoinAuth, HmacSha256MatchesRfc4231) {
  const std::string key(20, '\x0b'), data = "Hi There";
  unsigned char mac[32];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), 20, reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &len);
  static const unsigned char want[32] = {0xb0, 0x34, 0x4c, 0x61, 0xd8, 0xdb, 0x38, 0x53, 0x5c, 0xa8, 0xaf,
                                         0xce, 0xaf, 0x0b, 0xf1, 0x2b, 0x88, 0x1d, 0xc2, 0x00, 0xc9, 0x83,
                                         0x3d, 0xa7, 0x26, 0xe9, 0x37, 0x6c, 0x2e, 0x32, 0xcf, 0xf7};
  ASSERT_EQ(len, 32u);
  EXPECT_EQ(std::memcmp(mac, want, 32), 0);
}

TEST(JoinAuth, ControlMacVerifiesOnlyWithTheSameTokenNonceTimeCommandAndArgs) {
  const std::string token = "local-cluster-token-0123456789";
  auto n = join_auth::make_nonce();
  ASSERT_TRUE(n.ok());
  const uint64_t ts = 1'700'000'000'000;
  const std::vector<std::string> args = {"tiny", "2"};
  const std::string mac = join_auth::control_mac(token, *n, ts, "scale", args);
  EXPECT_EQ(mac.size(), 32u);
  EXPECT_EQ(mac, join_auth::control_mac(token, *n, ts, "scale", args));  // deterministic
  EXPECT_TRUE(join_auth::verify_control(token, *n, ts, "scale", args, mac));

  EXPECT_FALSE(join_auth::verify_control(token + "x", *n, ts, "scale", args, mac));
  auto other = join_auth::make_nonce();
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(join_auth::verify_control(token, *other, ts, "scale", args, mac));
  EXPECT_FALSE(join_auth::verify_control(token, *n, ts + 1, "scale", args, mac));
  EXPECT_FALSE(join_auth::verify_control(token, *n, ts, "drain", args, mac));
  EXPECT_FALSE(join_auth::verify_control(token, *n, ts, "scale", {"tiny", "3"}, mac));
  EXPECT_FALSE(join_auth::verify_control(token, *n, ts, "scale", {"small", "2"}, mac));
  EXPECT_FALSE(join_auth::verify_control(token, *n, ts, "scale", {"tiny"}, mac));
  EXPECT_FALSE(join_auth::verify_control(token, *n, ts, "scale", {"tiny", "2", ""}, mac));  // an extra empty arg
  EXPECT_FALSE(join_auth::verify_control(token, *n, ts, "scale", args, mac.substr(0, 16)));
  EXPECT_FALSE(join_auth::verify_control(token, *n, ts, "scale", args, ""));
  std::string flipped = mac;
  flipped[0] = static_cast<char>(flipped[0] ^ 1);
  EXPECT_FALSE(join_auth::verify_control(token, *n, ts, "scale", args, flipped));

  // A nonce of the wrong size fails even with a MAC computed over it.
  for (const std::string& bad : {std::string(), n->substr(0, 16), *n + "x"}) {
    EXPECT_FALSE(join_auth::verify_control(token, bad, ts, "status", {}, join_auth::control_mac(token, bad, ts, "status", {})))
        << bad.size();
  }
  // Fields are length-prefixed: moving bytes between the command and an argument, or between
  // arguments, changes the MAC.
  EXPECT_NE(join_auth::control_mac(token, *n, ts, "drain", {"ab"}), join_auth::control_mac(token, *n, ts, "draina", {"b"}));
  EXPECT_NE(join_auth::control_mac(token, *n, ts, "scale", {"ab", "c"}), join_auth::control_mac(token, *n, ts, "scale", {"a", "bc"}));
  EXPECT_NE(join_auth::control_mac(token, *n, ts, "status", {}), join_auth::control_mac(token, *n, ts, "status", {""}));
}

}  // namespace
}  // namespace llmesh::actors
