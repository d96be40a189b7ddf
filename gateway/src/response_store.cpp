#include "llmesh/gateway/response_store.hpp"

namespace llmesh::gateway {

using json = nlohmann::ordered_json;

json stored_response::conversation() const {
  json out = earlier.is_array() ? earlier : json::array();
  static const json none = json::array();
  const json& output = response.is_object() && response.contains("output") ? response["output"] : none;
  for (const auto& items : {std::cref(input_items), std::cref(output)}) {
    if (!items.get().is_array()) continue;
    for (const auto& item : items.get()) out.push_back(item);
  }
  return out;
}

size_t stored_response::bytes() const {
  const auto size = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace).size(); };
  return size(response) + size(input_items) + size(earlier);
}

void response_store::put(const std::string& id, stored_response r) {
  if (!enabled()) return;
  const size_t b = r.bytes();
  std::lock_guard lock(mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) drop_locked(it);
  if (b > max_bytes_) return;  // larger than the whole budget: never kept
  const uint64_t order = next_order_++;
  by_id_[id] = entry{std::make_shared<const stored_response>(std::move(r)), b, order};
  age_.emplace(order, id);
  bytes_ += b;
  while (by_id_.size() > max_entries_ || bytes_ > max_bytes_) drop_locked(by_id_.find(age_.begin()->second));
}

void response_store::drop_locked(std::map<std::string, entry>::iterator it) {
  bytes_ -= it->second.bytes;
  age_.erase(it->second.order);
  by_id_.erase(it);
}

std::shared_ptr<const stored_response> response_store::get(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second.r;
}

bool response_store::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  drop_locked(it);
  return true;
}

size_t response_store::size() const {
  std::lock_guard lock(mu_);
  return by_id_.size();
}

size_t response_store::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

}  // namespace llmesh::gateway
