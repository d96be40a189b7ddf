// config.json -> model_config. Unknown keys are ignored (HF configs carry many); known keys
// with wrong types or impossible values are errors, and so is anything we would silently
// compute wrong (a non-silu activation, an unsupported rope_scaling type, MLP biases).
// load_config also merges generation_config.json's bos/eos ids when that file is present.
#include <charconv>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <system_error>

#include "llmesh/model/config.hpp"
#include "config_fields.hpp"
#include "config_rope.hpp"
#include "config_multimodal.hpp"
#include "gguf_model.hpp"
#include "packed_weights.hpp"
#include "read_file.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;

using detail::bad;
using detail::get_bool;
using detail::get_number;
using detail::get_size;
using detail::get_string;

std::vector<int32_t> get_ids(const json& j, const char* key) {
  std::vector<int32_t> ids;
  if (!j.contains(key)) return ids;
  const auto& v = j[key];
  if (v.is_number_integer()) ids.push_back(v.get<int32_t>());
  if (v.is_array()) {
    for (const auto& x : v) {
      if (x.is_number_integer()) ids.push_back(x.get<int32_t>());
    }
  }
  return ids;
}

/// config.json's layer_types (transformers 4.53 on) into c.sliding_layers (sized n_layers).
status parse_layer_types(const json& j, model_config& c) {
  const auto& types = j["layer_types"];
  if (!types.is_array() || types.size() != c.n_layers) return bad("layer_types must list every layer");
  for (size_t i = 0; i < c.n_layers; ++i) {
    if (types[i] != "sliding_attention" && types[i] != "full_attention") {
      return bad("layer_types entries must be sliding_attention or full_attention");
    }
    c.sliding_layers[i] = types[i] == "sliding_attention";
  }
  return ok_status();
}

/// The experts of Qwen3-MoE and Qwen2-MoE (num_experts, num_experts_per_tok, norm_topk_prob;
/// every layer sparse; Qwen2-MoE's shared expert, shared_expert_intermediate_size) and Mixtral
/// (num_local_experts, num_experts_per_tok; always renormalised).
status parse_moe(const json& j, model_config& c) {
  if (c.arch != architecture::qwen3_moe && c.arch != architecture::mixtral && c.arch != architecture::qwen2_moe &&
      c.arch != architecture::gpt_oss) {
    return ok_status();
  }
  const bool qwen = c.arch == architecture::qwen3_moe || c.arch == architecture::qwen2_moe;
  if (c.arch == architecture::gpt_oss) {  // GptOssConfig: num_local_experts, num_experts_per_tok (the original config: experts_per_token)
    auto limit = get_number(j, "swiglu_limit", 7.0);
    if (!limit) return limit.take_error();
    if (!(*limit > 0.0 && *limit < 1e30)) return bad("swiglu_limit must be positive");
    auto alpha = get_number(j, "swiglu_alpha", 1.702);
    if (!alpha) return alpha.take_error();
    if (*alpha != 1.702) return make_error(errc::unsupported, "config.json: swiglu_alpha other than 1.702 is not supported");
    c.moe.swiglu_limit = static_cast<float>(*limit);
    c.moe.biases = true;
  }
  if (c.arch == architecture::qwen2_moe) {  // Qwen2MoeConfig's default: 5632
    auto shared = get_size(j, "shared_expert_intermediate_size", false, 5632);
    if (!shared) return shared.take_error();
    c.moe.shared_intermediate = *shared;
  }
  auto experts = get_size(j, qwen ? "num_experts" : "num_local_experts", true);
  if (!experts) return experts.take_error();
  const bool gpt_oss = c.arch == architecture::gpt_oss;
  const char* per_key = gpt_oss && !j.contains("num_experts_per_tok") && j.contains("experts_per_token") ? "experts_per_token"
                                                                                                          : "num_experts_per_tok";
  auto per_token = get_size(j, per_key, !gpt_oss, 4);  // GptOssConfig's default: 4
  if (!per_token) return per_token.take_error();
  if (*experts == 0 || *per_token == 0 || *per_token > *experts || *experts > 1024) {
    return bad("need 1 <= num_experts_per_tok <= the number of experts <= 1024");
  }
  c.moe.n_experts = *experts;
  c.moe.experts_per_token = *per_token;
  if (qwen) {
    auto norm = get_bool(j, "norm_topk_prob", false);
    if (!norm) return norm.take_error();
    c.moe.norm_topk_prob = *norm;
    auto step = get_size(j, "decoder_sparse_step", false, 1);
    if (!step) return step.take_error();
    const bool dense_layers = j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array() && !j["mlp_only_layers"].empty();
    if (*step != 1 || dense_layers) {
      return make_error(errc::unsupported, "config.json: dense layers among MoE ones (decoder_sparse_step other than 1, "
                                           "or mlp_only_layers) are not supported");
    }
  }
  return ok_status();
}

