// compile_constraint and choice_grammar (constraint.hpp), and the helpers the other compilers
// share (constraint_internal.hpp): UTF-8 byte sequences of code-point sets, and the JSON
// building blocks.
#include <algorithm>
#include <array>

#include "constraint_internal.hpp"
#include "llmesh/model/constraint.hpp"

namespace llmesh::model {

using namespace constraint_detail;

namespace constraint_detail {

// ---- UTF-8 --------------------------------------------------------------------------------

std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::optional<uint32_t> utf8_decode(std::string_view s, size_t& pos) {
  if (pos >= s.size()) return std::nullopt;
  const auto b0 = static_cast<uint8_t>(s[pos]);
  int n = 0;
  uint32_t cp = 0, min = 0;
  if (b0 < 0x80) {
    ++pos;
    return b0;
  } else if ((b0 & 0xE0) == 0xC0) {
    n = 1, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 2, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 3, cp = b0 & 0x07, min = 0x10000;
  } else {
    return std::nullopt;
  }
  if (pos + n >= s.size()) return std::nullopt;
  for (int i = 1; i <= n; ++i) {
    const auto b = static_cast<uint8_t>(s[pos + i]);
    if ((b & 0xC0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (b & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not well-formed.
  if (cp < min || cp > code_point_set::max_code_point || (cp >= 0xD800 && cp <= 0xDFFF)) return std::nullopt;
  pos += n + 1;
  return cp;
}

namespace {

/// Largest code point encoded in 1, 2 and 3 bytes.
constexpr std::array<uint32_t, 3> length_limits = {0x7F, 0x7FF, 0xFFFF};

// The interval is split until every piece encodes as one byte range per position (the split of
// Rust regex-syntax's Utf8Sequences): first at surrogates and encoded-length boundaries, then
// wherever a continuation byte would otherwise wrap.
void split_utf8(uint32_t lo, uint32_t hi, std::vector<std::vector<byte_range>>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) split_utf8(lo, 0xD7FF, out);
    if (hi > 0xDFFF) split_utf8(0xE000, hi, out);
    return;
  }
  for (uint32_t limit : length_limits) {
    if (lo <= limit && limit < hi) {
      split_utf8(lo, limit, out);
      split_utf8(limit + 1, hi, out);
      return;
    }
  }
  if (hi <= 0x7F) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_utf8(lo, lo | m, out);
        split_utf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split_utf8(lo, (hi & ~m) - 1, out);
        split_utf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = utf8_encode(lo), b = utf8_encode(hi);
  std::vector<byte_range> seq;
  for (size_t i = 0; i < a.size(); ++i) seq.push_back({static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])});
  out.push_back(std::move(seq));
}

}  // namespace

void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<byte_range>>& out) {
  split_utf8(lo, std::min(hi, code_point_set::max_code_point), out);
}

std::vector<sequence> utf8_alternatives(const code_point_set& s) {
  std::vector<std::vector<byte_range>> seqs;
  for (const auto& [lo, hi] : s.ranges()) utf8_sequences(lo, hi, seqs);
  std::vector<sequence> alts;
  byte_set ascii;
  for (const auto& seq : seqs) {
    if (seq.size() == 1) {
      ascii.add_range(seq[0].lo, seq[0].hi);
      continue;
    }
    sequence alt;
    for (const auto& r : seq) alt.push_back(grammar_builder::bytes(byte_set::range(r.lo, r.hi)));
    alts.push_back(std::move(alt));
  }
  if (!ascii.empty()) alts.insert(alts.begin(), sequence{grammar_builder::bytes(ascii)});
  return alts;
}

// ---- JSON building blocks ------------------------------------------------------------------

namespace {
using gb = grammar_builder;

byte_set digits() { return byte_set::range('0', '9'); }
byte_set chars(std::string_view s) {
  byte_set set;
  for (char c : s) set.add(static_cast<uint8_t>(c));
  return set;
}
sequence cat(sequence a, const sequence& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// Decimal strings of the values in [a, b], both of n digits (leading zeros allowed here: the
/// caller passes same-length bounds), appended to out as alternatives after prefix.
void same_length_range(std::string_view a, std::string_view b, const sequence& prefix, std::vector<sequence>& out) {
  if (a.empty()) {
    out.push_back(prefix);
    return;
  }
  if (a[0] == b[0]) {
    same_length_range(a.substr(1), b.substr(1), cat(prefix, {gb::byte(a[0])}), out);
    return;
  }
  const std::string zeros(a.size() - 1, '0'), nines(a.size() - 1, '9');
  char first_lo = a[0], first_hi = b[0];
  if (a.substr(1) != zeros) {
    same_length_range(a.substr(1), nines, cat(prefix, {gb::byte(a[0])}), out);
    ++first_lo;
  }
  if (b.substr(1) != nines) {
    same_length_range(zeros, b.substr(1), cat(prefix, {gb::byte(b[0])}), out);
    --first_hi;
  }
  if (first_lo <= first_hi) {
    sequence s = cat(prefix, {gb::bytes(byte_set::range(first_lo, first_hi))});
    for (size_t i = 1; i < a.size(); ++i) s.push_back(gb::bytes(digits()));
    out.push_back(std::move(s));
  }
}

/// Decimal strings without leading zeros of the values in [lo, hi], after prefix.
void unsigned_range(uint64_t lo, uint64_t hi, const sequence& prefix, std::vector<sequence>& out) {
  uint64_t first = 0, last = 9;  // the values with `digits` digits
  for (int n = 1; n <= 20 && first <= hi; ++n) {
    const uint64_t a = std::max(lo, first), b = std::min(hi, last);
    if (a <= b) same_length_range(std::to_string(a), std::to_string(b), prefix, out);
    if (n == 19) break;  // 10^19 - 1 is the last all-nines value below 2^64
    first = last + 1;
    last = last * 10 + 9;
  }
}

uint64_t all_nines(int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = v * 10 + 9;
  return v;
}
int digit_count(uint64_t v) { return static_cast<int>(std::to_string(v).size()); }
uint64_t magnitude(int64_t v) { return v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v); }

}  // namespace

rule_id json_rules::ws() {
  if (!ws_) {
    // Why 20: deep enough for pretty-printed JSON ten levels in at two spaces.
    const rule_id indent = b_.repeat("json-indent", {gb::bytes(chars(" \t"))}, 0, 20);
    ws_ = b_.add("ws", {{}, {gb::byte(' ')}, {gb::byte('\n'), gb::ref(indent)}});
  }
  return *ws_;
}

rule_id json_rules::string_char() {
  if (!string_char_) {
    code_point_set raw;
    raw.add(0x20, 0x21).add(0x23, 0x5B).add(0x5D, code_point_set::max_code_point);
    std::vector<sequence> alts = utf8_alternatives(raw);
    const byte_set hex = byte_set::range('0', '9').add_range('a', 'f').add_range('A', 'F');
    alts.push_back({gb::byte('\\'), gb::bytes(chars("\"\\/bfnrt"))});
    alts.push_back({gb::byte('\\'), gb::byte('u'), gb::bytes(hex), gb::bytes(hex), gb::bytes(hex), gb::bytes(hex)});
    string_char_ = b_.add("json-char", std::move(alts));
  }
  return *string_char_;
}

rule_id json_rules::string() {
  if (!string_) {
    const rule_id body = b_.star("json-chars", {gb::ref(string_char())});
    string_ = b_.add("string", {{gb::byte('"'), gb::ref(body), gb::byte('"')}});
  }
  return *string_;
}

namespace {
/// ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
rule_id unsigned_number(grammar_builder& b) {
  const rule_id more = b.repeat("json-int-digits", {gb::bytes(digits())}, 0, max_number_digits - 1);
  const rule_id int_part =
      b.add("json-int-part", {{gb::byte('0')}, {gb::bytes(byte_set::range('1', '9')), gb::ref(more)}});
  const rule_id frac_digits = b.repeat("json-frac-digits", {gb::bytes(digits())}, 1, max_number_digits);
  const rule_id frac = b.optional("json-frac", {gb::byte('.'), gb::ref(frac_digits)});
  // Why 3 exponent digits: doubles end near 1e308.
  const rule_id exp_digits = b.repeat("json-exp-digits", {gb::bytes(digits())}, 1, 3);
  const rule_id sign = b.optional("json-exp-sign", {gb::bytes(chars("+-"))});
  const rule_id exp = b.optional("json-exp", {gb::bytes(chars("eE")), gb::ref(sign), gb::ref(exp_digits)});
  return b.add("json-unsigned-number", {{gb::ref(int_part), gb::ref(frac), gb::ref(exp)}});
}
}  // namespace

rule_id json_rules::nonnegative_number() {
  if (!nonnegative_number_) nonnegative_number_ = unsigned_number(b_);
  return *nonnegative_number_;
}

rule_id json_rules::number() {
  if (!number_) {
    const rule_id u = nonnegative_number();
    number_ = b_.add("number", {{gb::ref(u)}, {gb::byte('-'), gb::ref(u)}});
  }
  return *number_;
}

rule_id json_rules::integer() {
  if (!integer_) {
    const rule_id more = b_.repeat("json-int-digits", {gb::bytes(digits())}, 0, max_number_digits - 1);
    const rule_id nonzero = b_.add("json-nonzero-int", {{gb::bytes(byte_set::range('1', '9')), gb::ref(more)}});
    integer_ = b_.add("integer", {{gb::byte('0')}, {gb::ref(nonzero)}, {gb::byte('-'), gb::ref(nonzero)}});
  }
  return *integer_;
}

result<rule_id> json_rules::integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) return invalid("the integer range is empty");
  // An unbounded side reaches as many digits as the other bound has, and at least the usual
  // max_number_digits.
  int n = max_number_digits;
  if (lo) n = std::max(n, digit_count(magnitude(*lo)));
  if (hi) n = std::max(n, digit_count(magnitude(*hi)));
  const uint64_t cap = all_nines(n);
  std::vector<sequence> alts;
  // Negative values: "-" then the magnitudes in [max(1, -hi), -lo].
  if (!lo || *lo < 0) {
    const uint64_t mag_hi = lo ? magnitude(*lo) : cap;
    const uint64_t mag_lo = hi && *hi < 0 ? magnitude(*hi) : 1;
    if (mag_lo <= mag_hi) unsigned_range(mag_lo, mag_hi, {gb::byte('-')}, alts);
  }
  if (!hi || *hi >= 0) {
    const uint64_t a = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    const uint64_t b = hi ? static_cast<uint64_t>(*hi) : cap;
    if (a <= b) unsigned_range(a, b, {}, alts);
  }
  if (alts.empty()) return invalid("the integer range is empty");
  return b_.add("integer-range", std::move(alts));
}

