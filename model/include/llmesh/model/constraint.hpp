// What a request's output must match (structured outputs), and its grammar: OpenAI's
// response_format (json_object, json_schema), vLLM's guided_json / guided_regex /
// guided_choice / guided_grammar (and structured_outputs), and forced tool calls, whose
// arguments follow the tool's parameters schema. The gateway compiles a spec to refuse a bad
// one with a clear 400 before the request enters the mesh; the replica compiles it again
// (cached by spec) and masks every draw with it (token_mask.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"
#include "llmesh/model/grammar.hpp"

namespace llmesh::model {

struct constraint_spec {
  enum class kind : uint8_t {
    none,         ///< unconstrained
    json_schema,  ///< text: a JSON Schema (as JSON text); the output is one JSON value it accepts
    json_object,  ///< text unused: the output is one JSON object (any keys and values)
    regex,        ///< text: a regular expression the whole output matches
    choice,       ///< text: a JSON array of strings; the output is exactly one of them
    grammar,      ///< text: a grammar in llama.cpp's GBNF; the output is a sentence of its root rule
  };
  kind type = kind::none;
  std::string text;
  bool operator==(const constraint_spec&) const = default;
};

/// The grammar of a spec (kind::none has none: an error). Errors are errc::invalid_request
/// and say what is wrong or unsupported, and where (a JSON pointer into the schema, an offset
/// into a pattern or grammar).
[[nodiscard]] result<std::shared_ptr<const grammar>> compile_constraint(const constraint_spec& spec);

/// One JSON value accepted by the schema (JSON Schema draft 2020-12 / OpenAI's subset); an
/// object's properties come in the schema's order (an ordered_json keeps it; a json, whose keys
/// are sorted, gives them in alphabetical order).
[[nodiscard]] result<std::shared_ptr<const grammar>> json_schema_grammar(const nlohmann::ordered_json& schema);
[[nodiscard]] result<std::shared_ptr<const grammar>> json_schema_grammar(const nlohmann::json& schema);
/// Strings the whole of which match pattern (ECMAScript-style syntax, as JSON Schema's pattern).
[[nodiscard]] result<std::shared_ptr<const grammar>> regex_grammar(std::string_view pattern);
/// Exactly one of choices (at least one; each non-empty).
[[nodiscard]] result<std::shared_ptr<const grammar>> choice_grammar(std::span<const std::string> choices);
/// A GBNF grammar text (root rule "root").
[[nodiscard]] result<std::shared_ptr<const grammar>> gbnf_grammar(std::string_view text);

/// Longest spec text accepted (schemas, patterns, grammars): bounds what a request can make
/// the gateway and each replica compile.
inline constexpr size_t max_constraint_bytes = 256 * 1024;

}  // namespace llmesh::model
