// The language model of a multimodal checkpoint (config_multimodal.cpp): its text_config as a
// causal LM's config.json, for llmesh serves text in and text out.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "llmesh/common/error.hpp"

namespace llmesh::model::detail {

/// For Gemma3ForConditionalGeneration (gemma-3-4b/12b/27b-it) and
/// Mistral3ForConditionalGeneration (Mistral Small 3.1/3.2, Magistral Small): the text_config
/// as a Gemma3ForCausalLM / MistralForCausalLM config — the text config class's defaults where
/// it leaves a required field out (Gemma3TextConfig's: the released configs list only what
/// differs), the top level's bos/eos ids and quantization_config where it has none. nullopt
/// for any other architecture; an error names what is missing or unsupported.
[[nodiscard]] std::optional<result<nlohmann::json>> language_model_config(const nlohmann::json& j);

}  // namespace llmesh::model::detail
