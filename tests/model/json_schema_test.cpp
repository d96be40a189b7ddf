// JSON Schema to grammar (json_schema_grammar through compile_constraint): valid documents,
// compact and pretty-printed, are accepted and invalid ones refused (wrong types, missing
// required, extra keys, bad escapes, invalid UTF-8, integers out of range checked exhaustively),
// and every unsupported keyword is an invalid_request naming the subschema and the keyword.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar_match.hpp"
#include "llmesh/model/constraint.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::ordered_json;
using testing::compile_error;
using testing::matches;
constexpr auto schema_kind = constraint_spec::kind::json_schema;

std::shared_ptr<const grammar> schema(const json& s) { return testing::compile_ok(schema_kind, s.dump()); }

/// Accepted compact and pretty-printed (2-space indent).
void expect_accepts(const std::shared_ptr<const grammar>& g, const json& doc) {
  EXPECT_TRUE(matches(g, doc.dump())) << doc.dump();
  EXPECT_TRUE(matches(g, doc.dump(2))) << doc.dump(2);
}
void expect_refuses(const std::shared_ptr<const grammar>& g, const std::string& text) {
  EXPECT_FALSE(matches(g, text)) << text;
}

const json person = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer", "minimum": 0},
    "email": {"type": "string", "format": "email"},
    "tags": {"type": "array", "items": {"type": "string"}}
  },
  "required": ["name", "age"]
})");

TEST(JsonSchema, ObjectPropertiesInDeclaredOrderRequiredAndOptional) {
  auto g = schema(person);
  ASSERT_TRUE(g);
  expect_accepts(g, json::parse(R"({"name":"Ann","age":31})"));
  expect_accepts(g, json::parse(R"({"name":"Ann","age":31,"tags":["a","b"]})"));
  expect_accepts(g, json::parse(R"({"name":"Ann","age":31,"email":"ann@example.com","tags":[]})"));
  expect_accepts(g, json::parse(R"({"name":"","age":0,"email":"a.b+c@d-e.example.org"})"));
  EXPECT_TRUE(matches(g, R"({ "name" : "Ann" , "age" : 31 })"));
  EXPECT_TRUE(matches(g, "{\n\t\"name\": \"Ann\",\n\t\"age\": 31\n}"));
  expect_refuses(g, R"({"age":31,"name":"Ann"})");             // order is fixed
  expect_refuses(g, R"({"name":"Ann"})");                      // missing required
  expect_refuses(g, R"({"age":31})");                          // missing required
  expect_refuses(g, R"({})");
  expect_refuses(g, R"({"name":"Ann","age":31,"x":1})");       // extra key
  expect_refuses(g, R"({"name":"Ann","age":-1})");             // minimum
  expect_refuses(g, R"({"name":"Ann","age":31.5})");           // integer
  expect_refuses(g, R"({"name":1,"age":31})");                 // type
  expect_refuses(g, R"({"name":"Ann","age":31,})");            // trailing comma
  expect_refuses(g, R"({"name":"Ann",,"age":31})");
  expect_refuses(g, R"({"name":"Ann","age":31,"email":"no-at-sign"})");
  expect_refuses(g, R"({"name":"Ann","age":31,"tags":[1]})");
  expect_refuses(g, R"( {"name":"Ann","age":31})");            // no leading whitespace
  expect_refuses(g, R"({"name":"Ann","age":31} )");            // nor trailing
  expect_refuses(g, R"({"name":"Ann" "age":31})");
}

TEST(JsonSchema, WhitespaceIsBounded) {
  auto g = schema(json{{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}});
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "{\n" + std::string(20, ' ') + "\"a\": 1}"));
  EXPECT_FALSE(matches(g, "{\n" + std::string(21, ' ') + "\"a\": 1}"));
  EXPECT_FALSE(matches(g, "{\n\n\"a\": 1}"));
  EXPECT_FALSE(matches(g, "{  \"a\": 1}"));
  EXPECT_FALSE(matches(g, "{\r\n\"a\": 1}"));
}

