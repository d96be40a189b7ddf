// Private helpers shared by the constraint compilers (constraint.hpp): code-point sets and their
// well-formed UTF-8 byte sequences, the JSON building blocks (whitespace, strings, numbers,
// integer ranges, any value; constraint.cpp), the regex compiler's entry for JSON Schema
// patterns and formats (regex.cpp), and the bounds that keep a hostile spec from making a huge
// grammar or a deep recursion.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"
#include "llmesh/model/grammar.hpp"

namespace llmesh::model::constraint_detail {

using rule_id = grammar_builder::rule_id;
using sequence = grammar_builder::sequence;
using ordered_json = nlohmann::ordered_json;

/// Deepest nesting of subschemas (properties, items, anyOf...) a JSON Schema may have: real
/// schemas nest a handful of levels; this bounds the compiler's recursion.
inline constexpr int max_schema_depth = 64;
/// Deepest nesting of the schema document itself (objects and arrays, enum values included):
/// nlohmann's dump and comparisons recurse, so a deeper document is refused before either runs.
/// Each subschema level takes about two JSON levels ("properties", then the name).
inline constexpr int max_document_depth = 2 * max_schema_depth + 16;
/// Largest bound of one counted repetition (maxLength, maxItems, {n,m} in regexes and GBNF):
/// each unit of a bound costs a rule, and no sensible output needs more.
inline constexpr int max_repeat = 10000;
/// Most rules one grammar may have: a few counted repetitions at max_repeat, a large schema.
inline constexpr size_t max_rules = 200000;
/// Most digits in an integer part or fraction where the schema sets no bound (as llama.cpp's
/// json-schema-to-grammar): a model cannot loop on digits, and doubles hold no more anyway.
inline constexpr int max_number_digits = 16;

inline error invalid(std::string message) { return make_error(errc::invalid_request, std::move(message)); }

/// Whether a JSON document nests deeper than limit (iterative: safe on any depth).
template <class Json>
bool nests_deeper_than(const Json& j, int limit) {
  std::vector<std::pair<const Json*, int>> todo{{&j, 1}};
  while (!todo.empty()) {
    auto [v, depth] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    if (depth > limit) return true;
    for (const auto& child : *v) todo.push_back({&child, depth + 1});
  }
  return false;
}

/// A set of code points as closed intervals; kept sorted and merged on demand.
class code_point_set {
 public:
  using range = std::pair<uint32_t, uint32_t>;
  static constexpr uint32_t max_code_point = 0x10FFFF;

  code_point_set& add(uint32_t lo, uint32_t hi) {
    if (lo <= hi) ranges_.push_back({lo, std::min(hi, max_code_point)});
    normalized_ = false;
    return *this;
  }
  code_point_set& add(uint32_t c) { return add(c, c); }
  code_point_set& add(const code_point_set& o) {
    for (const auto& r : o.ranges()) ranges_.push_back(r);
    normalized_ = false;
    return *this;
  }
  /// Every code point in [0, max_code_point] not in the set.
  code_point_set complement() const {
    code_point_set c;
    uint32_t next = 0;
    for (const auto& [lo, hi] : ranges()) {
      if (lo > next) c.ranges_.push_back({next, lo - 1});
      next = hi + 1;
    }
    if (next <= max_code_point) c.ranges_.push_back({next, max_code_point});
    return c;
  }
  bool contains(uint32_t cp) const {
    for (const auto& [lo, hi] : ranges()) {
      if (cp >= lo && cp <= hi) return true;
    }
    return false;
  }
  /// Sorted, disjoint, non-adjacent.
  const std::vector<range>& ranges() const {
    if (!normalized_) normalize();
    return ranges_;
  }

