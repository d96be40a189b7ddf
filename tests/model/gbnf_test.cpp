// GBNF to grammar (gbnf_grammar): llama.cpp's example grammars accept and refuse what they
// should; every construct (literals and their escapes, classes over code points, '.', groups,
// quantifiers, comments, rule-ending newlines) behaves as in llama.cpp; every error names the
// rule or the offset.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grammar_match.hpp"
#include "llmesh/model/constraint.hpp"

namespace llmesh::model {
namespace {

using testing::matches;

std::shared_ptr<const grammar> compile(const std::string& text) {
  return testing::compile_ok(constraint_spec::kind::grammar, text);
}

// llama.cpp's grammars/arithmetic.gbnf.
const char* arithmetic = R"g(root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
)g";

// llama.cpp's grammars/json.gbnf.
const char* json_gbnf = R"g(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)g";

TEST(Gbnf, LlamaCppArithmetic) {
  auto g = compile(arithmetic);
  ASSERT_TRUE(g);
  for (const char* ok : {"1+2=3\n", "(a+b)*c= 42\n", "x=y\nfoo_1 /7=bar\n"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"1+2=3", "1+=3\n", "A=1\n", "(1=2\n", ""}) EXPECT_FALSE(matches(g, bad)) << bad;
}

TEST(Gbnf, LlamaCppJson) {
  auto g = compile(json_gbnf);
  ASSERT_TRUE(g);
  for (const char* ok : {R"({"a": [1, 2.5, "x\n", true], "b": null})", "{}", "{\n  \"k\": {\"n\": -0.5e19}\n}",
                         "{\"caf\xC3\xA9\": \"\\u00e9\"}"}) {
    EXPECT_TRUE(matches(g, ok)) << ok;
  }
  for (const char* bad : {R"({"a" 1})", "[]", R"({"a": 01x})", "{\"a\": \"\x01\"}", "{\"a\": \"\x7F\"}", R"({"a": "\q"})"}) {
    EXPECT_FALSE(matches(g, bad)) << bad;
  }
}

TEST(Gbnf, Constructs) {
  // A newline ends a rule outside parentheses: the quantified "!" would start a new rule.
  auto msg = testing::compile_error(constraint_spec::kind::grammar, "root ::= \"hi\"   # comment\n  \"!\"{1,3}\n");
  EXPECT_NE(msg.find("expected a rule name at offset 28"), std::string::npos) << msg;
  auto g = compile(R"g(
# a comment before the first rule
root ::= greeting ( " "
  name )? "!"{1,3}   # parentheses and a trailing comment
greeting ::= "hi" | "h\x65llo" |
  "\u00e9t\U0001F600"
name ::= [A-Z] [a-z\-]{2,} | "[" [^\]\n]* "]" | "<" . ">"
)g");
  ASSERT_TRUE(g);
  for (const char* ok : {"hi!", "hello Bob!!!", "\xC3\xA9t\xF0\x9F\x98\x80 Jo-e!", "hi [\xC3\xA9 x]!", "hi <\n>!",
                         "hi <\xF0\x9F\x98\x80>!"}) {
    EXPECT_TRUE(matches(g, ok)) << ok;
  }
  for (const char* bad : {"hi", "hi!!!!", "hello Bo!", "hi bob!", "hi [a\nb]!", "hi <ab>!", "hi <\xC3>!", "Hi!"}) {
    EXPECT_FALSE(matches(g, bad)) << bad;
  }
  auto counts = compile("root ::= \"a\"{2} \"b\"{1,} \"c\"{0,2} \"d\"* [x]+ \"e\"?\n");
  ASSERT_TRUE(counts);
  EXPECT_TRUE(matches(counts, "aabx"));
  EXPECT_TRUE(matches(counts, "aabbbccdddxxe"));
  EXPECT_FALSE(matches(counts, "abx"));
  EXPECT_FALSE(matches(counts, "aabcccx"));
  EXPECT_FALSE(matches(counts, "aab"));
  auto literal_group = compile("root ::= \"ab\"* \"c\"\n");  // a quantifier takes the whole literal
  ASSERT_TRUE(literal_group);
  EXPECT_TRUE(matches(literal_group, "ababc"));
  EXPECT_FALSE(matches(literal_group, "abbc"));
}

TEST(Gbnf, ErrorsNameTheRuleOrOffset) {
  struct refusal {
    std::string text;
    std::string says;
  };
  for (const auto& r : std::vector<refusal>{
           {"root ::= item\n", "'item'"},
           {"start ::= \"a\"\n", "root"},
           {"root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n", "left-recursive"},
           {"root ::= (\"a\"?)*\n", "left-recursive"},
           {"root ::= \"\\q\"\n", "unknown escape at offset 10"},
           {"root ::= \"abc\n", "unterminated"},
           {"root ::= [abc\n", "unterminated"},
           {"root ::= <think> \"a\"\n", "token"},
           {"root ::= \"a\"\nroot ::= \"b\"\n", "twice"},
           {"root ::= \"a\"{3,2}\n", "n < m"},
           {"root ::= \"a\"{10001}\n", "above"},
           {"root ::= * \"a\"\n", "nothing before"},
           {"root \"a\"\n", "'::='"},
           {"root ::= (\"a\"\n", "missing ')'"},
           {"root ::= [z-a]\n", "out of order"},
           {"root ::= \"\\uD800\"\n", "scalar"},
           {"root ::= \"\xC3\"\n", "UTF-8"},
           {"root ::= " + std::string(70, '(') + "\"a\"" + std::string(70, ')') + "\n", "nest"},
           {"root ::= \"a\" )\n", "end of the line"},
       }) {
    auto msg = testing::compile_error(constraint_spec::kind::grammar, r.text);
    EXPECT_NE(msg.find(r.says), std::string::npos) << r.text << " -> " << msg;
  }
}

}  // namespace
}  // namespace llmesh::model
