// Qwen3-Coder's XML tool calls (--tool-call-parser qwen3_coder, vLLM's qwen3_coder): blocks
// parse into calls whose values are typed by the tool's schema as vLLM types them; values
// holding the format's own delimiters (code that writes tool calls) stay whole; a missing
// </parameter>, an unclosed last call and a stray bare block are handled as vLLM handles
// them; auto mode takes the calls out of a whole message or a stream (content before them
// kept); corrupted outputs never throw and never lose the text.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/tool_calls.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

const json tools = json::parse(R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
    "city":{"type":"string"},"days":{"type":"integer"},"lat":{"type":"number"},"metric":{"type":"boolean"},
    "opts":{"type":"object"},"hours":{"type":"array"},"note":{"anyOf":[{"type":"string"},{"type":"null"}]},
    "level":{"type":["integer","null"]},"any":{}}}}},
  {"type":"function","function":{"name":"write_file","parameters":{"type":"object","properties":{
    "path":{"type":"string"},"content":{"type":"string"}}}}}])");

std::vector<tool_call_delta> calls_of(std::string_view text, const json* t = &tools) {
  auto c = parse_qwen3_coder_calls(text, t);
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.err().message) << "\n" << text;
  return c.ok() ? *c : std::vector<tool_call_delta>{};
}

json args_of(const tool_call_delta& c) { return json::parse(c.arguments); }

TEST(Qwen3CoderCalls, ValuesAreTypedByTheToolsSchema) {
  const auto calls = calls_of(
      "<tool_call>\n<function=get_weather>\n"
      "<parameter=extra>\n42\n</parameter>\n"
      "<parameter=city>\nSan Francisco\n</parameter>\n"
      "<parameter=days>\n 1_000 \n</parameter>\n"
      "<parameter=lat>\n37.5\n</parameter>\n"
      "<parameter=metric>\nTrue\n</parameter>\n"
      "<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n"
      "<parameter=hours>\n[9, 'noon']\n</parameter>\n"
      "<parameter=note>\nNone\n</parameter>\n"
      "<parameter=level>\nnull\n</parameter>\n"
      "<parameter=any>\n(1, 2)\n</parameter>\n"
      "</function>\n</tool_call>\n"
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nnull\n</parameter>\n<parameter=days>\nthree\n</parameter>\n"
      "<parameter=lat>\n2.0\n</parameter>\n<parameter=metric>\nyes\n</parameter>\n<parameter=opts>\n\"{'k': 'v'}\"\n</parameter>\n"
      "</function>\n</tool_call>");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].index, 0u);
  EXPECT_EQ(calls[1].index, 1u);
  EXPECT_NE(calls[0].id, calls[1].id);
  // (A parameter the schema lacks is its text; one without a type is a string.)
  EXPECT_EQ(args_of(calls[0]), json::parse(R"j({"extra":"42","city":"San Francisco","days":1000,"lat":37.5,"metric":true,
    "opts":{"a":[1,2]},"hours":[9,"noon"],"note":null,"level":null,"any":"(1, 2)"})j"));
  // A string keeps "null"; what does not convert stays text; a float without a fraction is an
  // int; a JSON string holding a Python dict is that dict (vLLM's double decode).
  EXPECT_EQ(args_of(calls[1]), json::parse(R"({"city":"null","days":"three","lat":2,"metric":false,"opts":{"k":"v"}})"));
  // No tools, or a tool not among them: every value is its text.
  const std::string unknown = "<tool_call>\n<function=f>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>";
  EXPECT_EQ(args_of(calls_of(unknown, nullptr).at(0)), json::parse(R"({"n":"5"})"));
  EXPECT_EQ(args_of(calls_of(unknown).at(0)), json::parse(R"({"n":"5"})"));
  // No parameters: an empty object.
  EXPECT_EQ(calls_of("<tool_call>\n<function=now>\n</function>\n</tool_call>").at(0).arguments, "{}");
}

TEST(Qwen3CoderCalls, ValuesThatHoldTheFormatsOwnTagsStayWhole) {
  // Code that writes a tool call: its own <parameter=...>, </parameter>, </function> and
  // </tool_call> are text, told apart by depth and by what follows.
  const std::string code =
      "print('<tool_call>')\n<parameter=x>\nnested\n</parameter>\nend = '</function>'\nclose = \"</tool_call>\" # </parameter> here";
  const std::string text = "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n<parameter=content>\n" + code +
                           "\n</parameter>\n</function>\n</tool_call>";
  const auto calls = calls_of(text);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(args_of(calls[0]), (json{{"path", "/tmp/a.py"}, {"content", code}}));
  // Multi-line values keep their inner newlines; only one leading and one trailing newline go.
  const auto lines = calls_of("<tool_call>\n<function=write_file>\n<parameter=content>\n\nline 1\n  line 2\n\n</parameter>\n</function>\n</tool_call>");
  EXPECT_EQ(args_of(lines.at(0))["content"], "\nline 1\n  line 2\n");
}

