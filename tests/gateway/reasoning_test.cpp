// Reasoning outputs (vLLM's --reasoning-parser): the <think> block of a chat choice becomes
// reasoning_content, the rest content, streamed or whole, and the two ways agree.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/completion_group.hpp"
#include "llmesh/gateway/reasoning.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;
using actors::finish_reason;
using actors::token_msg;

constexpr reasoning_mode qwen3{reasoning_parser::qwen3, false, true};
constexpr reasoning_mode qwen3_opened{reasoning_parser::qwen3, true, true};
constexpr reasoning_mode r1{reasoning_parser::deepseek_r1, false, true};

struct split {
  std::optional<std::string> reasoning;
  std::string content;
};

split whole(const reasoning_mode& m, const std::string& text) {
  choice_delta c;
  c.text = text;
  c.finish = "stop";
  split_reasoning(m, c);
  return {c.reasoning, c.text};
}

/// `text` streamed in pieces cut at `cuts` (ascending offsets); the pieces' reasoning and
/// content joined.
split streamed(const reasoning_mode& m, const std::string& text, const std::vector<size_t>& cuts) {
  reasoning_stream s(m);
  split out;
  size_t from = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const size_t to = i < cuts.size() ? cuts[i] : text.size();
    choice_delta c;
    c.text = text.substr(from, to - from);
    if (i == cuts.size()) c.finish = "stop";
    s.shape(c);
    if (c.reasoning) {
      EXPECT_FALSE(c.reasoning->empty()) << "a delta never carries an empty reasoning piece";
      out.reasoning = out.reasoning.value_or("") + *c.reasoning;
    }
    out.content += c.text;
    from = to;
  }
  if (s.reasoned() && !out.reasoning) out.reasoning = "";
  return out;
}

TEST(Reasoning, ParserNames) {
  EXPECT_EQ(parse_reasoning_parser("qwen3").value(), reasoning_parser::qwen3);
  EXPECT_EQ(parse_reasoning_parser("deepseek_r1").value(), reasoning_parser::deepseek_r1);
  EXPECT_EQ(parse_reasoning_parser("none").value(), reasoning_parser::none);
  for (auto p : {reasoning_parser::none, reasoning_parser::qwen3, reasoning_parser::deepseek_r1}) {
    EXPECT_EQ(parse_reasoning_parser(reasoning_parser_name(p)).value(), p);
  }
  auto bad = parse_reasoning_parser("granite");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.err().code, errc::invalid_request);
  EXPECT_NE(bad.err().message.find("'granite'"), std::string::npos);
  EXPECT_NE(bad.err().message.find("deepseek_r1, qwen3"), std::string::npos);
}

TEST(Reasoning, APromptOpensTheBlockOnlyAtItsEnd) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<｜Assistant｜><think>"));
  // Qwen3 with enable_thinking false closes an empty block in the prompt.
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_reasoning(""));
  // A user asking about the tag does not open a block.
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>user\nWhat does <think> do?<|im_end|>\n<|im_start|>assistant\n"));
  // A continued message that stopped mid-thought does.
  EXPECT_TRUE(leaves_reasoning_open("<think>old</think> then <think>half a thought"));
  EXPECT_FALSE(leaves_reasoning_open("<think>a thought</think>The answer"));
  EXPECT_FALSE(leaves_reasoning_open("The answer"));
}

TEST(Reasoning, Qwen3SplitsABlockAtTheStartAndLeavesOtherOutputAlone) {
  auto s = whole(qwen3, "<think>\nTwo and two.\n</think>\n\nFour.");
  EXPECT_EQ(s.reasoning, "\nTwo and two.\n");
  EXPECT_EQ(s.content, "\n\nFour.");
  s = whole(qwen3, "Four.");  // enable_thinking false: no block
  EXPECT_FALSE(s.reasoning);
  EXPECT_EQ(s.content, "Four.");
  s = whole(qwen3, "Four. </think> <think>");  // tags later in an answer are its text
  EXPECT_FALSE(s.reasoning);
  EXPECT_EQ(s.content, "Four. </think> <think>");
  s = whole(qwen3, "<think>\ncut short by max_tok");
  EXPECT_EQ(s.reasoning, "\ncut short by max_tok");
  EXPECT_EQ(s.content, "");
  s = whole(qwen3_opened, "thinking already</think>answer");  // the template opened the block
  EXPECT_EQ(s.reasoning, "thinking already");
  EXPECT_EQ(s.content, "answer");
  s = whole(qwen3, "<think></think>answer");
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "answer");
}

