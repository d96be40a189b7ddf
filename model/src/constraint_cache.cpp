// The process's compiled-grammar cache (constraint_cache.hpp).
#include "llmesh/model/constraint_cache.hpp"

namespace llmesh::model {

constraint_cache::constraint_cache(size_t max_elements, size_t max_entries)
    : max_elements_(max_elements), max_entries_(max_entries) {}

constraint_cache& constraint_cache::shared() {
  static constraint_cache cache;
  return cache;
}

result<std::shared_ptr<const grammar>> constraint_cache::get(const constraint_spec& spec) {
  std::string key(1, static_cast<char>(spec.type));
  key += spec.text;
  {
    std::lock_guard lock(mu_);
    if (auto it = by_key_.find(key); it != by_key_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      const entry& e = *it->second;
      if (e.g) return e.g;
      return e.err;
    }
    ++misses_;
  }
  auto g = compile_constraint(spec);  // outside the lock: it may take a while
  entry e;
  e.key = std::move(key);
  // The key (the spec's text, up to 256 KiB) counts too, in elements' size.
  e.cost = 1 + e.key.size() / sizeof(grammar::element);
  if (g) {
    e.g = *g;
    e.cost += e.g->elements().size();
  } else {
    e.err = g.err();
  }
  insert(std::move(e));
  return g;
}

void constraint_cache::insert(entry e) {
  std::lock_guard lock(mu_);
  if (by_key_.contains(e.key) || e.cost > max_elements_) return;  // another thread's compile won; or too big to keep
  elements_ += e.cost;
  lru_.push_front(std::move(e));
  by_key_.emplace(lru_.front().key, lru_.begin());
  while (elements_ > max_elements_ || lru_.size() > max_entries_) {
    elements_ -= lru_.back().cost;
    by_key_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

size_t constraint_cache::hits() const {
  std::lock_guard lock(mu_);
  return hits_;
}

size_t constraint_cache::misses() const {
  std::lock_guard lock(mu_);
  return misses_;
}

size_t constraint_cache::entries() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

}  // namespace llmesh::model
