// OpenAI's harmony output (GPT-OSS; gateway/src/harmony.hpp through reasoning.hpp's
// openai_gptoss parser): analysis → reasoning_content, final → content, functions.* messages →
// tool_calls; streamed in any pieces, the same split as whole.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/completion_group.hpp"
#include "llmesh/gateway/reasoning.hpp"
#include "llmesh/gateway/tool_calls.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;

reasoning_mode harmony(bool calls = true, bool include = true) {
  reasoning_mode m;
  m.parser = reasoning_parser::openai_gptoss;
  m.include = include;
  m.harmony_calls = calls;
  return m;
}

struct split {
  std::optional<std::string> reasoning;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  std::string finish;
};

split whole(const reasoning_mode& m, const std::string& text, const std::string& finish = "stop") {
  choice_delta c;
  c.text = text;
  c.finish = finish;
  split_reasoning(m, c);
  split out{c.reasoning, c.text, {}, *c.finish};
  for (const auto& t : c.tool_calls) out.calls.emplace_back(t.name, t.arguments);
  return out;
}

split streamed(const reasoning_mode& m, const std::string& text, const std::vector<size_t>& cuts, const std::string& finish = "stop") {
  reasoning_stream s(m);
  split out;
  size_t from = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const size_t to = i < cuts.size() ? cuts[i] : text.size();
    choice_delta c;
    c.text = text.substr(from, to - from);
    if (i == cuts.size()) c.finish = finish;
    s.shape(c);
    if (c.reasoning) {
      EXPECT_FALSE(c.reasoning->empty()) << "a delta never carries an empty reasoning piece";
      out.reasoning = out.reasoning.value_or("") + *c.reasoning;
    }
    out.content += c.text;
    for (const auto& t : c.tool_calls) {
      EXPECT_EQ(t.index, out.calls.size());
      EXPECT_TRUE(t.id.starts_with("chatcmpl-tool-"));
      out.calls.emplace_back(t.name, t.arguments);
    }
    if (c.finish) out.finish = *c.finish;
    from = to;
  }
  if (s.reasoned() && m.include && !out.reasoning) out.reasoning = "";  // as split_reasoning marks a whole one
  return out;
}

const std::string analysis_then_final =
    "<|channel|>analysis<|message|>User greets. Reply.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?";
const std::string call =
    "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
    "<|constrain|>json<|message|>{\"city\": \"Paris\", \"days\": [1, 2]}";

TEST(Harmony, AnalysisIsReasoningAndFinalIsContent) {
  auto s = whole(harmony(), analysis_then_final);
  EXPECT_EQ(s.reasoning, "User greets. Reply.");
  EXPECT_EQ(s.content, "Hello! How can I help?");
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.finish, "stop");
  // include_reasoning false drops it; a commentary preamble and a second analysis are
  // reasoning too, each message after the first on a line of its own (vLLM joins them so).
  EXPECT_EQ(whole(harmony(true, false), analysis_then_final).reasoning, std::nullopt);
  s = whole(harmony(), "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>Let me look."
                       "<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|><|start|>assistant<|channel|>final<|message|>done");
  EXPECT_EQ(s.reasoning, "a\nLet me look.\nb");
  EXPECT_EQ(s.content, "done");
  // Cut short in the analysis (max_tokens): all reasoning, no content.
  s = whole(harmony(), "<|channel|>analysis<|message|>thinking and", "length");
  EXPECT_EQ(s.reasoning, "thinking and");
  EXPECT_EQ(s.content, "");
  EXPECT_EQ(s.finish, "length");
}