TEST(Reasoning, DeepSeekR1OutputBeginsInTheReasoning) {
  auto s = whole(r1, "Let me see.</think>Four.");
  EXPECT_EQ(s.reasoning, "Let me see.");
  EXPECT_EQ(s.content, "Four.");
  s = whole(r1, "<think>Let me see.</think>Four.</think>");  // a leading tag is dropped; only the first close counts
  EXPECT_EQ(s.reasoning, "Let me see.");
  EXPECT_EQ(s.content, "Four.</think>");
  s = whole(r1, "never closed");
  EXPECT_EQ(s.reasoning, "never closed");
  EXPECT_EQ(s.content, "");
}

TEST(Reasoning, APromptThatClosedTheBlockLeavesTheAnswer) {
  const reasoning_mode r1_closed{reasoning_parser::deepseek_r1, false, true, /*closed=*/true};
  auto s = whole(r1_closed, "Four.");
  EXPECT_FALSE(s.reasoning);
  EXPECT_EQ(s.content, "Four.");
  s = whole(r1_closed, "<think>again</think>Four.");  // a block it opens itself still counts
  EXPECT_EQ(s.reasoning, "again");
  EXPECT_EQ(s.content, "Four.");
  EXPECT_TRUE(prompt_closes_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_closes_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_closes_reasoning("</think> then a question<|im_end|>\n<|im_start|>assistant\n"));
}

TEST(Reasoning, AParserNeedsTheTagsAsTokensOfTheirOwn) {
  auto qwen = model::tokenizer::load(LLMESH_TEST_DATA "/tokenizers/qwen3");
  ASSERT_TRUE(qwen.ok()) << qwen.err().message;
  EXPECT_TRUE(check_reasoning_tokens(**qwen, "q").ok());
  auto llama = model::tokenizer::load(LLMESH_TEST_DATA "/tokenizers/llama3");
  ASSERT_TRUE(llama.ok()) << llama.err().message;
  auto s = check_reasoning_tokens(**llama, "l");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("the model 'l' has no token \"<think>\""), std::string::npos) << s.err().message;
}

// The thinking's token count agrees with the text split: for random outputs of the qwen3
// tokenizer's tokens (the tags, and plain tokens that cannot form one), the tokens counted are
// exactly those whose text is the reasoning.
TEST(Reasoning, TheReasoningTokensCountedAreThoseOfTheReasoningText) {
  auto loaded = model::tokenizer::load(LLMESH_TEST_DATA "/tokenizers/qwen3");
  ASSERT_TRUE(loaded.ok()) << loaded.err().message;
  const auto& tok = **loaded;
  auto one = [&](const std::string& t) {
    const auto ids = tok.encode(t, false);
    EXPECT_EQ(ids.size(), 1u) << t;
    return ids.at(0);
  };
  const int32_t open = one("<think>"), close = one("</think>");
  const std::vector<int32_t> atoms = {open, close, one("x"), one(" a"), one("\n"), one("Four")};
  std::mt19937 rng(11);
  for (int round = 0; round < 2000; ++round) {
    std::vector<int32_t> out;
    for (size_t n = rng() % 10; n > 0; --n) out.push_back(atoms[rng() % atoms.size()]);
    reasoning_mode modes[] = {qwen3, qwen3_opened, r1, {reasoning_parser::deepseek_r1, false, true, true}};
    reasoning_mode mode = modes[rng() % 4];
    mode.open_id = open;
    mode.close_id = close;
    const std::string text = tok.decoder().decode(out, /*skip_special=*/false);
    const split want = whole(mode, text);
    const size_t n = count_reasoning_tokens(mode, out);
    const size_t from = !out.empty() && out[0] == open ? 1 : 0;
    ASSERT_LE(from + n, out.size() + (n == 0 ? 1 : 0)) << text;
    const std::vector<int32_t> counted(out.begin() + static_cast<std::ptrdiff_t>(std::min(from, out.size())),
                                       out.begin() + static_cast<std::ptrdiff_t>(std::min(from + n, out.size())));
    EXPECT_EQ(tok.decoder().decode(counted, false), want.reasoning.value_or("")) << text;
  }
  reasoning_mode unknown = qwen3_opened;  // ids not known: nothing is counted
  EXPECT_EQ(count_reasoning_tokens(unknown, {open, 5, close}), 0u);
  EXPECT_EQ(count_reasoning_tokens({}, {open, 5, close}), 0u);
}

