// Replica choice (balancer.hpp).
#include "llmesh/actors/balancer.hpp"

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "block_hash.hpp"

namespace llmesh::actors {
namespace {

/// A remembered prefix: its whole blocks' chained hash and how many blocks it spans.
struct prefix_hash {
  uint64_t hash;
  size_t blocks;
};

/// The prompt's whole leading blocks hashed as the replicas' prefix caches hash them, from its
/// cache_salt; kept: every block's up to balancer::dense_blocks, then every sparse_step-th.
std::vector<prefix_hash> block_hashes(std::span<const int32_t> prompt, size_t bs, uint64_t salt) {
  std::vector<prefix_hash> out;
  uint64_t h = salt;
  for (size_t b = 0; (b + 1) * bs <= prompt.size(); ++b) {
    h = detail::chain_block_hash(h, prompt.subspan(b * bs, bs));
    if (b < balancer::dense_blocks || (b + 1) % balancer::sparse_step == 0) out.push_back({h, b + 1});
  }
  return out;
}

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

size_t balancer::cached_tokens(uint64_t replica, std::span<const int32_t> prompt, uint64_t salt) const {
  if (policy_ != balance_policy::prefix_aware && !track_prefixes_) return 0;
  const auto hashes = block_hashes(prompt, block_size_, salt);
  // Chained hashes: block i's stands for the whole prefix up to it. The longest one last sent
  // to this replica (an earlier block may since have gone elsewhere with another prompt).
  for (size_t i = hashes.size(); i-- > 0;) {
    auto it = prefixes_.find(hashes[i].hash);
    if (it != prefixes_.end() && it->second.first == replica) return hashes[i].blocks * block_size_;
  }
  return 0;
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
  auto r = replicas_.find(it->second.first);
  // Cache affinity is worth a little imbalance, not a queue: at most 2x + 2 the least load.
  if (r != replicas_.end() && r->second.report.ready && load(r->second) <= 2 * floor + 2) return r->first;
  return std::nullopt;
}

result<uint64_t> balancer::pick(std::span<const int32_t> prompt, uint64_t salt, uint64_t key) {
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
      const auto hashes = block_hashes(prompt, block_size_, salt);
      for (size_t i = hashes.size(); i-- > 0;) {  // the longest remembered prefix first
        if (!prefixes_.count(hashes[i].hash)) continue;
        if (auto r = affine(hashes[i].hash, floor)) return *r;
        break;
      }
      return least;
    }
  }
  return make_error(errc::internal, "balancer: unknown policy");
}

void balancer::remember(uint64_t h, uint64_t replica) {
  auto p = prefixes_.find(h);
  if (p != prefixes_.end()) {
    lru_.erase(p->second.second);
    prefixes_.erase(p);
  }
  lru_.push_back(h);
  prefixes_[h] = {replica, std::prev(lru_.end())};
  if (prefixes_.size() > max_prefixes_) {
    prefixes_.erase(lru_.front());
    lru_.pop_front();
  }
}

void balancer::assigned(uint64_t replica, std::span<const int32_t> prompt, uint64_t salt, uint64_t key) {
  auto it = replicas_.find(replica);
  if (it == replicas_.end()) return;
  ++it->second.extra;
  if (policy_ == balance_policy::prefix_aware || track_prefixes_) {
    for (const auto& p : block_hashes(prompt, block_size_, salt)) remember(p.hash, replica);
  }
  // After the blocks: the key is its request's newest entry, the last of them to age out.
  if (key != 0 && policy_ != balance_policy::round_robin) remember(key_hash(key), replica);
}

void balancer::finished(uint64_t replica) {
  auto it = replicas_.find(replica);
  if (it != replicas_.end() && it->second.extra > 0) --it->second.extra;
}

}  // namespace llmesh::actors