TEST(Harmony, FunctionMessagesAreToolCalls) {
  auto s = whole(harmony(), call);
  EXPECT_EQ(s.reasoning, "Need weather.");
  EXPECT_EQ(s.content, "");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].first, "get_weather");
  EXPECT_EQ(s.calls[0].second, R"({"city":"Paris","days":[1,2]})");  // re-encoded compactly
  EXPECT_EQ(s.finish, "tool_calls");
  // The recipient before the channel, a bare content type, two calls, and arguments that are
  // not JSON (kept as written).
  s = whole(harmony(), "<|start|>assistant to=functions.a<|channel|>commentary json<|message|>{}<|end|>"
                       "<|start|>assistant<|channel|>commentary to=functions.b<|message|>not json");
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[0], (std::pair<std::string, std::string>{"a", "{}"}));
  EXPECT_EQ(s.calls[1], (std::pair<std::string, std::string>{"b", "not json"}));
  // Without tools (calls off) the body is content; cut short (max_tokens), too: nothing is lost.
  s = whole(harmony(false), call);
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, R"({"city": "Paris", "days": [1, 2]})");
  EXPECT_EQ(s.finish, "stop");
  s = whole(harmony(), call.substr(0, call.size() - 5), "length");
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, R"({"city": "Paris", "days": [1)");
  EXPECT_EQ(s.finish, "length");
  // A stop string that cut the call: its body is content, the finish stays "stop".
  {
    choice_delta c;
    c.text = call;
    c.finish = "stop";
    c.stop_string = "2]";
    split_reasoning(harmony(), c);
    EXPECT_TRUE(c.tool_calls.empty());
    EXPECT_EQ(c.text, R"({"city": "Paris", "days": [1, 2]})");
    EXPECT_EQ(c.finish, "stop");
  }
  // The content type decides whether arguments are JSON: "code" text is kept as written even
  // when it parses, a recipient that merely contains "json" does not make it JSON.
  s = whole(harmony(), "<|channel|>commentary to=functions.run <|constrain|>code<|message|>{ \"a\" : 1 }");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].second, R"({ "a" : 1 })");
  s = whole(harmony(), "<|channel|>commentary to=functions.get_json code<|message|>[1, 2]");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].second, "[1, 2]");
  s = whole(harmony(), "<|channel|>commentary to=functions.get_json json<|message|>[1, 2]");
  EXPECT_EQ(s.calls.at(0).second, "[1,2]");
  // A built-in tool's call (browser, python) is the model's own work: reasoning.
  s = whole(harmony(), "<|channel|>analysis to=browser.search code<|message|>{\"query\": \"x\"}<|call|>");
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.reasoning, R"({"query": "x"})");
}

TEST(Harmony, OutputThatIsNotHarmonyIsContent) {
  for (std::string text : {"plain words", "", "<|channel|>analysis but never a message", "<|end|>"}) {
    auto s = whole(harmony(), text);
    EXPECT_EQ(s.content, text);
    EXPECT_EQ(s.reasoning, std::nullopt);
  }
}

TEST(Harmony, EveryWayOfCuttingTheStreamGivesTheWholeSplit) {
  for (const std::string& text : {analysis_then_final, call, std::string("<|channel|>final<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>b")}) {
    SCOPED_TRACE(text);
    const split want = whole(harmony(), text);
    for (size_t a = 0; a <= text.size(); a += 3) {
      for (size_t b = a; b <= text.size(); b += 5) {
        const split got = streamed(harmony(), text, {a, b});
        ASSERT_EQ(got.reasoning, want.reasoning) << "cut at " << a << ", " << b;
        ASSERT_EQ(got.content, want.content) << "cut at " << a << ", " << b;
        ASSERT_EQ(got.calls, want.calls) << "cut at " << a << ", " << b;
        ASSERT_EQ(got.finish, want.finish);
      }
    }
    std::vector<size_t> bytes;
    for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
    const split got = streamed(harmony(), text, bytes);
    EXPECT_EQ(got.reasoning, want.reasoning) << "byte by byte";
    EXPECT_EQ(got.content, want.content) << "byte by byte";
    EXPECT_EQ(got.calls, want.calls) << "byte by byte";
  }
}

TEST(Harmony, RandomOutputsStreamedInRandomPiecesGiveTheWholeSplit) {
  const std::vector<std::string> atoms = {"<|channel|>", "<|message|>", "<|end|>", "<|start|>", "assistant", "analysis", "final",
                                          "commentary", " to=functions.f", " to=browser.open", "<|constrain|>json", "{\"k\": 1}",
                                          "<|", "|>", "<|mess", "x", " ", "\n", "é"};
  std::mt19937 rng(11);
  for (int round = 0; round < 3000; ++round) {
    std::string text;
    for (size_t n = rng() % 14; n > 0; --n) text += atoms[rng() % atoms.size()];
    const reasoning_mode m = harmony(rng() % 2 == 0, rng() % 4 != 0);
    const std::string finish = rng() % 3 == 0 ? "length" : "stop";
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i) {
      if (rng() % 3 == 0) cuts.push_back(i);
    }
    const split want = whole(m, text, finish), got = streamed(m, text, cuts, finish);
    ASSERT_EQ(got.reasoning, want.reasoning) << text;
    ASSERT_EQ(got.content, want.content) << text;
    ASSERT_EQ(got.calls, want.calls) << text;
    ASSERT_EQ(got.finish, want.finish) << text;
  }
}