TEST(Reasoning, NoParserAndIncludeFalse) {
  auto s = whole({}, "<think>x</think>y");
  EXPECT_FALSE(s.reasoning);
  EXPECT_EQ(s.content, "<think>x</think>y");
  s = whole({reasoning_parser::qwen3, false, /*include=*/false}, "<think>x</think>y");
  EXPECT_FALSE(s.reasoning);
  EXPECT_EQ(s.content, "y");
}

TEST(Reasoning, EveryWayOfCuttingTheStreamGivesTheWholeSplit) {
  const std::vector<std::pair<reasoning_mode, std::string>> cases = {
      {qwen3, "<think>\nab</think>\n\ncd"},  {qwen3, "<thinking>x</think>y"}, {qwen3, "<thin"},
      {qwen3, "<think>a</thinker></think>b"}, {qwen3, "a<think>b</think>c"}, {qwen3, ""},
      {qwen3_opened, "r</th</think>c"},      {r1, "<think>r</think>c"},      {r1, "r</think"},
      {r1, "<</think>>"},
  };
  for (const auto& [mode, text] : cases) {
    SCOPED_TRACE(std::string(reasoning_parser_name(mode.parser)) + (mode.opened ? " opened: " : ": ") + text);
    const split want = whole(mode, text);
    for (size_t a = 0; a <= text.size(); ++a) {
      for (size_t b = a; b <= text.size(); ++b) {
        const split got = streamed(mode, text, {a, b});
        ASSERT_EQ(got.reasoning, want.reasoning) << "cut at " << a << ", " << b;
        ASSERT_EQ(got.content, want.content) << "cut at " << a << ", " << b;
      }
    }
    std::vector<size_t> bytes;
    for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
    const split got = streamed(mode, text, bytes);
    EXPECT_EQ(got.reasoning, want.reasoning) << "byte by byte";
    EXPECT_EQ(got.content, want.content) << "byte by byte";
  }
}

TEST(Reasoning, RandomTextsStreamedInRandomPiecesGiveTheWholeSplit) {
  // Texts made of the tags, their pieces and plain bytes, cut at random: the stream never
  // loses, duplicates or reorders a byte, and agrees with the whole split.
  const std::vector<std::string> atoms = {"<think>", "</think>", "<", "</", "<th", "</thi", "think>", ">", "x", " ", "\n", "é"};
  std::mt19937 rng(7);
  for (int round = 0; round < 3000; ++round) {
    std::string text;
    for (size_t n = rng() % 12; n > 0; --n) text += atoms[rng() % atoms.size()];
    const reasoning_mode modes[] = {qwen3, qwen3_opened, r1, {reasoning_parser::deepseek_r1, false, true, true}};
    const reasoning_mode& mode = modes[rng() % 4];
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i) {
      if (rng() % 3 == 0) cuts.push_back(i);
    }
    const split want = whole(mode, text), got = streamed(mode, text, cuts);
    ASSERT_EQ(got.reasoning, want.reasoning) << text;
    ASSERT_EQ(got.content, want.content) << text;
    // Nothing but the tags that delimit the block is dropped.
    const size_t kept = want.content.size() + (want.reasoning ? want.reasoning->size() : 0);
    EXPECT_LE(text.size() - kept, std::string("<think></think>").size()) << text;
  }
}