/// Gemma's per-layer choices (gemma_config, sliding_layers, rope_local, attn_scale); the rotary
/// of the full layers is parse_rope's.
status parse_gemma(const json& j, model_config& c) {
  c.gemma.on = true;
  // HF's GemmaMLP takes hidden_activation (a missing one means gelu_pytorch_tanh: the first
  // Gemma configs said "gelu" in hidden_act by mistake); exact-erf "gelu" is not supported.
  auto act = get_string(j, "hidden_activation", "gelu_pytorch_tanh");
  if (!act) return act.take_error();
  if (*act != "gelu_pytorch_tanh") {
    return make_error(errc::unsupported, "config.json: unsupported hidden_activation '" + *act + "' (supported: gelu_pytorch_tanh)");
  }
  auto bidirectional = get_bool(j, "use_bidirectional_attention", false);
  if (!bidirectional) return bidirectional.take_error();
  if (*bidirectional) return make_error(errc::unsupported, "config.json: use_bidirectional_attention (an embedding model) is not supported");
  if (c.arch == architecture::gemma) return ok_status();
  c.gemma.sandwich_norms = true;
  // A missing cap is the config class's default (Gemma 2's 50 and 30, Gemma 3's none); null is none.
  auto cap = [&](const char* key, double gemma2_default) {
    return get_number(j, key, j.contains(key) || c.arch != architecture::gemma2 ? 0.0 : gemma2_default);
  };
  auto attn_cap = cap("attn_logit_softcapping", 50.0);
  auto final_cap = cap("final_logit_softcapping", 30.0);
  auto scalar = get_number(j, "query_pre_attn_scalar", 256.0);
  for (auto* r : {&attn_cap, &final_cap, &scalar}) {
    if (!*r) return r->take_error();
  }
  if (!(*attn_cap >= 0.0) || !(*final_cap >= 0.0)) return bad("the logit soft-capping values must not be negative");
  if (!(*scalar > 0.0)) return bad("query_pre_attn_scalar must be positive");
  c.gemma.attn_softcap = static_cast<float>(*attn_cap);
  c.gemma.final_softcap = static_cast<float>(*final_cap);
  c.attn_scale = 1.0 / std::sqrt(*scalar);
  auto w = get_size(j, "sliding_window", false, j.contains("sliding_window") ? 0 : 4096);  // the configs' default
  if (!w) return w.take_error();
  c.sliding_window = *w;  // 0 (null): no layer has a window; Gemma 3's sliding layers keep their rotary
  c.sliding_layers.assign(c.n_layers, false);
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {  // transformers 4.53 on
    LLMESH_TRY(parse_layer_types(j, c));
  } else if (c.arch == architecture::gemma2) {  // layers 0, 2, 4, ... slide
    for (size_t i = 0; i < c.n_layers; i += 2) c.sliding_layers[i] = true;
  } else {  // Gemma 3: every sliding_window_pattern-th layer (the last of each group) is global
    auto pattern = get_size(j, "sliding_window_pattern", false, 6);
    if (!pattern) return pattern.take_error();
    if (*pattern == 0) return bad("sliding_window_pattern must be positive");
    for (size_t i = 0; i < c.n_layers; ++i) c.sliding_layers[i] = (i + 1) % *pattern != 0;
  }
  if (c.arch == architecture::gemma3) {  // the sliding layers' own unscaled rotary
    auto local = get_number(j, "rope_local_base_freq", 10000.0);
    if (!local) return local.take_error();
    if (!(*local > 0.0)) return bad("rope_local_base_freq must be positive");
    kernels::rope_config r;
    r.head_dim = c.rope.head_dim;
    r.theta = *local;
    c.rope_local = r;
  }
  return ok_status();
}

/// transformers v5 writes Gemma 3's rotary per layer type: rope_parameters {full_attention: {...},
/// sliding_attention: {...}}. Rewrites such a config into the flat form (rope_parameters the
/// full layers', rope_local_base_freq the sliding layers' theta), refusing a scaled local rotary.
/// Granite's multipliers (GraniteConfig's defaults: 1, 1, 1 and 1).
status parse_granite(const json& j, model_config& c) {
  auto embedding = get_number(j, "embedding_multiplier", 1.0);
  auto attention = get_number(j, "attention_multiplier", 1.0);
  auto residual = get_number(j, "residual_multiplier", 1.0);
  auto logits = get_number(j, "logits_scaling", 1.0);
  for (auto* r : {&embedding, &attention, &residual, &logits}) {
    if (!*r) return r->take_error();
    if (!(**r > 0.0) || !std::isfinite(**r)) {
      return bad("embedding_multiplier, attention_multiplier, residual_multiplier and logits_scaling must be positive");
    }
  }
  c.scaling.embedding = static_cast<float>(*embedding);
  c.attn_scale = *attention;
  c.scaling.residual = static_cast<float>(*residual);
  c.scaling.logits_divisor = static_cast<float>(*logits);
  return ok_status();
}

