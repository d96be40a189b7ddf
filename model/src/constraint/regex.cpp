// regex_grammar (constraint.hpp) and regex_rules (constraint_internal.hpp): the front half of
// the regex compiler. A pattern (an ECMAScript subset: literals, escapes, classes, '.', groups,
// alternation, greedy and lazy quantifiers, ^ and $ at the ends of top-level alternatives) is
// parsed into a regex_node tree; regex_automaton.cpp makes the rules. Anything else (anchors
// elsewhere, backreferences, lookaround, named groups, word boundaries, property escapes) is
// refused with its offset.
#include "regex_ast.hpp"
#include "llmesh/model/constraint.hpp"

namespace llmesh::model {

using namespace constraint_detail;

namespace {

using node = regex_node;

constexpr int max_group_depth = 64;

code_point_set any_code_point() { return code_point_set{}.add(0, code_point_set::max_code_point); }

/// ECMAScript's line terminators: what '.' does not match.
code_point_set line_terminators() { return code_point_set{}.add('\n').add('\r').add(0x2028, 0x2029); }

/// ECMAScript's \s: WhiteSpace and LineTerminator.
code_point_set space_set() {
  code_point_set s;
  s.add('\t', '\r').add(' ').add(0xA0).add(0x1680).add(0x2000, 0x200A).add(0x2028, 0x2029).add(0x202F).add(0x205F);
  return s.add(0x3000).add(0xFEFF);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

struct class_atom {
  code_point_set set;
  std::optional<uint32_t> single;  ///< set when the atom is one code point (a range end)
};

struct top_alternative {
  node body;
  bool anchored_start = false, anchored_end = false;
};

class regex_parser {
 public:
  explicit regex_parser(std::string_view p) : p_(p) {}

  result<std::vector<top_alternative>> parse() {
    std::vector<top_alternative> alts;
    while (true) {
      top_alternative a;
      if (peek() == '^') {
        a.anchored_start = true;
        ++pos_;
      }
      auto body = parse_sequence(0, &a.anchored_end);
      if (!body.ok()) return body.take_error();
      a.body = std::move(body.value());
      alts.push_back(std::move(a));
      if (pos_ >= p_.size()) break;
      if (peek() == ')') return fail("unmatched ')'");
      ++pos_;  // '|'
    }
    return alts;
  }

 private:
  char peek(size_t ahead = 0) const { return pos_ + ahead < p_.size() ? p_[pos_ + ahead] : '\0'; }
  bool at_end(size_t ahead = 0) const { return pos_ + ahead >= p_.size(); }
  error fail(const std::string& what) const { return fail_at(what, pos_); }
  static error fail_at(const std::string& what, size_t at) {
    return invalid("regex: " + what + " at offset " + std::to_string(at));
  }

  /// Alternatives inside a group, up to its ')'.
  result<node> parse_alternation(int depth) {
    node alt;
    alt.type = node::kind::alt;
    while (true) {
      auto seq = parse_sequence(depth, nullptr);
      if (!seq.ok()) return seq;
      alt.kids.push_back(std::move(seq.value()));
      if (at_end() || peek() != '|') break;
      ++pos_;
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  /// Terms up to '|', ')' or the end. end_anchor (top level only) takes a final '$'.
  result<node> parse_sequence(int depth, bool* end_anchor) {
    node seq;
    while (!at_end()) {
      const char c = peek();
      if (c == '|' || (c == ')' && depth > 0)) break;
      if (c == ')') return fail("unmatched ')'");
      if (c == '^')
        return fail("'^' away from the start of the pattern (or of a top-level alternative) is not supported");
      if (c == '$') {
        if (end_anchor != nullptr && (at_end(1) || peek(1) == '|')) {
          *end_anchor = true;
          ++pos_;
          break;
        }
        return fail("'$' away from the end of the pattern (or of a top-level alternative) is not supported");
      }
      const size_t start = pos_;
      if (c == '*' || c == '+' || c == '?') return fail("nothing to repeat");
      if (c == '{') {
        int min = 0, max = 0;
        if (read_braces(min, max)) return fail_at("nothing to repeat", start);
      }
      auto atom = parse_atom(depth);
      if (!atom.ok()) return atom;
      node term = std::move(atom.value());
      int min = 0, max = 0;
      auto q = read_quantifier(min, max);
      if (!q.ok()) return q.take_error();
      if (q.value()) term = repeat_node(std::move(term), min, max);
      seq.kids.push_back(std::move(term));
    }
    return seq;
  }

  /// A quantifier at pos_ (then an optional lazy '?': same language). false: none here.
  result<bool> read_quantifier(int& min, int& max) {
    const size_t start = pos_;
    const char c = peek();
    if (c == '*') {
      min = 0, max = -1, ++pos_;
    } else if (c == '+') {
      min = 1, max = -1, ++pos_;
    } else if (c == '?') {
      min = 0, max = 1, ++pos_;
    } else if (c != '{' || !read_braces(min, max)) {
      return false;
    }
    if (min > max_repeat || max > max_repeat) {
      return fail_at("repetition bound above " + std::to_string(max_repeat), start);
    }
    if (max >= 0 && max < min) return fail_at("repetition {min,max} with max < min", start);
    if (peek() == '?' && !at_end()) ++pos_;
    return true;
  }

  /// {n}, {n,} or {n,m} at pos_: consumes it and returns true; anything else (ECMAScript's
  /// Annex B reads it as a literal '{') leaves pos_ and returns false. Numbers saturate.
  bool read_braces(int& min, int& max) {
    size_t i = pos_ + 1;
    auto number = [&](int& out) {
      const size_t from = i;
      long long v = 0;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9')
        v = std::min<long long>(v * 10 + (p_[i++] - '0'), 1LL << 30);
      out = static_cast<int>(v);
      return i > from;
    };
    if (!number(min)) return false;
    max = min;
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      max = -1;
      if (i < p_.size() && p_[i] != '}' && !number(max)) return false;
    }
    if (i >= p_.size() || p_[i] != '}') return false;
    pos_ = i + 1;
    return true;
  }

  result<node> parse_atom(int depth) {
    const char c = peek();
    if (c == '(') {
      const size_t open = pos_;
      ++pos_;
      if (peek() == '?') {
        if (peek(1) != ':') return fail_at("lookaround, named groups and inline flags are not supported", open);
        pos_ += 2;
      }
      if (depth + 1 > max_group_depth) return fail("groups nest deeper than " + std::to_string(max_group_depth));
      auto inner = parse_alternation(depth + 1);
      if (!inner.ok()) return inner;
      if (at_end() || peek() != ')') return fail_at("missing ')' for the group", open);
      ++pos_;
      return inner;
    }
    if (c == '[') return parse_class();
    if (c == '.') {
      ++pos_;
      return set_node(line_terminators().complement());
    }
    auto a = parse_class_atom(false);
    if (!a.ok()) return a.take_error();
    return set_node(std::move(a.value().set));
  }

  result<node> parse_class() {
    const size_t open = pos_;
    ++pos_;
    bool negate = false;
    if (peek() == '^' && !at_end()) {
      negate = true;
      ++pos_;
    }
    code_point_set set;
    while (true) {
      if (at_end()) return fail_at("missing ']' for the class", open);
      if (peek() == ']') {
        ++pos_;
        break;
      }
      const size_t start = pos_;
      auto a = parse_class_atom(true);
      if (!a.ok()) return a.take_error();
      if (peek() == '-' && !at_end(1) && peek(1) != ']') {
        ++pos_;
        auto b = parse_class_atom(true);
        if (!b.ok()) return b.take_error();
        if (!a.value().single || !b.value().single) return fail_at("a class range needs single characters", start);
        if (*a.value().single > *b.value().single) return fail_at("class range out of order", start);
        set.add(*a.value().single, *b.value().single);
      } else {
        set.add(a.value().set);
      }
    }
    return set_node(negate ? set.complement() : set);
  }

  /// One character or escape (outside a class or inside one).
  result<class_atom> parse_class_atom(bool in_class) {
    const size_t start = pos_;
    if (peek() != '\\') {
      auto cp = utf8_decode(p_, pos_);
      if (!cp) return fail("invalid UTF-8");
      return single(*cp);
    }
    ++pos_;
    if (at_end()) return fail_at("the pattern ends with '\\'", start);
    const char e = p_[pos_++];
    auto digit = code_point_set{}.add('0', '9');
    auto word = code_point_set{}.add('a', 'z').add('A', 'Z').add('0', '9').add('_');
    switch (e) {
      case 'd': return class_atom{digit, std::nullopt};
      case 'D': return class_atom{digit.complement(), std::nullopt};
      case 'w': return class_atom{word, std::nullopt};
      case 'W': return class_atom{word.complement(), std::nullopt};
      case 's': return class_atom{space_set(), std::nullopt};
      case 'S': return class_atom{space_set().complement(), std::nullopt};
      case 'n': return single('\n');
      case 't': return single('\t');
      case 'r': return single('\r');
      case 'f': return single('\f');
      case 'v': return single('\v');
      case 'b':
        if (in_class) return single('\b');
        return fail_at("word boundaries (\\b) are not supported", start);
      case 'B': return fail_at("word boundaries (\\B) are not supported", start);
      case '0':
        if (peek() >= '0' && peek() <= '9') return fail_at("octal escapes are not supported", start);
        return single(0);
      case 'x': {
        const int h = hex_value(peek()), l = hex_value(peek(1));
        if (h < 0 || l < 0) return fail_at("\\x needs two hex digits", start);
        pos_ += 2;
        return single(static_cast<uint32_t>(h * 16 + l));
      }
      case 'u': {
        auto unit = read_hex4();
        if (!unit) return fail_at("\\u needs four hex digits", start);
        if (*unit >= 0xDC00 && *unit <= 0xDFFF) return fail_at("lone surrogate", start);
        if (*unit >= 0xD800 && *unit <= 0xDBFF) {
          // A UTF-16 pair written as two escapes is one code point.
          if (peek() != '\\' || peek(1) != 'u') return fail_at("lone surrogate", start);
          pos_ += 2;
          auto low = read_hex4();
          if (!low || *low < 0xDC00 || *low > 0xDFFF) return fail_at("lone surrogate", start);
          return single(0x10000 + ((*unit - 0xD800) << 10) + (*low - 0xDC00));
        }
        return single(*unit);
      }
      case 'c': {
        const char l = peek();
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z'))) return fail_at("\\c needs a letter", start);
        ++pos_;
        return single(static_cast<uint32_t>(l) % 32);
      }
      default: break;
    }
    if (e >= '1' && e <= '9') return fail_at("backreferences are not supported", start);
    if (e == 'k') return fail_at("named backreferences are not supported", start);
    if (e == 'p' || e == 'P') return fail_at("Unicode property escapes are not supported", start);
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
      return fail_at(std::string("unknown escape \\") + e, start);
    }
    // An escaped punctuation or other character stands for itself.
    --pos_;
    auto cp = utf8_decode(p_, pos_);
    if (!cp) return fail("invalid UTF-8");
    return single(*cp);
  }

  std::optional<uint32_t> read_hex4() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = hex_value(peek(i));
      if (h < 0) return std::nullopt;
      v = v * 16 + static_cast<uint32_t>(h);
    }
    pos_ += 4;
    return v;
  }

