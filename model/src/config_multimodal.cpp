#include "config_multimodal.hpp"

#include <span>
#include <string>
#include <utility>

#include "config_fields.hpp"

namespace llmesh::model::detail {

std::optional<result<json>> language_model_config(const json& j) {
  const std::string arch = j["architectures"][0].get<std::string>();
  const bool gemma3 = arch == "Gemma3ForConditionalGeneration", mistral3 = arch == "Mistral3ForConditionalGeneration";
  if (!gemma3 && !mistral3) return std::nullopt;
  // HF would take a missing text_config as the class's defaults; a checkpoint always has one, and
  // a config without it (its text fields at the top level) is not what it says.
  if (!j.contains("text_config")) return result<json>(bad("missing field 'text_config' (" + arch + "'s language model)"));
  json t = j["text_config"];
  if (!t.is_object()) return result<json>(bad("text_config must be an object"));
  if (t.contains("model_type") && !t["model_type"].is_string()) return result<json>(bad("text_config.model_type must be a string"));
  const std::string type = t.value("model_type", gemma3 ? "gemma3_text" : "mistral");
  const bool ministral3 = mistral3 && type == "ministral3";  // Ministral 3 (3B/8B/14B-2512)
  if (type != (gemma3 ? "gemma3_text" : "mistral") && !ministral3) {
    return result<json>(make_error(errc::unsupported, "config.json: " + arch + " with a text_config of model_type '" + type +
                                                          "' (supported: " + (gemma3 ? "gemma3_text" : "mistral, ministral3") + ")"));
  }
  // The text config classes' defaults for the fields llmesh requires (Gemma3TextConfig's are
  // gemma-3-4b's heads over gemma-2-2b's shape; MistralConfig's Mistral 7B's).
  static const std::pair<const char*, int64_t> gemma3_defaults[] = {
      {"vocab_size", 262208},       {"hidden_size", 2304},        {"intermediate_size", 9216},
      {"num_hidden_layers", 26},    {"num_attention_heads", 8},   {"num_key_value_heads", 4}};
  static const std::pair<const char*, int64_t> mistral_defaults[] = {
      {"vocab_size", 32000},        {"hidden_size", 4096},        {"intermediate_size", 14336},
      {"num_hidden_layers", 32},    {"num_attention_heads", 32},  {"num_key_value_heads", 8}};
  static const std::pair<const char*, int64_t> ministral3_defaults[] = {
      {"vocab_size", 131072},       {"hidden_size", 4096},        {"intermediate_size", 14336},
      {"num_hidden_layers", 34},    {"num_attention_heads", 32},  {"num_key_value_heads", 8}};
  for (const auto& [key, value] : gemma3       ? std::span(gemma3_defaults)
                                  : ministral3 ? std::span(ministral3_defaults)
                                               : std::span(mistral_defaults)) {
    if (!t.contains(key) || t[key].is_null()) t[key] = value;
  }
  if (mistral3 && !ministral3) {  // MistralConfig's defaults
    if (!t.contains("sliding_window")) t["sliding_window"] = 4096;
    if (!t.contains("max_position_embeddings") || t["max_position_embeddings"].is_null()) t["max_position_embeddings"] = 131072;
  }
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id", "quantization_config", "torch_dtype", "dtype"}) {
    if ((!t.contains(key) || t[key].is_null()) && j.contains(key)) t[key] = j[key];
  }
  t["architectures"] = json::array({gemma3 ? "Gemma3ForCausalLM" : ministral3 ? "Ministral3ForCausalLM" : "MistralForCausalLM"});
  t["model_type"] = type;
  return result<json>(std::move(t));
}

}  // namespace llmesh::model::detail
