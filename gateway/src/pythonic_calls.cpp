// Pythonic tool calls (vLLM's pythonic parser; Llama 3.2 and Llama 4 templates ask for them):
// the output is a Python list of calls with keyword arguments whose values are literals,
// [get_weather(city="Paris", days=3), get_time(tz='UTC')]. A small recursive-descent reader of
// exactly that subset of Python (strings with Python's escapes, ints, floats, True / False /
// None, lists, tuples, dicts); anything else is not calls. Where Python and JSON differ it does
// what vLLM's json.dumps of the evaluated literal does: a dict's number, True / False / None keys
// become strings ("1", "true", "null"), tuples become arrays. JSON's true / false / null are taken
// for Python's (a model's slip into JSON is still a call). Ints must fit 64 bits and \N{name}
// escapes are not read (no name table): such an output is content, not a wrong call.
#include "llmesh/gateway/tool_calls.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>
#include <utf8proc.h>

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

/// Llama 4 wraps its calls in these (special tokens: the decoder usually drops them).
constexpr std::string_view python_start = "<|python_start|>", python_end = "<|python_end|>";

class reader {
 public:
  explicit reader(std::string_view s) : s_(s) {}

  /// One literal, the whole (stripped) text.
  std::optional<json> literal() {
    skip();
    auto v = value(0);
    skip();
    if (!v || at_ != s_.size()) return std::nullopt;
    return v;
  }

  std::optional<std::vector<tool_call_delta>> calls() {
    std::vector<tool_call_delta> out;
    skip();
    if (!eat('[')) return std::nullopt;
    const bool listed = items(']', [&] {
      auto c = call();
      if (!c) return false;
      c->index = out.size();
      out.push_back(std::move(*c));
      return true;
    });
    if (!listed) return std::nullopt;
    skip();
    if (at_ != s_.size() || out.empty()) return std::nullopt;
    return out;
  }

 private:
  /// A comma-separated list up to `close` (its opening bracket already read), a trailing comma
  /// allowed; `item` reads one element. False when an element or a comma is missing.
  template <class F>
  bool items(char close, F&& item) {
    for (size_t n = 0;; ++n) {
      skip();
      if (eat(close)) return true;
      if (n > 0) {
        if (!eat(',')) return false;
        skip();
        if (eat(close)) return true;  // a trailing comma
      }
      if (!item()) return false;
    }
  }

