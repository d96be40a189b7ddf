// The router's replica choice, a plain class: round-robin, least-load, power-of-two-choices or
// prefix-aware (send a prompt where its leading blocks are cached, unless that replica is much
// busier than the least loaded). What a replica caches is known two ways: the prompts this
// balancer sent it (a prediction, Dynamo's approximate KV router) and, exactly, the KV events
// the replica reports (apply: what it stored and evicted, also for other routers' requests).
// Load is what replicas report (running + waiting requests) plus what this router assigned
// since their last report.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "llmesh/actors/kv_events.hpp"
#include "llmesh/common/error.hpp"

namespace llmesh::actors {

enum class balance_policy { round_robin, least_load, power_of_two, prefix_aware };

/// Parses "round-robin", "least-load", "power-of-two" or "prefix-aware".
[[nodiscard]] result<balance_policy> parse_balance_policy(std::string_view name);

/// A replica's state as its last report gave it.
struct replica_load {
  uint64_t replica = 0;
  bool ready = true;  ///< false while loading, draining or dead: never picked
  size_t running = 0, waiting = 0;
  size_t kv_used = 0, kv_total = 0;  ///< KV blocks held by requests (cached-free ones excluded), of all
  size_t drafted = 0, accepted = 0;  ///< speculative decoding: drafts run and kept since the replica started
  size_t preemptions = 0;            ///< running requests sent back to wait for blocks since it started
  size_t kv_imported = 0, kv_refused = 0;  ///< disaggregated prefill: KV blocks taken in, imports refused, since it started
};

/// A prompt's whole blocks' chained hashes from its salt (element i stands for blocks 0..i, as
/// the replicas' prefix caches hash them; empty when the balancer tracks no prefixes): hashed
/// once per route, then picked, measured and recorded with.
struct prompt_blocks {
  std::vector<uint64_t> hashes;
  size_t tokens = 0;  ///< the prompt's length
};

/// Thread affinity: the router's. Deterministic for a given seed and sequence of calls.
class balancer {
 public:
  explicit balancer(balance_policy policy, uint64_t seed = 1, size_t block_size = 16, size_t max_prefixes = 100000);

  /// Adds a replica or refreshes its report (assignments since the last report are dropped:
  /// the report includes them).
  void update(const replica_load& load);
  void remove(uint64_t replica);

  /// A ready replica for this prompt; replica_unavailable when there is none.
  /// `salt`: the request's cache_salt key (0: none); prefix-aware affinity is per salt, as the
  /// replicas' caches are. `key`: its affinity key (OpenAI's prompt_cache_key; 0: none): under
  /// every policy but round-robin, the replica the key's last request went to, unless it is no
  /// longer ready or is much busier than the least loaded (more than 2x + 2 its load).
  [[nodiscard]] result<uint64_t> pick(std::span<const int32_t> prompt, uint64_t salt = 0, uint64_t key = 0) {
    return pick_blocks(blocks_of(prompt, salt), key);
  }
  [[nodiscard]] result<uint64_t> pick_blocks(const prompt_blocks& p, uint64_t key = 0);
  /// Records that a request with this prompt (and key) went to `replica`.
  void assigned(uint64_t replica, std::span<const int32_t> prompt, uint64_t salt = 0, uint64_t key = 0) {
    assigned_blocks(replica, blocks_of(prompt, salt), key);
  }
  void assigned_blocks(uint64_t replica, const prompt_blocks& p, uint64_t key = 0);
  /// The prompt's blocks as this balancer hashes them (none when it tracks no prefixes).
  prompt_blocks blocks_of(std::span<const int32_t> prompt, uint64_t salt = 0) const;
  /// Records that one of its requests ended.
  void finished(uint64_t replica);

  bool empty() const { return replicas_.empty(); }
  /// Current load estimate of a replica (0 for unknown ones).
  size_t load_of(uint64_t replica) const;
  /// The ready replica with the least load estimate (the lowest id among equals);
  /// replica_unavailable when none is ready.
  [[nodiscard]] result<uint64_t> least_loaded() const;

  /// A replica's KV events (kv_events.hpp): the blocks it reports cached count towards
  /// cached_tokens() and prefix-aware picks; an evicted block is also no longer predicted there.
  /// Ignored for unknown replicas and when prefixes are not tracked.
  void apply(const kv_events& e);
  /// Blocks a replica's KV events report cached (0 for unknown replicas).
  size_t reported_blocks(uint64_t replica) const {
    auto it = replicas_.find(replica);
    return it == replicas_.end() ? 0 : it->second.kv.size();
  }
  /// Whether prefixes are tracked (prefix-aware, or track_prefixes()): KV events are of use.
  bool tracking() const { return policy_ == balance_policy::prefix_aware || track_prefixes_; }

  /// Remember the block hashes of every assigned prompt under any policy (prefix-aware always
  /// does), so that cached_tokens() can tell what a replica was sent (disaggregated prefill).
  void track_prefixes() { track_prefixes_ = true; }
  /// The prompt's leading tokens, in whole blocks, that `replica` caches: the longer of the
  /// leading blocks its KV events reported and those this balancer last sent it (a prediction:
  /// past the first dense_blocks blocks it counts in steps of sparse_step blocks, rounded down).
  /// 0 when prefixes are not tracked.
  size_t cached_tokens(uint64_t replica, std::span<const int32_t> prompt, uint64_t salt = 0) const {
    return cached_tokens_of(replica, blocks_of(prompt, salt));
  }
  size_t cached_tokens_of(uint64_t replica, const prompt_blocks& p) const;

  /// Forgets where every prefix and affinity key went (the replicas' prefix caches were emptied).
  void forget_prefixes();

  /// A prompt's prefixes remembered: every whole block's up to dense_blocks, then every
  /// sparse_step-th (a 64 Ki-token prompt takes ~316 of the max_prefixes entries, not 4096).
  static constexpr size_t dense_blocks = 64, sparse_step = 16;

 private:
  struct entry {
    replica_load report;
    size_t extra = 0;  ///< assigned since the report, minus finished
    std::unordered_set<uint64_t> kv;  ///< block hashes its KV events report cached
  };
  /// Leading blocks of a prompt (its chained block hashes, every block) that `e` caches.
  size_t cached_blocks(uint64_t replica, const entry& e, std::span<const uint64_t> hashes) const;
  /// Forgets the prediction `h` → `replica` (not one that names another replica).
  void unpredict(uint64_t h, uint64_t replica);
  size_t load(const entry& e) const { return e.report.running + e.report.waiting + e.extra; }
  /// The replica remembered for hash `h` when it is ready and within 2x + 2 of `floor`.
  std::optional<uint64_t> affine(uint64_t h, size_t floor) const;
  /// Remembers `h` → `replica` (most recent; the oldest goes beyond max_prefixes); `key`: an
  /// affinity key's entry, not a prefix's.
  void remember(uint64_t h, uint64_t replica, bool key = false);

  balance_policy policy_;
  size_t block_size_, max_prefixes_;
  bool track_prefixes_ = false;
  std::mt19937_64 rng_;
  std::map<uint64_t, entry> replicas_;  ///< ordered: round-robin and ties go by id
  uint64_t next_rr_ = 0;
  // prefix-aware: chained block hash → (replica, position in the LRU list); affinity keys too
  // (key_hash), under every policy but round-robin
  struct remembered_at {
    uint64_t replica;
    std::list<uint64_t>::iterator pos;  ///< in lru_
    bool key;                           ///< an affinity key's entry
  };
  std::list<uint64_t> lru_;
  std::unordered_map<uint64_t, remembered_at> prefixes_;
};

}  // namespace llmesh::actors
