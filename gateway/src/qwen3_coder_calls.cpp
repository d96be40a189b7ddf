// Qwen3-Coder's XML tool calls (vLLM's qwen3_coder parser; Qwen3-Coder's and Qwen3.5's
// templates ask for them):
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// A parameter's value is raw text (code, say, with any characters), turned into a JSON value by
// the tool's schema as vLLM turns it. Delimiters are told from the same strings inside a value
// as vLLM tells them: a "<parameter=" counts only at a line's start, a "</parameter>" only where
// what follows it is another parameter (of a name in the schema, when the tool has one), the
// function's or the call's end, or the text's end — literal ones inside a value pair up by
// depth; a "</tool_call>" only before another call or the end.
#include "llmesh/gateway/tool_calls.hpp"
#include "text_space.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;
constexpr auto npos = std::string_view::npos;
constexpr std::string_view call_open = "<tool_call>", call_close = "</tool_call>", fn_open = "<function=",
                           fn_close = "</function>", param_open = "<parameter=", param_close = "</parameter>";

using detail::lstripped;
using detail::stripped;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

/// A parameter's name at `at` (just past "<parameter="), up to its ">"; nullopt when unclosed.
std::optional<std::string_view> name_at(std::string_view text, size_t at) {
  const size_t end = text.find('>', at);
  if (end == npos) return std::nullopt;
  return text.substr(at, end - at);
}

/// The next "<parameter=" at or after `from` that starts a line (or the text), named in `names`
/// when given; npos when none.
size_t next_param(std::string_view text, size_t from, const std::set<std::string, std::less<>>* names) {
  for (size_t at = from; (at = text.find(param_open, at)) != npos; ++at) {
    if (at != 0 && text[at - 1] != '\n') continue;
    if (!names) return at;
    const auto name = name_at(text, at + param_open.size());
    if (name && names->contains(*name)) return at;
  }
  return npos;
}

/// Where a value (the text after "<parameter=NAME>") ends: its "</parameter>" — at depth 0 of
/// the line-starting "<parameter=" opened inside it, and followed (after whitespace) by a next
/// parameter (named in `names` when given), "</function>", "</tool_call>", or nothing. npos
/// when there is none.
size_t value_end(std::string_view v, const std::set<std::string, std::less<>>* names) {
  int depth = 0;
  for (size_t pos = 0; pos < v.size();) {
    const size_t open = next_param(v, pos, nullptr), close = v.find(param_close, pos);
    if (close == npos) return npos;
    if (open != npos && open < close) {
      ++depth;
      pos = open + param_open.size();
      continue;
    }
    pos = close + param_close.size();
    if (depth > 0) {
      --depth;
      continue;
    }
    const std::string_view after = lstripped(v.substr(pos));
    bool next = after.starts_with(param_open);
    if (next && names) {
      const auto name = name_at(after, param_open.size());
      next = name && names->contains(*name);
    }
    if (after.empty() || next || after.starts_with(fn_close) || after.starts_with(call_close)) return close;
  }
  return npos;
}

/// The function's own "</function>" in `v`: one followed only by whitespace (the call's text
/// ends at its structural "</tool_call>"); npos when none.
size_t function_end(std::string_view v) {
  for (size_t at = 0; (at = v.find(fn_close, at)) != npos; at += fn_close.size()) {
    const std::string_view after = lstripped(v.substr(at + fn_close.size()));
    if (after.empty() || after.starts_with(call_close)) return at;
  }
  return npos;
}

/// Python's int() of a stripped string: a sign, digits with single underscores between them;
/// nullopt otherwise or beyond 64 bits.
std::optional<int64_t> python_int(std::string_view s) {
  s = stripped(s);
  std::string digits;
  if (!s.empty() && (s.front() == '+' || s.front() == '-')) {
    if (s.front() == '-') digits += '-';
    s.remove_prefix(1);
  }
  if (s.empty() || s.front() == '_' || s.back() == '_') return std::nullopt;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && s[i + 1] != '_') continue;
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    digits += s[i];
  }
  int64_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return v;
}

/// Python's float() of a finite number (a sign, digits, a point, an exponent); nullopt otherwise.
std::optional<double> python_float(std::string_view s) {
  s = stripped(s);
  bool negative = false;
  if (!s.empty() && (s.front() == '+' || s.front() == '-')) {
    negative = s.front() == '-';
    s.remove_prefix(1);
  }
  if (s.empty() || s.front() == '+' || s.front() == '-') return std::nullopt;  // one sign, as Python's
  std::string text;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_' && i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-') return std::nullopt;
    text += c;
  }
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) return std::nullopt;
  return negative ? -v : v;
}

/// A parameter's schema type, lower-cased (the first non-null one of a type list or anyOf;
/// "string" when none is given), and whether the schema admits null.
std::pair<std::string, bool> type_of(const json& schema) {
  if (!schema.is_object()) return {"string", false};
  auto pick = [](const json& types) {
    std::string first;
    bool null = false;
    for (const json& t : types) {
      const json* ty = t.is_object() && t.contains("type") ? &t["type"] : &t;
      if (!ty->is_string()) continue;
      const std::string name = lower(stripped(ty->get_ref<const std::string&>()));
      if (name == "null") null = true;
      else if (first.empty()) first = name;
    }
    return std::pair{first.empty() ? std::string("string") : first, null};
  };
  if (schema.contains("type")) {
    const json& t = schema["type"];
    if (t.is_string()) {
      const std::string name = lower(stripped(t.get_ref<const std::string&>()));
      return {name, name == "null"};
    }
    if (t.is_array()) return pick(t);
  }
  if (schema.contains("anyOf") && schema["anyOf"].is_array()) return pick(schema["anyOf"]);
  return {"string", false};
}

