// json_schema_grammar (constraint.hpp): a JSON Schema (2020-12 / OpenAI's subset, with older
// drafts' definitions, tuple items and boolean exclusive bounds, and OpenAPI's nullable) to a
// grammar of the JSON texts it accepts. One rule per $ref target (declared first, compiled from a
// worklist, so recursive schemas work); objects emit their properties in declared order, with
// linearly many rules however many are optional; what cannot be enforced exactly is refused with
// the JSON pointer of the subschema and the keyword, never silently dropped. The exceptions,
// documented in model/README.md: number bounds other than the sign, oneOf's exclusivity, and
// the formats outside date, time, date-time, uuid, email and ipv4 (annotations in 2020-12).
#include <cmath>
#include <map>
#include <set>

#include "json_schema_compiler.hpp"
#include "llmesh/model/constraint.hpp"

namespace llmesh::model {

using namespace constraint_detail;

namespace {

using json = ordered_json;
using gb = grammar_builder;

/// Keywords that only describe: ignored. $defs and definitions hold schemas reached by $ref.
const std::set<std::string, std::less<>> annotation_keywords = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "strict", "$anchor", "$defs", "definitions", "contentMediaType",
    "contentEncoding", "$vocabulary"};

/// Assertions this compiler enforces (some only in some forms: see compile()).
const std::set<std::string, std::less<>> supported_keywords = {
    "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "nullable",
    "properties", "required", "additionalProperties", "unevaluatedProperties",
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
    "minLength", "maxLength", "pattern", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

/// Standard assertions this compiler cannot enforce: refused, so a schema is never silently
/// weakened. Keywords in no list (vendor extensions) are ignored, as JSON Schema asks.
const std::set<std::string, std::less<>> refused_keywords = {
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
    "minProperties", "maxProperties", "patternProperties", "propertyNames",
    "contains", "minContains", "maxContains", "unevaluatedItems", "multipleOf",
    "$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor", "contentSchema"};

const std::vector<std::string> all_types = {"object", "array", "string", "number", "boolean", "null"};

/// Formats enforced, as patterns of the string's value (RFC 3339 dates and times, RFC 4122
/// UUIDs, dotted-quad IPv4, and a plain local@domain email).
const std::map<std::string, std::string, std::less<>> format_patterns = {
    {"date", "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"},
    {"time", "^([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"date-time",
     "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)"
     "(\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"email", "^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63}){1,8}$"},
    {"ipv4", "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$"},
};

bool type_matches(const json& v, const std::string& type) {
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  }
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "object") return v.is_object();
  return v.is_array();
}

}  // namespace

