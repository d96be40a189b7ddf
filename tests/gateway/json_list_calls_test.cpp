// Granite 3.x's and Phi-4-mini's tool calls (--tool-call-parser granite, phi4_mini_json; vLLM's
// parsers of those names): a JSON array of calls after Granite's optional markers, or after
// Phi-4-mini's "functools"; what is not calls stays content; auto mode takes them out of a whole
// message or a stream (Phi-4-mini's content before its calls kept, Granite's output held whole
// only when it begins as calls).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/tool_calls.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

/// The calls, content and finish a choice's deltas add up to, streamed in pieces of `step` bytes.
struct streamed {
  std::string content;
  std::vector<tool_call_delta> calls;
  std::optional<std::string> finish;
};
streamed stream(tool_call_parser p, const std::string& text, size_t step) {
  tool_call_stream s(tool_output{tool_choice_mode::automatic, "", p});
  streamed out;
  for (size_t i = 0; i < text.size(); i += step) {
    choice_delta d;
    d.text = text.substr(i, step);
    if (i + step >= text.size()) d.finish = "stop";
    for (auto& o : s.shape(std::move(d))) {
      out.content += o.text;
      for (auto& c : o.tool_calls) out.calls.push_back(c);
      if (o.finish) out.finish = o.finish;
    }
  }
  return out;
}

choice_delta whole(tool_call_parser p, const std::string& text) {
  choice_delta c;
  c.text = text;
  c.finish = "stop";
  shape_tool_calls(tool_output{tool_choice_mode::automatic, "", p}, c);
  return c;
}

TEST(JsonListCalls, GraniteTakesAJsonArrayAfterItsOptionalMarkers) {
  const std::string list = R"([{"name": "get_weather", "arguments": {"city": "Ur"}}, {"name": "now", "arguments": {}}])";
  for (const std::string& text : {list, "<|tool_call|>" + list, " <tool_call> " + list + "\n", "<|tool_call|><tool_call>" + list}) {
    auto calls = parse_granite_calls(text);
    ASSERT_TRUE(calls.ok()) << text << ": " << calls.err().message;
    ASSERT_EQ(calls->size(), 2u);
    EXPECT_EQ((*calls)[0].name, "get_weather");
    EXPECT_EQ((*calls)[0].arguments, R"({"city":"Ur"})");
    EXPECT_EQ((*calls)[1].index, 1u);
    EXPECT_EQ((*calls)[1].arguments, "{}");
  }
  // Anything else, as vLLM's json.loads of the whole output refuses it.
  for (const char* bad : {"", "[]", "hello", R"([{"name": "f"}])", R"([{"arguments": {}}])", R"({"name": "f", "arguments": {}})",
                          R"([{"name": "f", "arguments": {}}] and more)", R"([{"name": "f", "arguments": {})", "[1]"}) {
    EXPECT_FALSE(parse_granite_calls(bad).ok()) << bad;
  }
  // Auto: an output that begins as calls is held and becomes them; any other streams as content.
  const auto c = whole(tool_call_parser::granite, "<tool_call>" + list);
  EXPECT_EQ(c.tool_calls.size(), 2u);
  EXPECT_EQ(c.text, "");
  EXPECT_EQ(c.finish, "tool_calls");
  for (size_t step : {1u, 4u, 100u}) {
    const auto s = stream(tool_call_parser::granite, "<tool_call>" + list, step);
    EXPECT_EQ(s.content, "") << step;
    ASSERT_EQ(s.calls.size(), 2u) << step;
    EXPECT_EQ(s.calls[0].arguments, R"({"city":"Ur"})");
    EXPECT_EQ(s.finish, "tool_calls");
    const auto prose = stream(tool_call_parser::granite, "<tool Use [brackets] freely.", step);
    EXPECT_EQ(prose.content, "<tool Use [brackets] freely.") << step;
    EXPECT_TRUE(prose.calls.empty());
  }
  const auto cut = whole(tool_call_parser::granite, R"([{"name": "f", "arguments": {"a": )");
  EXPECT_EQ(cut.text, R"([{"name": "f", "arguments": {"a": )");  // not calls after all: content
  EXPECT_TRUE(cut.tool_calls.empty());
}

TEST(JsonListCalls, Phi4MiniTakesTheArrayAfterFunctools) {
  auto calls = parse_phi4_mini_calls(R"(functools[{"name": "get_weather", "arguments": {"days": [1, [2]]}}, {"name": "now", "parameters": {"tz": "UTC"}}] trailing)");
  ASSERT_TRUE(calls.ok()) << calls.err().message;
  ASSERT_EQ(calls->size(), 2u);
  EXPECT_EQ((*calls)[0].arguments, R"({"days":[1,[2]]})");  // (nested arrays: vLLM's regex stops at the first "]")
  EXPECT_EQ((*calls)[1].name, "now");
  EXPECT_EQ((*calls)[1].arguments, R"({"tz":"UTC"})");
  for (const char* bad : {"", "functools", "functools [", R"(functools[{"name": "f"}])", R"(functools[{"name": "f", "arguments": {})",
                          "functools[]", R"(functools{"name": "f", "arguments": {}})", R"(functools [{"name": "f", "arguments": {}}])"}) {
    EXPECT_FALSE(parse_phi4_mini_calls(bad).ok()) << bad;
  }
  // Python's functools in prose or code is not a call's start: only "functools[" is (vLLM's regex).
  const std::string out = R"(With functools.reduce: functools[{"name": "get_weather", "arguments": {"city": "Ur"}}])";
  const auto c = whole(tool_call_parser::phi4_mini_json, out);
  EXPECT_EQ(c.text, "With functools.reduce: ");  // the content before the calls stays (vLLM drops it)
  ASSERT_EQ(c.tool_calls.size(), 1u);
  EXPECT_EQ(c.finish, "tool_calls");
  for (size_t step : {1u, 3u, 100u}) {
    const auto s = stream(tool_call_parser::phi4_mini_json, out, step);
    EXPECT_EQ(s.content, "With functools.reduce: ") << step;
    ASSERT_EQ(s.calls.size(), 1u) << step;
    EXPECT_EQ(s.calls[0].arguments, R"({"city":"Ur"})");
    EXPECT_EQ(s.finish, "tool_calls");
  }
  // A broken array stays content (vLLM answers an empty message then).
  const auto broken = whole(tool_call_parser::phi4_mini_json, "functools[{oops");
  EXPECT_EQ(broken.text, "functools[{oops");
  EXPECT_TRUE(broken.tool_calls.empty());
  EXPECT_EQ(parse_tool_call_parser("granite").value(), tool_call_parser::granite);
  EXPECT_EQ(parse_tool_call_parser("phi4_mini_json").value(), tool_call_parser::phi4_mini_json);
  EXPECT_EQ(tool_call_parser_name(tool_call_parser::phi4_mini_json), "phi4_mini_json");
}

}  // namespace
}  // namespace llmesh::gateway