/// SmolLM3's NoPE layers: no_rope_layers (1: the layer rotates, 0: it does not), else every
/// no_rope_layer_interval-th layer (SmolLM3Config's default 4) without; with use_sliding_window
/// and a sliding_window, layer_types' sliding layers (SmolLM3Config's default: the NoPE ones).
status parse_smollm3(const json& j, model_config& c, bool use_window) {
  c.nope_layers.assign(c.n_layers, false);
  if (j.contains("no_rope_layers") && !j["no_rope_layers"].is_null() && !j["no_rope_layers"].empty()) {
    const auto& v = j["no_rope_layers"];
    if (!v.is_array() || v.size() < c.n_layers) return bad("no_rope_layers must list every layer");  // HF reads the first n_layers
    for (size_t i = 0; i < c.n_layers; ++i) {
      if (!v[i].is_number_integer() || (v[i] != 0 && v[i] != 1)) return bad("no_rope_layers entries must be 0 or 1");
      c.nope_layers[i] = v[i] == 0;
    }
  } else {
    auto interval = get_size(j, "no_rope_layer_interval", false, 4);
    if (!interval) return interval.take_error();
    if (*interval == 0) return bad("no_rope_layer_interval must be positive");
    for (size_t i = 0; i < c.n_layers; ++i) c.nope_layers[i] = (i + 1) % *interval == 0;
  }
  auto w = get_size(j, "sliding_window", false, 0);
  if (!w) return w.take_error();
  if (!use_window || *w == 0) return ok_status();
  c.sliding_window = *w;
  c.sliding_layers = c.nope_layers;
  if (j.contains("layer_types") && !j["layer_types"].is_null()) LLMESH_TRY(parse_layer_types(j, c));
  return ok_status();
}

/// Ministral3Config's defaults where config.json leaves a field out: its yarn rotary (theta 1e6,
/// factor 16 over 16384 positions, mscale 1/1, llama_4_scaling_beta 0.1), 262144 positions,
/// head_dim 128, rms_norm_eps 1e-5.
void ministral3_defaults(json& j) {
  if (!j.contains("max_position_embeddings") || j["max_position_embeddings"].is_null()) j["max_position_embeddings"] = 262144;
  if (!j.contains("head_dim") || j["head_dim"].is_null()) j["head_dim"] = 128;
  if (!j.contains("rms_norm_eps") || j["rms_norm_eps"].is_null()) j["rms_norm_eps"] = 1e-5;
  const bool scaled = (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) ||
                      (j.contains("rope_scaling") && !j["rope_scaling"].is_null());
  if (!scaled) {
    j["rope_parameters"] = {{"type", "yarn"}, {"rope_theta", 1000000.0}, {"factor", 16.0},
                            {"original_max_position_embeddings", 16384}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                            {"mscale_all_dim", 1.0}, {"mscale", 1.0}, {"llama_4_scaling_beta", 0.1}};
  }
}

/// Ministral 3's attention temperature: rope_parameters' (or rope_scaling's)
/// llama_4_scaling_beta over its original_max_position_embeddings.
status parse_query_temperature(const json& j, model_config& c) {
  const json* s = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? &j["rope_parameters"]
                  : j.contains("rope_scaling") && j["rope_scaling"].is_object()    ? &j["rope_scaling"]
                                                                                    : nullptr;
  if (s == nullptr) return ok_status();
  auto beta = get_number(*s, "llama_4_scaling_beta", 0.0);
  auto original = get_number(*s, "original_max_position_embeddings", 0.0);
  if (!beta) return beta.take_error();
  if (!original) return original.take_error();
  if (*beta == 0.0) return ok_status();
  if (!std::isfinite(*beta) || !(*original >= 1.0) || !std::isfinite(*original)) {
    return bad("llama_4_scaling_beta needs a finite beta and original_max_position_embeddings >= 1");
  }
  c.query_temperature = {*beta, *original};
  return ok_status();
}

/// A missing rope_theta is Gemma3TextConfig's default, 1e6.
result<json> flatten_gemma3_rope(json j) {
  const bool per_type = j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
                        j["rope_parameters"].contains("full_attention");
  if (!per_type) {
    const bool v5 = j.contains("rope_parameters") && j["rope_parameters"].is_object();
    if (!j.contains("rope_theta") && !(v5 && j["rope_parameters"].contains("rope_theta"))) j["rope_theta"] = 1e6;
    return j;
  }
  json params = j["rope_parameters"];
  j["rope_parameters"] = params["full_attention"];
  if (!j["rope_parameters"].is_object()) return bad("rope_parameters.full_attention must be an object");
  if (!j["rope_parameters"].contains("rope_theta")) j["rope_parameters"]["rope_theta"] = 1e6;
  if (params.contains("sliding_attention") && !params["sliding_attention"].is_null()) {
    const auto& local = params["sliding_attention"];
    if (!local.is_object()) return bad("rope_parameters.sliding_attention must be an object");
    auto legacy = get_string(local, "type", "default");
    if (!legacy) return legacy.take_error();
    auto type = get_string(local, "rope_type", *legacy);
    if (!type) return type.take_error();
    if (*type != "default") {
      return make_error(errc::unsupported, "config.json: a scaled rotary on the sliding layers is not supported");
    }
    if (local.contains("rope_theta")) j["rope_local_base_freq"] = local["rope_theta"];
  }
  return j;
}

