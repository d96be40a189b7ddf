// The chained hash of a full KV block (private to actors/): the replica's prefix cache and the
// router's prefix-aware policy identify a prompt's leading blocks the same way.
#pragma once

#include <cstdint>
#include <span>

namespace llmesh::actors::detail {

inline uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Hash of a block given its predecessor's hash (0 before the first block); never 0.
inline uint64_t chain_block_hash(uint64_t prev, std::span<const int32_t> block_tokens) {
  uint64_t h = mix(prev ^ 0x6c6c6d657368ull);
  for (int32_t t : block_tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h == 0 ? 1 : h;
}

}  // namespace llmesh::actors::detail
