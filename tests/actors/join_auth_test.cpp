// The join challenge: the right token verifies; a wrong token, a replayed proof under a new
// nonce, another node's name, short nonces or a truncated mac do not; RFC 4231's HMAC-SHA256
// test vector pins the primitive.
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

}  // namespace
}  // namespace llmesh::actors
