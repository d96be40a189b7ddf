// OpenAI's Conversations API on the HTTP API (api_service.hpp): a conversation is a list of
// items (the Responses API's input items) that a response named by `conversation` continues
// and then extends with its input and output. Routes:
//   POST   /v1/conversations                      {items?, metadata?} → the conversation
//   GET    /v1/conversations/{id}                  → the conversation
//   POST   /v1/conversations/{id}                  {metadata} → the conversation
//   DELETE /v1/conversations/{id}                  → {id, object: "conversation.deleted", deleted}
//   GET    /v1/conversations/{id}/items            ?limit&order&after → a list (newest first)
//   POST   /v1/conversations/{id}/items            {items} → the list of those added
//   GET    /v1/conversations/{id}/items/{item}     → the item
//   DELETE /v1/conversations/{id}/items/{item}     → the conversation
// Kept in a json_store ({"id", "created_at", "metadata", "items"}), bounded by
// --max-conversations and --max-conversations-mb; process memory only.
#include <chrono>
#include <cstdio>
#include <set>

#include "json_reply.hpp"
#include "llmesh/gateway/api_service.hpp"
#include "llmesh/gateway/responses_api.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

/// OpenAI's bounds: items per create or add call, metadata pairs and their lengths.
constexpr size_t max_items_per_call = 20, max_metadata_pairs = 16, max_metadata_key = 64, max_metadata_value = 512;

using detail::dumped;
using detail::json_body;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

error bad(std::string message) { return make_error(errc::invalid_request, std::move(message)); }

error conversation_not_found(const std::string& id) {
  return make_error(errc::not_found, "no conversation with id '" + id + "' (it was never made, was deleted, or was dropped to "
                                                                        "keep the conversations within their bounds)");
}

/// The conversation object (without its items).
json object_of(const json& c) {
  return {{"id", c["id"]}, {"object", "conversation"}, {"created_at", c["created_at"]}, {"metadata", c["metadata"]}};
}

status check_metadata(const json& m) {
  if (!m.is_object()) return bad("'metadata' must be an object of strings");
  if (m.size() > max_metadata_pairs) return bad("'metadata' holds at most " + std::to_string(max_metadata_pairs) + " pairs");
  for (const auto& [k, v] : m.items()) {
    if (k.size() > max_metadata_key) return bad("'metadata' keys are at most " + std::to_string(max_metadata_key) + " characters");
    if (!v.is_string() || v.get_ref<const std::string&>().size() > max_metadata_value) {
      return bad("'metadata." + k + "' must be a string of at most " + std::to_string(max_metadata_value) + " characters");
    }
  }
  return ok_status();
}

/// A message item as a conversation keeps it: string content as one text part (input_text,
/// or output_text for the assistant's), as OpenAI lists conversation items.
json normalized(json item) {
  if (item.is_object() && item.value("type", std::string()) == "message") {
    if (item.contains("content") && item["content"].is_string()) {
      const bool assistant = item.value("role", std::string()) == "assistant";
      item["content"] = json::array({{{"type", assistant ? "output_text" : "input_text"}, {"text", item["content"]}}});
    }
    if (!item.contains("status")) item["status"] = "completed";
  }
  return item;
}

/// The ids of a conversation's items.
std::set<std::string> ids_of(const json& items) {
  std::set<std::string> out;
  for (const auto& i : items) {
    if (i.is_object() && i.contains("id") && i["id"].is_string()) out.insert(i["id"].get<std::string>());
  }
  return out;
}

/// A 400 when an item's id is among `taken` (or twice in `items`): ids name one item each.
status check_new_ids(const json& items, std::set<std::string> taken) {
  for (const auto& i : items) {
    const std::string id = i.value("id", std::string());
    if (!taken.insert(id).second) return bad("an item with id '" + id + "' is already in the conversation");
  }
  return ok_status();
}

/// A request body as a JSON object, or a 400.
result<json> body_object(std::string_view body) { return parse_request_object(body); }

}  // namespace

std::string api_service::fresh_hex() {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(mix_id(next_id_.fetch_add(1))));
  return buf;
}

