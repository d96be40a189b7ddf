// Objects and arrays for the JSON Schema compiler (json_schema_compiler.hpp). Objects: the
// declared properties in their order, required ones always, optional ones skippable, in linearly
// many rules; extra keys per additionalProperties (none by default beside "properties", as
// OpenAI's strict mode and xgrammar). Arrays: prefixItems (or draft 4's array items), then items,
// with minItems / maxItems as bounded repetition.
#include "json_schema_compiler.hpp"

namespace llmesh::model::constraint_detail {

namespace {
using gb = grammar_builder;
using json = ordered_json;
}  // namespace

result<rule_id> schema_compiler::compile_object(const json& s, const std::string& ptr, int depth) {
  struct property {
    std::string name;
    const json* schema = nullptr;  ///< nullptr: the extra properties' schema
    bool required = false;
  };
  std::vector<property> props;
  if (auto it = s.find("properties"); it != s.end()) {
    if (!it->is_object()) return fail(ptr, "'properties' must be an object");
    for (const auto& [name, sub] : it->items()) props.push_back({name, &sub, false});
  }
  std::vector<std::string> required;
  if (auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) return fail(ptr, "'required' must be an array of strings");
    for (const auto& name : *it) {
      if (!name.is_string()) return fail(ptr, "'required' must be an array of strings");
      if (std::find(required.begin(), required.end(), name.get<std::string>()) == required.end()) {
        required.push_back(name.get<std::string>());
      }
    }
  }
  // Extra keys: with "properties" and no additionalProperties, none (strict, as OpenAI's and
  // xgrammar's); without either, any.
  const json* extra = nullptr;
  bool extra_allowed = !s.contains("properties");
  bool extra_forbidden_explicitly = false;
  if (auto it = s.find("additionalProperties"); it != s.end()) {
    if (!it->is_boolean() && !it->is_object()) return fail(ptr, "'additionalProperties' must be a schema");
    extra_allowed = !(it->is_boolean() && !it->get<bool>());
    extra_forbidden_explicitly = !extra_allowed;
    if (it->is_object()) extra = &*it;
  } else if (s.contains("unevaluatedProperties")) {
    extra_allowed = false;
    extra_forbidden_explicitly = true;
  }
  for (const auto& name : required) {
    auto p = std::find_if(props.begin(), props.end(), [&](const property& x) { return x.name == name; });
    if (p != props.end()) {
      p->required = true;
    } else if (extra_forbidden_explicitly) {
      return fail(ptr, "required property '" + name + "' is not in 'properties' and extra properties are forbidden");
    } else {
      props.push_back({name, extra, true});  // required beyond the declared ones: any (or the extra schema)
    }
  }
  if (props.empty() && extra_allowed && extra == nullptr) return rules_.object();

  const rule_id w = rules_.ws();
  auto member = [&](sequence key, rule_id value) {
    key.insert(key.end(), {gb::ref(w), gb::byte(':'), gb::ref(w), gb::ref(value), gb::ref(w)});
    return b_.add("member", {std::move(key)});
  };
  std::vector<rule_id> members;
  for (const auto& p : props) {
    rule_id value = rules_.value();
    if (p.schema != nullptr) {
      const std::string at = p.schema == extra ? ptr + "/additionalProperties"
                                               : ptr + "/properties/" + escape_pointer_token(p.name);
      auto r = compile(*p.schema, at, depth + 1);
      if (!r.ok()) return r;
      value = r.value();
    }
    auto key = json_text(json(p.name));
    if (!key.ok()) return fail(ptr, key.err().message);
    members.push_back(member(gb::literal(key.value()), value));
  }
  // first[i]: properties i.. with none written yet; next[i]: after at least one (a comma first).
  // Linear in the properties however many are optional.
  const size_t n = props.size();
  std::vector<rule_id> first(n + 1), next(n + 1);
  for (size_t i = 0; i <= n; ++i) {
    first[i] = b_.declare("props-first");
    next[i] = b_.declare("props-next");
  }
  if (extra_allowed) {
    rule_id value = rules_.value();
    if (extra != nullptr) {
      auto r = compile(*extra, ptr + "/additionalProperties", depth + 1);
      if (!r.ok()) return r;
      value = r.value();
    }
    const rule_id any = member({gb::ref(rules_.string())}, value);
    b_.define(first[n], {{}, {gb::ref(any), gb::ref(next[n])}});
    b_.define(next[n], {{}, {gb::byte(','), gb::ref(w), gb::ref(any), gb::ref(next[n])}});
  } else {
    b_.define(first[n], {{}});
    b_.define(next[n], {{}});
  }
  for (size_t i = n; i-- > 0;) {
    std::vector<sequence> f{{gb::ref(members[i]), gb::ref(next[i + 1])}};
    std::vector<sequence> x{{gb::byte(','), gb::ref(w), gb::ref(members[i]), gb::ref(next[i + 1])}};
    if (!props[i].required) {
      f.push_back({gb::ref(first[i + 1])});
      x.push_back({gb::ref(next[i + 1])});
    }
    b_.define(first[i], std::move(f));
    b_.define(next[i], std::move(x));
  }
  return b_.add("object", {{gb::byte('{'), gb::ref(w), gb::ref(first[0]), gb::byte('}')}});
}