namespace constraint_detail {

std::string escape_pointer_token(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

result<std::string> json_text(const ordered_json& v) {
  try {
    return v.dump();
  } catch (const ordered_json::exception&) {
    return invalid("json schema: a string is not valid UTF-8");
  }
}

result<std::shared_ptr<const grammar>> schema_compiler::run() {
  auto top = ref_rule("#", "#");
  if (!top.ok()) return top.take_error();
  while (!pending_.empty()) {
    auto [ptr, r] = pending_.front();
    pending_.pop_front();
    auto target = resolve(ptr, ptr);
    if (!target.ok()) return target.take_error();
    auto sub = compile(*target.value(), ptr, 0);
    if (!sub.ok()) return sub.take_error();
    b_.define(r, {{gb::ref(sub.value())}});
  }
  return std::move(b_).build(top.value());
}

error schema_compiler::fail(const std::string& ptr, const std::string& what) {
  return invalid("json schema at " + ptr + ": " + what);
}

result<const json*> schema_compiler::resolve(const std::string& ref, const std::string& at) {
  if (ref.empty() || ref[0] != '#') return fail(at, "'$ref' " + ref + " is not local (only '#...' refs are supported)");
  std::string pointer;
  for (size_t i = 1; i < ref.size(); ++i) {
    const auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
    if (ref[i] == '%' && i + 2 < ref.size() && hex(ref[i + 1]) && hex(ref[i + 2])) {
      pointer += static_cast<char>(std::stoi(ref.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      pointer += ref[i];
    }
  }
  try {
    return &root_.at(json::json_pointer(pointer));
  } catch (const json::exception&) {
    return fail(at, "'$ref' " + ref + " does not resolve");
  }
}

result<rule_id> schema_compiler::ref_rule(const std::string& ref, const std::string& at) {
  auto target = resolve(ref, at);
  if (!target.ok()) return target.take_error();
  auto it = refs_.find(ref);
  if (it != refs_.end()) return it->second;
  if (refs_.size() >= max_rules / 16) return fail(at, "too many $ref targets");
  const rule_id r = b_.declare(ref);
  refs_.emplace(ref, r);
  pending_.push_back({ref, r});
  return r;
}

std::string schema_compiler::other_assertion(const json& s, const std::set<std::string, std::less<>>& allowed) {
  for (const auto& [k, v] : s.items()) {
    if (allowed.count(k) == 0 && (supported_keywords.count(k) != 0 || refused_keywords.count(k) != 0)) return k;
  }
  return "";
}

result<rule_id> schema_compiler::compile(const json& s, const std::string& ptr, int depth) {
  if (depth > max_schema_depth) return fail(ptr, "subschemas nest deeper than " + std::to_string(max_schema_depth));
  if (b_.rule_count() > max_rules) return fail(ptr, "the grammar would be too large");
  if (s.is_boolean()) {
    if (s.get<bool>()) return rules_.value();
    return fail(ptr, "the schema 'false' matches nothing");
  }
  if (!s.is_object()) return fail(ptr, "a schema must be an object or a boolean");
  for (const auto& [k, v] : s.items()) {
    if (refused_keywords.count(k) != 0) return fail(ptr, "'" + k + "' is not supported");
  }
  if (auto it = s.find("uniqueItems"); it != s.end() && *it != json(false)) {
    return fail(ptr, "'uniqueItems' is not supported");
  }
  if (auto it = s.find("unevaluatedProperties"); it != s.end() && *it != json(false)) {
    return fail(ptr, "'unevaluatedProperties' is only supported as false");
  }
  const bool has_ref = s.contains("$ref");
  if (has_ref && other_assertion(s, {"$ref"}).empty()) {
    if (!s["$ref"].is_string()) return fail(ptr, "'$ref' must be a string");
    return ref_rule(s["$ref"].get<std::string>(), ptr);
  }
  if (has_ref || s.contains("allOf")) {
    auto merged = merge_all_of(s, ptr);
    if (!merged.ok()) return merged.take_error();
    return compile(merged.value(), ptr, depth + 1);
  }
  bool nullable = false;
  if (auto it = s.find("nullable"); it != s.end()) {
    if (!it->is_boolean()) return fail(ptr, "'nullable' must be a boolean");
    nullable = it->get<bool>();
  }
  if (s.contains("anyOf") || s.contains("oneOf")) return compile_any_of(s, ptr, depth, nullable);
  if (s.contains("enum") || s.contains("const")) return compile_enum(s, ptr, nullable);

  std::vector<std::string> types;
  if (auto it = s.find("type"); it != s.end()) {
    auto t = read_types(*it, ptr);
    if (!t.ok()) return t.take_error();
    types = std::move(t.value());
  } else {
    if (other_assertion(s, {"nullable"}).empty()) return rules_.value();
    types = all_types;
  }
  std::vector<sequence> alts;
  for (const auto& t : types) {
    result<rule_id> r = rules_.null();
    if (t == "string") {
      r = compile_string(s, ptr);
    } else if (t == "number" || t == "integer") {
      r = compile_number(s, ptr, t == "integer");
    } else if (t == "boolean") {
      r = rules_.boolean();
    } else if (t == "object") {
      r = compile_object(s, ptr, depth);
    } else if (t == "array") {
      r = compile_array(s, ptr, depth);
    }
    if (!r.ok()) return r;
    alts.push_back({gb::ref(r.value())});
  }
  if (nullable && std::find(types.begin(), types.end(), "null") == types.end())
    alts.push_back({gb::ref(rules_.null())});
  if (alts.size() == 1) return alts[0][0].rule;
  return b_.add("types", std::move(alts));
}

result<std::vector<std::string>> schema_compiler::read_types(const json& t, const std::string& ptr) {
  std::vector<std::string> types;
  const json list = t.is_array() ? t : json::array({t});
  for (const auto& x : list) {
    if (!x.is_string() || (std::find(all_types.begin(), all_types.end(), x.get<std::string>()) == all_types.end() &&
                           x.get<std::string>() != "integer")) {
      return fail(ptr, "'type' must be a type name or an array of them");
    }
    if (std::find(types.begin(), types.end(), x.get<std::string>()) == types.end())
      types.push_back(x.get<std::string>());
  }
  if (types.empty()) return fail(ptr, "'type' is an empty array");
  // Integers are numbers: with both, "number" covers them.
  auto integer = std::find(types.begin(), types.end(), "integer");
  if (integer != types.end() && std::find(types.begin(), types.end(), "number") != types.end()) types.erase(integer);
  return types;
}

result<rule_id> schema_compiler::compile_any_of(const json& s, const std::string& ptr, int depth, bool nullable) {
  const std::string key = s.contains("anyOf") ? "anyOf" : "oneOf";
  if (auto other = other_assertion(s, {key, "nullable"}); !other.empty()) {
    return fail(ptr, "'" + key + "' beside '" + other + "' is not supported");
  }
  const json& list = s[key];
  if (!list.is_array() || list.empty()) return fail(ptr, "'" + key + "' must be a non-empty array");
  std::vector<sequence> alts;
  for (size_t i = 0; i < list.size(); ++i) {
    // oneOf is compiled as anyOf: exclusivity is not checked.
    auto r = compile(list[i], ptr + "/" + key + "/" + std::to_string(i), depth + 1);
    if (!r.ok()) return r;
    alts.push_back({gb::ref(r.value())});
  }
  if (nullable) alts.push_back({gb::ref(rules_.null())});
  return b_.add(key, std::move(alts));
}

result<rule_id> schema_compiler::compile_enum(const json& s, const std::string& ptr, bool nullable) {
  if (auto other = other_assertion(s, {"enum", "const", "type", "nullable"}); !other.empty()) {
    return fail(ptr, "'enum' / 'const' beside '" + other + "' is not supported");
  }
  if (s.contains("enum") && s.contains("const")) return fail(ptr, "'enum' beside 'const' is not supported");
  json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
  if (!values.is_array() || values.empty()) return fail(ptr, "'enum' must be a non-empty array");
  std::vector<std::string> types;
  if (auto it = s.find("type"); it != s.end()) {
    auto t = read_types(*it, ptr);
    if (!t.ok()) return t.take_error();
    types = std::move(t.value());
  }
  std::set<std::string> seen;
  std::vector<std::string> alts;
  for (const auto& v : values) {
    if (!types.empty() &&
        std::none_of(types.begin(), types.end(), [&](const std::string& t) { return type_matches(v, t); })) {
      continue;
    }
    auto text = json_text(v);
    if (!text.ok()) return fail(ptr, text.err().message);
    if (seen.insert(text.value()).second) alts.push_back(text.value());
  }
  if (nullable && seen.insert("null").second) alts.push_back("null");
  if (alts.empty()) return fail(ptr, "no 'enum' value has the schema's 'type'");
  return literals_rule(b_, "enum", std::move(alts));
}

result<json> schema_compiler::merge_all_of(const json& s, const std::string& ptr) {
  std::vector<const json*> parts;
  int hops = 0;
  if (auto st = collect_parts(s, ptr, parts, hops); !st.ok()) return st.take_error();
  json merged = json::object();
  for (const json* part : parts) {
    for (const auto& [k, v] : part->items()) {
      if (k == "$ref" || k == "allOf" || annotation_keywords.count(k) != 0) continue;
      if (k == "properties") {
        if (!v.is_object()) return fail(ptr, "'properties' must be an object");
        json& props = merged["properties"];
        if (props.is_null()) props = json::object();
        for (const auto& [name, sub] : v.items()) {
          if (props.contains(name) && props[name] != sub) {
            return fail(ptr, "'allOf' gives property '" + name + "' two different schemas (not supported)");
          }
          props[name] = sub;
        }
      } else if (k == "required") {
        if (!v.is_array()) return fail(ptr, "'required' must be an array");
        json& req = merged["required"];
        if (req.is_null()) req = json::array();
        for (const auto& name : v) {
          if (std::find(req.begin(), req.end(), name) == req.end()) req.push_back(name);
        }
      } else if (k == "type" && merged.contains("type")) {
        auto a = read_types(merged["type"], ptr);
        auto b = read_types(v, ptr);
        if (!a.ok()) return a.take_error();
        if (!b.ok()) return b.take_error();
        json both = json::array();
        for (const auto& t : a.value()) {
          for (const auto& u : b.value()) {
            if (t == u || (t == "number" && u == "integer")) both.push_back(u);
            else if (t == "integer" && u == "number") both.push_back(t);
          }
        }
        if (both.empty()) return fail(ptr, "'allOf' parts have no type in common");
        merged["type"] = both;
      } else if (merged.contains(k) && merged[k] != v) {
        return fail(ptr, "'allOf' parts set '" + k + "' differently (not supported)");
      } else {
        merged[k] = v;
      }
    }
  }
  return merged;
}

status schema_compiler::collect_parts(const json& s, const std::string& ptr, std::vector<const json*>& parts,
                                      int& hops) {
  if (++hops > max_schema_depth) return fail(ptr, "'allOf' / '$ref' chains are too deep or cyclic");
  if (s.is_boolean()) {
    if (s.get<bool>()) return ok_status();
    return fail(ptr, "the schema 'false' matches nothing");
  }
  if (!s.is_object()) return fail(ptr, "a schema must be an object or a boolean");
  if (auto it = s.find("$ref"); it != s.end()) {
    if (!it->is_string()) return fail(ptr, "'$ref' must be a string");
    auto target = resolve(it->get<std::string>(), ptr);
    if (!target.ok()) return target.take_error();
    LLMESH_TRY(collect_parts(*target.value(), ptr, parts, hops));
  }
  if (auto it = s.find("allOf"); it != s.end()) {
    if (!it->is_array() || it->empty()) return fail(ptr, "'allOf' must be a non-empty array");
    for (const auto& part : *it) LLMESH_TRY(collect_parts(part, ptr, parts, hops));
  }
  parts.push_back(&s);
  return ok_status();
}

result<std::optional<int>> schema_compiler::read_count(const json& s, const char* key, const std::string& ptr) {
  auto it = s.find(key);
  if (it == s.end()) return std::optional<int>();
  if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>() && it->get<double>() >= 0 &&
      it->get<double>() <= max_repeat) {
    return std::optional<int>(static_cast<int>(it->get<double>()));
  }
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    return fail(ptr, std::string("'") + key + "' must be a non-negative integer");
  if (it->get<int64_t>() > max_repeat) {
    return fail(ptr, std::string("'") + key + "' above " + std::to_string(max_repeat) + " is not supported");
  }
  return std::optional<int>(static_cast<int>(it->get<int64_t>()));
}

result<rule_id> schema_compiler::compile_string(const json& s, const std::string& ptr) {
  auto min = read_count(s, "minLength", ptr);
  if (!min.ok()) return min.take_error();
  auto max = read_count(s, "maxLength", ptr);
  if (!max.ok()) return max.take_error();
  const bool lengths = min.value() || max.value();
  std::optional<std::string> pattern;
  std::string what = "pattern";
  if (auto it = s.find("pattern"); it != s.end()) {
    if (!it->is_string()) return fail(ptr, "'pattern' must be a string");
    pattern = it->get<std::string>();
  }
  if (auto it = s.find("format"); it != s.end()) {
    if (!it->is_string()) return fail(ptr, "'format' must be a string");
    if (auto f = format_patterns.find(it->get<std::string>()); f != format_patterns.end()) {
      if (pattern) return fail(ptr, "'pattern' beside an enforced 'format' is not supported");
      pattern = f->second;
      what = "format";
    }
  }
  if (pattern) {
    if (lengths) return fail(ptr, "'minLength' / 'maxLength' beside '" + what + "' is not supported");
    auto r = regex_rules(b_, *pattern, regex_mode::json_string, what);
    if (!r.ok()) return fail(ptr, "'" + what + "': " + r.err().message);
    return b_.add("string-" + what, {{gb::byte('"'), gb::ref(r.value()), gb::byte('"')}});
  }
  if (!lengths) return rules_.string();
  const int lo = min.value().value_or(0), hi = max.value().value_or(-1);
  if (hi >= 0 && hi < lo) return fail(ptr, "'maxLength' is below 'minLength'");
  // Shared by every string with the same bounds: a bound costs as many rules as its value.
  auto [it, fresh] = string_lengths_.emplace(std::pair{lo, hi}, 0);
  if (fresh) {
    const rule_id body = b_.repeat("string-chars", {gb::ref(rules_.string_char())}, lo, hi);
    it->second = b_.add("string-length", {{gb::byte('"'), gb::ref(body), gb::byte('"')}});
  }
  return it->second;
}

result<std::optional<int64_t>> schema_compiler::integer_bound(const json& v, bool lower, bool exclusive,
                                                              const std::string& ptr, const std::string& key) {
  constexpr double limit = 9.2e18;  // just inside int64
  double d = 0;
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return fail(ptr, "'" + key + "' is out of the supported range");
    x = static_cast<int64_t>(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float()) {
    d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > limit) return fail(ptr, "'" + key + "' is out of the supported range");
    const double r = lower ? std::ceil(d) : std::floor(d);
    x = static_cast<int64_t>(r);
    if (r != d) exclusive = false;  // rounding already stepped past it
  } else {
    return fail(ptr, "'" + key + "' must be a number");
  }
  if (exclusive) {
    if ((lower && x == INT64_MAX) || (!lower && x == INT64_MIN)) return fail(ptr, "'" + key + "' leaves no integer");
    x += lower ? 1 : -1;
  }
  return std::optional<int64_t>(x);
}

result<rule_id> schema_compiler::compile_number(const json& s, const std::string& ptr, bool integer) {
  // Draft 4 wrote exclusive bounds as booleans beside minimum / maximum.
  bool min_exclusive = false, max_exclusive = false;
  std::vector<std::pair<std::string, bool>> lower_keys, upper_keys;  // (keyword, exclusive)
  for (const auto& [key, lower] :
       {std::pair<std::string, bool>{"exclusiveMinimum", true}, {"exclusiveMaximum", false}}) {
    auto it = s.find(key);
    if (it == s.end()) continue;
    if (it->is_boolean()) {
      (lower ? min_exclusive : max_exclusive) = it->get<bool>();
    } else {
      (lower ? lower_keys : upper_keys).push_back({key, true});
    }
  }
  if (s.contains("minimum")) lower_keys.push_back({"minimum", min_exclusive});
  if (s.contains("maximum")) upper_keys.push_back({"maximum", max_exclusive});
  if (!integer) {
    // Only the sign is enforced: a lower bound >= 0 forbids a minus sign.
    for (const auto& [key, exclusive] : lower_keys) {
      if (!s[key].is_number()) return fail(ptr, "'" + key + "' must be a number");
      if (s[key].get<double>() >= 0) return rules_.nonnegative_number();
    }
    for (const auto& [key, exclusive] : upper_keys) {
      if (!s[key].is_number()) return fail(ptr, "'" + key + "' must be a number");
    }
    return rules_.number();
  }
  std::optional<int64_t> lo, hi;
  for (const auto& [key, exclusive] : lower_keys) {
    auto b = integer_bound(s[key], true, exclusive, ptr, key);
    if (!b.ok()) return b.take_error();
    lo = lo ? std::max(*lo, *b.value()) : *b.value();
  }
  for (const auto& [key, exclusive] : upper_keys) {
    auto b = integer_bound(s[key], false, exclusive, ptr, key);
    if (!b.ok()) return b.take_error();
    hi = hi ? std::min(*hi, *b.value()) : *b.value();
  }
  if (!lo && !hi) return rules_.integer();
  auto r = rules_.integer_range(lo, hi);
  if (!r.ok()) return fail(ptr, "the bounds leave no integer");
  return r;
}

result<std::shared_ptr<const grammar>> ordered_json_schema_grammar(const ordered_json& schema) {
  if (nests_deeper_than(schema, max_document_depth)) {
    return invalid("json schema: the document nests deeper than " + std::to_string(max_document_depth));
  }
  return schema_compiler(schema).run();
}

}  // namespace constraint_detail

result<std::shared_ptr<const grammar>> json_schema_grammar(const nlohmann::ordered_json& schema) {
  return ordered_json_schema_grammar(schema);
}

result<std::shared_ptr<const grammar>> json_schema_grammar(const nlohmann::json& schema) {
  // Properties keep their declared order only through ordered_json (compile_constraint parses
  // into one); a nlohmann::json has already sorted its keys.
  if (nests_deeper_than(schema, max_document_depth)) {
    return invalid("json schema: the document nests deeper than " + std::to_string(max_document_depth));
  }
  try {
    return ordered_json_schema_grammar(ordered_json::parse(schema.dump()));
  } catch (const nlohmann::json::exception&) {
    return invalid("json schema: a string is not valid UTF-8");
  }
}

}  // namespace llmesh::model
