// Joining the mesh proves knowledge of the cluster token without sending it (DESIGN.md §6):
// the joiner's Hello carries its nonce, the coordinator answers with a Challenge nonce of its
// own, and the joiner's Proof is HMAC-SHA256(token, "llmesh-join" || coordinator nonce ||
// joiner nonce || node name). Both nonces are fresh (a recorded proof is useless later); the
// check is constant-time. A plain module over OpenSSL.
#pragma once

#include <string>
#include <vector>
#include <string_view>

#include "llmesh/common/error.hpp"

namespace llmesh::actors::join_auth {

inline constexpr size_t nonce_bytes = 32;

/// A fresh random nonce (OpenSSL's CSPRNG).
[[nodiscard]] result<std::string> make_nonce();
/// A nonce (or any bytes) as lower-case hex: how a command's nonce names it in a JSON reply.
std::string hex(std::string_view bytes);

/// The joiner's proof.
std::string proof(std::string_view token, std::string_view coordinator_nonce, std::string_view joiner_nonce,
                  std::string_view node);

/// The coordinator's check: nonces of the right size and a matching proof.
[[nodiscard]] bool verify(std::string_view token, std::string_view coordinator_nonce, std::string_view joiner_nonce,
                          std::string_view node, std::string_view mac);

/// An operator command's MAC (`llmesh ctl`): HMAC-SHA256(token, "llmesh-ctl" || nonce ||
/// timestamp_ms || command || args), each field length-prefixed.
std::string control_mac(std::string_view token, std::string_view nonce, uint64_t timestamp_ms, std::string_view command,
                        const std::vector<std::string>& args);

/// The coordinator's check of a command's MAC (constant-time; nonce of the right size).
[[nodiscard]] bool verify_control(std::string_view token, std::string_view nonce, uint64_t timestamp_ms,
                                  std::string_view command, const std::vector<std::string>& args, std::string_view mac);

}  // namespace llmesh::actors::join_auth
