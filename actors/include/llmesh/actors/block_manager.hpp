// The replica's paged KV-cache bookkeeping: which physical blocks each sequence holds, and the
// prefix cache that lets a new request reuse the blocks of an earlier one with the same
// leading tokens (vLLM's automatic prefix caching). A plain class: no actors, no devices.
//
// Prefix cache: a full block is identified by a hash chained over every token before it and
// in it, so equal blocks after different prefixes never match; a hit is also checked token by
// token, so a hash collision can never hand out wrong KV. Blocks are reference counted; a
// cached block nobody uses stays in the cache until a new allocation needs it (LRU eviction).
// Only full blocks are shared, and never the block that holds a prompt's last token, so every
// shared block is read-only and at least one prompt token is always computed (its logits
// start the generation). A released sequence's blocks join the LRU list last block first, so
// its tail is evicted before its head and what stays cached is still a prefix (vLLM's order).
//
// KV events: every block entering or leaving the cache is logged by its chained hash (a
// bounded log, counted by a sequence number), so that routers can follow exactly what this
// replica caches (events_since).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "llmesh/actors/kv_events.hpp"
#include "llmesh/common/error.hpp"

namespace llmesh::actors {

/// One sequence's blocks, owned by the caller, changed only through block_manager.
struct block_list {
  std::vector<int32_t> ids;  ///< physical block ids, block i covers positions [i·bs, (i+1)·bs)
  size_t n_hashed = 0;       ///< leading full blocks already in (or taken from) the prefix cache
  uint64_t last_hash = 0;    ///< chain hash of block n_hashed - 1 (0 before the first)
};

/// Thread affinity: one thread (the replica's). Ownership: owns the block pool's bookkeeping;
/// block_lists belong to their sequences and must be released before the manager dies.
class block_manager {
 public:
  block_manager(size_t n_blocks, size_t block_size, bool prefix_caching = true);

  size_t block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  size_t total_blocks() const { return ref_.size(); }
  /// Blocks an allocation may take now: never-used or freed ones plus evictable cached ones.
  size_t free_blocks() const { return free_.size() + lru_.size(); }
  /// Blocks an allocation may take now without evicting a cached one.
  size_t unused_blocks() const { return free_.size(); }
  /// Full blocks registered in the prefix cache (in use or evictable).
  size_t cached_blocks() const { return by_hash_.size(); }
  /// Prompt tokens served from the cache, and prompt tokens looked up, since construction.
  size_t hit_tokens() const { return hit_tokens_; }
  size_t queried_tokens() const { return queried_tokens_; }

  /// Blocks `b` still needs to cover `n_tokens` positions.
  size_t blocks_needed(const block_list& b, size_t n_tokens) const;

  /// Starts an empty `b` for `prompt`: takes the longest chain of cached full blocks that
  /// match the prompt's leading tokens (leaving at least the last token to compute) and
  /// returns how many prompt tokens they hold. Allocates nothing else.
  /// REQUIRES: b is empty.
  size_t match_prefix(std::span<const int32_t> prompt, block_list& b);

  /// KV transfer (disaggregated prefill): as match_prefix, for a chain of whole blocks `tokens`
  /// (a multiple of the block size, each block eligible, the last too) from b.last_hash, and
  /// not counted as a lookup (hit_tokens, queried_tokens). REQUIRES: b is empty.
  size_t match_chain(std::span<const int32_t> tokens, block_list& b);

  /// Grows `b` to cover `n_tokens` positions, evicting least recently used cached blocks when
  /// no free block is left. On overloaded (not enough blocks) nothing changes.
  [[nodiscard]] status reserve(block_list& b, size_t n_tokens);

  /// Registers b's newly full blocks in the prefix cache; `tokens` are the sequence's tokens
  /// whose KV has been computed (the prefix of its prompt + output that its blocks now hold).
  void commit(block_list& b, std::span<const int32_t> tokens);

  /// Gives back b's trailing blocks beyond those covering `n_tokens` positions (never one of its
  /// hashed blocks): what a step reserved for speculative drafts that were not kept.
  void trim(block_list& b, size_t n_tokens);

  /// Returns all of b's blocks (cached ones stay in the cache, evictable) and empties it.
  void release(block_list& b);

  /// Empties the prefix cache (vLLM's reset_prefix_cache, SGLang's flush_cache): evictable
  /// blocks become free; blocks that sequences hold stay theirs but are no longer found by a
  /// lookup (and are freed, not cached, when released). Blocks their sequences fill later are
  /// cached as usual. Returns how many blocks left the cache.
  size_t reset_prefix_cache();

  /// The cache's changes after event `since` (kv_events: netted, hashes that entered and left),
  /// or, when the log no longer reaches back that far (it keeps max(4096, 2 x blocks) events;
  /// a reset empties it) or `since` is ahead of it, the whole cache (`full`). `seq` is the
  /// cursor for the next call. A manager without prefix caching has no events.
  kv_events events_since(uint64_t since) const;
  /// Events so far (a reset counts as one).
  uint64_t event_seq() const { return log_first_ + log_.size(); }

  /// Checks the bookkeeping (every block free, evictable or referenced exactly once in its
  /// state; the cache maps agree). For tests; returns a message naming the first problem.
  [[nodiscard]] status check_invariants() const;

 private:
  /// Takes the cached chain of up to `n_blocks` leading blocks of `tokens` into b; its tokens.
  size_t take_chain(std::span<const int32_t> tokens, size_t n_blocks, block_list& b);
  void take(int32_t id);
  int32_t allocate_one();
  /// Logs that hash `h` entered (stored) or left the cache.
  void log_event(uint64_t h, bool stored);

  size_t block_size_;
  bool prefix_caching_;
  std::vector<int32_t> ref_;              ///< references per block
  std::vector<int32_t> free_;             ///< unreferenced, not cached (a stack)
  std::list<int32_t> lru_;                ///< unreferenced, cached; front = least recently used
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<bool> in_lru_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::vector<uint64_t> hash_;            ///< chain hash of a cached block
  std::vector<uint64_t> parent_;          ///< its predecessor's chain hash
  std::vector<std::vector<int32_t>> content_;  ///< its tokens, to verify hits
  std::vector<bool> cached_;
  size_t hit_tokens_ = 0, queried_tokens_ = 0;
  std::deque<std::pair<uint64_t, bool>> log_;  ///< (hash, stored) for events log_first_ + 1 ..
  uint64_t log_first_ = 0;
  size_t log_capacity_;
};

}  // namespace llmesh::actors
