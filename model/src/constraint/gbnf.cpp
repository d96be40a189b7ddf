// gbnf_grammar (constraint.hpp): llama.cpp's GBNF (grammars/README.md there) parsed straight
// into grammar_builder rules. Supported: `name ::= alternatives`, string literals and character
// classes (ranges, ^ negation: over code points, encoded as well-formed UTF-8) with llama.cpp's
// escapes (\x.. \u.... \U........ \t \r \n \\ \" \[ \] \-), '.', groups, '|', the quantifiers
// * + ? {m} {m,} {m,n}, '#' comments; a newline ends a rule except inside parentheses or after
// '|'. Refused with an offset: token references (<...>), undefined rules, a missing root, left
// recursion (from the builder), repetition bounds past max_repeat.
#include <map>
#include <set>

#include "constraint_internal.hpp"
#include "llmesh/model/constraint.hpp"

namespace llmesh::model {

using namespace constraint_detail;

namespace {

using gb = grammar_builder;

constexpr int max_group_depth = 64;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class gbnf_parser {
 public:
  explicit gbnf_parser(std::string_view text) : t_(text) {}

  result<std::shared_ptr<const grammar>> parse() {
    skip_space(true);
    while (!at_end()) {
      const size_t start = pos_;
      const std::string name = read_name();
      if (name.empty()) return fail("expected a rule name");
      skip_space(false);
      if (t_.substr(pos_, 3) != "::=") return fail("expected '::=' after '" + name + "'");
      pos_ += 3;
      skip_space(true);
      std::vector<sequence> alts;
      LLMESH_TRY(parse_alternatives(0, alts));
      const rule_id r = rule_of(name, start);
      if (defined_.count(name) != 0) return fail_at("rule '" + name + "' is defined twice", start);
      defined_.insert(name);
      b_.define(r, std::move(alts));
      if (!at_end() && peek() != '\n' && peek() != '\r') return fail("expected the end of the line");
      skip_space(true);
    }
    for (const auto& [name, at] : used_at_) {
      if (defined_.count(name) == 0) return fail_at("rule '" + name + "' is used but never defined", at);
    }
    auto root = ids_.find("root");
    if (root == ids_.end() || defined_.count("root") == 0) return invalid("gbnf: the grammar has no 'root' rule");
    auto g = std::move(b_).build(root->second);
    if (!g.ok()) return invalid("gbnf: " + g.err().message);
    return g;
  }

 private:
  bool at_end() const { return pos_ >= t_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < t_.size() ? t_[pos_ + ahead] : '\0'; }
  error fail(const std::string& what) const { return fail_at(what, pos_); }
  static error fail_at(const std::string& what, size_t at) {
    return invalid("gbnf: " + what + " at offset " + std::to_string(at));
  }

  /// Spaces, tabs and comments; newlines too when newline_ok.
  void skip_space(bool newline_ok) {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n' && peek() != '\r') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string read_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    return std::string(t_.substr(start, pos_ - start));
  }

  rule_id rule_of(const std::string& name, size_t at) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const rule_id r = b_.declare(name);
    ids_.emplace(name, r);
    used_at_.emplace(name, at);
    return r;
  }

  status parse_alternatives(int depth, std::vector<sequence>& alts) {
    while (true) {
      sequence seq;
      LLMESH_TRY(parse_sequence(depth, seq));
      alts.push_back(std::move(seq));
      if (peek() != '|' || at_end()) return ok_status();
      ++pos_;
      skip_space(true);
    }
  }

  status parse_sequence(int depth, sequence& seq) {
    const bool nested = depth > 0;
    constexpr size_t none = SIZE_MAX;
    size_t last = none;  // where the last atom's elements start in seq
    while (!at_end()) {
      const char c = peek();
      const size_t start = pos_;
      if (c == '"') {
        last = seq.size();
        LLMESH_TRY(parse_literal(seq));
      } else if (c == '[') {
        last = seq.size();
        LLMESH_TRY(parse_class(seq));
      } else if (c == '.') {
        ++pos_;
        last = seq.size();
        seq.push_back(gb::ref(any_char()));
      } else if (is_name_char(c)) {
        last = seq.size();
        seq.push_back(gb::ref(rule_of(read_name(), start)));
      } else if (c == '(') {
        if (depth + 1 > max_group_depth) return fail("groups nest deeper than " + std::to_string(max_group_depth));
        ++pos_;
        skip_space(true);
        std::vector<sequence> alts;
        LLMESH_TRY(parse_alternatives(depth + 1, alts));
        if (peek() != ')' || at_end()) return fail_at("missing ')' for the group", start);
        ++pos_;
        last = seq.size();
        if (alts.size() == 1) {
          seq.insert(seq.end(), alts[0].begin(), alts[0].end());
        } else {
          seq.push_back(gb::ref(b_.add("group", std::move(alts))));
        }
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last == none) return fail(std::string("nothing before '") + c + "' to repeat");
        LLMESH_TRY(parse_quantifier(seq, last));
        last = none;
      } else if (c == '<') {
        return fail("token references (<...>) are not supported");
      } else {
        break;
      }
      skip_space(nested);
    }
    return ok_status();
  }