TEST(Harmony, ParserNamesAndTokens) {
  EXPECT_EQ(*parse_reasoning_parser("openai_gptoss"), reasoning_parser::openai_gptoss);
  EXPECT_EQ(reasoning_parser_name(reasoning_parser::openai_gptoss), "openai_gptoss");
  EXPECT_EQ(*parse_tool_call_parser("openai"), tool_call_parser::openai);
  EXPECT_EQ(tool_call_parser_name(tool_call_parser::openai), "openai");
  EXPECT_EQ(harmony_final_header(), "<|channel|>final<|message|>");
  // kjv-tiny spells harmony's tags in pieces: the parser refuses it, naming the tag.
  auto kjv = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
  ASSERT_TRUE(kjv.ok());
  auto s = check_reasoning_tokens(**kjv, "kjv", reasoning_parser::openai_gptoss);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("<|start|>"), std::string::npos) << s.err().message;
  EXPECT_NE(s.err().message.find("harmony"), std::string::npos) << s.err().message;
  // The openai tool shapers leave a harmony choice as the reasoning stage made it.
  choice_delta c;
  c.text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  c.finish = "stop";
  shape_tool_calls(tool_output{tool_choice_mode::automatic, "", tool_call_parser::openai, nullptr}, c);
  EXPECT_TRUE(c.tool_calls.empty());
  EXPECT_EQ(c.finish, "stop");
}

// Through the group, as a chat choice streams and answers whole: kjv-tiny's tokens carry the
// harmony text in pieces.
TEST(Harmony, AChatChoiceStreamsReasoningContentAndCalls) {
  auto tok = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
  ASSERT_TRUE(tok.ok());
  auto run = [&](bool streaming) {
    completion_group g(group_setup{true, streaming, false, "chatcmpl-1", 1, "m", 1}, (*tok)->decoder(), nullptr);
    stream_setup s;
    s.prompt_ids = {1, 2};
    s.skip_special = false;
    s.reasoning = harmony();
    s.tools = tool_output{tool_choice_mode::automatic, "", tool_call_parser::openai, nullptr};
    g.add_choice(7, s);
    std::string out;
    const auto ids = (*tok)->encode(call, false);
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto f = i + 1 == ids.size() ? actors::finish_reason::eos : actors::finish_reason::none;
      out += g.on_message(actors::token_msg{7, ids[i], f, false, {}, {}, {}});
    }
    EXPECT_TRUE(g.done());
    return streaming ? out : g.reply().body;
  };
  const json msg = json::parse(run(false))["choices"][0];
  EXPECT_EQ(msg["finish_reason"], "tool_calls");
  EXPECT_EQ(msg["message"]["reasoning_content"], "Need weather.");
  ASSERT_EQ(msg["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(msg["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris","days":[1,2]})");
  std::string sse = run(true), reasoning;
  size_t calls = 0;
  std::string finish;
  for (size_t pos = 0; (pos = sse.find("data: ", pos)) != std::string::npos;) {
    const size_t end = sse.find("\n\n", pos);
    const std::string payload = sse.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    if (payload == "[DONE]") continue;
    const json ch = json::parse(payload)["choices"][0];
    const json& d = ch["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls")) calls += d["tool_calls"].size();
    EXPECT_FALSE(d.contains("content") && !d["content"].is_null() && !d["content"].get<std::string>().empty()) << payload;
    if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(reasoning, "Need weather.");
  EXPECT_EQ(calls, 1u);
  EXPECT_EQ(finish, "tool_calls");
}

}  // namespace
}  // namespace llmesh::gateway
