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
  store_.put(id, json{{"response", r.response}, {"input_items", r.input_items}, {"earlier", r.earlier}});
}

std::shared_ptr<const stored_response> response_store::get(const std::string& id) const {
  auto whole = store_.get(id);
  if (!whole) return nullptr;
  auto r = std::make_shared<stored_response>();
  r->response = std::move((*whole)["response"]);
  r->input_items = std::move((*whole)["input_items"]);
  r->earlier = std::move((*whole)["earlier"]);
  return r;
}

}  // namespace llmesh::gateway
