// A chat choice's output as tool calls (structured_output.hpp's tool_choice): a named tool's
// output is its arguments, one call; "required"'s output is a JSON array of {"name",
// "parameters"}, one call each; with "auto" (and tools), calls the model wrote in its format
// are taken out of the text, by the served model's tool-call parser (vLLM's
// --tool-call-parser): hermes — <tool_call>{"name": ..., "arguments": {...}}</tool_call>
// blocks, as Qwen2.5/3 and Hermes 2 Pro templates ask for — or llama3_json — an output that
// is JSON objects {"name": ..., "parameters": {...}} separated by ";" (after Llama 3.1's
// <|python_tag|>, if kept), as Llama 3.1-3.3 templates ask for — or mistral — [TOOL_CALLS]
// and the calls after it, as Mistral's templates ask for — or pythonic — a Python list of
// calls with keyword arguments, as Llama 3.2 and Llama 4 templates ask for. Other formats stay
// content.
// Whole messages and streamed deltas shaped as OpenAI's (and vLLM's) tool_calls. With "none"
// nothing is shaped.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/gateway/openai_api.hpp"
#include "llmesh/gateway/structured_output.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::gateway {

/// The format "auto" looks for calls in (vLLM's --tool-call-parser names).
/// openai: GPT-OSS's harmony calls, which the openai_gptoss reasoning parser takes out of the
/// output (reasoning.hpp, harmony.hpp; api_service turns it on with this parser unless another
/// reasoning parser is named — then no call is found): the shapers here leave its choices as
/// they are.
enum class tool_call_parser { hermes, llama3_json, mistral, pythonic, qwen3_coder, granite, phi4_mini_json, openai };

/// "hermes", "llama3_json", "mistral", "pythonic", "qwen3_coder", "granite", "phi4_mini_json", "openai".
std::string_view tool_call_parser_name(tool_call_parser p);
/// Parses a --tool-call-parser value (or a cluster config's tool_call_parser); invalid_request
/// names the choices.
[[nodiscard]] result<tool_call_parser> parse_tool_call_parser(std::string_view s);

/// The special tokens whose text a parser needs to see (the decoder drops special tokens):
/// mistral's [TOOL_CALLS] (and [ARGS], where the vocabulary has it). An error naming the model
/// when it has no [TOOL_CALLS] token; none for the other parsers.
[[nodiscard]] result<std::vector<int32_t>> tool_parser_kept_tokens(const model::tokenizer& tok, tool_call_parser p,
                                                                   const std::string& model_name);

/// How a choice's output is shaped (api_service sets it from the request's tool_choice).
struct tool_output {
  tool_choice_mode mode = tool_choice_mode::none;  ///< none shapes nothing (automatic: only with tools)
  std::string name;                                ///< named: the function
  tool_call_parser parser = tool_call_parser::hermes;  ///< automatic: the served model's format
  /// The request's chat tools (qwen3_coder converts each parameter's text by its schema there);
  /// null: none.
  std::shared_ptr<const nlohmann::ordered_json> tools;
  bool shapes() const { return mode != tool_choice_mode::none; }
};

/// A new call id, "chatcmpl-tool-" and 32 random hex digits (vLLM's form).
std::string new_tool_call_id();

/// A new call id for Mistral models: 9 random alphanumerics (their templates refuse others).
std::string new_mistral_tool_call_id();

/// Mistral's calls, `text` being what follows [TOOL_CALLS]: a JSON array of {"name",
/// "arguments"} (tokenizer v3; one object alone too: text that starts with "[" or "{"), or
/// name[ARGS]{...} with further calls after further [TOOL_CALLS] (v11 and later). An output
/// that does not parse is content without the markers. Ids are Mistral's; arguments compact JSON. An
/// invalid_request error when the text is anything else.
[[nodiscard]] result<std::vector<tool_call_delta>> parse_mistral_calls(std::string_view text);

/// The calls of a "required" output (a JSON array of {"name": string, "parameters": any}),
/// each with a new id and its parameters as compact JSON text for arguments. An
/// invalid_request error when the text is not that (a generation cut short by max_tokens).
[[nodiscard]] result<std::vector<tool_call_delta>> parse_required_calls(std::string_view text);

/// The Hermes-style calls in `text` (from its first "<tool_call>" on): each <tool_call> block's
/// JSON object {"name": string, "arguments": any (left out: {})} is a call with a new id and
/// its arguments as compact JSON text; the last block may be unclosed, and text between or
/// after blocks is ignored (vLLM's hermes parser). An invalid_request error when there is no
/// block or one is not such an object.
[[nodiscard]] result<std::vector<tool_call_delta>> parse_hermes_calls(std::string_view text);

/// Llama 3.1-3.3's JSON calls (vLLM's llama3_json parser): `text`, after an optional leading
/// "<|python_tag|>", is one or more JSON objects {"name": string, "parameters" (or
/// "arguments"): any} separated by ";" (or "," or whitespace alone); each is a call with a new id and its
/// parameters as compact JSON text. An invalid_request error when the text is anything else.
[[nodiscard]] result<std::vector<tool_call_delta>> parse_llama3_json_calls(std::string_view text);

/// Granite 3.x's calls (vLLM's granite parser): `text`, stripped, after an optional
/// "<|tool_call|>" (Granite 3.0's token, when kept) and then "<tool_call>" (3.1's string), is a
/// JSON array of {"name": string, "arguments": any}, nothing after it; each is a call with a new
/// id and its arguments as compact JSON text. An invalid_request error when the text is
/// anything else (an empty array too).
[[nodiscard]] result<std::vector<tool_call_delta>> parse_granite_calls(std::string_view text);

