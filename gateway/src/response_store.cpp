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

void response_store::put(const std::string& id, const stored_response& r) {
  if (!enabled()) return;
  const json whole = {{"response", r.response}, {"input_items", r.input_items}, {"earlier", r.earlier}};
  auto text = std::make_shared<const std::string>(whole.dump(-1, ' ', false, json::error_handler_t::replace));
  std::lock_guard lock(mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) drop_locked(it);
  if (text->size() > max_bytes_) return;  // larger than the whole budget: never kept
  const uint64_t order = next_order_++;
  bytes_ += text->size();
  by_id_[id] = entry{std::move(text), order};
  age_.emplace(order, id);
  while (by_id_.size() > max_entries_ || bytes_ > max_bytes_) drop_locked(by_id_.find(age_.begin()->second));
}

void response_store::drop_locked(std::map<std::string, entry>::iterator it) {
  bytes_ -= it->second.text->size();
  age_.erase(it->second.order);
  by_id_.erase(it);
}

std::shared_ptr<const stored_response> response_store::get(const std::string& id) const {
  std::shared_ptr<const std::string> text;
  {
    std::lock_guard lock(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return nullptr;
    text = it->second.text;
  }
  json whole = json::parse(*text, nullptr, false);  // outside the lock: its own text, shared
  if (whole.is_discarded()) return nullptr;          // (never: the store wrote it)
  auto r = std::make_shared<stored_response>();
  r->response = std::move(whole["response"]);
  r->input_items = std::move(whole["input_items"]);
  r->earlier = std::move(whole["earlier"]);
  return r;
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
