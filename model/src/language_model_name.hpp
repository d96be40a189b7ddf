// A multimodal checkpoint's language-model tensor names (safetensors.cpp), shared by
// tensor_store::take_language_model and the LoRA loader (lora.cpp).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace llmesh::model::detail {

/// `name` as a causal LM's: language_model.model.X and model.language_model.X as model.X,
/// language_model.lm_head.X as lm_head.X, lm_head.X as it is (transformers before 4.52 saved
/// the first forms, after it the others); nullopt for any other (the vision tower's, the projector's).
std::optional<std::string> language_model_name(std::string_view name);

}  // namespace llmesh::model::detail
