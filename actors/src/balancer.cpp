// Replica choice (balancer.hpp).
#include "llmesh/actors/balancer.hpp"

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "block_hash.hpp"

namespace llmesh::actors {
namespace {

/// The prompt's whole blocks' chained hashes, as the replicas' prefix caches hash them, from
/// its cache_salt: element i stands for the prefix of blocks 0..i.
std::vector<uint64_t> block_hashes(std::span<const int32_t> prompt, size_t bs, uint64_t salt) {
  std::vector<uint64_t> out;
  out.reserve(prompt.size() / bs);
  uint64_t h = salt;
  for (size_t b = 0; (b + 1) * bs <= prompt.size(); ++b) {
    h = detail::chain_block_hash(h, prompt.subspan(b * bs, bs));
    out.push_back(h);
  }
  return out;
}

/// Whether block i's prefix is remembered as a prediction: every block's up to
/// balancer::dense_blocks, then every sparse_step-th.
bool remembered(size_t i) { return i < balancer::dense_blocks || (i + 1) % balancer::sparse_step == 0; }

}  // namespace

result<balance_policy> parse_balance_policy(std::string_view name) {
  if (name == "round-robin") return balance_policy::round_robin;
  if (name == "least-load") return balance_policy::least_load;
  if (name == "power-of-two") return balance_policy::power_of_two;
  if (name == "prefix-aware") return balance_policy::prefix_aware;
  return make_error(errc::invalid_request, "unknown router policy '" + std::string(name) +
                                               "' (expected round-robin, least-load, power-of-two or prefix-aware)");
}

balancer::balancer(balance_policy policy, uint64_t seed, size_t block_size, size_t max_prefixes)
    : policy_(policy), block_size_(block_size == 0 ? 16 : block_size), max_prefixes_(max_prefixes), rng_(seed) {}

void balancer::update(const replica_load& load) {
  auto& e = replicas_[load.replica];
  e.report = load;
  e.extra = 0;
}

void balancer::remove(uint64_t replica) { replicas_.erase(replica); }

size_t balancer::load_of(uint64_t replica) const {
  auto it = replicas_.find(replica);
  return it == replicas_.end() ? 0 : load(it->second);
}

size_t balancer::cached_blocks(uint64_t replica, const entry& e, std::span<const uint64_t> hashes) const {
  // Reported: the leading run of blocks the replica said it caches.
  size_t n = 0;
  while (n < hashes.size() && e.kv.contains(hashes[n])) ++n;
  // Predicted: chained hashes, block i's stands for the whole prefix up to it. The longest one
  // last sent to this replica (an earlier block may since have gone elsewhere with another prompt).
  for (size_t i = hashes.size(); i-- > n;) {
    if (!remembered(i)) continue;
    auto it = prefixes_.find(hashes[i]);
    if (it != prefixes_.end() && it->second.replica == replica) return i + 1;
  }
  return n;
}

prompt_blocks balancer::blocks_of(std::span<const int32_t> prompt, uint64_t salt) const {
  prompt_blocks out;
  out.tokens = prompt.size();
  if (tracking()) out.hashes = block_hashes(prompt, block_size_, salt);
  return out;
}

size_t balancer::cached_tokens_of(uint64_t replica, const prompt_blocks& p) const {
  if (!tracking() || p.tokens == 0) return 0;
  auto it = replicas_.find(replica);
  if (it == replicas_.end()) return 0;
  // Never the block of the prompt's last token: a replica computes that one whatever it caches.
  const size_t usable = std::min(p.hashes.size(), (p.tokens - 1) / block_size_);
  return cached_blocks(replica, it->second, std::span<const uint64_t>(p.hashes).first(usable)) * block_size_;
}

void balancer::unpredict(uint64_t h, uint64_t replica) {
  auto p = prefixes_.find(h);
  if (p == prefixes_.end() || p->second.replica != replica) return;
  lru_.erase(p->second.pos);
  prefixes_.erase(p);
}

void balancer::apply(const kv_events& e) {
  auto it = replicas_.find(e.replica);
  if (it == replicas_.end() || !tracking() || e.block_size != block_size_) return;
  auto& kv = it->second.kv;
  if (e.full) {
    // Predictions of this replica that it does not confirm are dropped (its cache was reset,
    // or this balancer fell behind and cannot tell what it evicted meanwhile): a scan of the
    // predictions, as rare as whole-cache reports.
    std::unordered_set<uint64_t> now(e.stored.begin(), e.stored.end());
    for (auto p = lru_.begin(); p != lru_.end();) {
      auto entry = prefixes_.find(*p);
      if (entry->second.replica == e.replica && !entry->second.key && !now.contains(*p)) {
        prefixes_.erase(entry);
        p = lru_.erase(p);
      } else {
        ++p;
      }
    }
    kv = std::move(now);
    return;
  }
  for (uint64_t h : e.removed) {
    kv.erase(h);
    unpredict(h, e.replica);
  }
  kv.insert(e.stored.begin(), e.stored.end());
}

void balancer::forget_prefixes() {
  prefixes_.clear();
  lru_.clear();
  for (auto& [id, e] : replicas_) e.kv.clear();
}

result<uint64_t> balancer::least_loaded() const {
  const entry* best = nullptr;
  uint64_t best_id = 0;
  for (const auto& [id, e] : replicas_) {
    if (!e.report.ready) continue;
    if (!best || load(e) < load(*best)) {
      best = &e;
      best_id = id;
    }
  }
  if (!best) return make_error(errc::replica_unavailable, "no ready replica");
  return best_id;
}

namespace {

/// An affinity key's entry among the prefix hashes (a domain of its own).
uint64_t key_hash(uint64_t key) {
  uint64_t h = key ^ 0x6b65792d61666669ull;  // "key-affi"
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

}  // namespace

std::optional<uint64_t> balancer::affine(uint64_t h, size_t floor) const {
  auto it = prefixes_.find(h);
  if (it == prefixes_.end()) return std::nullopt;
  auto r = replicas_.find(it->second.replica);
  // Cache affinity is worth a little imbalance, not a queue: at most 2x + 2 the least load.
  if (r != replicas_.end() && r->second.report.ready && load(r->second) <= 2 * floor + 2) return r->first;
  return std::nullopt;
}

result<uint64_t> balancer::pick_blocks(const prompt_blocks& p, uint64_t key) {
  std::vector<uint64_t> ready;
  for (const auto& [id, e] : replicas_) {
    if (e.report.ready) ready.push_back(id);
  }
  if (ready.empty()) return make_error(errc::replica_unavailable, "no ready replica");
  if (key != 0 && policy_ != balance_policy::round_robin) {
    auto least = least_loaded();
    if (!least) return least;
    if (auto r = affine(key_hash(key), load(replicas_.at(*least)))) return *r;
  }
  switch (policy_) {
    case balance_policy::round_robin: {
      auto it = std::lower_bound(ready.begin(), ready.end(), next_rr_);
      const uint64_t id = it == ready.end() ? ready.front() : *it;
      next_rr_ = id + 1;
      return id;
    }
    case balance_policy::least_load:
      return least_loaded();
    case balance_policy::power_of_two: {
      if (ready.size() == 1) return ready[0];
      std::uniform_int_distribution<size_t> d(0, ready.size() - 1);
      const size_t a = d(rng_);
      size_t b = d(rng_);
      while (b == a) b = d(rng_);
      const uint64_t ra = ready[a], rb = ready[b];
      return load(replicas_.at(rb)) < load(replicas_.at(ra)) ? rb : ra;
    }
    case balance_policy::prefix_aware: {
      auto least = least_loaded();
      if (!least) return least;
      const size_t floor = load(replicas_.at(*least));
      const auto& hashes = p.hashes;
      // The replica that caches the most of the prompt, among those within 2x + 2 of the least
      // load (cache affinity is worth a little imbalance, not a queue); the less loaded, then
      // the lower id, among equals; the least loaded when none caches any of it.
      uint64_t best = *least;
      size_t best_blocks = 0;
      for (const auto& [id, e] : replicas_) {
        if (!e.report.ready || load(e) > 2 * floor + 2) continue;
        const size_t n = cached_blocks(id, e, hashes);
        if (n > best_blocks || (n == best_blocks && n > 0 && load(e) < load(replicas_.at(best)))) {
          best = id;
          best_blocks = n;
        }
      }
      return best;
    }
  }
  return make_error(errc::internal, "balancer: unknown policy");
}

void balancer::remember(uint64_t h, uint64_t replica, bool key) {
  auto p = prefixes_.find(h);
  if (p != prefixes_.end()) {
    lru_.erase(p->second.pos);
    prefixes_.erase(p);
  }
  lru_.push_back(h);
  prefixes_[h] = {replica, std::prev(lru_.end()), key};
  if (prefixes_.size() > max_prefixes_) {
    prefixes_.erase(lru_.front());
    lru_.pop_front();
  }
}

void balancer::assigned_blocks(uint64_t replica, const prompt_blocks& p, uint64_t key) {
  auto it = replicas_.find(replica);
  if (it == replicas_.end()) return;
  ++it->second.extra;
  if (tracking()) {
    for (size_t i = 0; i < p.hashes.size(); ++i) {
      if (remembered(i)) remember(p.hashes[i], replica);
    }
  }
  // After the blocks: the key is its request's newest entry, the last of them to age out.
  if (key != 0 && policy_ != balance_policy::round_robin) remember(key_hash(key), replica, true);
}

void balancer::finished(uint64_t replica) {
  auto it = replicas_.find(replica);
  if (it != replicas_.end() && it->second.extra > 0) --it->second.extra;
}

}  // namespace llmesh::actors