TEST(Reasoning, RenderedAsReasoningContent) {
  choice_delta c;
  c.reasoning = "hmm";
  c.finish = "length";
  json whole_msg = json::parse(response_json("chat.completion", "x", 1, "m", {c}, {}))["choices"][0]["message"];
  EXPECT_EQ(whole_msg["reasoning_content"], "hmm");
  EXPECT_TRUE(whole_msg["content"].is_null()) << "all of it was reasoning";
  c.text = "ok";
  whole_msg = json::parse(response_json("chat.completion", "x", 1, "m", {c}, {}))["choices"][0]["message"];
  EXPECT_EQ(whole_msg["content"], "ok");
  choice_delta d;
  d.reasoning = "step";
  json delta = json::parse(chunk_json("chat.completion.chunk", "x", 1, "m", d))["choices"][0]["delta"];
  EXPECT_EQ(delta, json({{"reasoning_content", "step"}}));
  EXPECT_FALSE(empty_delta(d));
  d.reasoning = "";
  EXPECT_TRUE(empty_delta(d));
  choice_delta plain;
  plain.text = "x";
  EXPECT_FALSE(json::parse(response_json("chat.completion", "x", 1, "m", {plain}, {}))["choices"][0]["message"].contains(
      "reasoning_content"));
}

// Through the group, as api_service builds a chat choice: a real Qwen3 vocabulary (where
// <think> and </think> are single tokens) and kjv-tiny's (where they are many).
class ReasoningChoice : public ::testing::TestWithParam<const char*> {
 protected:
  static std::shared_ptr<const model::tokenizer> load(const std::string& dir) {
    auto t = model::tokenizer::load(dir);
    EXPECT_TRUE(t.ok()) << t.err().message;
    return t.ok() ? *t : nullptr;
  }
  std::shared_ptr<const model::tokenizer> tok() const {
    static auto qwen = load(LLMESH_TEST_DATA "/tokenizers/qwen3");
    static auto kjv = load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
    return std::string(GetParam()) == "qwen3" ? qwen : kjv;
  }
  std::string run(const reasoning_mode& m, const tool_output& tools, bool streaming, const std::string& text) const {
    auto t = tok();
    completion_group g(group_setup{true, streaming, false, "chatcmpl-1", 1, "m", 1}, t->decoder(), nullptr);
    stream_setup s;
    s.prompt_ids = {1, 2};
    s.tools = tools;
    s.reasoning = m;
    g.add_choice(7, s);
    std::string out;
    const auto ids = t->encode(text, false);
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto f = i + 1 == ids.size() ? finish_reason::eos : finish_reason::none;
      out += g.on_message(token_msg{7, ids[i], f, false, {}, {}, {}});
    }
    EXPECT_TRUE(g.done());
    return streaming ? out : g.reply().body;
  }
  static std::vector<json> deltas(const std::string& sse) {
    std::vector<json> out;
    for (size_t pos = 0; (pos = sse.find("data: ", pos)) != std::string::npos;) {
      const size_t end = sse.find("\n\n", pos);
      const std::string payload = sse.substr(pos + 6, end - pos - 6);
      if (payload != "[DONE]") out.push_back(json::parse(payload)["choices"][0]);
      pos = end + 2;
    }
    return out;
  }
};

TEST_P(ReasoningChoice, ThinkingStreamsAsReasoningContentThenTheAnswer) {
  const std::string text = tok()->decoder().decode(tok()->encode("<think>\nThe LORD is one.\n</think>\n\nAmen.", false));
  ASSERT_EQ(text, "<think>\nThe LORD is one.\n</think>\n\nAmen.");
  auto ev = deltas(run(qwen3, {}, true, text));
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev[0]["delta"]["role"], "assistant");
  std::string reasoning, content;
  bool answer_started = false;
  for (const auto& e : ev) {
    const json& d = e["delta"];
    if (d.contains("reasoning_content")) {
      EXPECT_FALSE(answer_started) << "reasoning after the answer began";
      reasoning += d["reasoning_content"].get<std::string>();
    }
    if (d.contains("content")) {
      answer_started = true;
      content += d["content"].get<std::string>();
    }
    EXPECT_TRUE(d.size() > 0 || e["finish_reason"].is_string()) << "an empty delta went out: " << e.dump();
  }
  EXPECT_EQ(reasoning, "\nThe LORD is one.\n");
  EXPECT_EQ(content, "\n\nAmen.");
  EXPECT_EQ(ev.back()["finish_reason"], "stop");
  json msg = json::parse(run(qwen3, {}, false, text))["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "\nThe LORD is one.\n");
  EXPECT_EQ(msg["content"], "\n\nAmen.");
  // Without a parser the tags stay in the content.
  msg = json::parse(run({}, {}, false, text))["choices"][0]["message"];
  EXPECT_EQ(msg["content"], text);
  EXPECT_FALSE(msg.contains("reasoning_content"));
}