rule_id json_rules::boolean() {
  if (!boolean_) boolean_ = b_.add("boolean", {gb::literal("true"), gb::literal("false")});
  return *boolean_;
}

rule_id json_rules::null() {
  if (!null_) null_ = b_.add("null", {gb::literal("null")});
  return *null_;
}

rule_id json_rules::value() {
  if (!value_) {
    // Declared first: objects and arrays hold values.
    value_ = b_.declare("value");
    const rule_id obj = object(), arr = array();
    b_.define(*value_, {{gb::ref(obj)}, {gb::ref(arr)}, {gb::ref(string())}, {gb::ref(number())},
                        {gb::ref(boolean())}, {gb::ref(null())}});
  }
  return *value_;
}

rule_id json_rules::object() {
  if (!object_) {
    object_ = b_.declare("object");
    const rule_id w = ws();
    // member ::= string ws ":" ws value ws ; object ::= "{" ws (member ("," ws member)*)? "}"
    const rule_id member =
        b_.add("member", {{gb::ref(string()), gb::ref(w), gb::byte(':'), gb::ref(w), gb::ref(value()), gb::ref(w)}});
    const rule_id more = b_.star("members-rest", {gb::byte(','), gb::ref(w), gb::ref(member)});
    const rule_id members = b_.optional("members", {gb::ref(member), gb::ref(more)});
    b_.define(*object_, {{gb::byte('{'), gb::ref(w), gb::ref(members), gb::byte('}')}});
  }
  return *object_;
}

