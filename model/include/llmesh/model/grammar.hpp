// Context-free grammars over bytes, and the matcher that follows one byte at a time: the core of
// structured outputs (response_format json_schema / json_object, vLLM's guided_json,
// guided_regex, guided_choice and grammar, forced tool calls). A grammar is a set of rules in
// the style of llama.cpp's GBNF: each rule is alternatives of sequences of elements, an
// element being a byte set or a reference to a rule. Built by grammar_builder (from JSON
// Schema, a regex or a choice list: constraint.hpp), checked once (every rule defined, no left
// recursion), then shared read-only by every request that uses it.
//
// The matcher keeps the set of parse stacks that the bytes so far allow (a pushdown automaton
// run on all alternatives at once, as llama.cpp's llama_grammar_accept does); the token mask
// (token_mask.hpp) asks it which vocabulary tokens may come next.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::model {

/// A set of byte values.
struct byte_set {
  std::array<uint64_t, 4> bits{};

  static byte_set of(uint8_t b) { return byte_set{}.add(b); }
  static byte_set range(uint8_t lo, uint8_t hi) { return byte_set{}.add_range(lo, hi); }
  byte_set& add(uint8_t b) {
    bits[b >> 6] |= uint64_t{1} << (b & 63);
    return *this;
  }
  byte_set& add_range(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
    return *this;
  }
  byte_set& add(const byte_set& o) {
    for (size_t i = 0; i < 4; ++i) bits[i] |= o.bits[i];
    return *this;
  }
  byte_set complement() const {
    byte_set c;
    for (size_t i = 0; i < 4; ++i) c.bits[i] = ~bits[i];
    return c;
  }
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  bool operator==(const byte_set&) const = default;
};

/// A checked grammar: flat and immutable; share it through shared_ptr<const grammar>.
class grammar {
 public:
  /// One flat element: a byte set, a rule reference, or the end of a sequence.
  struct element {
    enum class kind : uint8_t { end, bytes, rule } type = kind::end;
    uint32_t arg = 0;  ///< bytes: index into sets(); rule: the rule's id
  };

  std::span<const element> elements() const { return elements_; }
  const byte_set& set(uint32_t i) const { return sets_[i]; }
  /// Positions in elements() where rule r's alternatives start (each runs to a kind::end).
  std::span<const uint32_t> alternatives(uint32_t rule) const { return rules_[rule]; }
  uint32_t root() const { return root_; }
  size_t rule_count() const { return rules_.size(); }
  const std::string& rule_name(uint32_t rule) const { return names_[rule]; }

 private:
  friend class grammar_builder;
  std::vector<element> elements_;
  std::vector<byte_set> sets_;
  std::vector<std::vector<uint32_t>> rules_;
  std::vector<std::string> names_;
  uint32_t root_ = 0;
};

/// Builds a grammar rule by rule. Rules may refer to rules declared later (declare, then
/// define), so recursive grammars (JSON values, $ref cycles) are fine as long as no rule can
/// reach itself without consuming a byte first (left recursion): build() refuses those.
/// Repetition should be right-recursive (star/plus/repeat below are): the matcher's stacks then
/// stay flat however many times it repeats.
class grammar_builder {
 public:
  using rule_id = uint32_t;
  struct element {
    bool is_rule = false;
    byte_set set;      ///< when !is_rule
    rule_id rule = 0;  ///< when is_rule
  };
  using sequence = std::vector<element>;

  /// A new rule without alternatives yet; `name` is for errors and debugging (need not be unique).
  rule_id declare(std::string name);
  /// Sets the alternatives of a declared rule (once). An empty sequence is the empty string.
  void define(rule_id r, std::vector<sequence> alternatives);
  /// declare + define.
  rule_id add(std::string name, std::vector<sequence> alternatives);

  static element bytes(const byte_set& s) { return element{false, s, 0}; }
  static element byte(uint8_t b) { return bytes(byte_set::of(b)); }
  static element ref(rule_id r) { return element{true, {}, r}; }
  /// The bytes of s, one element each.
  static sequence literal(std::string_view s);

  /// x?   (a new rule: x | empty)
  rule_id optional(std::string name, sequence x);
  /// x*   (right-recursive: R ::= x R | empty)
  rule_id star(std::string name, sequence x);
  /// x+
  rule_id plus(std::string name, sequence x);
  /// x{min,max}; max < 0: unbounded. Refuses (at build) max < min.
  rule_id repeat(std::string name, sequence x, int min, int max);

  /// Checks and flattens: every referenced rule defined, no empty byte set, no left recursion,
  /// root valid. Errors are errc::invalid_request naming the rule.
  [[nodiscard]] result<std::shared_ptr<const grammar>> build(rule_id root) &&;

  size_t rule_count() const { return rules_.size(); }
  size_t element_count() const { return elements_; }

  /// Elements in all (each about 48 bytes while building): past this, define() stores nothing
  /// more and build() refuses the grammar — a short spec such as x{10000} repeated cannot make
  /// gigabytes.
  static constexpr size_t max_elements = 2'000'000;
  /// Rule references a matcher may have to open before reaching a byte (a chain of leading
  /// references): past this, build() refuses the grammar, whose expansion would recurse as deep.
  static constexpr size_t max_leading_depth = 2000;

 private:
  struct rule {
    std::string name;
    std::vector<sequence> alternatives;
    bool defined = false;
  };
  std::vector<rule> rules_;
  size_t elements_ = 0;
  std::string error_;  ///< the first misuse (define twice, bad repeat bounds), reported by build
};

/// Follows a grammar byte by byte. Cheap to copy (the state is its stacks).
class grammar_matcher {
 public:
  /// The grammar's start: the root rule, nothing consumed.
  explicit grammar_matcher(std::shared_ptr<const grammar> g);

  /// Consumes one byte; false (and no change) when the grammar cannot take it here.
  bool accept(uint8_t b);
  /// Consumes bytes; false (and no change) unless the grammar takes them all.
  bool accept(std::string_view bytes);
  /// Whether the bytes so far form a complete sentence of the grammar.
  bool accepting() const;
  /// Whether some byte may still follow.
  bool can_continue() const;
  /// accepting() and nothing may follow: generation must end here.
  bool done() const { return accepting() && !can_continue(); }

  /// The state as bytes, equal for equal states (to key caches of what may follow).
  std::string key() const;
  const grammar& rules() const { return *g_; }
  const std::shared_ptr<const grammar>& shared_rules() const { return g_; }

  /// Stacks past this many make the grammar too ambiguous to follow: accept() refuses the byte.
  static constexpr size_t max_stacks = 4096;

  using stack = std::vector<uint32_t>;  ///< positions in grammar::elements(), top at the back

 private:
  friend class token_vocabulary;
  friend class grammar_states;
  friend class grammar_builder;
  grammar_matcher(std::shared_ptr<const grammar> g, std::vector<stack> stacks) : g_(std::move(g)), stacks_(std::move(stacks)) {}
  /// The stacks after consuming b from `from` (sorted, unique; empty: rejected).
  std::vector<stack> advance(const std::vector<stack>& from, uint8_t b) const;
  /// Expands a stack whose top may be a rule reference or a finished sequence into stacks whose
  /// tops are byte sets (or that are empty: a complete parse), appending them to out.
  void expand(stack s, std::vector<stack>& out) const;

  std::shared_ptr<const grammar> g_;
  std::vector<stack> stacks_;  ///< sorted, unique; each top is a byte-set element, or empty
};

}  // namespace llmesh::model
