// Pythonic tool calls (--tool-call-parser pythonic, vLLM's pythonic / llama4_pythonic): the
// literal subset of Python they are written in, vLLM's cases (keyword arguments of every literal
// kind, several calls, Llama 4's <|python_start|> wrapper), what is not calls (prose,
// positional arguments, expressions, an empty list), a fuzz of random calls and their
// corruptions, and the whole and streamed shapes.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/tool_calls.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;

json delta_json(const choice_delta& d) { return json::parse(chunk_json("chat.completion.chunk", "chatcmpl-1", 1, "m", d)); }

TEST(PythonicCalls, KeywordArgumentsOfEveryLiteralKind) {
  auto calls = parse_pythonic_calls(
      R"([get_weather(city='San Francisco', metric="celsius"), register_user(name="John Doe", age=37, )"
      R"(address={'city': 'San Francisco', 'state': 'CA'}, role=None, passed_test=True, aliases=['John', 'Johnny'], )"
      R"(score=-0.5e1, big=1_000, pair=(1, 2), empty={}), do_nothing()])");
  ASSERT_TRUE(calls.ok()) << calls.err().message;
  ASSERT_EQ(calls->size(), 3u);
  EXPECT_EQ((*calls)[0].index, 0u);
  EXPECT_EQ((*calls)[0].name, "get_weather");
  EXPECT_EQ((*calls)[0].arguments, R"({"city":"San Francisco","metric":"celsius"})");
  EXPECT_EQ((*calls)[1].index, 1u);
  EXPECT_EQ((*calls)[1].name, "register_user");
  EXPECT_EQ(json::parse((*calls)[1].arguments),
            json::parse(R"({"name": "John Doe", "age": 37, "address": {"city": "San Francisco", "state": "CA"},
                            "role": null, "passed_test": true, "aliases": ["John", "Johnny"], "score": -5.0,
                            "big": 1000, "pair": [1, 2], "empty": {}})"));
  EXPECT_EQ((*calls)[2].name, "do_nothing");
  EXPECT_EQ((*calls)[2].arguments, "{}");
  EXPECT_NE((*calls)[0].id, (*calls)[1].id);
  EXPECT_EQ((*calls)[0].id.rfind("chatcmpl-tool-", 0), 0u);
}

TEST(PythonicCalls, StringsHavePythonsQuotesAndEscapes) {
  auto calls = parse_pythonic_calls(
      "[f(a='it\\'s', b=\"say \\\"hi\\\"\", c='tab\\there\\nnew', d='\\u00e9\\x41\\U0001F600', e='''multi\nline''', "
      "f='back\\\\slash', g='é', h='keep \\d')]");
  ASSERT_TRUE(calls.ok()) << calls.err().message;
  const json args = json::parse((*calls)[0].arguments);
  EXPECT_EQ(args["a"], "it's");
  EXPECT_EQ(args["b"], "say \"hi\"");
  EXPECT_EQ(args["c"], "tab\there\nnew");
  EXPECT_EQ(args["d"], "\xc3\xa9" "A" "\xf0\x9f\x98\x80");
  EXPECT_EQ(args["e"], "multi\nline");
  EXPECT_EQ(args["f"], "back\\slash");
  EXPECT_EQ(args["g"], "\xc3\xa9");
  EXPECT_EQ(args["h"], "keep \\d");  // Python keeps an unknown escape as written
}

TEST(PythonicCalls, OctalEscapesGroupingDictKeysAndWideIntsAreReadAsPythonAndJsonDumpsDoThem) {
  auto calls = parse_pythonic_calls(
      "[f(a='\\101\\1010\\7z', b=(1), c=(1,), d=(), e=((1, 2)), g={2: 'a', True: 'b', None: 'c', 1.5: 'd', 'k': 'e'}, "
      "h=18446744073709551615, i=-9223372036854775808, j=+7, k=.5, l=1., m=1_0.2_5e1_0)]");
  ASSERT_TRUE(calls.ok()) << calls.err().message;
  const json args = json::parse((*calls)[0].arguments);
  EXPECT_EQ(args["a"], "AA0\az");  // \101 is A, \1010 is A then 0, \7 is BEL
  EXPECT_EQ(args["b"], 1);
  EXPECT_EQ(args["c"], json::array({1}));
  EXPECT_EQ(args["d"], json::array());
  EXPECT_EQ(args["e"], json::array({1, 2}));
  EXPECT_EQ(args["g"], json::parse(R"({"2": "a", "true": "b", "null": "c", "1.5": "d", "k": "e"})"));
  EXPECT_EQ(args["h"].get<uint64_t>(), 18446744073709551615ull);
  EXPECT_EQ(args["i"].get<int64_t>(), INT64_MIN);
  EXPECT_EQ(args["j"], 7);
  EXPECT_EQ(args["k"], 0.5);
  EXPECT_EQ(args["l"], 1.0);
  EXPECT_EQ(args["m"], 10.25e10);
  EXPECT_NE((*calls)[0].arguments.find("18446744073709551615"), std::string::npos);  // exact, not a float
}

