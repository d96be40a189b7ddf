// The block manager (block_manager.hpp): a free stack, an LRU list of evictable cached blocks,
// and the hash → block map of the prefix cache.
#include "llmesh/actors/block_manager.hpp"

#include <algorithm>
#include <string>

#include "block_hash.hpp"

namespace llmesh::actors {

block_manager::block_manager(size_t n_blocks, size_t block_size, bool prefix_caching)
    : block_size_(block_size == 0 ? 1 : block_size),
      prefix_caching_(prefix_caching),
      ref_(n_blocks, 0),
      lru_pos_(n_blocks),
      in_lru_(n_blocks, false),
      hash_(n_blocks, 0),
      parent_(n_blocks, 0),
      content_(n_blocks),
      cached_(n_blocks, false),
      log_capacity_(std::max<size_t>(4096, 2 * n_blocks)) {
  free_.reserve(n_blocks);
  for (size_t b = n_blocks; b-- > 0;) free_.push_back(static_cast<int32_t>(b));  // block 0 first
}

size_t block_manager::blocks_needed(const block_list& b, size_t n_tokens) const {
  const size_t want = (n_tokens + block_size_ - 1) / block_size_;
  return want > b.ids.size() ? want - b.ids.size() : 0;
}

void block_manager::take(int32_t id) {
  if (ref_[id] == 0 && in_lru_[id]) {
    lru_.erase(lru_pos_[id]);
    in_lru_[id] = false;
  }
  ++ref_[id];
}

int32_t block_manager::allocate_one() {
  int32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {  // evict the least recently used cached block
    id = lru_.front();
    lru_.pop_front();
    in_lru_[id] = false;
    by_hash_.erase(hash_[id]);
    log_event(hash_[id], false);
    cached_[id] = false;
    content_[id].clear();
  }
  ref_[id] = 1;
  return id;
}

size_t block_manager::match_prefix(std::span<const int32_t> prompt, block_list& b) {
  queried_tokens_ += prompt.size();
  if (!prefix_caching_ || prompt.empty()) return 0;
  const size_t hit = take_chain(prompt, (prompt.size() - 1) / block_size_, b);  // never the last token's block
  hit_tokens_ += hit;
  return hit;
}

size_t block_manager::match_chain(std::span<const int32_t> tokens, block_list& b) {
  if (!prefix_caching_) return 0;
  return take_chain(tokens, tokens.size() / block_size_, b);
}

size_t block_manager::take_chain(std::span<const int32_t> prompt, size_t usable, block_list& b) {
  for (size_t i = 0; i < usable; ++i) {
    auto tokens = prompt.subspan(i * block_size_, block_size_);
    const uint64_t h = detail::chain_block_hash(b.last_hash, tokens);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const int32_t id = it->second;
    if (parent_[id] != b.last_hash || !std::equal(tokens.begin(), tokens.end(), content_[id].begin(), content_[id].end())) {
      break;  // a hash collision: treat as a miss
    }
    take(id);
    b.ids.push_back(id);
    b.n_hashed = i + 1;
    b.last_hash = h;
  }
  return b.ids.size() * block_size_;
}

status block_manager::reserve(block_list& b, size_t n_tokens) {
  const size_t need = blocks_needed(b, n_tokens);
  if (need > free_blocks()) {
    return make_error(errc::overloaded, "KV cache full: need " + std::to_string(need) + " blocks, " +
                                            std::to_string(free_blocks()) + " free");
  }
  for (size_t i = 0; i < need; ++i) b.ids.push_back(allocate_one());
  return ok_status();
}

void block_manager::commit(block_list& b, std::span<const int32_t> tokens) {
  if (!prefix_caching_) return;
  while ((b.n_hashed + 1) * block_size_ <= tokens.size() && b.n_hashed < b.ids.size()) {
    auto block_tokens = tokens.subspan(b.n_hashed * block_size_, block_size_);
    const uint64_t h = detail::chain_block_hash(b.last_hash, block_tokens);
    const int32_t id = b.ids[b.n_hashed];
    if (!by_hash_.contains(h) && !cached_[id]) {  // a duplicate of a cached block stays private
      by_hash_[h] = id;
      cached_[id] = true;
      hash_[id] = h;
      parent_[id] = b.last_hash;
      content_[id].assign(block_tokens.begin(), block_tokens.end());
      log_event(h, true);
    }
    b.last_hash = h;
    ++b.n_hashed;
  }
}

void block_manager::trim(block_list& b, size_t n_tokens) {
  const size_t keep = std::max((n_tokens + block_size_ - 1) / block_size_, b.n_hashed);
  while (b.ids.size() > keep) {
    const int32_t id = b.ids.back();
    b.ids.pop_back();
    if (--ref_[id] > 0) continue;
    if (cached_[id]) {  // not reachable (only hashed blocks are cached), kept for safety
      lru_pos_[id] = lru_.insert(lru_.end(), id);
      in_lru_[id] = true;
    } else {
      free_.push_back(id);
    }
  }
}

size_t block_manager::reset_prefix_cache() {
  const size_t n = by_hash_.size();
  for (const auto& [h, id] : by_hash_) {
    cached_[id] = false;
    content_[id].clear();
    if (in_lru_[id]) {
      in_lru_[id] = false;
      free_.push_back(id);
    }
  }
  by_hash_.clear();
  lru_.clear();
  // Every cursor before the reset now gets the whole (empty) cache.
  log_first_ = event_seq() + 1;
  log_.clear();
  return n;
}

void block_manager::log_event(uint64_t h, bool stored) {
  log_.emplace_back(h, stored);
  if (log_.size() > log_capacity_) {
    log_.pop_front();
    ++log_first_;
  }
}

kv_events block_manager::events_since(uint64_t since) const {
  kv_events out;
  out.seq = event_seq();
  out.block_size = block_size_;
  if (!prefix_caching_) return out;
  if (since < log_first_ || since > out.seq) {
    out.full = true;
    out.stored.reserve(by_hash_.size());
    for (const auto& [h, id] : by_hash_) out.stored.push_back(h);
    std::sort(out.stored.begin(), out.stored.end());
    return out;
  }
  // Netted: a hash's last event decides which list it is in.
  std::unordered_map<uint64_t, bool> last;
  for (auto it = log_.begin() + static_cast<std::ptrdiff_t>(since - log_first_); it != log_.end(); ++it) last[it->first] = it->second;
  for (const auto& [h, stored] : last) (stored ? out.stored : out.removed).push_back(h);
  std::sort(out.stored.begin(), out.stored.end());
  std::sort(out.removed.begin(), out.removed.end());
  return out;
}

void block_manager::release(block_list& b) {
  // Last block first: the LRU list's front is evicted first, so the tail goes before the head.
  for (auto it = b.ids.rbegin(); it != b.ids.rend(); ++it) {
    const int32_t id = *it;
    if (--ref_[id] > 0) continue;
    if (cached_[id]) {
      lru_pos_[id] = lru_.insert(lru_.end(), id);
      in_lru_[id] = true;
    } else {
      free_.push_back(id);
    }
  }
  b = block_list{};
}

status block_manager::check_invariants() const {
  std::vector<int> seen(ref_.size(), 0);
  for (int32_t id : free_) {
    if (ref_[id] != 0 || cached_[id]) return make_error(errc::internal, "free block " + std::to_string(id) + " is in use or cached");
    ++seen[id];
  }
  for (int32_t id : lru_) {
    if (ref_[id] != 0 || !cached_[id] || !in_lru_[id]) return make_error(errc::internal, "LRU block " + std::to_string(id) + " is in use or uncached");
    ++seen[id];
  }
  for (size_t id = 0; id < ref_.size(); ++id) {
    if (ref_[id] < 0) return make_error(errc::internal, "block " + std::to_string(id) + " has a negative count");
    if (ref_[id] > 0) ++seen[id];
    if (seen[id] != 1) return make_error(errc::internal, "block " + std::to_string(id) + " is in " + std::to_string(seen[id]) + " states");
  }
  for (const auto& [h, id] : by_hash_) {
    if (!cached_[id] || hash_[id] != h) return make_error(errc::internal, "cache map disagrees for block " + std::to_string(id));
  }
  const auto n_cached = static_cast<size_t>(std::count(cached_.begin(), cached_.end(), true));
  if (n_cached != by_hash_.size()) return make_error(errc::internal, "cached flags and cache map sizes differ");
  return ok_status();
}

}  // namespace llmesh::actors