/// A …ForSequenceClassification config's labels (id2label, else num_labels, else 2, as
/// transformers counts them) and vLLM's classifier_from_token / method / is_original_qwen3_reranker.
status parse_classifier(const json& j, model_config& c) {
  auto& k = c.classifier;
  size_t labels = 2;
  std::vector<std::string> names;
  if (auto it = j.find("id2label"); it != j.end() && it->is_object() && !it->empty()) {
    labels = it->size();
    names.resize(labels);
    for (const auto& [key, value] : it->items()) {
      size_t i = 0;
      auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), i);
      if (ec != std::errc() || end != key.data() + key.size() || i >= labels || !value.is_string()) {
        return bad("id2label: keys must be the labels' indices 0.." + std::to_string(labels - 1) + " and values strings");
      }
      names[i] = value.get<std::string>();
    }
  } else if (auto n = j.find("num_labels"); n != j.end()) {
    if (!n->is_number_unsigned() || n->get<uint64_t>() < 1 || n->get<uint64_t>() > 65536) return bad("num_labels must be 1 to 65536");
    labels = n->get<size_t>();
  }
  // vLLM's: classifier_from_token counts only with a method (Qwen3-Reranker's flag sets one);
  // without, the checkpoint's score.weight is the head.
  std::string method = j.value("method", std::string());
  if (j.value("is_original_qwen3_reranker", false)) method = "from_2_way_softmax";
  auto t = j.find("classifier_from_token");
  const bool tokens = t != j.end() && !t->is_null();
  if (!method.empty()) {
    if (!tokens) return bad("method " + method + " needs classifier_from_token (e.g. [\"no\", \"yes\"])");
    if (!t->is_array() || t->empty() || t->size() > 65536) return bad("classifier_from_token must be a non-empty list of tokens");
    for (const auto& tok : *t) {
      if (!tok.is_string()) return bad("classifier_from_token must be a list of strings");
      k.from_tokens.push_back(tok.get<std::string>());
    }
    if (method == "from_2_way_softmax") {
      if (k.from_tokens.size() != 2) return bad("method from_2_way_softmax takes two classifier_from_token tokens (false, true)");
      k.two_way = true;
    } else if (method != "no_post_processing") {
      return bad("method must be from_2_way_softmax or no_post_processing, not '" + method + "'");
    }
    labels = k.two_way ? 1 : k.from_tokens.size();
  }
  // A cross-encoder's pair: the tokenizer's pair template, or (an LLM as reranker, vLLM's
  // default with a method) the two texts as one.
  k.use_pad_token = j.value("use_pad_token", method.empty());
  // sentence-transformers' CrossEncoder activation for /score (vLLM reads both keys).
  std::string act;
  if (auto st = j.find("sentence_transformers"); st != j.end() && st->is_object()) act = st->value("activation_fn", std::string());
  if (act.empty()) act = j.value("sbert_ce_default_activation_function", std::string());
  k.score_identity = act.ends_with("Identity");
  k.labels = labels;
  if (names.size() != labels) names.clear();
  for (size_t i = 0; i < labels; ++i) k.names.push_back(i < names.size() && !names[i].empty() ? names[i] : "LABEL_" + std::to_string(i));
  return ok_status();
}