  void skip() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) ++at_;
  }
  bool eat(char ch) {
    if (at_ < s_.size() && s_[at_] == ch) {
      ++at_;
      return true;
    }
    return false;
  }
  static bool ident_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
  static bool ident_char(char ch) { return ident_start(ch) || (ch >= '0' && ch <= '9'); }

  /// A name; dotted (a module's function, as vLLM's llama4 parser allows) joins with '.'.
  std::optional<std::string> name() {
    if (at_ >= s_.size() || !ident_start(s_[at_])) return std::nullopt;
    const size_t b = at_;
    while (at_ < s_.size() && (ident_char(s_[at_]) || (s_[at_] == '.' && at_ + 1 < s_.size() && ident_start(s_[at_ + 1])))) ++at_;
    return std::string(s_.substr(b, at_ - b));
  }

  std::optional<tool_call_delta> call() {
    auto fn = name();
    if (!fn) return std::nullopt;
    skip();
    if (!eat('(')) return std::nullopt;
    json args = json::object();
    const bool listed = items(')', [&] {
      auto key = name();
      if (!key || key->find('.') != std::string::npos) return false;  // keyword arguments only
      skip();
      if (!eat('=')) return false;
      skip();
      auto v = value(0);
      if (!v || args.contains(*key)) return false;
      args[*key] = std::move(*v);
      return true;
    });
    if (!listed) return std::nullopt;
    tool_call_delta c;
    c.id = new_tool_call_id();
    c.name = std::move(*fn);
    c.arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
    return c;
  }

  std::optional<json> value(int depth) {
    if (depth > 64 || at_ >= s_.size()) return std::nullopt;
    const char ch = s_[at_];
    if (ch == '"' || ch == '\'') {
      auto str = string();
      if (!str) return std::nullopt;
      return json(std::move(*str));
    }
    if (ch == '[' || ch == '(') return sequence(ch == '[' ? ']' : ')', depth);
    if (ch == '{') return dict(depth);
    if (ch == '-' || ch == '+' || ch == '.' || (ch >= '0' && ch <= '9')) return number();
    auto word = name();
    if (word == "True" || word == "true") return json(true);
    if (word == "False" || word == "false") return json(false);
    if (word == "None" || word == "null") return json(nullptr);
    return std::nullopt;
  }

  /// A list, or a parenthesised tuple; `(x)` without a comma is x itself, as in Python.
  std::optional<json> sequence(char close, int depth) {
    ++at_;
    json out = json::array();
    size_t after_item = at_;
    const bool listed = items(close, [&] {
      auto v = value(depth + 1);
      if (v) out.push_back(std::move(*v));
      after_item = at_;
      return v.has_value();
    });
    if (!listed) return std::nullopt;
    if (close == ')' && out.size() == 1 && s_.substr(after_item, at_ - after_item).find(',') == std::string_view::npos) {
      return std::move(out[0]);
    }
    return out;
  }

  std::optional<json> dict(int depth) {
    ++at_;
    json out = json::object();
    const bool listed = items('}', [&] {
      auto key = value(depth + 1);
      if (!key || key->is_array() || key->is_object()) return false;  // Python: unhashable, or not JSON
      skip();
      if (!eat(':')) return false;
      skip();
      auto v = value(depth + 1);
      if (v) out[key->is_string() ? key->get<std::string>() : key->dump()] = std::move(*v);
      return v.has_value();
    });
    if (!listed) return std::nullopt;
    return out;
  }

  std::optional<json> number() {
    const size_t b = at_;
    if (s_[at_] == '-' || s_[at_] == '+') ++at_;
    bool is_float = false;
    while (at_ < s_.size()) {
      const char ch = s_[at_];
      if (ch >= '0' && ch <= '9') {
      } else if (ch == '.' || ch == 'e' || ch == 'E') {
        is_float = true;
      } else if ((ch == '-' || ch == '+') && (s_[at_ - 1] == 'e' || s_[at_ - 1] == 'E')) {
      } else if (ch == '_') {  // Python's digit separator
      } else {
        break;
      }
      ++at_;
    }
    std::string text;
    for (char ch : s_.substr(b, at_ - b)) {
      if (ch != '_') text += ch;
    }
    if (text.starts_with('+')) text.erase(0, 1);
    if (text.empty() || text == "-") return std::nullopt;
    const char* first = text.data();
    const char* last = first + text.size();
    if (!is_float) {  // locale-free; beyond 64 bits Python's exact int has no JSON number here: refused
      int64_t v = 0;
      if (auto [end, ec] = std::from_chars(first, last, v); ec == std::errc() && end == last) return json(v);
      uint64_t u = 0;
      if (auto [end, ec] = std::from_chars(first, last, u); ec == std::errc() && end == last) return json(u);
      return std::nullopt;
    }
    double d = 0;
    auto [end, ec] = std::from_chars(first, last, d);
    if (ec != std::errc() || end != last || !std::isfinite(d)) return std::nullopt;
    return json(d);
  }

  /// Encodes a code point as UTF-8; false for a surrogate or one beyond Unicode.
  static bool append_utf8(std::string& out, uint32_t cp) {
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    utf8proc_uint8_t bytes[4];
    const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), bytes);
    out.append(reinterpret_cast<const char*>(bytes), static_cast<size_t>(n));
    return true;
  }

  std::optional<uint32_t> hex(size_t digits) {
    if (at_ + digits > s_.size()) return std::nullopt;
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i) {
      const char ch = s_[at_++];
      const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
      if (d < 0) return std::nullopt;
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  /// A Python string literal, quoted with ' or " (triple quotes too), with its escapes.
  std::optional<std::string> string() {
    if (at_ >= s_.size() || (s_[at_] != '"' && s_[at_] != '\'')) return std::nullopt;
    const char q = s_[at_];
    const bool triple = s_.substr(at_, 3) == std::string(3, q);
    at_ += triple ? 3 : 1;
    std::string out;
    while (at_ < s_.size()) {
      const char ch = s_[at_];
      if (ch == q && (!triple || s_.substr(at_, 3) == std::string(3, q))) {
        at_ += triple ? 3 : 1;
        return out;
      }
      if (ch == '\n' && !triple) return std::nullopt;
      ++at_;
      if (ch != '\\') {
        out += ch;
        continue;
      }
      if (at_ >= s_.size()) return std::nullopt;
      const char e = s_[at_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'a': out += '\a'; break;
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
          uint32_t cp = static_cast<uint32_t>(e - '0');  // \ooo: up to three octal digits
          for (int i = 0; i < 2 && at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '7'; ++i) {
            cp = cp * 8 + static_cast<uint32_t>(s_[at_++] - '0');
          }
          append_utf8(out, cp);
          break;
        }
        case 'N': return std::nullopt;  // \N{name}: no name table here
        case '\\': case '\'': case '"': out += e; break;
        case '\n': break;  // a line continuation
        case 'x': case 'u': case 'U': {
          auto cp = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
          if (!cp || !append_utf8(out, *cp)) return std::nullopt;
          break;
        }
        default: out += '\\'; out += e;  // Python keeps unknown escapes as written
      }
    }
    return std::nullopt;
  }

  std::string_view s_;
  size_t at_ = 0;
};

}  // namespace

bool pythonic_calls_start(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\n\r");
  if (first == std::string_view::npos) return false;
  text.remove_prefix(first);
  return text.starts_with('[') || text.starts_with(python_start);
}

bool pythonic_calls_may_follow(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\n\r");
  if (first == std::string_view::npos) return true;
  text.remove_prefix(first);
  if (text.starts_with(python_start)) return true;  // the model said so
  if (text.size() < python_start.size() && python_start.starts_with(text)) return true;
  // "[" name "(": the name may be dotted, spaces may come between.
  size_t at = 0;
  auto spaces = [&] {
    while (at < text.size() && (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' || text[at] == '\r')) ++at;
  };
  if (text[at++] != '[') return false;
  spaces();
  if (at == text.size()) return true;
  if (!std::isalpha(static_cast<unsigned char>(text[at])) && text[at] != '_') return false;
  while (at < text.size() && (std::isalnum(static_cast<unsigned char>(text[at])) || text[at] == '_' || text[at] == '.')) ++at;
  spaces();
  return at == text.size() || text[at] == '(';
}

std::optional<nlohmann::ordered_json> python_literal(std::string_view text) { return reader(text).literal(); }

result<std::vector<tool_call_delta>> parse_pythonic_calls(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\n\r");
  if (first != std::string_view::npos) text.remove_prefix(first);
  if (text.starts_with(python_start)) {
    text.remove_prefix(python_start.size());
    const size_t last = text.find_last_not_of(" \t\n\r");
    text = text.substr(0, last == std::string_view::npos ? 0 : last + 1);
    if (text.ends_with(python_end)) text.remove_suffix(python_end.size());
  }
  auto calls = reader(text).calls();
  if (!calls) {
    return make_error(errc::invalid_request, "the output is not a Python list of calls with keyword arguments");
  }
  return std::move(*calls);
}

}  // namespace llmesh::gateway
