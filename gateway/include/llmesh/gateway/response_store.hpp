// The Responses API's stored responses (OpenAI's `store`, on by default): what
// `previous_response_id`, GET /v1/responses/{id}, its input_items and DELETE read. A plain
// class, bounded in entries and bytes: past either bound the oldest stored go first (DESIGN.md
// §6: no memory without bound), and a response larger than the whole byte budget is not kept.
// Each is kept as its compact JSON text (so the bytes counted are the bytes held) and parsed
// again when read.
// Process memory only: a restarted gateway has forgotten them (a 404 then, as for an unknown id).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/json_store.hpp"

namespace llmesh::gateway {

struct stored_response {
  nlohmann::ordered_json response;     ///< the response object, as it was returned
  nlohmann::ordered_json input_items;  ///< this request's input items, each with its id
  /// The items the model saw before this request's input: the previous response's
  /// conversation, then its output (empty without previous_response_id). Instructions are not
  /// items: they do not carry over (as OpenAI's).
  nlohmann::ordered_json earlier = nlohmann::ordered_json::array();

  /// What a request naming this response as its previous_response_id continues from: earlier,
  /// input_items, then the response's output.
  nlohmann::ordered_json conversation() const;
};

/// Thread affinity: any thread.
class response_store {
 public:
  /// `max_entries` 0: nothing is stored (enabled() is false).
  response_store(size_t max_entries, size_t max_bytes) : store_(max_entries, max_bytes) {}

  bool enabled() const { return store_.enabled(); }
  /// Keeps `r` under `id` (replacing one of that id), then drops the oldest past the bounds.
  void put(const std::string& id, const stored_response& r);
  std::shared_ptr<const stored_response> get(const std::string& id) const;
  /// Whether one was there.
  bool erase(const std::string& id) { return store_.erase(id); }
  size_t size() const { return store_.size(); }
  size_t bytes() const { return store_.bytes(); }

 private:
  json_store store_;  ///< {"response", "input_items", "earlier"} by id
};

}  // namespace llmesh::gateway