result<model_config> parse_config_json(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  model_config c;
  if (!j.contains("architectures") || !j["architectures"].is_array() || j["architectures"].empty() ||
      !j["architectures"][0].is_string()) {
    return bad("missing field 'architectures'");
  }
  c.arch_name = j["architectures"][0].get<std::string>();
  if (auto text = detail::language_model_config(j)) {  // a multimodal checkpoint: its language model
    if (!*text) return text->take_error();
    auto lm = parse_config_json(text->value().dump());
    if (!lm) return lm.take_error();
    lm->arch_name = c.arch_name;
    lm->language_model_of_multimodal = true;
    return lm;
  }
  // A bare transformer (an embedding model's checkpoint): the same layers, no LM head.
  static const std::pair<const char*, const char*> bare[] = {{"LlamaModel", "LlamaForCausalLM"},
                                                             {"MistralModel", "MistralForCausalLM"},
                                                             {"Qwen2Model", "Qwen2ForCausalLM"},
                                                             {"Qwen3Model", "Qwen3ForCausalLM"},
                                                             {"GemmaModel", "GemmaForCausalLM"},
                                                             {"Gemma2Model", "Gemma2ForCausalLM"}};
  std::string arch_name = c.arch_name;
  for (const auto& [base, causal] : bare) {
    if (arch_name == base) {
      arch_name = causal;
      c.has_lm_head = false;
    }
  }
  // A sequence classifier: the same layers, a score head in place of the LM head.
  constexpr std::string_view seq_cls = "ForSequenceClassification";
  if (arch_name.ends_with(seq_cls) && arch_name != "Gemma3ForSequenceClassification") {
    arch_name = arch_name.substr(0, arch_name.size() - seq_cls.size()) + "ForCausalLM";
    LLMESH_TRY(parse_classifier(j, c));
    if (c.classifier.from_tokens.empty()) c.has_lm_head = false;  // score.weight in its place
  }
  // Qwen2's reward models (vLLM's): a two-layer score head on every position; the labels are
  // the architecture's (vLLM sets num_labels so), named by id2label when it has as many.
  if (arch_name == "Qwen2ForRewardModel" || arch_name == "Qwen2ForProcessRewardModel") {
    const size_t labels = arch_name == "Qwen2ForRewardModel" ? 1 : 2;
    arch_name = "Qwen2ForCausalLM";
    LLMESH_TRY(parse_classifier(j, c));
    auto& k = c.classifier;
    if (!k.from_tokens.empty()) return bad("a reward model's head is its score.0 and score.2, not classifier_from_token");
    if (k.labels != labels) {
      k.labels = labels;
      k.names.clear();
      for (size_t i = 0; i < labels; ++i) k.names.push_back("LABEL_" + std::to_string(i));
    }
    k.reward = true;
    c.has_lm_head = false;
  }
  if (arch_name == "LlamaForCausalLM") {
    c.arch = architecture::llama;
  } else if (arch_name == "MistralForCausalLM" || arch_name == "Ministral3ForCausalLM") {
    c.arch = architecture::mistral;
  } else if (arch_name == "Qwen2ForCausalLM") {
    c.arch = architecture::qwen2;
  } else if (arch_name == "Qwen3ForCausalLM") {
    c.arch = architecture::qwen3;
  } else if (arch_name == "Phi3ForCausalLM") {
    c.arch = architecture::phi3;
  } else if (arch_name == "Qwen3MoeForCausalLM") {
    c.arch = architecture::qwen3_moe;
  } else if (arch_name == "MixtralForCausalLM") {
    c.arch = architecture::mixtral;
  } else if (arch_name == "Qwen2MoeForCausalLM") {
    c.arch = architecture::qwen2_moe;
  } else if (arch_name == "GraniteForCausalLM") {
    c.arch = architecture::granite;
  } else if (arch_name == "GptOssForCausalLM") {
    c.arch = architecture::gpt_oss;
  } else if (arch_name == "SmolLM3ForCausalLM") {
    c.arch = architecture::smollm3;
  } else if (arch_name == "GemmaForCausalLM") {
    c.arch = architecture::gemma;
  } else if (arch_name == "Gemma2ForCausalLM") {
    c.arch = architecture::gemma2;
  } else if (arch_name == "Gemma3ForCausalLM") {
    c.arch = architecture::gemma3;
  } else {
    return make_error(errc::unsupported, "config.json: unknown architecture '" + c.arch_name +
                                             "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                                             "Qwen3ForCausalLM, Phi3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, "
                                             "GraniteForCausalLM, GptOssForCausalLM, SmolLM3ForCausalLM, Ministral3ForCausalLM, "
                                             "the language models of Gemma3ForConditionalGeneration and "
                                             "Mistral3ForConditionalGeneration, "
                                             "GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, and the bare LlamaModel, "
                                             "MistralModel, Qwen2Model, Qwen3Model, GemmaModel, Gemma2Model for embeddings, "
                                             "each causal LM's …ForSequenceClassification but Gemma 3's, and "
                                             "Qwen2ForRewardModel, Qwen2ForProcessRewardModel)");
  }
  const bool gemma = c.arch == architecture::gemma || c.arch == architecture::gemma2 || c.arch == architecture::gemma3;
  if (c.arch == architecture::gpt_oss) {  // GptOssConfig's defaults where the file says nothing
    if (!j.contains("rope_theta")) j["rope_theta"] = 150000.0;
    if (!j.contains("rms_norm_eps")) j["rms_norm_eps"] = 1e-5;
    if (!j.contains("rope_scaling") && !j.contains("rope_parameters")) {
      j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                           {"original_max_position_embeddings", 4096}, {"truncate", false}};
    }
  }
  const bool ministral3 = arch_name == "Ministral3ForCausalLM";
  if (ministral3) ministral3_defaults(j);
  if (c.arch == architecture::smollm3) {  // SmolLM3Config's defaults: default_theta, and 4 KV heads (not the query heads)
    if (!j.contains("rope_theta") && !j.contains("rope_parameters")) j["rope_theta"] = 2000000.0;
    if (!j.contains("num_key_value_heads") || j["num_key_value_heads"].is_null()) j["num_key_value_heads"] = 4;
  }
  if (c.arch == architecture::gemma3) {
    auto flat = flatten_gemma3_rope(j);
    if (!flat) return flat.take_error();
    j = std::move(*flat);
  }

