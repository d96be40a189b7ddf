// Compiled grammars by spec (kind + text), shared by every thread of a process: a spec is
// compiled once however many requests use it, and in one process the gateway's check and the
// replica's use are one compile. Refusals are kept too, so a bad or too costly spec sent again
// is refused at once. Least recently used entries go first, within a bound on the grammars'
// total elements (a grammar may hold up to grammar_builder's 2 M) plus their spec texts (in
// elements' size: 8 bytes) and on the entry count.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "llmesh/model/constraint.hpp"

namespace llmesh::model {

/// Thread affinity: any thread (one mutex, never held while compiling: two threads that miss
/// the same spec at once both compile it, and the second result is dropped).
class constraint_cache {
 public:
  explicit constraint_cache(size_t max_elements = size_t{8} << 20, size_t max_entries = 512);
  constraint_cache(const constraint_cache&) = delete;
  constraint_cache& operator=(const constraint_cache&) = delete;

  /// compile_constraint(spec), from the cache when it holds the spec.
  [[nodiscard]] result<std::shared_ptr<const grammar>> get(const constraint_spec& spec);

  /// The process's cache.
  static constraint_cache& shared();

  size_t hits() const;
  size_t misses() const;
  size_t entries() const;

 private:
  struct entry {
    std::string key;
    std::shared_ptr<const grammar> g;  ///< null: refused, with `err`
    error err{errc::internal, ""};
    size_t cost = 1;
  };
  void insert(entry e);

  const size_t max_elements_, max_entries_;
  mutable std::mutex mu_;
  std::list<entry> lru_;  ///< front: most recently used
  std::unordered_map<std::string, std::list<entry>::iterator> by_key_;
  size_t elements_ = 0, hits_ = 0, misses_ = 0;
};

}  // namespace llmesh::model