TEST(JsonSchema, StringsTakeEscapesAndWellFormedUtf8Only) {
  auto g = schema(json{{"type", "string"}});
  ASSERT_TRUE(g);
  for (const char* ok : {R"("")", R"("plain")", R"("\"\\\/\b\f\n\r\t")", R"("\u00e9\uD83D\uDE00\u0000")", "\"caf\xC3\xA9\"",
                         "\"\xE2\x82\xAC \xF0\x9F\x98\x80 \xEF\xBF\xBF \xF4\x8F\xBF\xBF\"", "\"\x7F\""}) {
    EXPECT_TRUE(matches(g, ok)) << ok;
  }
  for (const char* bad : {R"("\a")", R"("\u12G4")", R"("\u123")", R"("\x41")", "\"a\nb\"", "\"a\tb\"", "\"\x01\"", R"("abc)",
                          R"("a"b")", "\"\xC0\xAF\"", "\"\xC1\xBF\"", "\"\xE0\x9F\xBF\"", "\"\xED\xA0\x80\"",
                          "\"\xF0\x8F\xBF\xBF\"", "\"\xF4\x90\x80\x80\"", "\"\xF5\x80\x80\x80\"", "\"\x80\"", "\"\xC3\"",
                          "\"\xE2\x82\"", "\"\xFF\""}) {
    EXPECT_FALSE(matches(g, bad)) << bad;
  }
}

/// The standard's table of well-formed UTF-8 (Unicode 15, table 3-7), written independently of
/// the code under test.
bool well_formed_char(const std::string& s) {
  auto in = [&](size_t i, int lo, int hi) { return i < s.size() && (uint8_t)s[i] >= lo && (uint8_t)s[i] <= hi; };
  const int b0 = s.empty() ? -1 : (uint8_t)s[0];
  size_t n = 0;
  if (b0 >= 0 && b0 <= 0x7F) n = 1;
  else if (b0 >= 0xC2 && b0 <= 0xDF) n = in(1, 0x80, 0xBF) ? 2 : 0;
  else if (b0 == 0xE0) n = in(1, 0xA0, 0xBF) && in(2, 0x80, 0xBF) ? 3 : 0;
  else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) n = in(1, 0x80, 0xBF) && in(2, 0x80, 0xBF) ? 3 : 0;
  else if (b0 == 0xED) n = in(1, 0x80, 0x9F) && in(2, 0x80, 0xBF) ? 3 : 0;
  else if (b0 == 0xF0) n = in(1, 0x90, 0xBF) && in(2, 0x80, 0xBF) && in(3, 0x80, 0xBF) ? 4 : 0;
  else if (b0 >= 0xF1 && b0 <= 0xF3) n = in(1, 0x80, 0xBF) && in(2, 0x80, 0xBF) && in(3, 0x80, 0xBF) ? 4 : 0;
  else if (b0 == 0xF4) n = in(1, 0x80, 0x8F) && in(2, 0x80, 0xBF) && in(3, 0x80, 0xBF) ? 4 : 0;
  return n != 0 && n == s.size();
}

TEST(JsonSchema, StringCharactersFollowTheUtf8TableExhaustively) {
  auto g = schema(json{{"type", "string"}, {"maxLength", 1}});
  ASSERT_TRUE(g);
  auto expect_char = [&](const std::string& c) {
    const bool raw_ok = well_formed_char(c) && (uint8_t)c[0] >= 0x20 && c != "\"" && c != "\\";
    const bool escape_ok = c.size() == 2 && c[0] == '\\' && std::string_view("\"\\/bfnrt").find(c[1]) != std::string_view::npos;
    ASSERT_EQ(matches(g, "\"" + c + "\""), raw_ok || escape_ok) << std::hex << (int)(uint8_t)c[0] << " " << c.size();
  };
  for (int a = 0; a < 256; ++a) {
    expect_char(std::string(1, (char)a));
    for (int b = 0; b < 256; ++b) expect_char(std::string{(char)a, (char)b});
  }
  for (int a : {0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF4}) {
    for (int b = 0x70; b < 0xD0; ++b) {
      for (int c = 0x70; c < 0xD0; ++c) expect_char(std::string{(char)a, (char)b, (char)c});
    }
  }
  for (int a : {0xF0, 0xF1, 0xF3, 0xF4, 0xF5}) {
    for (int b = 0x7F; b < 0xC1; ++b) {
      for (int c : {0x7F, 0x80, 0xBF, 0xC0}) {
        for (int d : {0x7F, 0x80, 0xA5, 0xBF, 0xC0}) expect_char(std::string{(char)a, (char)b, (char)c, (char)d});
      }
    }
  }
}