#define LLMESH_FIELD(dst, key, required, fallback)     \
  {                                                    \
    auto v = get_size(j, key, required, fallback);     \
    if (!v) return v.take_error();                     \
    dst = *v;                                          \
  }
  LLMESH_FIELD(c.hidden, "hidden_size", true, 0)
  // Qwen3-MoE's and Qwen2-MoE's experts have moe_intermediate_size; every layer is MoE (checked below).
  const bool qwen_moe = c.arch == architecture::qwen3_moe || c.arch == architecture::qwen2_moe;
  LLMESH_FIELD(c.intermediate, qwen_moe ? "moe_intermediate_size" : "intermediate_size", true, 0)
  LLMESH_FIELD(c.n_layers, "num_hidden_layers", true, 0)
  LLMESH_FIELD(c.n_heads, "num_attention_heads", true, 0)
  LLMESH_FIELD(c.n_kv_heads, "num_key_value_heads", false, c.n_heads)
  LLMESH_FIELD(c.vocab, "vocab_size", true, 0)
  // The config classes' defaults: Gemma 1/2 8192, Gemma 3 131072, SmolLM3 32768, the others 2048 (HF writes the key anyway).
  LLMESH_FIELD(c.max_positions, "max_position_embeddings", false,
               c.arch == architecture::gemma3 || c.arch == architecture::gpt_oss ? 131072
               : (c.arch == architecture::gemma || c.arch == architecture::gemma2) ? 8192
               : c.arch == architecture::smollm3 ? 32768 : 2048)
  if (c.hidden == 0 || c.intermediate == 0 || c.n_layers == 0 || c.n_heads == 0 || c.vocab == 0) {
    return bad("hidden_size, intermediate_size, num_hidden_layers, num_attention_heads and vocab_size must be positive");
  }
  const bool qwen3_like = c.arch == architecture::qwen3 || c.arch == architecture::qwen3_moe;
  // HF's Qwen3Config defaults head_dim to 128, the Gemma configs to 256 (not hidden / heads).
  LLMESH_FIELD(c.head_dim, "head_dim", false,
               qwen3_like ? 128 : gemma ? 256 : c.arch == architecture::gpt_oss ? 64 : c.hidden / c.n_heads)
