// What a replica's prefix cache gained and lost since a router last asked (Dynamo's KV events,
// vLLM's BlockStored/BlockRemoved): the chained hashes of whole blocks (block_hash.hpp), so a
// router knows exactly which prompts' leading blocks each replica caches. Plain data.
#pragma once

#include <cstdint>
#include <vector>

namespace llmesh::actors {

/// A replica's cache changes after a cursor, netted: a hash appears in at most one list.
struct kv_events {
  uint64_t replica = 0;  ///< filled in by whoever knows the replica's id (its actor, a proxy)
  /// The whole cache, not changes: the cursor was older than what the replica keeps (or its
  /// cache was reset since); `stored` replaces what the reader knew, `removed` is empty.
  bool full = false;
  uint64_t seq = 0;  ///< the replica's event count: the cursor for the next ask
  std::vector<uint64_t> stored, removed;
  /// Tokens per block of the hashes (a reader hashing prompts in other blocks ignores them).
  uint64_t block_size = 0;
};

}  // namespace llmesh::actors