TEST_P(ReasoningChoice, UsageCountsTheThinkingsTokensWhereTheTagsAreTokens) {
  if (std::string(GetParam()) != "qwen3") GTEST_SKIP() << "kjv-tiny spells the tags in pieces: a parser refuses it";
  const auto t = tok();
  reasoning_mode m = qwen3;
  m.open_id = t->encode("<think>", false).at(0);
  m.close_id = t->encode("</think>", false).at(0);
  const std::string text = "<think>\nThe LORD is one.\n</think>\n\nAmen.";
  const size_t thinking = t->encode("\nThe LORD is one.\n", false).size();
  const size_t all = t->encode(text, false).size();
  ASSERT_GT(all, thinking + 2);
  const json u = json::parse(run(m, {}, false, text))["usage"];
  EXPECT_EQ(u["completion_tokens"], all);
  EXPECT_EQ(u["completion_tokens_details"], json({{"reasoning_tokens", thinking}})) << u;
  // Streamed, with usage: the same count on the usage chunk.
  completion_group g(group_setup{true, true, true, "chatcmpl-1", 1, "m", 1}, t->decoder(), nullptr);
  stream_setup s;
  s.prompt_ids = {1, 2};
  s.reasoning = m;
  g.add_choice(7, s);
  std::string out;
  const auto ids = t->encode(text, false);
  for (size_t i = 0; i < ids.size(); ++i) {
    out += g.on_message(token_msg{7, ids[i], i + 1 == ids.size() ? finish_reason::eos : finish_reason::none, false, {}, {}, {}});
  }
  const size_t at = out.rfind("\"usage\":");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_NE(out.find("\"completion_tokens_details\":{\"reasoning_tokens\":" + std::to_string(thinking) + "}", at), std::string::npos)
      << out.substr(at);
  // A model without a parser reports no details (as before).
  EXPECT_FALSE(json::parse(run({}, {}, false, text))["usage"].contains("completion_tokens_details"));
}

TEST_P(ReasoningChoice, ToolCallsAreFoundInTheAnswerOnly) {
  const tool_output automatic{tool_choice_mode::automatic, ""};
  const std::string text = tok()->decoder().decode(tok()->encode(
      "<think>\nI could write <tool_call> here.\n</think>\n\n<tool_call>\n{\"name\": \"psalm\", \"arguments\": {\"n\": 23}}\n</tool_call>",
      false));
  json msg = json::parse(run(qwen3, automatic, false, text))["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "\nI could write <tool_call> here.\n");
  EXPECT_EQ(msg["content"], "\n\n");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"], json({{"name", "psalm"}, {"arguments", R"({"n":23})"}}));
  auto ev = deltas(run(qwen3, automatic, true, text));
  std::string reasoning;
  json calls = json::array();
  for (const auto& e : ev) {
    reasoning += e["delta"].value("reasoning_content", "");
    for (const auto& c : e["delta"].value("tool_calls", json::array())) calls.push_back(c);
  }
  EXPECT_EQ(reasoning, "\nI could write <tool_call> here.\n");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "psalm");
  EXPECT_EQ(ev.back()["finish_reason"], "tool_calls");
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, ReasoningChoice, ::testing::Values("qwen3", "kjv"));

}  // namespace
}  // namespace llmesh::gateway