 private:
  void normalize() const {
    std::sort(ranges_.begin(), ranges_.end());
    std::vector<range> merged;
    for (const auto& r : ranges_) {
      if (!merged.empty() && r.first <= merged.back().second + 1) {
        merged.back().second = std::max(merged.back().second, r.second);
      } else {
        merged.push_back(r);
      }
    }
    ranges_ = std::move(merged);
    normalized_ = true;
  }
  mutable std::vector<range> ranges_;
  mutable bool normalized_ = true;
};

struct byte_range {
  uint8_t lo = 0, hi = 0;
};
/// The well-formed UTF-8 encodings of the code points in [lo, hi], surrogates skipped, as
/// sequences of 1-4 byte ranges (each sequence: every combination of its ranges is one code
/// point of the interval). Appends to out.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<byte_range>>& out);
/// The same for a set, as grammar alternatives; all one-byte code points share one alternative.
/// Empty when the set holds no encodable code point.
std::vector<sequence> utf8_alternatives(const code_point_set& s);
/// One spec's compile, on this thread: its regexes (a schema may hold many patterns) share one
/// subset-construction work bound instead of one each, so a spec's cost is bounded whatever it
/// holds. compile_constraint opens one; outside one each regex has its own bound.
class spec_budget {
 public:
  spec_budget();
  ~spec_budget();
  spec_budget(const spec_budget&) = delete;
  spec_budget& operator=(const spec_budget&) = delete;
  /// The work spent so far by the innermost open budget; null when none is open.
  static size_t* spent();
};

/// A rule matching exactly one of `literals` (non-empty strings), built as their trie: at every
/// byte one parse stack survives, however many literals there are (alternatives of whole
/// literals would keep one stack per literal sharing the prefix so far).
rule_id literals_rule(grammar_builder& b, const std::string& name, std::vector<std::string> literals);
/// The UTF-8 bytes of one code point (REQUIRES: cp <= 0x10FFFF).
std::string utf8_encode(uint32_t cp);
/// Decodes one well-formed UTF-8 code point at s[pos]; advances pos. nullopt when malformed.
std::optional<uint32_t> utf8_decode(std::string_view s, size_t& pos);

/// The JSON pieces one grammar needs, each made on first use (so a grammar holds only what it
/// uses). Whitespace between tokens is bounded (as llama.cpp's): "" | " " | "\n" [ \t]{0,20}.
/// Numbers without schema bounds take at most max_number_digits digits per part; integers are
/// written canonically (no "-0", no leading zeros, no fraction or exponent).
class json_rules {
 public:
  explicit json_rules(grammar_builder& b) : b_(b) {}
  grammar_builder& builder() { return b_; }

  rule_id ws();
  /// One character inside a string: well-formed UTF-8 except '"', '\\' and controls, or an escape.
  rule_id string_char();
  rule_id string();
  rule_id number();
  /// A number without a minus sign.
  rule_id nonnegative_number();
  rule_id integer();
  /// Integers in [lo, hi] (nullopt: unbounded, up to max_number_digits digits). Error when empty.
  [[nodiscard]] result<rule_id> integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi);
  rule_id boolean();
  rule_id null();
  /// Any JSON value, object or array.
  rule_id value();
  rule_id object();
  rule_id array();

 private:
  grammar_builder& b_;
  std::optional<rule_id> ws_, string_char_, string_, number_, nonnegative_number_, integer_, boolean_, null_,
      value_, object_, array_;
};

/// How a regex's matches are written.
enum class regex_mode {
  whole,        ///< the output is the match itself, as UTF-8; anchored at both ends
  json_string,  ///< the output is the inside of a JSON string whose value matches (each
                ///< character in its one canonical JSON form); unanchored like JSON Schema's
                ///< pattern unless the pattern has ^ / $
};
/// Rules (in b) for the strings described; returns the start rule. Errors name the offset in
/// the pattern. `name` prefixes the rules' names.
[[nodiscard]] result<rule_id> regex_rules(grammar_builder& b, std::string_view pattern, regex_mode mode,
                                          const std::string& name);

/// json_schema_grammar on a document that keeps its keys' order (properties are emitted in
/// their declared order).
[[nodiscard]] result<std::shared_ptr<const grammar>> ordered_json_schema_grammar(const ordered_json& schema);

}  // namespace llmesh::model::constraint_detail