rule_id json_rules::array() {
  if (!array_) {
    array_ = b_.declare("array");
    const rule_id w = ws();
    const rule_id item = b_.add("item", {{gb::ref(value()), gb::ref(w)}});
    const rule_id more = b_.star("items-rest", {gb::byte(','), gb::ref(w), gb::ref(item)});
    const rule_id items = b_.optional("items", {gb::ref(item), gb::ref(more)});
    b_.define(*array_, {{gb::byte('['), gb::ref(w), gb::ref(items), gb::byte(']')}});
  }
  return *array_;
}

}  // namespace constraint_detail

// ---- entry points ----------------------------------------------------------------------------

namespace constraint_detail {

namespace {
thread_local size_t budget_work = 0;
thread_local int budget_depth = 0;
}  // namespace

spec_budget::spec_budget() {
  if (budget_depth++ == 0) budget_work = 0;
}
spec_budget::~spec_budget() { --budget_depth; }
size_t* spec_budget::spent() { return budget_depth > 0 ? &budget_work : nullptr; }

rule_id literals_rule(grammar_builder& b, const std::string& name, std::vector<std::string> literals) {
  std::sort(literals.begin(), literals.end());
  literals.erase(std::unique(literals.begin(), literals.end()), literals.end());
  // The literals in [lo, hi) share their first `depth` bytes: one rule for what may follow.
  auto node = [&](auto&& self, size_t lo, size_t hi, size_t depth) -> rule_id {
    std::vector<sequence> alts;
    if (literals[lo].size() == depth) alts.push_back({}), ++lo;  // sorted: the one that ends here comes first
    while (lo < hi) {
      const char c = literals[lo][depth];
      size_t end = lo;
      while (end < hi && literals[end][depth] == c) ++end;
      // Follow the run of bytes all of [lo, end) share, then branch (or end) in a new rule.
      size_t d = depth + 1;
      while (literals[lo].size() > d && literals[end - 1].size() > d && literals[lo][d] == literals[end - 1][d]) ++d;
      sequence seq = grammar_builder::literal(std::string_view(literals[lo]).substr(depth, d - depth));
      if (!(end - lo == 1 && literals[lo].size() == d)) seq.push_back(grammar_builder::ref(self(self, lo, end, d)));
      alts.push_back(std::move(seq));
      lo = end;
    }
    return b.add(name, std::move(alts));
  };
  return node(node, 0, literals.size(), 0);
}

}  // namespace constraint_detail