/// A value as vLLM's _convert_param_value makes it: by the parameter's type in the tool's
/// properties (not there: the text); a string type keeps the text; null / None is null for
/// other types (and for a nullable string); int and float types their numbers (a float with no
/// fraction an int); boolean true when the text is "true" (any case); objects and arrays from
/// JSON (a JSON string holding a Python literal: that literal), else from a Python literal;
/// other types from a Python literal. What does not convert stays the text.
json convert(const std::string& value, const std::string& name, const json* props) {
  if (!props || !props->contains(name)) return value;
  const auto [type, nullable] = type_of((*props)[name]);
  const std::string low = lower(value);
  if (nullable && (low == "null" || low == "none")) return nullptr;
  if (type == "string" || type == "str" || type == "text" || type == "varchar" || type == "char" || type == "enum") return value;
  if (low == "null" || low == "none") return nullptr;
  for (const char* p : {"int", "uint", "long", "short", "unsigned"}) {
    if (type.starts_with(p)) {
      auto v = python_int(value);
      return v ? json(*v) : json(value);
    }
  }
  if (type.starts_with("num") || type.starts_with("float")) {
    auto v = python_float(value);
    if (!v) return value;
    if (*v == std::trunc(*v) && std::fabs(*v) < 9.2e18) return static_cast<int64_t>(*v);
    return *v;
  }
  if (type == "boolean" || type == "bool" || type == "binary") return low == "true";
  const bool container = type == "object" || type == "array" || type == "arr" || type.starts_with("dict") || type.starts_with("list");
  if (container) {
    if (auto parsed = parse_embedded_json(value)) {  // (depth-bounded: a model's output)
      if (parsed->is_string()) {
        if (auto again = python_literal(parsed->get_ref<const std::string&>())) return *again;
      }
      return *parsed;
    }
  }
  auto literal = python_literal(value);
  if (!literal) return value;
  if (container && literal->is_string()) {
    if (auto again = python_literal(literal->get_ref<const std::string&>())) return *again;
  }
  return *literal;
}

/// The properties of the tool named `name` among the request's chat tools; null when none.
const json* properties_of(const json* tools, std::string_view name) {
  if (!tools || !tools->is_array()) return nullptr;
  for (const json& t : *tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const json& f = t["function"];
    if (!f.contains("name") || f["name"] != name) continue;
    if (!f.contains("parameters") || !f["parameters"].is_object()) return nullptr;
    const json& p = f["parameters"];
    return p.contains("properties") && p["properties"].is_object() ? &p["properties"] : nullptr;
  }
  return nullptr;
}

/// A real function name, not a stray template piece or prose: non-empty, without braces,
/// angle brackets, quotes or whitespace (vLLM's check).
bool valid_name(std::string_view name) {
  return !name.empty() && name.find_first_of("{}<>\"' \t\n\r") == npos;
}

/// One call's text (after "<tool_call>", up to its "</tool_call>"); nullopt when it holds no
/// well-formed function.
std::optional<tool_call_delta> parse_call(std::string_view raw, const json* tools) {
  const size_t f = raw.find(fn_open);
  if (f == npos) return std::nullopt;
  const auto fname = name_at(raw, f + fn_open.size());
  if (!fname || !valid_name(*fname)) return std::nullopt;
  const json* props = properties_of(tools, *fname);
  std::set<std::string, std::less<>> names;
  if (props) {
    for (const auto& [k, v] : props->items()) names.insert(k);
  }
  const auto* known = names.empty() ? nullptr : &names;
  const std::string_view body = raw.substr(f + fn_open.size() + fname->size() + 1);
  json args = json::object();
  for (size_t pos = 0;;) {
    if (lstripped(body.substr(pos)).starts_with(fn_close)) break;
    const size_t start = next_param(body, pos, nullptr);
    if (start == npos) break;
    const auto pname = name_at(body, start + param_open.size());
    if (!pname) break;
    const size_t value_at = start + param_open.size() + pname->size() + 1;
    const std::string_view rest = body.substr(value_at);
    std::string_view value;
    if (const size_t end = value_end(rest, known); end != npos) {
      value = rest.substr(0, end);
      pos = value_at + end + param_close.size();
    } else if (const size_t next = next_param(rest, 0, known); next != npos) {  // a missing </parameter>
      value = rest.substr(0, next);
      pos = value_at + next;
    } else {
      const size_t fend = function_end(rest);
      value = rest.substr(0, fend);
      pos = body.size();
    }
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    const std::string key(*pname);
    args[key] = convert(std::string(value), key, props);
  }
  tool_call_delta c;
  c.id = new_tool_call_id();
  c.name = std::string(*fname);
  c.arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
  return c;
}

}  // namespace

result<std::vector<tool_call_delta>> parse_qwen3_coder_calls(std::string_view text, const nlohmann::ordered_json* tools) {
  std::vector<tool_call_delta> calls;
  for (size_t pos = 0, start; (start = text.find(call_open, pos)) != npos;) {
    const size_t from = start + call_open.size();
    size_t end = npos;  // the structural close: before another call, or the end
    for (size_t at = from; (at = text.find(call_close, at)) != npos; at += call_close.size()) {
      const std::string_view after = lstripped(text.substr(at + call_close.size()));
      if (after.empty() || after.starts_with(call_open)) {
        end = at;
        break;
      }
    }
    if (auto c = parse_call(text.substr(from, end == npos ? npos : end - from), tools)) {
      c->index = calls.size();
      calls.push_back(std::move(*c));
    }
    if (end == npos) break;
    pos = end + call_close.size();
  }
  if (calls.empty()) return make_error(errc::invalid_request, "the output holds no <tool_call> with a well-formed <function=NAME>");
  return calls;
}

}  // namespace llmesh::gateway
