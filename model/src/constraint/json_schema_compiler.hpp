// The JSON Schema compiler (json_schema_grammar, constraint.hpp), shared by json_schema.cpp
// (keywords, $ref, allOf, enum, strings, numbers) and json_schema_containers.cpp (objects and
// arrays). One instance compiles one schema into one grammar; not thread-safe.
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "constraint_internal.hpp"

namespace llmesh::model::constraint_detail {

/// A JSON pointer token with '~' and '/' escaped (RFC 6901).
std::string escape_pointer_token(const std::string& s);
/// Compact JSON text of a value; an error for strings that are not UTF-8 (nlohmann throws).
result<std::string> json_text(const ordered_json& v);

class schema_compiler {
 public:
  using json = ordered_json;
  /// REQUIRES: root outlives the compiler, and nests no deeper than max_document_depth.
  explicit schema_compiler(const json& root) : root_(root), rules_(b_) {}

  /// The grammar of the whole schema.
  result<std::shared_ptr<const grammar>> run();
 private:
  static error fail(const std::string& ptr, const std::string& what);
  /// The schema a local $ref names ("#", "#/$defs/x", any "#/json/pointer").
  result<const json*> resolve(const std::string& ref, const std::string& at);
  /// The rule of a $ref target: declared on first use, compiled later from the worklist.
  result<rule_id> ref_rule(const std::string& ref, const std::string& at);
  /// The first keyword of s that asserts something and is not in allowed; empty when none.
  static std::string other_assertion(const json& s, const std::set<std::string, std::less<>>& allowed);
  result<rule_id> compile(const json& s, const std::string& ptr, int depth);
  result<std::vector<std::string>> read_types(const json& t, const std::string& ptr);
  result<rule_id> compile_any_of(const json& s, const std::string& ptr, int depth, bool nullable);
  result<rule_id> compile_enum(const json& s, const std::string& ptr, bool nullable);
  /// allOf (and $ref beside other assertions) merged into one schema, when the parts do not
  /// overlap: properties are united, required lists joined, types intersected; any other keyword
  /// that two parts both set must be equal.
  result<json> merge_all_of(const json& s, const std::string& ptr);
  status collect_parts(const json& s, const std::string& ptr, std::vector<const json*>& parts, int& hops);
  /// A count keyword (minLength, maxItems...): absent, or an integer in [0, max_repeat].
  result<std::optional<int>> read_count(const json& s, const char* key, const std::string& ptr);
  result<rule_id> compile_string(const json& s, const std::string& ptr);
  /// One integer bound: the least (lower) or greatest (upper) integer the keyword allows.
  result<std::optional<int64_t>> integer_bound(const json& v, bool lower, bool exclusive, const std::string& ptr,
                                              const std::string& key);
  result<rule_id> compile_number(const json& s, const std::string& ptr, bool integer);
  result<rule_id> compile_object(const json& s, const std::string& ptr, int depth);
  result<rule_id> compile_array(const json& s, const std::string& ptr, int depth);

  const json& root_;
  grammar_builder b_;
  json_rules rules_;
  std::map<std::string, rule_id> refs_;  ///< "$ref" text -> its rule
  std::deque<std::pair<std::string, rule_id>> pending_;  ///< declared, not yet compiled
  std::map<std::pair<int, int>, rule_id> string_lengths_;  ///< (minLength, maxLength) -> string rule
};

}  // namespace llmesh::model::constraint_detail
