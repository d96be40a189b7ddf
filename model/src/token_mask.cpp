// token_vocabulary and token_mask_cache (token_mask.hpp).
#include "llmesh/model/token_mask.hpp"

#include <algorithm>
#include <numeric>

#include "llmesh/model/detokenizer.hpp"

namespace llmesh::model {

std::shared_ptr<const token_vocabulary> token_vocabulary::build(const detokenizer& d) {
  std::vector<std::string> tokens(d.vocab_size());
  std::vector<bool> excluded(d.vocab_size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = d.token_bytes(static_cast<int32_t>(i));
    excluded[i] = d.is_special(static_cast<int32_t>(i));
  }
  return from_bytes(tokens, excluded);
}

std::shared_ptr<const token_vocabulary> token_vocabulary::from_bytes(const std::vector<std::string>& tokens,
                                                                     const std::vector<bool>& excluded) {
  auto v = std::make_shared<token_vocabulary>();
  v->size_ = tokens.size();
  v->bytes_ = tokens;
  v->excluded_.assign(tokens.size(), false);
  for (size_t i = 0; i < tokens.size(); ++i) v->excluded_[i] = (i < excluded.size() && excluded[i]) || tokens[i].empty();
  std::vector<int32_t> order;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!v->excluded_[i]) order.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
  // Preorder trie from the sorted byte strings: `path` holds the open nodes, one per depth.
  v->nodes_.push_back({});
  std::vector<uint32_t> path{0};
  std::string_view prev;
  for (int32_t id : order) {
    const std::string_view t = tokens[static_cast<size_t>(id)];
    size_t common = 0;
    while (common < prev.size() && common < t.size() && prev[common] == t[common]) ++common;
    while (path.size() > common + 1) {
      v->nodes_[path.back()].skip = static_cast<uint32_t>(v->nodes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < t.size(); ++d) {
      node n;
      n.byte = static_cast<uint8_t>(t[d]);
      n.depth = static_cast<uint32_t>(d + 1);
      n.first = n.last = static_cast<uint32_t>(v->ids_.size());
      path.push_back(static_cast<uint32_t>(v->nodes_.size()));
      v->nodes_.push_back(n);
    }
    node& end = v->nodes_[path.back()];
    if (end.last != v->ids_.size()) end.first = static_cast<uint32_t>(v->ids_.size());  // a fresh node
    v->ids_.push_back(id);
    end.last = static_cast<uint32_t>(v->ids_.size());
    v->max_depth_ = std::max(v->max_depth_, static_cast<uint32_t>(t.size()));
    prev = t;
  }
  while (!path.empty()) {
    v->nodes_[path.back()].skip = static_cast<uint32_t>(v->nodes_.size());
    path.pop_back();
  }
  return v;
}

const std::string& token_vocabulary::bytes(int32_t id) const {
  static const std::string none;
  return id < 0 || static_cast<size_t>(id) >= size_ ? none : bytes_[static_cast<size_t>(id)];
}

std::vector<uint32_t> token_vocabulary::end_mask(const grammar_matcher& m, std::span<const int32_t> end_ids) const {
  std::vector<uint32_t> out(words(), 0u);
  if (!m.accepting()) return out;
  for (int32_t id : end_ids) {
    if (id >= 0 && static_cast<size_t>(id) < size_) out[static_cast<size_t>(id) >> 5] |= 1u << (static_cast<uint32_t>(id) & 31);
  }
  return out;
}

std::vector<uint32_t> token_vocabulary::mask(const grammar_matcher& m, std::span<const int32_t> end_ids) const {
  std::vector<uint32_t> out = end_mask(m, end_ids);
  auto set = [&](int32_t id) { out[static_cast<size_t>(id) >> 5] |= 1u << (static_cast<uint32_t>(id) & 31); };
  if (!m.can_continue()) return out;
  std::vector<std::vector<grammar_matcher::stack>> level(max_depth_ + 1);
  level[0] = m.stacks_;
  for (size_t i = 1; i < nodes_.size();) {
    const node& n = nodes_[i];
    auto& here = level[n.depth];
    here = m.advance(level[n.depth - 1], n.byte);
    if (here.empty()) {
      i = n.skip;
      continue;
    }
    for (uint32_t k = n.first; k < n.last; ++k) set(ids_[k]);
    ++i;
  }
  return out;
}

int32_t grammar_states::intern(const std::vector<grammar_matcher::stack>& stacks) {
  std::string key = grammar_matcher(g_, stacks).key();
  if (sets_.size() >= max_states_) {
    auto it = ids_.find(key);
    return it == ids_.end() ? full : it->second;
  }
  auto [it, fresh] = ids_.emplace(std::move(key), static_cast<int32_t>(sets_.size()));
  if (fresh) {
    sets_.push_back(stacks);
    next_.emplace_back().fill(unknown);
  }
  return it->second;
}

int32_t grammar_states::next(int32_t state, uint8_t b) {
  int32_t& to = next_[static_cast<size_t>(state)][b];
  if (to != unknown) return to;
  auto after = proto_.advance(sets_[static_cast<size_t>(state)], b);
  const int32_t id = after.empty() ? dead : intern(after);
  if (id != full) next_[static_cast<size_t>(state)][b] = id;  // `to` may dangle: intern() grows next_
  return id;
}

std::vector<uint32_t> token_vocabulary::mask(const grammar_matcher& m, std::span<const int32_t> end_ids,
                                             grammar_states& states) const {
  std::vector<uint32_t> out = end_mask(m, end_ids);
  auto set = [&](int32_t id) { out[static_cast<size_t>(id) >> 5] |= 1u << (static_cast<uint32_t>(id) & 31); };
  if (!m.can_continue()) return out;
  std::vector<int32_t> level(max_depth_ + 1);
  level[0] = states.intern(m);
  if (level[0] == grammar_states::full) return mask(m, end_ids);
  for (size_t i = 1; i < nodes_.size();) {
    const node& n = nodes_[i];
    const int32_t s = states.next(level[n.depth - 1], n.byte);
    if (s == grammar_states::full) return mask(m, end_ids);  // the same mask, without the table
    if (s == grammar_states::dead) {
      i = n.skip;
      continue;
    }
    level[n.depth] = s;
    for (uint32_t k = n.first; k < n.last; ++k) set(ids_[k]);
    ++i;
  }
  return out;
}

std::shared_ptr<const std::vector<uint32_t>> token_mask_cache::get(const token_vocabulary& v, const grammar_matcher& m,
                                                                   std::span<const int32_t> end_ids) {
  std::string key;
  const void* g = m.shared_rules().get();
  key.append(reinterpret_cast<const char*>(&g), sizeof g);
  const auto n_end = static_cast<uint32_t>(end_ids.size());
  key.append(reinterpret_cast<const char*>(&n_end), sizeof n_end);
  key.append(reinterpret_cast<const char*>(end_ids.data()), end_ids.size() * sizeof(int32_t));
  key += m.key();
  if (auto it = map_.find(key); it != map_.end()) {
    ++hits_;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->mask;
  }
  ++misses_;
  size_t states = 0;
  for (const auto& [g, s] : states_) states += s->size();
  if (states > max_states) states_.clear();
  auto& table = states_[m.shared_rules().get()];
  if (!table) table = std::make_unique<grammar_states>(m.shared_rules());
  auto mask = std::make_shared<const std::vector<uint32_t>>(v.mask(m, end_ids, *table));
  lru_.push_front({key, m.shared_rules(), mask});
  map_[std::move(key)] = lru_.begin();
  while (map_.size() > max_) {
    map_.erase(lru_.back().key);
    lru_.pop_back();
  }
  return mask;
}

}  // namespace llmesh::model