TEST(PythonicCalls, JsonsTrueFalseAndNullAreTakenForPythons) {
  auto calls = parse_pythonic_calls("[f(a=true, b=false, c=null, d=[True, None])]");
  ASSERT_TRUE(calls.ok()) << calls.err().message;
  EXPECT_EQ((*calls)[0].arguments, R"({"a":true,"b":false,"c":null,"d":[true,null]})");
}

TEST(PythonicCalls, Llama4WrapperAndWhitespace) {
  for (const char* text : {"<|python_start|>[f(x=1)]<|python_end|>", "  \n[f(x=1)]\n", "<|python_start|>[f(x=1)]",
                           "[ f ( x = 1 , ) , ]"}) {
    auto calls = parse_pythonic_calls(text);
    ASSERT_TRUE(calls.ok()) << text;
    ASSERT_EQ(calls->size(), 1u) << text;
    EXPECT_EQ((*calls)[0].arguments, R"({"x":1})") << text;
  }
  auto dotted = parse_pythonic_calls("[weather.get(city='Oslo')]");
  ASSERT_TRUE(dotted.ok());
  EXPECT_EQ((*dotted)[0].name, "weather.get");
}

TEST(PythonicCalls, WhatIsNotCalls) {
  for (const char* text : {"The weather is fair.", "[]", "[f(1)]", "[f(x=y)]", "[f(x=1 + 2)]", "[f(x=1), g(x=2)",
                           "[f(x=1)] and more", "f(x=1)", "[f(x=1, x=2)]", "[f(x='unclosed)]", "[f(x={[1]: 2})]",
                           "[f(x={(1, 2): 2})]", "[f(x=18446744073709551616)]", "[f(x=-9223372036854775809)]",
                           "[f(x='\\N{BULLET}')]", "[f(x=(1 2))]", "[f(x=0x10)]",
                           "[f(x=nan)]", "[f(x='a\nb')]", "[1, 2]", "[f(**kw)]", "[f(x=1)(y=2)]", "[f(x=1) g(y=2)]",
                           "[.f(x=1)]", "[f(x=\"\\u12\")]", "[f(x='\\ud800')]", ""}) {
    EXPECT_FALSE(parse_pythonic_calls(text).ok()) << text;
  }
}

TEST(PythonicCalls, RandomCallsAndTheirCorruptionsGiveAClearAnswer) {
  // Random call lists parse into exactly their calls; the same texts with a byte dropped,
  // doubled or replaced give calls or an error, never a crash or a read past the end.
  const std::vector<std::pair<std::string, std::string>> values = {
      {"1", "1"}, {"-2.5", "-2.5"}, {"'a]'", "\"a]\""}, {"\"b)\\\"\"", "\"b)\\\"\""}, {"True", "true"},
      {"None", "null"}, {"[1, 'x', {'k': [None]}]", "[1,\"x\",{\"k\":[null]}]"}, {"{'a': (1, 2)}", "{\"a\":[1,2]}"}};
  std::mt19937 rng(11);
  for (int round = 0; round < 5000; ++round) {
    const size_t n = 1 + rng() % 3;
    std::string text = rng() % 4 == 0 ? "<|python_start|>[" : "[";
    std::vector<std::string> want;
    for (size_t i = 0; i < n; ++i) {
      const size_t n_args = rng() % 3;
      std::string call = "f" + std::to_string(i) + "(", args = "{";
      for (size_t a = 0; a < n_args; ++a) {
        const auto& v = values[rng() % values.size()];
        call += (a ? ", " : "") + std::string("p") + std::to_string(a) + "=" + v.first;
        args += (a ? ",\"p" : "\"p") + std::to_string(a) + "\":" + v.second;
      }
      want.push_back(args + "}");
      text += call + ")" + (i + 1 < n ? ", " : "");
    }
    text += "]";
    auto calls = parse_pythonic_calls(text);
    ASSERT_TRUE(calls.ok()) << text;
    ASSERT_EQ(calls->size(), n) << text;
    for (size_t i = 0; i < n; ++i) EXPECT_EQ((*calls)[i].arguments, want[i]) << text;
    std::string bad = text;
    const size_t at = rng() % bad.size();
    switch (rng() % 3) {
      case 0: bad.erase(at, 1); break;
      case 1: bad.insert(at, 1, bad[at]); break;
      default: bad[at] = "()[]{}'\",=: x\\"[rng() % 14]; break;
    }
    auto maybe = parse_pythonic_calls(bad);
    if (maybe) {
      for (const auto& c : *maybe) EXPECT_TRUE(json::accept(c.arguments)) << bad;
    }
  }
}

