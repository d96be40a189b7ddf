// The LoRA adapters a model serves: loaded at start (--lora-modules) or while it serves
// (vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter). Thread-safe: replicas step
// while the gateway adds and removes adapters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/model/lora.hpp"

namespace llmesh::model {

/// Adapters by id. An id is never given twice: once an adapter is removed its id names nothing,
/// so a request or a prefix-cache entry that holds an id can never meet another adapter under
/// it. A removed adapter's memory goes when the last holder of it (a running request's pin, a
/// step) lets go: requests running with it finish with it.
class lora_set {
 public:
  /// The adapters loaded at most at once (more are refused).
  static constexpr size_t default_capacity = 64;

  explicit lora_set(size_t capacity = default_capacity) : capacity_(capacity) {}

  /// Adds `a` under the next id. invalid_request: its name is taken, or `capacity()` adapters
  /// are loaded (removing is the caller's choice: nothing is evicted).
  [[nodiscard]] result<int32_t> add(std::shared_ptr<const lora_adapter> a);
  /// Removes the adapter named `name`; not_found when none is.
  [[nodiscard]] status remove(std::string_view name);
  /// The adapter of id `id`; null when it was removed or never given.
  std::shared_ptr<const lora_adapter> get(int32_t id) const;
  /// The id and the adapter named `name`, or {-1, null}.
  std::pair<int32_t, std::shared_ptr<const lora_adapter>> find(std::string_view name) const;
  /// The loaded adapters, by id.
  std::vector<std::shared_ptr<const lora_adapter>> loaded() const;
  /// Adapters loaded now.
  size_t size() const;
  bool empty() const { return size() == 0; }
  /// Ids given so far (every id is below this).
  int32_t ids() const;
  size_t capacity() const;
  void set_capacity(size_t n);

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<const lora_adapter>> slots_;  ///< by id; null: removed
  size_t capacity_;
};

}  // namespace llmesh::model
