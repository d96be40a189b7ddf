// A bounded map of JSON values by id, a plain class: what the Responses API's stored responses
// (response_store.hpp) and the Conversations API's conversations are kept in. Each value is kept
// as its compact JSON text (so the bytes counted are the bytes held) and parsed again when
// read; past the entry or the byte bound the least recently written go first (DESIGN.md §6:
// no memory without bound), and a value larger than the whole byte budget is not kept.
// Process memory only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"

namespace llmesh::gateway {

/// Thread affinity: any thread.
class json_store {
 public:
  /// `max_entries` 0: nothing is kept (enabled() is false).
  json_store(size_t max_entries, size_t max_bytes) : max_entries_(max_entries), max_bytes_(max_bytes) {}

  bool enabled() const { return max_entries_ > 0; }
  /// Keeps `value` under `id` (replacing one of that id), then drops the least recently
  /// written past the bounds. False when it was not kept (larger than the byte budget, or
  /// the store is off); the old value of that id is gone either way.
  bool put(const std::string& id, const nlohmann::ordered_json& value);
  std::optional<nlohmann::ordered_json> get(const std::string& id) const;
  /// Read, change and write back atomically: `change` edits the value (an error leaves it as
  /// it was and is returned). The new value, or not_found, or invalid_request when it would be
  /// larger than the whole byte budget (it is then left as it was). The parse, the change and
  /// the new text happen outside the lock, so `change` may run more than once (when another
  /// write came meanwhile, on the value as it is then): it must depend only on its argument
  /// and on what it captures unchanged.
  result<nlohmann::ordered_json> update(const std::string& id, const std::function<status(nlohmann::ordered_json&)>& change);
  /// Whether one was there.
  bool erase(const std::string& id);
  size_t size() const;
  size_t bytes() const;

 private:
  struct entry {
    std::shared_ptr<const std::string> text;
    uint64_t order = 0;
  };
  void drop_locked(std::map<std::string, entry>::iterator it);
  void keep_locked(const std::string& id, std::shared_ptr<const std::string> text);

  const size_t max_entries_, max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, entry> by_id_;
  std::map<uint64_t, std::string> age_;  ///< order written → id, oldest first
  uint64_t next_order_ = 0;
  size_t bytes_ = 0;
};

}  // namespace llmesh::gateway