TEST(PythonicCalls, AutoTakesCallsOnlyFromAnOutputThatIsCallsWholeOrStreamed) {
  const tool_output py{tool_choice_mode::automatic, "", tool_call_parser::pythonic};
  choice_delta c;
  c.text = "\n[get_weather(city='Zion')]";
  c.finish = "stop";
  shape_tool_calls(py, c);
  EXPECT_EQ(c.text, "");
  ASSERT_EQ(c.tool_calls.size(), 1u);
  EXPECT_EQ(c.tool_calls[0].arguments, R"({"city":"Zion"})");
  EXPECT_EQ(*c.finish, "tool_calls");
  for (const char* text : {"It is fair.", "[1, 2, 3] are numbers", "[f(x=1"}) {
    choice_delta p;
    p.text = text;
    p.finish = "length";
    shape_tool_calls(py, p);
    EXPECT_EQ(p.text, text);
    EXPECT_TRUE(p.tool_calls.empty()) << text;
    EXPECT_EQ(*p.finish, "length");
  }
  auto run = [&](const std::vector<std::string>& pieces) {
    tool_call_stream s(py);
    std::vector<json> out;
    for (size_t i = 0; i < pieces.size(); ++i) {
      choice_delta d;
      d.role = i == 0;
      d.text = pieces[i];
      if (i + 1 == pieces.size()) d.finish = "stop";
      for (const auto& x : s.shape(d)) out.push_back(delta_json(x)["choices"][0]);
    }
    return out;
  };
  auto calls = run({"", " \n", "[now(), ", "add(a=1, b=2)]", ""});  // whitespace waits for the first word
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["delta"], json({{"role", "assistant"}}));
  ASSERT_EQ(calls[1]["delta"]["tool_calls"].size(), 2u);
  EXPECT_EQ(calls[1]["delta"]["tool_calls"][1]["function"], json({{"name", "add"}, {"arguments", R"({"a":1,"b":2})"}}));
  EXPECT_EQ(calls[1]["finish_reason"], "tool_calls");
  auto prose = run({" It", " is [fair]", "."});
  ASSERT_EQ(prose.size(), 3u);
  EXPECT_EQ(prose[0]["delta"]["content"], " It");
  EXPECT_EQ(prose[1]["delta"]["content"], " is [fair]");
  auto tag = run({"<|python_", "start|>[f(n=1)]<|python_end|>"});
  ASSERT_EQ(tag.size(), 2u);
  EXPECT_EQ(tag[1]["delta"]["tool_calls"][0]["function"], json({{"name", "f"}, {"arguments", R"({"n":1})"}}));
  auto broken = run({"[f(", "x)]"});  // looked like calls, was not: all of it is content
  std::string text;
  for (const auto& e : broken) text += e["delta"].value("content", "");
  EXPECT_EQ(text, "[f(x)]");
  EXPECT_EQ(broken.back()["finish_reason"], "stop");
  auto note = run({"[", "1", "] is a ", "note"});  // prose that opens with "[" streams once it is plainly prose
  ASSERT_EQ(note.size(), 4u);
  EXPECT_EQ(note[0]["delta"], json({{"role", "assistant"}}));
  EXPECT_EQ(note[1]["delta"]["content"], "[1");
  EXPECT_EQ(note[2]["delta"]["content"], "] is a ");
  EXPECT_EQ(note[3]["delta"]["content"], "note");
  auto link = run({" [see", " here", "](x) ok"});
  ASSERT_EQ(link.size(), 3u);
  EXPECT_EQ(link[1]["delta"]["content"], " [see here");
  EXPECT_EQ(link[2]["delta"]["content"], "](x) ok");
  for (const char* held : {"[", " [get", "[get_weather ", "[m.get (", "<|python_st", "<|python_start|>[1"}) {
    EXPECT_TRUE(pythonic_calls_may_follow(held)) << held;
  }
  for (const char* prose : {"[1", "[]", "[.f(", "[f)", "[f x", "[\"a\"", "Hello"}) {
    EXPECT_FALSE(pythonic_calls_may_follow(prose)) << prose;
  }
  auto spaces = run({"  ", "\n"});  // only whitespace: content at the end
  text.clear();
  for (const auto& e : spaces) text += e["delta"].value("content", "");
  EXPECT_EQ(text, "  \n");
}

}  // namespace
}  // namespace llmesh::gateway
