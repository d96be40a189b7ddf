// Joining the mesh proves knowledge of the cluster token without sending it (DESIGN.md §6):
// the joiner's Hello carries its nonce, the coordinator answers with a Challenge nonce of its
// own, and the joiner's Proof is HMAC-SHA256(token, "llmesh-join" || coordinator nonce ||
// joiner nonce || node name). Both nonces are fresh (a recorded proof is useless later); the
// check is constant-time. A plain module over OpenSSL.
#pragma once

#include <string>
#include <string_view>

#include "llmesh/common/error.hpp"

namespace llmesh::actors::join_auth {

inline constexpr size_t nonce_bytes = 32;

/// A fresh random nonce (OpenSSL's CSPRNG).
[[nodiscard]] result<std::string> make_nonce();

/// The joiner's proof.
std::string proof(std::string_view token, std::string_view coordinator_nonce, std::string_view joiner_nonce,
                  std::string_view node);

/// The coordinator's check: nonces of the right size and a matching proof.
[[nodiscard]] bool verify(std::string_view token, std::string_view coordinator_nonce, std::string_view joiner_nonce,
                          std::string_view node, std::string_view mac);

}  // namespace llmesh::actors::join_auth