#undef LLMESH_FIELD
  if (c.n_kv_heads == 0 || c.n_heads % c.n_kv_heads != 0) {
    return bad("num_attention_heads (" + std::to_string(c.n_heads) + ") must be a multiple of num_key_value_heads (" +
               std::to_string(c.n_kv_heads) + ")");
  }
  if (c.head_dim == 0 || c.head_dim % 2 != 0) return bad("head_dim must be even and positive");

  auto eps = get_number(j, "rms_norm_eps", 1e-6);
  if (!eps) return eps.take_error();
  if (!(*eps >= 0.0)) return bad("rms_norm_eps must not be negative");
  c.rms_norm_eps = static_cast<float>(*eps);
  if (!gemma) {  // Gemma's activation is hidden_activation (parse_gemma)
    auto act = get_string(j, "hidden_act", "silu");
    if (!act) return act.take_error();
    if (*act != "silu") return make_error(errc::unsupported, "config.json: unsupported hidden_act '" + *act + "' (supported: silu)");
  }
  auto mlp_bias = get_bool(j, "mlp_bias", false);
  const bool smollm3 = c.arch == architecture::smollm3;
  auto tie = get_bool(j, "tie_word_embeddings", gemma || smollm3);  // the Gemma and SmolLM3 configs default to tied
  const bool gpt_oss = c.arch == architecture::gpt_oss;
  auto attention_bias_r = get_bool(j, "attention_bias", gpt_oss);  // GptOssConfig's default: true
  auto use_window = get_bool(j, "use_sliding_window", false);
  for (auto* r : {&mlp_bias, &tie, &attention_bias_r, &use_window}) {
    if (!*r) return r->take_error();
  }
  if (*mlp_bias) return make_error(errc::unsupported, "config.json: mlp_bias is not supported");
  LLMESH_TRY(detail::parse_rope(j, c));

  c.tie_embeddings = *tie;
  bool attention_bias = *attention_bias_r;
  const bool qwen3_family = c.arch == architecture::qwen3 || c.arch == architecture::qwen3_moe;
  const bool biased =
      attention_bias && (c.arch == architecture::llama || qwen3_family || gemma || c.arch == architecture::granite || gpt_oss || smollm3);
  c.qkv_bias = c.arch == architecture::qwen2 || c.arch == architecture::qwen2_moe || biased;
  c.o_bias = biased;
  c.qk_norm = qwen3_family || c.arch == architecture::gemma3;
  LLMESH_TRY(parse_moe(j, c));
  LLMESH_TRY(detail::parse_packed_config(j, c));
  if (gemma) LLMESH_TRY(parse_gemma(j, c));
  if (gpt_oss) {  // sinks on every layer; the window on layer_types' sliding layers (GptOssConfig's default: the even ones)
    c.attn_sinks = true;
    auto w = get_size(j, "sliding_window", false, j.contains("sliding_window") ? 0 : 128);
    if (!w) return w.take_error();
    c.sliding_window = *w;
    c.sliding_layers.assign(c.n_layers, false);
    if (j.contains("layer_types") && !j["layer_types"].is_null()) {
      LLMESH_TRY(parse_layer_types(j, c));
    } else {
      for (size_t i = 0; i < c.n_layers; i += 2) c.sliding_layers[i] = true;
    }
  }
  if (c.arch == architecture::granite) LLMESH_TRY(parse_granite(j, c));
  if (smollm3) LLMESH_TRY(parse_smollm3(j, c, *use_window));
  if (ministral3) LLMESH_TRY(parse_query_temperature(j, c));
  c.fused_projections = c.arch == architecture::phi3;
  if ((c.arch == architecture::qwen2 || c.arch == architecture::qwen2_moe || qwen3_family) && *use_window) {
    // HF applies Qwen's window only from layer max_window_layers on; released checkpoints
    // ship with it off. Refuse rather than compute something subtly different.
    return make_error(errc::unsupported, "config.json: " + c.arch_name + " use_sliding_window is not supported");
  }
  if (c.arch == architecture::mistral || c.arch == architecture::phi3 || c.arch == architecture::mixtral) {
    auto w = get_size(j, "sliding_window", false, 0);
    if (!w) return w.take_error();
    c.sliding_window = *w;
  }
  c.bos_ids = get_ids(j, "bos_token_id");
  c.eos_ids = get_ids(j, "eos_token_id");
  return c;
}

/// Appends each of `src` not already in `dst`, keeping order.
void append_unique(std::vector<int32_t>& dst, const std::vector<int32_t>& src) {
  for (int32_t id : src) {
    if (std::find(dst.begin(), dst.end(), id) == dst.end()) dst.push_back(id);
  }
}

/// generation_config.json's `key`: absent or null is none, else an int or a list of ints, each a
/// valid token id (0..INT32_MAX). Unlike config.json's ids (read leniently), a wrong type here is
/// an error: this file is the only source of e.g. Llama-3-Instruct's end-of-turn id, and
/// ignoring it silently would make generation run to max_tokens.
result<std::vector<int32_t>> get_generation_ids(const json& j, const char* key, const std::string& path) {
  std::vector<int32_t> ids;
  if (!j.contains(key) || j[key].is_null()) return ids;
  auto bad_ids = [&] {
    return make_error(errc::invalid_request, path + ": field '" + key + "' must be a token id or a list of token ids");
  };
  auto add = [&](const json& x) {
    if (!x.is_number_integer()) return false;
    const bool in_range = x.is_number_unsigned()
                              ? x.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max())
                              : x.get<int64_t>() >= 0 && x.get<int64_t>() <= std::numeric_limits<int32_t>::max();
    if (!in_range) return false;
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
    return true;
  };
  const auto& v = j[key];
  if (v.is_array()) {
    for (const auto& x : v) {
      if (!add(x)) return bad_ids();
    }
  } else if (!add(v)) {
    return bad_ids();
  }
  return ids;
}

/// Merges generation_config.json (the text of `path`) into `c`, as HF transformers and vLLM do:
/// eos ids are config.json's followed by generation_config's, without duplicates; bos ids are
/// taken from it only where config.json has none.
status merge_generation_config(model_config& c, const std::string& text, const std::string& path) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error(errc::invalid_request, path + ": not a JSON object");
  auto eos = get_generation_ids(j, "eos_token_id", path);
  if (!eos) return eos.take_error();
  auto bos = get_generation_ids(j, "bos_token_id", path);
  if (!bos) return bos.take_error();
  std::vector<int32_t> merged;
  append_unique(merged, c.eos_ids);
  append_unique(merged, *eos);
  c.eos_ids = std::move(merged);
  if (c.bos_ids.empty()) append_unique(c.bos_ids, *bos);
  auto number = [&](const char* key, double lo, double hi) -> result<std::optional<double>> {
    if (!j.contains(key) || j[key].is_null()) return std::optional<double>{};
    const auto& v = j[key];
    if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi)) {
      return make_error(errc::invalid_request, path + ": field '" + key + "' must be a number in [" + std::to_string(lo) + ", " +
                                                   std::to_string(hi) + "]");
    }
    return std::optional<double>(v.get<double>());
  };
  auto t = number("temperature", 0.0, 1e6);
  if (!t) return t.take_error();
  auto p = number("top_p", 0.0, 1.0);
  if (!p) return p.take_error();
  auto k = number("top_k", 0.0, static_cast<double>(std::numeric_limits<int>::max()));
  if (!k) return k.take_error();
  if (*k && std::floor(**k) != **k) return make_error(errc::invalid_request, path + ": field 'top_k' must be an integer");
  if (*t) c.sampling.temperature = static_cast<float>(**t);
  if (*p) c.sampling.top_p = static_cast<float>(**p);
  if (*k) c.sampling.top_k = static_cast<int>(**k);
  return ok_status();
}

}  // namespace