  status parse_quantifier(sequence& seq, size_t last) {
    const size_t start = pos_;
    sequence atom(seq.begin() + static_cast<std::ptrdiff_t>(last), seq.end());
    seq.resize(last);
    const char c = t_[pos_++];
    rule_id r = 0;
    if (c == '*') {
      r = b_.star("star", std::move(atom));
    } else if (c == '+') {
      r = b_.plus("plus", std::move(atom));
    } else if (c == '?') {
      r = b_.optional("optional", std::move(atom));
    } else {
      int min = 0, max = 0;
      skip_space(true);
      if (!read_int(min)) return fail("expected a number in '{...}'");
      skip_space(true);
      max = min;
      if (peek() == ',') {
        ++pos_;
        skip_space(true);
        max = -1;
        if (peek() >= '0' && peek() <= '9' && !read_int(max)) return fail("repetition bound too large");
        skip_space(true);
      }
      if (peek() != '}' || at_end()) return fail("expected '}'");
      ++pos_;
      if (min > max_repeat || max > max_repeat) {
        return fail_at("repetition bound above " + std::to_string(max_repeat), start);
      }
      if (max >= 0 && max < min) return fail_at("repetition {m,n} with n < m", start);
      if (b_.rule_count() + static_cast<size_t>(std::max(min, max)) > max_rules) {
        return fail_at("the grammar would be too large", start);
      }
      r = b_.repeat("repeat", std::move(atom), min, max);
    }
    seq.push_back(gb::ref(r));
    return ok_status();
  }

  /// Digits at pos_ (saturating past max_repeat, so the bound check refuses them).
  bool read_int(int& out) {
    if (!(peek() >= '0' && peek() <= '9') || at_end()) return false;
    long long v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') v = std::min<long long>(v * 10 + (t_[pos_++] - '0'), 1LL << 30);
    out = static_cast<int>(v);
    return true;
  }

  /// One character of a literal or class: a UTF-8 code point or an escape.
  result<uint32_t> read_char() {
    const size_t start = pos_;
    if (at_end()) return fail("unexpected end of the grammar");
    if (peek() != '\\') {
      auto cp = utf8_decode(t_, pos_);
      if (!cp) return fail("invalid UTF-8");
      return *cp;
    }
    ++pos_;
    const char e = peek();
    ++pos_;
    int digits = 0;
    switch (e) {
      case 'x': digits = 2; break;
      case 'u': digits = 4; break;
      case 'U': digits = 8; break;
      case 't': return uint32_t{'\t'};
      case 'r': return uint32_t{'\r'};
      case 'n': return uint32_t{'\n'};
      case '\\': case '"': case '[': case ']': case '-': return static_cast<uint32_t>(e);
      default: return fail_at("unknown escape", start);
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i, ++pos_) {
      const char h = peek();
      int d = -1;
      if (h >= '0' && h <= '9') d = h - '0';
      if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
      if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
      if (d < 0 || at_end()) return fail_at("the escape needs " + std::to_string(digits) + " hex digits", start);
      v = v * 16 + static_cast<uint32_t>(d);
    }
    if (v > code_point_set::max_code_point || (v >= 0xD800 && v <= 0xDFFF)) {
      return fail_at("the escape is not a Unicode scalar value", start);
    }
    return v;
  }

  status parse_literal(sequence& seq) {
    const size_t open = pos_++;
    while (true) {
      if (at_end()) return fail_at("unterminated string literal", open);
      if (peek() == '"') break;
      auto cp = read_char();
      if (!cp.ok()) return cp.take_error();
      for (char b : utf8_encode(cp.value())) seq.push_back(gb::byte(static_cast<uint8_t>(b)));
    }
    ++pos_;
    return ok_status();
  }

  status parse_class(sequence& seq) {
    const size_t open = pos_++;
    bool negate = false;
    if (peek() == '^' && !at_end()) {
      negate = true;
      ++pos_;
    }
    code_point_set set;
    while (true) {
      if (at_end()) return fail_at("unterminated character class", open);
      if (peek() == ']') break;
      auto lo = read_char();
      if (!lo.ok()) return lo.take_error();
      uint32_t hi = lo.value();
      if (peek() == '-' && peek(1) != ']' && !at_end(1)) {
        const size_t dash = pos_++;
        auto h = read_char();
        if (!h.ok()) return h.take_error();
        if (h.value() < lo.value()) return fail_at("class range out of order", dash);
        hi = h.value();
      }
      set.add(lo.value(), hi);
    }
    ++pos_;
    auto alts = utf8_alternatives(negate ? set.complement() : set);
    if (alts.empty()) return fail_at("the character class matches nothing", open);
    if (alts.size() == 1 && alts[0].size() == 1) {
      seq.push_back(alts[0][0]);
    } else {
      seq.push_back(gb::ref(b_.add("class", std::move(alts))));
    }
    return ok_status();
  }
  bool at_end(size_t ahead) const { return pos_ + ahead >= t_.size(); }

  rule_id any_char() {
    if (!any_) any_ = b_.add("any-char", utf8_alternatives(code_point_set{}.add(0, code_point_set::max_code_point)));
    return *any_;
  }

  std::string_view t_;
  size_t pos_ = 0;
  grammar_builder b_;
  std::map<std::string, rule_id> ids_;
  std::map<std::string, size_t> used_at_;  ///< first mention, for "never defined"
  std::set<std::string> defined_;
  std::optional<rule_id> any_;
};

}  // namespace

result<std::shared_ptr<const grammar>> gbnf_grammar(std::string_view text) {
  if (text.size() > max_constraint_bytes) return invalid("gbnf: the grammar is too long");
  return gbnf_parser(text).parse();
}

}  // namespace llmesh::model
