// Which vocabulary tokens a grammar allows next (structured outputs). The vocabulary's token
// bytes sit in a trie, walked in preorder: a node's parse stacks are its parent's advanced by
// its byte, and a node whose stacks are empty skips its whole subtree — so a step visits only
// the prefixes the grammar still allows (as llama.cpp and outlines do; xgrammar adds
// precomputation on top). The masks of states already seen come from a cache keyed by the
// matcher's state: inside a JSON string, say, every step after the first is a lookup.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "llmesh/model/grammar.hpp"

namespace llmesh::model {

class detokenizer;

/// One grammar's parse-stack sets met so far, interned, and their transitions by byte, filled
/// as walks need them: a DFA built lazily from the pushdown automaton's reachable states. A
/// mask walk then costs a table lookup per trie node once its states are known (inside a
/// JSON string the walk's states are a handful). Single-threaded.
class grammar_states {
 public:
  explicit grammar_states(std::shared_ptr<const grammar> g, size_t max_states = default_max_states)
      : g_(std::move(g)), proto_(g_), max_states_(max_states) {}
  static constexpr int32_t dead = -1;
  /// next() would have to intern a state past the table's bound: the walk starts again without it.
  static constexpr int32_t full = -3;
  /// States one table holds at most (each is a 1 KiB row of transitions plus its stacks): a
  /// grammar whose walks meet ever new states (deep nesting) cannot grow it without bound.
  static constexpr size_t default_max_states = 65536;
  /// The id of m's state (m must follow this grammar), or full.
  int32_t intern(const grammar_matcher& m) { return intern(m.stacks_); }
  /// The state after byte b (dead: b cannot come next; full: see above).
  int32_t next(int32_t state, uint8_t b);
  size_t size() const { return sets_.size(); }

 private:
  int32_t intern(const std::vector<grammar_matcher::stack>& stacks);
  static constexpr int32_t unknown = -2;
  std::shared_ptr<const grammar> g_;
  grammar_matcher proto_;  ///< advance() over this grammar
  size_t max_states_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::vector<grammar_matcher::stack>> sets_;
  std::vector<std::array<int32_t, 256>> next_;
};

/// Immutable after build; thread-safe to share.
class token_vocabulary {
 public:
  /// Every id's bytes as the detokenizer gives them. Special (added, special) tokens and tokens
  /// without bytes are never allowed by a grammar; a request's end ids are allowed where the
  /// grammar is complete (an end id that is an ordinary token, such as a stop_token_ids entry
  /// "\n", is also allowed wherever the grammar takes its bytes — and ends the request there,
  /// as in vLLM).
  static std::shared_ptr<const token_vocabulary> build(const detokenizer& d);
  /// The same from explicit bytes (`excluded[i]`: never allowed); for tests.
  static std::shared_ptr<const token_vocabulary> from_bytes(const std::vector<std::string>& tokens,
                                                            const std::vector<bool>& excluded = {});

  size_t size() const { return size_; }
  /// Words of a mask: bit id % 32 of word id / 32.
  size_t words() const { return (size_ + 31) / 32; }
  const std::string& bytes(int32_t id) const;
  bool excluded(int32_t id) const { return id < 0 || static_cast<size_t>(id) >= size_ || excluded_[static_cast<size_t>(id)]; }

  /// The tokens the matcher's grammar allows now: those whose bytes it accepts whole, plus
  /// end_ids when it is accepting().
  std::vector<uint32_t> mask(const grammar_matcher& m, std::span<const int32_t> end_ids) const;
  /// The same, walking through (and filling) the grammar's state table.
  std::vector<uint32_t> mask(const grammar_matcher& m, std::span<const int32_t> end_ids, grammar_states& states) const;

 private:
  struct node {
    uint8_t byte = 0;
    uint32_t depth = 0;     ///< bytes from the root (the root, index 0, has depth 0)
    uint32_t skip = 0;      ///< the index past this node's subtree (preorder)
    uint32_t first = 0;     ///< its tokens: ids_[first, last)
    uint32_t last = 0;
  };
  /// A mask holding only end_ids, when the matcher is accepting (else none): where both walks start.
  std::vector<uint32_t> end_mask(const grammar_matcher& m, std::span<const int32_t> end_ids) const;
  size_t size_ = 0;
  std::vector<std::string> bytes_;
  std::vector<bool> excluded_;
  std::vector<node> nodes_;   ///< preorder, children in byte order
  std::vector<int32_t> ids_;  ///< the tokens ending at each node, node by node
  uint32_t max_depth_ = 0;
};

/// Masks by (grammar, matcher state), least recently used out first. Single-threaded (one
/// replica's step loop).
class token_mask_cache {
 public:
  explicit token_mask_cache(size_t max_entries = 4096) : max_(max_entries) {}

  /// The mask for m's state (computed on a miss). end_ids must be the same for a given grammar
  /// state across calls — they are part of the key.
  std::shared_ptr<const std::vector<uint32_t>> get(const token_vocabulary& v, const grammar_matcher& m,
                                                   std::span<const int32_t> end_ids);
  size_t hits() const { return hits_; }
  /// Interned states, all grammars together; past this many every table starts again.
  static constexpr size_t max_states = 32768;
  size_t misses() const { return misses_; }
  size_t size() const { return map_.size(); }

 private:
  struct entry {
    std::string key;
    std::shared_ptr<const grammar> g;  ///< held: its address is part of the key
    std::shared_ptr<const std::vector<uint32_t>> mask;
  };
  size_t max_;
  std::list<entry> lru_;  ///< most recent first
  std::unordered_map<std::string, std::list<entry>::iterator> map_;
  std::unordered_map<const grammar*, std::unique_ptr<grammar_states>> states_;  ///< each holds its grammar
  size_t hits_ = 0, misses_ = 0;
};

}  // namespace llmesh::model