  static class_atom single(uint32_t cp) { return class_atom{code_point_set{}.add(cp), cp}; }

  std::string_view p_;
  size_t pos_ = 0;
};
}  // namespace

namespace constraint_detail {

result<rule_id> regex_rules(grammar_builder& b, std::string_view pattern, regex_mode mode, const std::string& name) {
  auto parsed = regex_parser(pattern).parse();
  if (!parsed.ok()) return parsed.take_error();
  node top;
  top.type = node::kind::alt;
  for (auto& a : parsed.value()) {
    if (mode == regex_mode::whole) {
      top.kids.push_back(std::move(a.body));
      continue;
    }
    // JSON Schema patterns are unanchored: a side without its anchor takes any text.
    node padded;
    if (!a.anchored_start) padded.kids.push_back(repeat_node(set_node(any_code_point()), 0, -1));
    padded.kids.push_back(std::move(a.body));
    if (!a.anchored_end) padded.kids.push_back(repeat_node(set_node(any_code_point()), 0, -1));
    top.kids.push_back(std::move(padded));
  }
  return automaton_rules(b, top, mode, name);
}

}  // namespace constraint_detail

result<std::shared_ptr<const grammar>> regex_grammar(std::string_view pattern) {
  if (pattern.size() > max_constraint_bytes) return invalid("regex: the pattern is too long");
  grammar_builder b;
  auto root = regex_rules(b, pattern, regex_mode::whole, "regex");
  if (!root.ok()) return root.take_error();
  return std::move(b).build(root.value());
}

}  // namespace llmesh::model
