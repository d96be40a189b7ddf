// Reasoning outputs (vLLM's --reasoning-parser): models such as DeepSeek-R1 and Qwen3 think
// before they answer, writing "<think>…</think>" and then the answer. With a parser set for
// the served model, a chat choice's text is split: the thinking goes to the message's (or
// delta's) "reasoning_content", the rest to "content" (and to tool-call parsing).
//
// The split, streamed or whole (the same rule both ways, so a streamed choice concatenates to
// the whole one):
// - The output begins in the reasoning when the parser is deepseek_r1 (R1 models always think;
//   their templates open the block in the prompt) unless the prompt closed a block, when the
//   rendered prompt ends by opening a "<think>" (Qwen3 thinking templates), or when a continued
//   final message left one open. A "<think>" at the very start of the output opens it too
//   (and is dropped).
// - Otherwise (qwen3: enable_thinking false, whose template closes an empty block in the
//   prompt, or a model that answers at once) all of the output is content.
// - The reasoning ends at the first "</think>" (dropped); everything after it is content.
//   An output that never closes it (cut by max_tokens) is all reasoning.
// vLLM's qwen3 parser differs in one corner: non-streamed, an unclosed block is content there.
//
// With a structured output or a forced tool call, the constraint holds for the answer only:
// api_service sets generation_fields::constraint_after to the tokens of "</think>" (unless the
// prompt closed the block already), so the model thinks unconstrained first, as vLLM does.
// A model that never writes "</think>" is then never constrained.
//
// openai_gptoss (vLLM's name; GPT-OSS models served without a reasoning parser use it, as
// vLLM's harmony path does, and so does any model served with tool_call_parser openai and none): the output is OpenAI's harmony format, decoded with its special tokens kept —
// analysis → reasoning_content, final → content, functions.NAME calls → tool_calls (tool_choice
// auto with tools; tool_call_parser openai), see harmony.hpp. A structured output then holds
// after "<|channel|>final<|message|>".
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "llmesh/common/error.hpp"
#include "llmesh/gateway/openai_api.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::gateway {

enum class reasoning_parser { none, deepseek_r1, qwen3, openai_gptoss };

/// "none", "deepseek_r1", "qwen3", "openai_gptoss".
std::string_view reasoning_parser_name(reasoning_parser p);
/// Parses a --reasoning-parser value (or a cluster config's reasoning_parser); invalid_request
/// names the choices.
[[nodiscard]] result<reasoning_parser> parse_reasoning_parser(std::string_view s);

/// Whether the served model's tokenizer spells `reasoning_end_tag()` as one token of its own,
/// which a reasoning parser needs (the replica waits for that token before a constraint
/// holds; a tag split differently in context would never be seen). An error naming the model
/// otherwise, as vLLM refuses such parsers.
/// openai_gptoss: harmony's <|start|>, <|channel|>, <|message|> and <|end|> instead.
[[nodiscard]] status check_reasoning_tokens(const model::tokenizer& tok, const std::string& model_name,
                                            reasoning_parser p = reasoning_parser::qwen3);

/// Whether a rendered chat prompt opens a "<think>" block for the output: it ends with "<think>"
/// and whitespace (Qwen3 thinking and DeepSeek-R1 templates). A "<think>" elsewhere in the
/// prompt (a user asking about the tag, a tool schema) does not count.
bool prompt_opens_reasoning(std::string_view prompt);

/// Whether a rendered chat prompt ends by closing a "<think>" block (and whitespace): Qwen3's
/// template with enable_thinking false writes an empty one, so the model answers at once.
bool prompt_closes_reasoning(std::string_view prompt);

/// The tag that ends the reasoning, "</think>".
std::string_view reasoning_end_tag();
/// "<think>".
std::string_view reasoning_start_tag();

/// Whether `text` (a continued final message's content) leaves a "<think>" open: its last
/// "<think>" has no "</think>" after it.
bool leaves_reasoning_open(std::string_view text);

/// How one chat choice's output is split.
struct reasoning_mode {
  reasoning_parser parser = reasoning_parser::none;
  bool opened = false;   ///< the prompt left a block open (prompt_opens_reasoning)
  bool include = true;   ///< vLLM's include_reasoning: false drops the reasoning from the response
  /// The prompt closed a block (thinking turned off), or a continued message is answer text:
  /// the output is the answer (deepseek_r1 too), unless it opens a block with "<think>".
  bool closed = false;
  /// The "<think>" and "</think>" token ids (check_reasoning_tokens: each is one token), for
  /// count_reasoning_tokens; -1: unknown (nothing is counted).
  int32_t open_id = -1, close_id = -1;
  /// openai_gptoss: function-call messages become tool_calls (tool_choice auto with tools);
  /// otherwise their text is content.
  bool harmony_calls = false;
  bool active() const { return parser != reasoning_parser::none; }
};

/// The harmony header after which a GPT-OSS answer begins (a structured output's start).
std::string_view harmony_final_header();

namespace detail {
class harmony_stream;
}

/// How many of an output's tokens are its thinking, as reasoning_stream splits the text: those
/// inside the block (not its "<think>" or "</think>"), the block opened by a first "<think>"
/// token, or at the start where the mode thinks first (opened; deepseek_r1 unless closed),
/// and ended by the first "</think>" token (an unclosed block: every token after its start).
size_t count_reasoning_tokens(const reasoning_mode& m, const std::vector<int32_t>& output);

/// Thread affinity: its stream's. Splits a choice's text pieces as they come: each delta's
/// text becomes its content piece and `reasoning` its reasoning piece (unset when empty).
/// Text that may begin a "<think>" at the start, or a "</think>" inside the reasoning, is held
/// until the next piece tells (the final delta, with its finish, releases everything).
class reasoning_stream {
 public:
  explicit reasoning_stream(reasoning_mode m);
  void shape(choice_delta& c);
  /// Whether any reasoning was seen (the block was entered).
  bool reasoned() const { return reasoned_; }

 private:
  enum class state { start, reasoning, content };
  reasoning_mode m_;
  state state_ = state::start;
  std::string pending_;
  bool reasoned_ = false;
  std::shared_ptr<detail::harmony_stream> harmony_;  ///< openai_gptoss's
};

/// A whole (non-streamed) choice: its text split as a stream would split it; `reasoning` is
/// set ("" possible) when the output had a reasoning block, and dropped without include.
void split_reasoning(const reasoning_mode& m, choice_delta& c);

}  // namespace llmesh::gateway