/// Phi-4-mini's calls (vLLM's phi4_mini_json parser), `text` from "functools" on: "functools"
/// then a JSON array of {"name": string, "arguments" (or "parameters"): any}; text after the
/// array is dropped. Each is a call with a new id and its arguments as compact JSON text. An
/// invalid_request error when the array is missing, unclosed or not such objects.
[[nodiscard]] result<std::vector<tool_call_delta>> parse_phi4_mini_calls(std::string_view text);

/// Pythonic calls (vLLM's pythonic and llama4_pythonic parsers): `text`, stripped (and without a
/// Llama 4 <|python_start|> ... <|python_end|> around it), is a Python list of calls
/// [f(a=1, b="x"), g.h(c=[1, 2], d={"k": None})] whose arguments are keywords with literal values
/// (strings with Python's quotes and escapes, ints, floats, True / False / None, lists, tuples,
/// dicts with string keys; negative numbers too). Each is a call with a new id and its
/// arguments as compact JSON text. An invalid_request error when the text is anything else.
[[nodiscard]] result<std::vector<tool_call_delta>> parse_pythonic_calls(std::string_view text);

/// A Python literal (what pythonic arguments may be: strings, numbers, True / False / None,
/// lists, tuples, dicts) as JSON, the whole stripped text; nullopt when it is not one
/// (ast.literal_eval's use in vLLM's parsers).
std::optional<nlohmann::ordered_json> python_literal(std::string_view text);

/// Qwen3-Coder's XML calls (vLLM's qwen3_coder parser; qwen3_coder_calls.cpp), `text` from its
/// first "<tool_call>" on: each <tool_call> block's <function=NAME> with its
/// <parameter=P>\nVALUE\n</parameter> parameters is a call with a new id; a value becomes JSON
/// by the type its parameter has in `tools` (the request's chat tools; a string when the tool
/// or parameter is not there). Blocks without a valid function are left out; an
/// invalid_request error when none is left.
[[nodiscard]] result<std::vector<tool_call_delta>> parse_qwen3_coder_calls(std::string_view text, const nlohmann::ordered_json* tools);

/// Whether pythonic takes this output for calls: after leading whitespace, "[" or <|python_start|>.
bool pythonic_calls_start(std::string_view text);

/// Whether `text`, an output's beginning, may still begin pythonic calls: false once it is plainly
/// not "[name(" (a "[1]" or a "[note]" of prose), so a stream need not hold it to the end.
bool pythonic_calls_may_follow(std::string_view text);

/// A whole (non-streamed) choice: named — one call whose arguments are the text, finish kept
/// (vLLM's "stop"); required — the parsed calls, finish "tool_calls" where it was "stop"; the
/// content becomes "" (vLLM's). A required output that does not parse (cut by max_tokens)
/// stays the content, with its finish reason ("length"). automatic, hermes (mistral,
/// qwen3_coder, phi4_mini_json) — where the text holds Hermes-style calls (a [TOOL_CALLS] and
/// Mistral's calls; Qwen3-Coder's XML calls; "functools[" and its array) that parse, they
/// become the calls, the content is the text before the first, finish "tool_calls" where it
/// was "stop"; llama3_json (pythonic, granite) — where the text
/// begins with "{" (or "<|python_tag|>"; pythonic: "["; granite: "[" after its markers) and is
/// all calls, they become the calls and the content is ""; otherwise nothing changes. Nothing
/// changes when !t.shapes().
void shape_tool_calls(const tool_output& t, choice_delta& c);

/// Thread affinity: its stream's. Shapes one streamed choice's deltas.
///
/// named: the first delta carries the role and the call's start {index 0, id, type, name,
/// arguments ""}; each later text piece becomes {index 0, arguments: piece}; when the first
/// delta has text it follows as a second delta. required: the text is held until the choice
/// ends (not parsed incrementally), then one delta carries every call whole (index, id, type,
/// name, arguments) with finish "tool_calls"; if it does not parse, the held text goes out as
/// content with the engine's finish reason. automatic, hermes (mistral, qwen3_coder,
/// phi4_mini_json): content streams as it comes, except that text which may begin a
/// "<tool_call>" ("[TOOL_CALLS]", "functools[") tag is held back until the next piece tells;
/// from a tag on, the text is held until the choice ends, then goes out as one delta of
/// calls (finish "tool_calls") if they all parse, else as content. automatic, llama3_json
/// (pythonic, granite): an output whose text begins with "{" (or "<|python_tag|>"; pythonic: "[" after
/// any whitespace; granite: "[" after whitespace and its markers) is held until the choice ends, then
/// goes out as calls or, if it is not all calls, as content; any other output streams as content. Logprobs and token ids ride on
/// the deltas as before (while text is held, on the deltas that still go out: the first,
/// those that carry them, the last).
class tool_call_stream {
 public:
  explicit tool_call_stream(tool_output t) : t_(std::move(t)) {}
  /// The deltas to send instead of `c` (none, one or two), in order.
  std::vector<choice_delta> shape(choice_delta c);

 private:
  std::vector<choice_delta> shape_automatic(choice_delta c);
  /// llama3_json and pythonic: the output is calls whole or content.
  std::vector<choice_delta> shape_whole_output(choice_delta c);

  tool_output t_;
  std::string held_;     ///< required: the text so far; automatic: the text from the first tag on
  std::string pending_;  ///< automatic: the text's end that may begin a tag
  bool in_calls_ = false;  ///< automatic: a tag was seen (llama3_json, pythonic: the output begins as calls)
  bool decided_ = false;   ///< llama3_json, pythonic: the output's first text told whether it is calls
};

}  // namespace llmesh::gateway