result<json> api_service::conversation_items(const json& items, const std::string& field) {
  if (!items.is_array()) return bad("'" + field + "' must be an array of items");
  if (items.size() > max_items_per_call) {
    return bad("'" + field + "' holds at most " + std::to_string(max_items_per_call) + " items per call");
  }
  if (items.empty()) return json::array();
  // The items must be what a Responses request's input may hold: its translation checks them.
  const json as_request = {{"input", items}};
  responses_echo echo;
  auto checked = responses_to_chat(as_request, echo);
  if (!checked) {
    // The field's name in the message is this call's (built anew: g++ 12 warns on replace here).
    const std::string& msg = checked.err().message;
    std::string named;
    size_t from = 0;
    for (size_t at; (at = msg.find("'input", from)) != std::string::npos; from = at + 6) named += msg.substr(from, at - from) + "'" + field;
    named += msg.substr(from);
    return bad(named);
  }
  std::string hex = "c";  // (appended: g++ 12 warns on "c" + a temporary string)
  hex += fresh_hex();
  json out = json::array();
  for (auto& i : responses_input_items(as_request, hex)) out.push_back(normalized(std::move(i)));
  return out;
}

http_reply api_service::conversations(std::string_view method, std::string_view rest, std::string_view query,
                                      std::string_view body) {
  const std::string path = "/v1/conversations" + std::string(rest);
  auto not_allowed = [&](const char* allow) {
    http_reply r = error_reply(bad(std::string(method) + " is not allowed on " + path));
    r.status = 405;
    r.headers.emplace_back("Allow", allow);
    return r;
  };
  if (!conversations_->enabled()) {
    return error_reply(bad("this server keeps no conversations (--max-conversations 0)"));
  }
  try {
    if (rest.empty()) {  // /v1/conversations
      if (method != "POST") return not_allowed("POST");
      auto j = body.empty() ? result<json>(json::object()) : body_object(body);
      if (!j) return error_reply(j.err());
      std::string cid = "conv_";
      cid += fresh_hex();
      cid += fresh_hex();
      json c = {{"id", cid}, {"created_at", unix_now()}, {"metadata", json::object()}, {"items", json::array()}};
      if (j->contains("metadata") && !(*j)["metadata"].is_null()) {
        if (auto s = check_metadata((*j)["metadata"]); !s) return error_reply(s.err());
        c["metadata"] = (*j)["metadata"];
      }
      if (j->contains("items") && !(*j)["items"].is_null()) {
        auto items = conversation_items((*j)["items"], "items");
        if (!items) return error_reply(items.err());
        if (auto s = check_new_ids(*items, {}); !s) return error_reply(s.err());
        c["items"] = std::move(*items);
      }
      if (!conversations_->put(c["id"], c)) return error_reply(bad("the conversation is larger than this server keeps"));
      return json_body(object_of(c));
    }
    // /{id}[/items[/{item}]]
    std::string_view tail = rest.substr(1);
    const size_t slash = tail.find('/');
    const std::string id(tail.substr(0, slash));
    const std::string_view sub = slash == std::string_view::npos ? std::string_view() : tail.substr(slash + 1);
    const size_t item_slash = sub.find('/');
    const std::string_view sub_kind = sub.substr(0, item_slash);
    const std::string item_id = item_slash == std::string_view::npos ? std::string() : std::string(sub.substr(item_slash + 1));
    if (id.empty() || (!sub.empty() && sub_kind != "items") || (item_slash != std::string_view::npos && item_id.empty())) {
      return error_reply(make_error(errc::not_found, "no route for " + std::string(method) + " " + path));
    }
    if (sub.empty()) {
      if (method == "GET") {
        auto c = conversations_->get(id);
        if (!c) return error_reply(conversation_not_found(id));
        return json_body(object_of(*c));
      }
      if (method == "DELETE") {
        if (!conversations_->erase(id)) return error_reply(conversation_not_found(id));
        return json_body({{"id", id}, {"object", "conversation.deleted"}, {"deleted", true}});
      }
      if (method != "POST") return not_allowed("GET, POST, DELETE");
      auto j = body_object(body);
      if (!j) return error_reply(j.err());
      if (!j->contains("metadata")) return error_reply(bad("'metadata' is required"));
      const json metadata = (*j)["metadata"].is_null() ? json::object() : (*j)["metadata"];
      if (auto s = check_metadata(metadata); !s) return error_reply(s.err());
      auto c = conversations_->update(id, [&](json& v) {
        v["metadata"] = metadata;
        return ok_status();
      });
      if (!c) return error_reply(c.err().code == errc::not_found ? conversation_not_found(id) : c.err());
      return json_body(object_of(*c));
    }
    if (item_id.empty()) {  // .../items
      if (method == "GET") {
        auto c = conversations_->get(id);
        if (!c) return error_reply(conversation_not_found(id));
        auto page = items_page((*c)["items"], query);
        if (!page) return error_reply(page.err());
        return json_body(*page);
      }
      if (method != "POST") return not_allowed("GET, POST");
      auto j = body_object(body);
      if (!j) return error_reply(j.err());
      if (!j->contains("items")) return error_reply(bad("'items' is required"));
      auto items = conversation_items((*j)["items"], "items");
      if (!items) return error_reply(items.err());
      auto c = conversations_->update(id, [&](json& v) -> status {
        LLMESH_TRY(check_new_ids(*items, ids_of(v["items"])));
        for (const auto& i : *items) v["items"].push_back(i);
        return ok_status();
      });
      if (!c) return error_reply(c.err().code == errc::not_found ? conversation_not_found(id) : c.err());
      json list = {{"object", "list"}, {"data", *items}};
      list["first_id"] = items->empty() ? json(nullptr) : items->front()["id"];
      list["last_id"] = items->empty() ? json(nullptr) : items->back()["id"];
      list["has_more"] = false;
      return json_body(list);
    }
    // .../items/{item}
    auto find_item = [&](const json& c) -> const json* {
      for (const auto& i : c["items"]) {
        if (i.is_object() && i.contains("id") && i["id"] == item_id) return &i;
      }
      return nullptr;
    };
    if (method == "GET") {
      auto c = conversations_->get(id);
      if (!c) return error_reply(conversation_not_found(id));
      const json* item = find_item(*c);
      if (!item) return error_reply(make_error(errc::not_found, "the conversation '" + id + "' has no item '" + item_id + "'"));
      return json_body(*item);
    }
    if (method != "DELETE") return not_allowed("GET, DELETE");
    bool had_item = false;
    auto c = conversations_->update(id, [&](json& v) -> status {
      json kept = json::array();
      for (auto& i : v["items"]) {
        if (!(i.is_object() && i.contains("id") && i["id"] == item_id)) kept.push_back(std::move(i));
      }
      had_item = kept.size() < v["items"].size();
      if (!had_item) return make_error(errc::not_found, "the conversation '" + id + "' has no item '" + item_id + "'");
      v["items"] = std::move(kept);
      return ok_status();
    });
    if (!c) return error_reply(c.err().code == errc::not_found && !had_item && !conversations_->get(id) ? conversation_not_found(id) : c.err());
    return json_body(object_of(*c));
  } catch (const nlohmann::json::exception& e) {  // a field of an unexpected type
    return error_reply(bad(std::string("the request does not have the Conversations API's shape: ") + e.what()));
  }
}

status api_service::extend_conversation(json_store& store, const std::string& id, const json& input_items, const json& response) {
  auto c = store.update(id, [&](json& v) {
    // An item already there (an earlier output sent back as input, with its id) is not added again.
    auto taken = ids_of(v["items"]);
    auto add = [&](const json& i) {
      if (i.is_object() && i.contains("id") && i["id"].is_string() && !taken.insert(i["id"].get<std::string>()).second) return;
      v["items"].push_back(normalized(i));
    };
    for (const auto& i : input_items) add(i);
    if (response.contains("output") && response["output"].is_array()) {
      for (const auto& i : response["output"]) add(i);
    }
    return ok_status();
  });
  if (!c) return c.take_error();
  return ok_status();
}

}  // namespace llmesh::gateway