result<std::shared_ptr<const grammar>> choice_grammar(std::span<const std::string> choices) {
  if (choices.empty()) return invalid("choice: the list of choices is empty");
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) return invalid("choice: choice " + std::to_string(i) + " is empty");
  }
  grammar_builder b;
  const rule_id root = literals_rule(b, "choice", std::vector<std::string>(choices.begin(), choices.end()));
  return std::move(b).build(root);
}

result<std::shared_ptr<const grammar>> compile_constraint(const constraint_spec& spec) {
  using kind = constraint_spec::kind;
  if (spec.type == kind::none) return invalid("constraint: no constraint to compile");
  spec_budget budget;
  if (spec.text.size() > max_constraint_bytes) {
    return invalid("constraint: the spec is " + std::to_string(spec.text.size()) + " bytes, more than the " +
                   std::to_string(max_constraint_bytes) + " accepted");
  }
  switch (spec.type) {
    case kind::json_object:
      return ordered_json_schema_grammar(ordered_json{{"type", "object"}});
    case kind::json_schema: {
      // Parsing is iterative in nlohmann; the depth check then guards what recurses.
      ordered_json schema = ordered_json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return invalid("json schema: the schema is not valid JSON");
      return ordered_json_schema_grammar(schema);
    }
    case kind::regex:
      return regex_grammar(spec.text);
    case kind::choice: {
      ordered_json list = ordered_json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      if (list.is_discarded() || !list.is_array())
        return invalid("choice: the choices must be a JSON array of strings");
      std::vector<std::string> choices;
      for (const auto& c : list) {
        if (!c.is_string()) return invalid("choice: the choices must be a JSON array of strings");
        choices.push_back(c.get<std::string>());
      }
      return choice_grammar(choices);
    }
    case kind::grammar:
      return gbnf_grammar(spec.text);
    case kind::none:
      break;
  }
  return invalid("constraint: unknown kind");
}

}  // namespace llmesh::model