status load_generation_config(model_config& c, const std::string& dir) {
  const std::string path = dir + "/generation_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return make_error(errc::invalid_request, "--generation-config " + dir + ": no generation_config.json there");
  }
  auto text = read_text_file(path);
  if (!text) return make_error(errc::io_error, "cannot read " + path);
  c.sampling = {};
  return merge_generation_config(c, *text, path);
}

status override_generation_config(model_config& c, const std::string& text) {
  const std::string flag = "--override-generation-config";
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error(errc::invalid_request, flag + ": not a JSON object: " + text);
  for (const auto& [key, value] : j.items()) {
    if (key != "temperature" && key != "top_p" && key != "top_k") {
      return make_error(errc::invalid_request, flag + ": '" + key + "' is not taken here (temperature, top_p, top_k)");
    }
  }
  return merge_generation_config(c, text, flag);
}


result<model_config> parse_config(const std::string& text) {
  try {
    return parse_config_json(text);
  } catch (const std::exception& e) {  // nlohmann's typed accessors throw on a wrong type
    return bad(std::string("invalid field type: ") + e.what());
  }
}

namespace {

/// A nested model config, as transformers writes one (text_config, vision_config...): an object
/// with its own model_type. Other objects (rope_scaling, quantization_config) are plain values.
bool is_sub_config(const json& config, const std::string& key) {
  auto at = config.find(key);
  return at != config.end() && at->is_object() && at->contains("model_type");
}

void override_into(json& config, const json& overrides) {
  for (const auto& [key, value] : overrides.items()) {
    if (value.is_null()) {
      config.erase(key);
    } else if (value.is_object() && is_sub_config(config, key)) {
      override_into(config[key], value);
    } else {
      config[key] = value;
    }
  }
}

constexpr int max_override_depth = 16;

}  // namespace

result<std::string> apply_hf_overrides(const std::string& config_text, const std::string& hf_overrides) {
  int deepest = 0;
  const json::parser_callback_t depth = [&](int d, json::parse_event_t, json&) {
    deepest = std::max(deepest, d);
    return d <= max_override_depth;  // (deeper values are not kept)
  };
  auto o = json::parse(hf_overrides, depth, false);
  if (deepest > max_override_depth) {
    return make_error(errc::invalid_request, "--hf-overrides: nested deeper than " + std::to_string(max_override_depth) + " levels");
  }
  if (o.is_discarded() || !o.is_object()) {
    return make_error(errc::invalid_request, "--hf-overrides must be a JSON object, e.g. '{\"max_position_embeddings\": 4096}'");
  }
  if (o.size() > 256) return make_error(errc::invalid_request, "--hf-overrides: at most 256 keys");
  auto c = json::parse(config_text, nullptr, false);
  if (c.is_discarded() || !c.is_object()) return bad("not a JSON object");
  override_into(c, o);
  return c.dump();
}

result<model_config> load_config(const std::string& model_dir) { return load_config(model_dir, ""); }

result<model_config> load_config(const std::string& model_dir, const std::string& hf_overrides) {
  auto text = read_model_file(model_dir, "config.json");
  if (!text) return text.take_error();
  if (!hf_overrides.empty()) {
    auto changed = apply_hf_overrides(*text, hf_overrides);
    if (!changed) return changed.take_error();
    *text = std::move(*changed);
  }
  auto c = parse_config(*text);
  if (!c) {
    error e = c.take_error();
    e.message = model_dir + (is_gguf_file(model_dir) ? ": " : "/") + e.message;
    return e;
  }
  // generation_config.json is optional: only a missing file is skipped; one that exists but
  // cannot be read or parsed is an error, so a model never loads without its stop ids.
  const std::string gen_path = model_dir + "/generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(gen_path, ec)) return c;
  auto gen_text = read_text_file(gen_path);
  if (!gen_text) return make_error(errc::io_error, "cannot read " + gen_path);  // it exists
  LLMESH_TRY(merge_generation_config(*c, *gen_text, gen_path));
  return c;
}

}  // namespace llmesh::model