result<rule_id> schema_compiler::compile_array(const json& s, const std::string& ptr, int depth) {
  // The items: prefix (prefixItems, or draft 4's array-valued items), then the rest
  // (items, or additionalItems after an array-valued items).
  const json* prefix = nullptr;
  std::string prefix_key = "prefixItems", rest_key = "items";
  if (auto it = s.find("prefixItems"); it != s.end()) prefix = &*it;
  if (auto it = s.find("items"); it != s.end() && it->is_array()) {
    if (prefix != nullptr) return fail(ptr, "array-valued 'items' beside 'prefixItems'");
    prefix = &*it;
    prefix_key = "items";
    rest_key = "additionalItems";
  }
  if (prefix != nullptr && !prefix->is_array()) return fail(ptr, "'" + prefix_key + "' must be an array of schemas");
  const size_t k = prefix != nullptr ? prefix->size() : 0;
  const json* rest = nullptr;
  bool rest_allowed = true;
  if (auto it = s.find(rest_key); it != s.end()) {
    if (!it->is_boolean() && !it->is_object()) return fail(ptr, "'" + rest_key + "' must be a schema");
    rest_allowed = !(it->is_boolean() && !it->get<bool>());
    if (it->is_object()) rest = &*it;
  }
  auto min_items = read_count(s, "minItems", ptr);
  if (!min_items.ok()) return min_items.take_error();
  auto max_items = read_count(s, "maxItems", ptr);
  if (!max_items.ok()) return max_items.take_error();
  const int m = min_items.value().value_or(0);
  int max = max_items.value().value_or(-1);
  if (k > static_cast<size_t>(max_repeat)) return fail(ptr, "'" + prefix_key + "' holds too many schemas");
  if (!rest_allowed) max = max < 0 ? static_cast<int>(k) : std::min(max, static_cast<int>(k));
  if (max >= 0 && m > max) return fail(ptr, "'minItems' is above the items the array may hold");
  if (k == 0 && rest == nullptr && rest_allowed && m == 0 && max < 0) return rules_.array();

  const rule_id w = rules_.ws();
  std::optional<rule_id> rest_rule;
  if (rest_allowed) {
    rest_rule = rules_.value();
    if (rest != nullptr) {
      auto r = compile(*rest, ptr + "/" + rest_key, depth + 1);
      if (!r.ok()) return r;
      rest_rule = r.value();
    }
  }
  // Item i's rule, followed by whitespace.
  auto item = [&](size_t i) -> result<rule_id> {
    if (i >= k) return *rest_rule;
    return compile((*prefix)[i], ptr + "/" + prefix_key + "/" + std::to_string(i), depth + 1);
  };
  if (max == 0) return b_.add("array", {{gb::byte('['), gb::ref(w), gb::byte(']')}});
  // after[i]: i items written (i >= 1). Explicit rules up to p, then a bounded repetition.
  const size_t p = std::max<size_t>(1, std::min<size_t>(std::max<size_t>(k, m), max < 0 ? SIZE_MAX : max));
  std::vector<rule_id> after(p + 1);
  for (size_t i = 1; i <= p; ++i) after[i] = b_.declare("items-after");
  const int more = max < 0 ? -1 : max - static_cast<int>(p);
  if (rest_rule && more != 0) {
    const rule_id tail = b_.repeat("items-tail", {gb::byte(','), gb::ref(w), gb::ref(*rest_rule), gb::ref(w)}, 0, more);
    b_.define(after[p], {{gb::ref(tail)}});
  } else {
    b_.define(after[p], {{}});
  }
  for (size_t i = 1; i < p; ++i) {
    auto r = item(i);
    if (!r.ok()) return r;
    std::vector<sequence> alts{{gb::byte(','), gb::ref(w), gb::ref(r.value()), gb::ref(w), gb::ref(after[i + 1])}};
    if (static_cast<int>(i) >= m) alts.push_back({});
    b_.define(after[i], std::move(alts));
  }
  auto r0 = item(0);
  if (!r0.ok()) return r0;
  std::vector<sequence> alts{
      {gb::byte('['), gb::ref(w), gb::ref(r0.value()), gb::ref(w), gb::ref(after[1]), gb::byte(']')}};
  if (m == 0) alts.push_back({gb::byte('['), gb::ref(w), gb::byte(']')});
  return b_.add("array", std::move(alts));
}

}  // namespace llmesh::model::constraint_detail
