// The join challenge (join_auth.hpp).
#include "llmesh/actors/join_auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace llmesh::actors::join_auth {
namespace {

void append_field(std::string& out, std::string_view v) {
  // Length-prefixed, so that no two (nonce, nonce, name) triples share a message.
  const uint32_t n = static_cast<uint32_t>(v.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  out.append(v);
}

}  // namespace

result<std::string> make_nonce() {
  std::string n(nonce_bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    return make_error(errc::internal, "the system's random generator failed");
  }
  return n;
}

std::string hex(std::string_view bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += {digits[c >> 4], digits[c & 15]};
  return out;
}

namespace {
std::string hmac(std::string_view token, const std::string& msg) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}
}  // namespace

std::string control_mac(std::string_view token, std::string_view nonce, uint64_t timestamp_ms, std::string_view command,
                        const std::vector<std::string>& args) {
  std::string msg = "llmesh-ctl";
  append_field(msg, nonce);
  append_field(msg, std::to_string(timestamp_ms));
  append_field(msg, command);
  for (const auto& a : args) append_field(msg, a);
  return hmac(token, msg);
}

bool verify_control(std::string_view token, std::string_view nonce, uint64_t timestamp_ms, std::string_view command,
                    const std::vector<std::string>& args, std::string_view mac) {
  if (nonce.size() != nonce_bytes) return false;
  const std::string want = control_mac(token, nonce, timestamp_ms, command, args);
  return mac.size() == want.size() && CRYPTO_memcmp(mac.data(), want.data(), want.size()) == 0;
}

std::string proof(std::string_view token, std::string_view coordinator_nonce, std::string_view joiner_nonce,
                  std::string_view node) {
  std::string msg = "llmesh-join";
  append_field(msg, coordinator_nonce);
  append_field(msg, joiner_nonce);
  append_field(msg, node);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}

bool verify(std::string_view token, std::string_view coordinator_nonce, std::string_view joiner_nonce,
            std::string_view node, std::string_view mac) {
  if (coordinator_nonce.size() != nonce_bytes || joiner_nonce.size() != nonce_bytes) return false;
  const std::string want = proof(token, coordinator_nonce, joiner_nonce, node);
  return mac.size() == want.size() && CRYPTO_memcmp(mac.data(), want.data(), want.size()) == 0;
}

}  // namespace llmesh::actors::join_auth