TEST(Qwen3CoderCalls, MalformedOutputsAsVllmReadsThem) {
  // A missing </parameter>: the next parameter of the schema ends the value.
  EXPECT_EQ(args_of(calls_of("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>").at(0)),
            json::parse(R"({"city":"Paris","days":3})"));
  // A generation cut inside its last call: what was written.
  EXPECT_EQ(args_of(calls_of("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar").at(0)), json::parse(R"({"city":"Par"})"));
  EXPECT_EQ(args_of(calls_of("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>").at(0)),
            json::parse(R"({"city":"Paris"})"));
  // A bare block and a template's unrendered name are not calls; the real one is.
  const auto mixed = calls_of("<tool_call>\n</tool_call>\n<tool_call>\n<function={{ name }}>\n</function>\n</tool_call>\n"
                              "<tool_call>\n<function=now>\n</function>\n</tool_call>");
  ASSERT_EQ(mixed.size(), 1u);
  EXPECT_EQ(mixed[0].name, "now");
  EXPECT_EQ(mixed[0].index, 0u);
  for (const char* bad : {"", "no tags", "<tool_call></tool_call>", "<tool_call>\n<function=f", "<tool_call>\n<function=a b>\n</function>",
                          "<tool_call>{\"name\": \"f\"}</tool_call>"}) {
    EXPECT_FALSE(parse_qwen3_coder_calls(bad, &tools).ok()) << bad;
  }
}

TEST(Qwen3CoderCalls, AutoTakesTheCallsOutOfAWholeMessageOrAStream) {
  tool_output t{tool_choice_mode::automatic, "", tool_call_parser::qwen3_coder, std::make_shared<const json>(tools)};
  const std::string calls = "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";
  choice_delta whole;
  whole.text = "Let me check.\n" + calls;
  whole.finish = "stop";
  shape_tool_calls(t, whole);
  EXPECT_EQ(whole.text, "Let me check.\n");
  ASSERT_EQ(whole.tool_calls.size(), 1u);
  EXPECT_EQ(whole.tool_calls[0].arguments, R"({"days":2})");
  EXPECT_EQ(whole.finish, "tool_calls");
  // Streamed in small pieces: the content streams (no piece of the tag leaks), the calls come at the end.
  tool_call_stream s(t);
  const std::string all = "Let me check.\n" + calls;
  std::string content;
  std::vector<tool_call_delta> got;
  std::optional<std::string> finish;
  for (size_t i = 0; i < all.size(); i += 3) {
    choice_delta d;
    d.text = all.substr(i, 3);
    if (i + 3 >= all.size()) d.finish = "stop";
    for (auto& out : s.shape(std::move(d))) {
      content += out.text;
      for (auto& c : out.tool_calls) got.push_back(c);
      if (out.finish) finish = out.finish;
    }
  }
  EXPECT_EQ(content, "Let me check.\n");
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].name, "get_weather");
  EXPECT_EQ(got[0].arguments, R"({"days":2})");
  EXPECT_EQ(finish, "tool_calls");
  // Not calls after all: everything is content.
  choice_delta prose;
  prose.text = "Use <tool_call> tags.";
  prose.finish = "stop";
  shape_tool_calls(t, prose);
  EXPECT_EQ(prose.text, "Use <tool_call> tags.");
  EXPECT_TRUE(prose.tool_calls.empty());
  EXPECT_EQ(parse_tool_call_parser("qwen3_coder").value(), tool_call_parser::qwen3_coder);
  EXPECT_EQ(parse_tool_call_parser("qwen3_xml").value(), tool_call_parser::qwen3_coder);
  EXPECT_EQ(tool_call_parser_name(tool_call_parser::qwen3_coder), "qwen3_coder");
}

// Random well-formed calls read back exactly; their corruptions never throw, and a parse
// either fails (the text stays content) or gives calls with object arguments.
TEST(Qwen3CoderCalls, RandomCallsAndTheirCorruptionsGiveAClearAnswer) {
  std::mt19937 rng(3);
  const std::string alphabet = "ab <>/=\n_{}[]\"'0123456789.";
  const std::vector<std::string> pieces = {"a", " ", "<", ">", "/", "=", "\n", "{", "'", "7", "</function>", "</tool_call>",
                                           "</parameter>", "<parameter=path>", "<function=x>", "<tool_call>"};
  auto word = [&](size_t n) {
    std::string w;
    for (size_t i = 0; i < n; ++i) w += pieces[rng() % pieces.size()];
    return w;
  };
  for (int round = 0; round < 2000; ++round) {
    json want = json::object();
    std::string text = "<tool_call>\n<function=write_file>\n";
    const int params = 1 + static_cast<int>(rng() % 3);
    for (int p = 0; p < params; ++p) {
      const std::string name = p == 0 ? "path" : "content";
      std::string value = word(1 + rng() % 12);
      // Values with a </parameter> or a line-starting <parameter= of their own, or a call's end
      // before a new call, are the format's ambiguity (vLLM reads them the same way); every
      // other tag must stay text.
      if (value.find("</parameter>") != std::string::npos || value.find("<tool_call>") != std::string::npos ||
          value.starts_with("<parameter=") || value.find("\n<parameter=") != std::string::npos) {
        continue;
      }
      want[name] = value;
      text += "<parameter=" + name + ">\n" + value + "\n</parameter>\n";
    }
    text += "</function>\n</tool_call>";
    auto calls = parse_qwen3_coder_calls(text, &tools);
    ASSERT_TRUE(calls.ok()) << text;
    EXPECT_EQ(json::parse(calls->at(0).arguments), want) << text;
    std::string bad = text;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % bad.size();
      if (rng() % 2) bad.erase(at, 1 + rng() % 4);
      else bad.insert(at, 1, alphabet[rng() % alphabet.size()]);
      if (bad.empty()) break;
    }
    result<std::vector<tool_call_delta>> r = make_error(errc::internal, "");
    ASSERT_NO_THROW(r = parse_qwen3_coder_calls(bad, &tools)) << bad;
    if (r.ok()) {
      for (const auto& c : *r) EXPECT_TRUE(json::parse(c.arguments).is_object()) << bad;
    }
  }
}

}  // namespace
}  // namespace llmesh::gateway