TEST(JsonSchema, StringLengthCountsCharacters) {
  auto g = schema(json{{"type", "string"}, {"minLength", 2}, {"maxLength", 3}});
  ASSERT_TRUE(g);
  EXPECT_FALSE(matches(g, R"("a")"));
  EXPECT_TRUE(matches(g, R"("ab")"));
  EXPECT_TRUE(matches(g, "\"\xC3\xA9\xF0\x9F\x98\x80\""));  // two characters, six bytes
  EXPECT_TRUE(matches(g, R"("\n\u0041c")"));                 // escapes are one character each
  EXPECT_FALSE(matches(g, R"("abcd")"));
  EXPECT_FALSE(matches(g, "\"\xC3\xA9\""));
}

TEST(JsonSchema, PatternsAreUnanchoredUnlessAnchoredAndSeeTheDecodedValue) {
  auto anchored = schema(json{{"type", "string"}, {"pattern", "^[a-z]+-[0-9]{2}$"}});
  ASSERT_TRUE(anchored);
  EXPECT_TRUE(matches(anchored, R"("abc-12")"));
  EXPECT_FALSE(matches(anchored, R"("abc-123")"));
  EXPECT_FALSE(matches(anchored, R"("xabc-1")"));
  auto search = schema(json{{"type", "string"}, {"pattern", "ab+c"}});
  ASSERT_TRUE(search);
  EXPECT_TRUE(matches(search, R"("abbc")"));
  EXPECT_TRUE(matches(search, R"("xx abc\nyy")"));
  EXPECT_TRUE(matches(search, "\"\xC3\xA9" "abc\""));
  EXPECT_FALSE(matches(search, R"("ac")"));
  // A quote, a backslash and a newline in the value are written escaped.
  auto quoted = schema(json{{"type", "string"}, {"pattern", "^a\"\\\\\\n$"}});
  ASSERT_TRUE(quoted);
  EXPECT_TRUE(matches(quoted, R"("a\"\\\n")"));
  EXPECT_FALSE(matches(quoted, "\"a\"\\\n\""));
  EXPECT_NE(compile_error(schema_kind, json{{"type", "string"}, {"pattern", "(a"}}.dump()).find("'pattern'"), std::string::npos);
}

TEST(JsonSchema, FormatsThatAreEnforced) {
  auto check = [](const char* format, std::vector<std::string> good, std::vector<std::string> bad) {
    auto g = schema(json{{"type", "string"}, {"format", format}});
    ASSERT_TRUE(g);
    for (const auto& s : good) EXPECT_TRUE(matches(g, json(s).dump())) << format << " " << s;
    for (const auto& s : bad) EXPECT_FALSE(matches(g, json(s).dump())) << format << " " << s;
  };
  check("date", {"2024-02-29", "1999-12-31"}, {"2024-13-01", "2024-00-10", "2024-1-01", "24-01-01", "2024-01-32"});
  check("time", {"23:59:60Z", "00:00:00.123+05:30"}, {"24:00:00Z", "12:00:00", "12:60:00Z"});
  check("date-time", {"2024-02-29T12:30:00Z", "2024-02-29T12:30:00.5-08:00"}, {"2024-02-29 12:30:00Z", "2024-02-29T12:30Z"});
  check("uuid", {"123e4567-e89b-12d3-A456-426614174000"}, {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"});
  check("ipv4", {"0.0.0.0", "255.255.255.255", "10.1.20.199"}, {"256.1.1.1", "1.2.3", "01.2.3.4", "1.2.3.4.5"});
  check("email", {"a@b.co", "first.last+tag@sub.example.org"}, {"a@b", "@b.co", "a b@c.de"});
  // Other formats are annotations: any string.
  auto uri = schema(json{{"type", "string"}, {"format", "uri"}});
  ASSERT_TRUE(uri);
  EXPECT_TRUE(matches(uri, R"("not a uri at all")"));
}

/// Integers in [lo, hi] are accepted and nothing else, for every value in -150..1250.
void expect_integer_range(const json& s, std::optional<int64_t> lo, std::optional<int64_t> hi) {
  auto g = schema(s);
  ASSERT_TRUE(g) << s.dump();
  for (int64_t v = -150; v <= 1250; ++v) {
    const bool in = (!lo || v >= *lo) && (!hi || v <= *hi);
    ASSERT_EQ(matches(g, std::to_string(v)), in) << s.dump() << " at " << v;
  }
  for (const char* bad : {"-0", "00", "01", "+1", "1.0", "1e2", "-", ""}) EXPECT_FALSE(matches(g, bad)) << bad;
}

TEST(JsonSchema, IntegerBoundsAreExactOverARange) {
  expect_integer_range(json{{"type", "integer"}}, std::nullopt, std::nullopt);
  expect_integer_range(json{{"type", "integer"}, {"minimum", 0}}, 0, std::nullopt);
  expect_integer_range(json{{"type", "integer"}, {"minimum", 7}}, 7, std::nullopt);
  expect_integer_range(json{{"type", "integer"}, {"maximum", -3}}, std::nullopt, -3);
  expect_integer_range(json{{"type", "integer"}, {"minimum", -5}, {"maximum", 17}}, -5, 17);
  expect_integer_range(json{{"type", "integer"}, {"minimum", 99}, {"maximum", 101}}, 99, 101);
  expect_integer_range(json{{"type", "integer"}, {"minimum", 0}, {"maximum", 0}}, 0, 0);
  expect_integer_range(json{{"type", "integer"}, {"minimum", -120}, {"maximum", -100}}, -120, -100);
  expect_integer_range(json{{"type", "integer"}, {"minimum", 10}, {"maximum", 1000}}, 10, 1000);
  expect_integer_range(json{{"type", "integer"}, {"minimum", 1}, {"maximum", 1200}}, 1, 1200);
  expect_integer_range(json{{"type", "integer"}, {"minimum", 190}, {"maximum", 1109}}, 190, 1109);
  expect_integer_range(json{{"type", "integer"}, {"exclusiveMinimum", -100}, {"exclusiveMaximum", 1000}}, -99, 999);
  expect_integer_range(json{{"type", "integer"}, {"minimum", 1.5}, {"maximum", 10.2}}, 2, 10);
  expect_integer_range(json{{"type", "integer"}, {"exclusiveMinimum", 1.5}, {"exclusiveMaximum", 10.0}}, 2, 9);
  expect_integer_range(json{{"type", "integer"}, {"minimum", 5}, {"exclusiveMinimum", true}, {"maximum", 50}}, 6, 50);
  expect_integer_range(json{{"type", "integer"}, {"minimum", -1000}, {"exclusiveMaximum", 0}}, -1000, -1);
}

TEST(JsonSchema, IntegerBoundsAtTheEdgesOfInt64) {
  auto g = schema(json{{"type", "integer"}, {"minimum", std::numeric_limits<int64_t>::min()},
                       {"maximum", std::numeric_limits<int64_t>::max()}});
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "9223372036854775807"));
  EXPECT_FALSE(matches(g, "9223372036854775808"));
  EXPECT_TRUE(matches(g, "-9223372036854775808"));
  EXPECT_FALSE(matches(g, "-9223372036854775809"));
  EXPECT_TRUE(matches(g, "0"));
  auto big = schema(json{{"type", "integer"}, {"minimum", 1000000000000000000LL}});
  ASSERT_TRUE(big);
  EXPECT_TRUE(matches(big, "1000000000000000000"));
  EXPECT_TRUE(matches(big, "9999999999999999999"));
  EXPECT_FALSE(matches(big, "999999999999999999"));
  auto any = schema(json{{"type", "integer"}});
  ASSERT_TRUE(any);
  EXPECT_TRUE(matches(any, "-9999999999999999"));  // 16 digits: the bound without a schema bound
  EXPECT_FALSE(matches(any, "99999999999999999"));
  EXPECT_NE(compile_error(schema_kind, R"({"type":"integer","minimum":1e30})").find("minimum"), std::string::npos);
  compile_error(schema_kind, R"({"type":"integer","minimum":5,"maximum":4})");
  compile_error(schema_kind, R"({"type":"integer","exclusiveMinimum":4,"exclusiveMaximum":5})");
}

TEST(JsonSchema, NumbersAndTheirSign) {
  auto g = schema(json{{"type", "number"}});
  ASSERT_TRUE(g);
  for (const char* ok : {"0", "-0", "1.5", "-12.25e+3", "3E-7", "1e300", "0.0001"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "--1", "1.5.5", "NaN", "12345678901234567"}) {
    EXPECT_FALSE(matches(g, bad)) << bad;
  }
  auto positive = schema(json{{"type", "number"}, {"minimum", 0}, {"maximum", 1}});
  ASSERT_TRUE(positive);
  EXPECT_TRUE(matches(positive, "0.5"));
  EXPECT_FALSE(matches(positive, "-0.5"));
  auto excl = schema(json{{"type", "number"}, {"exclusiveMinimum", 0}});
  ASSERT_TRUE(excl);
  EXPECT_FALSE(matches(excl, "-1"));
  auto negative_ok = schema(json{{"type", "number"}, {"minimum", -1}});
  ASSERT_TRUE(negative_ok);
  EXPECT_TRUE(matches(negative_ok, "-1"));
}

TEST(JsonSchema, EnumConstAndTypeLists) {
  auto e = schema(json::parse(R"({"enum":["red", 1, null, {"x":[1,2]}, true, "sp ace"]})"));
  ASSERT_TRUE(e);
  for (const char* ok : {R"("red")", "1", "null", R"({"x":[1,2]})", "true", R"("sp ace")"}) EXPECT_TRUE(matches(e, ok)) << ok;
  for (const char* bad : {R"("blue")", "2", "false", R"({"x": [1,2]})", "red"}) EXPECT_FALSE(matches(e, bad)) << bad;
  auto typed = schema(json::parse(R"({"type":"string","enum":["a", 1, "b"]})"));
  ASSERT_TRUE(typed);
  EXPECT_TRUE(matches(typed, R"("b")"));
  EXPECT_FALSE(matches(typed, "1"));
  auto c = schema(json::parse(R"({"const":"fixed"})"));
  ASSERT_TRUE(c);
  EXPECT_TRUE(matches(c, R"("fixed")"));
  EXPECT_FALSE(matches(c, R"("fixe")"));
  auto list = schema(json::parse(R"({"type":["integer","null"]})"));
  ASSERT_TRUE(list);
  EXPECT_TRUE(matches(list, "12"));
  EXPECT_TRUE(matches(list, "null"));
  EXPECT_FALSE(matches(list, R"("12")"));
  auto nullable = schema(json::parse(R"({"type":"boolean","nullable":true})"));
  ASSERT_TRUE(nullable);
  EXPECT_TRUE(matches(nullable, "false"));
  EXPECT_TRUE(matches(nullable, "null"));
  EXPECT_FALSE(matches(nullable, "0"));
  compile_error(schema_kind, R"({"type":"integer","enum":["a"]})");
}

TEST(JsonSchema, AnyOfOneOfAndAllOf) {
  auto any = schema(json::parse(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})"));
  ASSERT_TRUE(any);
  EXPECT_TRUE(matches(any, "5"));
  EXPECT_TRUE(matches(any, R"("ab")"));
  EXPECT_FALSE(matches(any, R"("abc")"));
  EXPECT_FALSE(matches(any, "true"));
  auto one = schema(json::parse(R"({"oneOf":[{"const":1},{"const":2}],"nullable":true})"));
  ASSERT_TRUE(one);
  EXPECT_TRUE(matches(one, "2"));
  EXPECT_TRUE(matches(one, "null"));
  EXPECT_FALSE(matches(one, "3"));
  auto all = schema(json::parse(R"({
    "$defs": {"base": {"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]}},
    "allOf": [{"$ref":"#/$defs/base"}, {"properties":{"name":{"type":"string"}}}]})"));
  ASSERT_TRUE(all);
  EXPECT_TRUE(matches(all, R"({"id":1,"name":"x"})"));
  EXPECT_TRUE(matches(all, R"({"id":1})"));
  EXPECT_FALSE(matches(all, R"({"name":"x"})"));
  EXPECT_FALSE(matches(all, R"({"id":1,"other":2})"));
  auto both = schema(json::parse(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                                                {"properties":{"b":{"type":"integer"}},"required":["b"]}]})"));
  ASSERT_TRUE(both);
  EXPECT_TRUE(matches(both, R"({"a":1,"b":2})"));
  EXPECT_FALSE(matches(both, R"({"a":1})"));
  EXPECT_FALSE(matches(both, R"({"b":2})"));
  auto ref_beside = schema(json::parse(R"({"$defs":{"s":{"type":"string"}},"$ref":"#/$defs/s","maxLength":1})"));
  ASSERT_TRUE(ref_beside);
  EXPECT_TRUE(matches(ref_beside, R"("a")"));
  EXPECT_FALSE(matches(ref_beside, R"("ab")"));
  auto msg = compile_error(schema_kind, R"({"allOf":[{"type":"string"},{"type":"integer"}]})");
  EXPECT_NE(msg.find("type"), std::string::npos) << msg;
  msg = compile_error(schema_kind, R"({"type":"object","anyOf":[{"required":["a"]}]})");
  EXPECT_NE(msg.find("anyOf"), std::string::npos) << msg;
}

TEST(JsonSchema, RecursiveRefs) {
  auto tree = schema(json::parse(R"({
    "$defs": {"node": {"type":"object","properties":{"value":{"type":"integer"},
      "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["value"]}},
    "$ref": "#/$defs/node"})"));
  ASSERT_TRUE(tree);
  expect_accepts(tree, json::parse(R"({"value":1,"children":[{"value":2},{"value":3,"children":[{"value":4,"children":[]}]}]})"));
  expect_refuses(tree, R"({"value":1,"children":[{"children":[]}]})");
  auto list = schema(json::parse(R"({"type":"object","properties":{"head":{"type":"string"},"tail":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["head","tail"]})"));
  ASSERT_TRUE(list);
  EXPECT_TRUE(matches(list, R"({"head":"a","tail":{"head":"b","tail":null}})"));
  EXPECT_FALSE(matches(list, R"({"head":"a","tail":{"head":"b"}})"));
  auto legacy = schema(json::parse(R"({"definitions":{"a b/c":{"type":"boolean"}},"$ref":"#/definitions/a%20b~1c"})"));
  ASSERT_TRUE(legacy);
  EXPECT_TRUE(matches(legacy, "true"));
  compile_error(schema_kind, R"({"$ref":"#/$defs/missing"})");
  compile_error(schema_kind, R"({"$ref":"https://example.com/schema.json"})");
  compile_error(schema_kind, R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})");  // a cycle with no bytes
}

TEST(JsonSchema, AdditionalProperties) {
  auto strict = schema(json::parse(R"({"type":"object","properties":{"a":{"type":"integer"}}})"));
  ASSERT_TRUE(strict);
  EXPECT_TRUE(matches(strict, R"({"a":1})"));
  EXPECT_TRUE(matches(strict, R"({})"));
  EXPECT_FALSE(matches(strict, R"({"a":1,"b":2})"));
  auto open = schema(json::parse(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})"));
  ASSERT_TRUE(open);
  EXPECT_TRUE(matches(open, R"({"a":1,"b":[2],"c":{}})"));
  EXPECT_TRUE(matches(open, R"({"b":2})"));
  EXPECT_FALSE(matches(open, R"({"b":2,"a":1,})"));
  auto typed = schema(json::parse(R"({"type":"object","additionalProperties":{"type":"integer"},"required":["n"]})"));
  ASSERT_TRUE(typed);
  EXPECT_TRUE(matches(typed, R"({"n":1,"m":2})"));
  EXPECT_FALSE(matches(typed, R"({"n":1,"m":"x"})"));
  EXPECT_FALSE(matches(typed, R"({"m":1})"));
  auto none = schema(json::parse(R"({"type":"object","additionalProperties":false})"));
  ASSERT_TRUE(none);
  EXPECT_TRUE(matches(none, "{}"));
  EXPECT_FALSE(matches(none, R"({"a":1})"));
  auto any = schema(json::parse(R"({"type":"object"})"));
  ASSERT_TRUE(any);
  expect_accepts(any, json::parse(R"({"k":[1,{"z":null}],"s":"t","n":-1.5e3,"b":false})"));
  EXPECT_FALSE(matches(any, "[]"));
  // Optional properties skipped in any combination, in order.
  auto many = schema(json::parse(R"({"type":"object","properties":{"a":{"const":1},"b":{"const":2},"c":{"const":3},"d":{"const":4}},"required":["c"]})"));
  ASSERT_TRUE(many);
  for (int mask = 0; mask < 16; ++mask) {
    json doc = json::object();
    for (int i = 0; i < 4; ++i) {
      if (mask & (1 << i)) doc[std::string(1, static_cast<char>('a' + i))] = i + 1;
    }
    EXPECT_EQ(matches(many, doc.dump()), (mask & 4) != 0) << doc.dump();
  }
  EXPECT_FALSE(matches(many, R"({"c":3,"a":1})"));
}

TEST(JsonSchema, Arrays) {
  auto bounded = schema(json::parse(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":4})"));
  ASSERT_TRUE(bounded);
  for (int n = 0; n <= 8; ++n) {
    json doc = json::array();
    for (int i = 0; i < n; ++i) doc.push_back(i);
    EXPECT_EQ(matches(bounded, doc.dump()), n >= 2 && n <= 4) << n;
    EXPECT_EQ(matches(bounded, doc.dump(2)), n >= 2 && n <= 4) << n;
  }
  EXPECT_FALSE(matches(bounded, R"([1,"2"])"));
  auto tuple = schema(json::parse(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})"));
  ASSERT_TRUE(tuple);
  EXPECT_TRUE(matches(tuple, R"(["a",1])"));
  EXPECT_TRUE(matches(tuple, R"(["a"])"));
  EXPECT_TRUE(matches(tuple, R"([])"));
  EXPECT_FALSE(matches(tuple, R"(["a",1,2])"));
  EXPECT_FALSE(matches(tuple, R"([1,"a"])"));
  auto tuple_rest = schema(json::parse(R"({"type":"array","prefixItems":[{"const":"x"}],"items":{"type":"boolean"},"minItems":1})"));
  ASSERT_TRUE(tuple_rest);
  EXPECT_TRUE(matches(tuple_rest, R"(["x",true,false])"));
  EXPECT_FALSE(matches(tuple_rest, R"([])"));
  EXPECT_FALSE(matches(tuple_rest, R"(["x",1])"));
  // Ending is allowed from minItems on, inside the prefix too.
  auto prefix_min = schema(json::parse(R"({"type":"array","prefixItems":[{"const":1},{"const":2},{"const":3}],"minItems":2,"items":false})"));
  ASSERT_TRUE(prefix_min);
  for (int n = 0; n <= 4; ++n) {
    json doc = json::array();
    for (int i = 1; i <= n; ++i) doc.push_back(i);
    EXPECT_EQ(matches(prefix_min, doc.dump()), n == 2 || n == 3) << n;
  }
  auto draft4 = schema(json::parse(R"({"type":"array","items":[{"type":"null"}],"additionalItems":{"type":"integer"}})"));
  ASSERT_TRUE(draft4);
  EXPECT_TRUE(matches(draft4, "[null,1,2]"));
  EXPECT_FALSE(matches(draft4, "[1]"));
  auto empty = schema(json::parse(R"({"type":"array","maxItems":0})"));
  ASSERT_TRUE(empty);
  EXPECT_TRUE(matches(empty, "[]"));
  EXPECT_FALSE(matches(empty, "[1]"));
  compile_error(schema_kind, R"({"type":"array","maxItems":100000})");
  compile_error(schema_kind, R"({"type":"array","minItems":3,"maxItems":2})");
}

TEST(JsonSchema, UntypedSchemasAndJsonObject) {
  for (const char* text : {"{}", "true"}) {
    auto g = testing::compile_ok(schema_kind, text);
    ASSERT_TRUE(g);
    for (const char* ok : {"1", R"("s")", "[1,[2]]", R"({"a":{}})", "null"}) EXPECT_TRUE(matches(g, ok)) << ok;
  }
  auto untyped = schema(json::parse(R"({"minLength":2})"));  // applies to strings only
  ASSERT_TRUE(untyped);
  EXPECT_TRUE(matches(untyped, "12"));
  EXPECT_FALSE(matches(untyped, R"("a")"));
  auto obj = testing::compile_ok(constraint_spec::kind::json_object, "");
  ASSERT_TRUE(obj);
  expect_accepts(obj, json::parse(R"({"a":[1,2,{"b":null}],"c":"d\n"})"));
  expect_accepts(obj, json::object());
  for (const char* bad : {"[]", "1", R"("{}")", " {}", "{} ", R"({"a"})", R"({"a":})", R"({a:1})", "{", R"({"a":1,})"}) {
    EXPECT_FALSE(matches(obj, bad)) << bad;
  }
}

TEST(JsonSchema, UnsupportedKeywordsAreRefusedWithTheirPointer) {
  struct refusal {
    const char* schema;
    const char* pointer;
    const char* keyword;
  };
  for (const auto& r : std::vector<refusal>{
           {R"({"type":"object","properties":{"a":{"type":"number","multipleOf":2}}})", "#/properties/a", "multipleOf"},
           {R"({"type":"object","minProperties":1})", "#", "minProperties"},
           {R"({"type":"object","patternProperties":{"^x":{}}})", "#", "patternProperties"},
           {R"({"type":"object","propertyNames":{"maxLength":3}})", "#", "propertyNames"},
           {R"({"type":"object","dependentRequired":{"a":["b"]}})", "#", "dependentRequired"},
           {R"({"type":"array","items":{"not":{"type":"string"}}})", "#/items", "not"},
           {R"({"anyOf":[{"type":"string"},{"if":{"type":"string"},"then":{}}]})", "#/anyOf/1", "if"},
           {R"({"type":"array","uniqueItems":true})", "#", "uniqueItems"},
           {R"({"type":"array","contains":{"type":"string"}})", "#", "contains"},
           {R"({"properties":{"a/b":{"type":"string","maxLength":-1}}})", "#/properties/a~1b", "maxLength"},
           {R"({"type":"string","maxLength":1000000})", "#", "maxLength"},
           {R"({"type":"strin"})", "#", "type"},
           {R"(false)", "#", "false"},
           {R"({"type":"object","properties":{"x":false}})", "#/properties/x", "false"},
       }) {
    auto msg = compile_error(schema_kind, r.schema);
    EXPECT_NE(msg.find(std::string("at ") + r.pointer + ":"), std::string::npos) << r.schema << " -> " << msg;
    EXPECT_NE(msg.find(r.keyword), std::string::npos) << r.schema << " -> " << msg;
  }
  // Annotations and unknown (vendor) keywords are ignored.
  auto g = schema(json::parse(R"({"type":"string","title":"T","description":"d","default":"x","examples":["y"],
                                   "$schema":"https://json-schema.org/draft/2020-12/schema","x-order":3,"deprecated":false})"));
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, R"("q")"));
}

TEST(JsonSchema, HostileSchemasAreErrors) {
  compile_error(schema_kind, "{\"type\": ");  // not JSON
  compile_error(schema_kind, "[1,2]");
  std::string deep = "{}";
  for (int i = 0; i < 70; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  EXPECT_NE(compile_error(schema_kind, deep).find("deeper"), std::string::npos);
  std::string deep_doc(100000, '[');
  compile_error(schema_kind, R"({"enum":[)" + deep_doc + std::string(100000, ']') + "]}");
  compile_error(schema_kind, std::string(max_constraint_bytes + 1, ' '));
  // A ref chain that only ever merges.
  compile_error(schema_kind, R"({"$defs":{"a":{"allOf":[{"$ref":"#/$defs/a"}],"type":"string"}},"$ref":"#/$defs/a","maxLength":1})");
}

TEST(JsonSchema, PublicFunctionTakesNlohmannJson) {
  auto g = json_schema_grammar(nlohmann::json::parse(R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"integer"}},"required":["a","b"]})"));
  ASSERT_TRUE(g.ok()) << g.err().message;
  // nlohmann::json sorts keys, so the declared order is lost: properties come alphabetically.
  EXPECT_TRUE(matches(g.value(), R"({"a":1,"b":2})"));
}

}  // namespace
}  // namespace llmesh::model
