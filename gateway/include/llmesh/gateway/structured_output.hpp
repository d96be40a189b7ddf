// Structured outputs and tools in a request body, without the HTTP: OpenAI's `response_format`
// (text, json_object, json_schema), vLLM's `guided_json` / `guided_regex` / `guided_choice` /
// `guided_grammar` and `structured_outputs` {json, regex, choice, grammar, json_object}, and
// chat's `tools`, `tool_choice` and `parallel_tool_calls`, turned into the one
// model::constraint_spec a request's generations follow (compiled here once with
// model::compile_constraint so a bad schema, pattern or grammar is a 400 naming its field
// before the request enters the mesh; the replica compiles it again and masks every draw).
// Also the incoming chat messages' tool calls (assistant `tool_calls`, whose JSON-string
// arguments become objects for the chat template, as vLLM does). Plain functions; the parsers
// in openai_api.cpp call them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"
#include "llmesh/model/constraint.hpp"

namespace llmesh::gateway {

/// JSON text held in a string (guided_json as a string, a tool call's arguments) or read back
/// from an output (tool calls), nesting at most as deep as a request body may
/// (max_embedded_json_depth, openai_api.cpp's bound), so a string cannot smuggle in what the
/// body may not hold; nullopt when it is not JSON or nests deeper.
inline constexpr int max_embedded_json_depth = 32;
std::optional<nlohmann::ordered_json> parse_embedded_json(std::string_view text);

/// What a chat request's tools do to its answer (OpenAI's tool_choice).
enum class tool_choice_mode : uint8_t {
  none,      ///< no tool is called: the answer is content (tool_choice "none", or no tools)
  automatic, ///< "auto" (the default with tools): unconstrained; Hermes-style <tool_call>
             ///< blocks in the text become calls (tool_calls.hpp), the rest is content
  required,  ///< "required": the output is a JSON array of {"name", "parameters"} calls
  named,     ///< {"type":"function","function":{"name":N}}: the output is N's arguments
};

/// A chat request's tools, checked.
struct tool_request {
  /// The tools as sent (an array of {"type":"function","function":{"name", ...}}), for the
  /// chat template's `tools` variable; empty: none (then the template sees no `tools`).
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  tool_choice_mode mode = tool_choice_mode::none;
  std::string name;  ///< named: the tool to call
  bool parallel_tool_calls = true;
};

/// Tools per request: each is rendered into the prompt and, with "required", into the schema
/// every draw is checked against; 128 is OpenAI's own limit.
inline constexpr size_t max_tools = 128;

/// `tools`, `tool_choice` and `parallel_tool_calls` of a chat body. tools: null or an array of
/// at most max_tools objects {"type": "function" (or left out), "function": {"name": a
/// non-empty string, unique, at most 256 bytes; "description": a string; "parameters": a JSON
/// schema object; "strict": a boolean — each optional but name}}. tool_choice: "none",
/// "auto" (the default with tools, else "none"), "required", or {"type":"function",
/// "function":{"name": one of the tools}}; "required" and a named tool need tools.
/// parallel_tool_calls: a boolean (null: true). An invalid_request error names the field.
[[nodiscard]] status parse_tools(const nlohmann::ordered_json& body, tool_request& out);

/// The output constraint of a body (both endpoints; `tools` null on /v1/completions): at most
/// one of response_format (json_object or json_schema; "text" and null ask for none),
/// guided_json (an object or a string holding one), guided_regex, guided_choice (an array of
/// strings), guided_grammar (GBNF), structured_outputs' json / regex / choice / grammar /
/// json_object: true, and a tool_choice that forces a call (named: the tool's parameters
/// schema; required: an array of calls, see required_tools_schema). Two or more: a 400 naming
/// them. The spec is compiled (model::compile_constraint); its error becomes a 400 naming the
/// field ('guided_regex': ..., 'response_format.json_schema.schema': ...). `out` stays kind
/// none when nothing is asked for.
[[nodiscard]] status parse_output_constraint(const nlohmann::ordered_json& body, const tool_request* tools,
                                             model::constraint_spec& out);

/// tool_choice "required"'s schema (vLLM's construction): {"type":"array","minItems":1,
/// ("maxItems":1 without parallel tool calls,) "items":{"anyOf":[{"type":
/// "object","properties":{"name":{"type":"string","enum":[N]},"parameters":P},"required":
/// ["name","parameters"],"additionalProperties":false} per tool]}}, P the tool's parameters
/// ({"type":"object","properties":{}} when it has none). additionalProperties false is this
/// server's addition: the output is parsed back into calls, so nothing else belongs in it.
nlohmann::ordered_json required_tools_schema(const tool_request& t);

/// One chat message's tool calls, in place: an assistant message's `tool_calls` (null: none)
/// must be an array of objects whose "function" holds a string "name" and "arguments" (a
/// string or an object); a string that parses as a JSON object becomes that object, as vLLM
/// hands them to chat templates (HF templates read tool_call.function.arguments as a mapping).
/// Such a message may leave `content` out or null: it becomes "" (vLLM's). Other messages are
/// left alone. `index` is the message's, for errors ('messages[2].tool_calls[0].function').
[[nodiscard]] status normalize_tool_calls(nlohmann::ordered_json& message, size_t index);

}  // namespace llmesh::gateway
