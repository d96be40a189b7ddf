// A bounded map of JSON values (json_store.hpp).
#include "llmesh/gateway/json_store.hpp"

namespace llmesh::gateway {

using json = nlohmann::ordered_json;

namespace {

std::shared_ptr<const std::string> text_of(const json& value) {
  return std::make_shared<const std::string>(value.dump(-1, ' ', false, json::error_handler_t::replace));
}

}  // namespace

void json_store::keep_locked(const std::string& id, std::shared_ptr<const std::string> text) {
  const uint64_t order = next_order_++;
  bytes_ += text->size();
  by_id_[id] = entry{std::move(text), order};
  age_.emplace(order, id);
  while (by_id_.size() > max_entries_ || bytes_ > max_bytes_) drop_locked(by_id_.find(age_.begin()->second));
}

bool json_store::put(const std::string& id, const json& value) {
  if (!enabled()) return false;
  auto text = text_of(value);
  std::lock_guard lock(mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) drop_locked(it);
  if (text->size() > max_bytes_) return false;  // larger than the whole budget: never kept
  keep_locked(id, std::move(text));
  return true;
}

void json_store::drop_locked(std::map<std::string, entry>::iterator it) {
  bytes_ -= it->second.text->size();
  age_.erase(it->second.order);
  by_id_.erase(it);
}

std::optional<json> json_store::get(const std::string& id) const {
  std::shared_ptr<const std::string> text;
  {
    std::lock_guard lock(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return std::nullopt;
    text = it->second.text;
  }
  json value = json::parse(*text, nullptr, false);  // outside the lock: its own text, shared
  if (value.is_discarded()) return std::nullopt;     // (never: the store wrote it)
  return value;
}

result<json> json_store::update(const std::string& id, const std::function<status(json&)>& change) {
  // Optimistic: parse and change outside the lock, and write back only if no other write came
  // meanwhile (the entry's write order is the same); after a few collisions, under the lock.
  constexpr int optimistic_tries = 3;
  for (int attempt = 0;; ++attempt) {
    const bool locked = attempt >= optimistic_tries;
    std::unique_lock lock(mu_, std::defer_lock);
    if (locked) lock.lock();
    std::shared_ptr<const std::string> text;
    uint64_t order = 0;
    {
      std::unique_lock peek(mu_, std::defer_lock);
      if (!locked) peek.lock();
      auto it = by_id_.find(id);
      if (it == by_id_.end()) return make_error(errc::not_found, "no entry '" + id + "'");
      text = it->second.text;
      order = it->second.order;
    }
    json value = json::parse(*text, nullptr, false);
    if (value.is_discarded()) return make_error(errc::internal, "a stored value of '" + id + "' does not parse");
    LLMESH_TRY(change(value));
    auto new_text = text_of(value);
    if (new_text->size() > max_bytes_) {
      return make_error(errc::invalid_request, "'" + id + "' would take " + std::to_string(new_text->size()) +
                                                   " bytes, more than this server keeps (" + std::to_string(max_bytes_) + ")");
    }
    if (!locked) lock.lock();
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return make_error(errc::not_found, "no entry '" + id + "'");  // erased meanwhile
    if (it->second.order != order) continue;  // written meanwhile: change what it is now
    drop_locked(it);
    keep_locked(id, std::move(new_text));
    return value;
  }
}

bool json_store::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  drop_locked(it);
  return true;
}

size_t json_store::size() const {
  std::lock_guard lock(mu_);
  return by_id_.size();
}

size_t json_store::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

}  // namespace llmesh::gateway
