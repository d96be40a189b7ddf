// The model hyper-parameters llmesh honours, read from an HF config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/rope.hpp"

namespace llmesh::model {

/// Supported architectures (DESIGN.md §Models).
enum class architecture { llama, mistral, qwen2, qwen3, phi3, qwen3_moe, mixtral, gemma, gemma2, gemma3, qwen2_moe, granite, gpt_oss, smollm3 };

/// Everything the forward pass needs to know about a model's shape.
struct model_config {
  architecture arch = architecture::llama;
  std::string arch_name;  ///< as spelled in config.json, e.g. "LlamaForCausalLM"
  size_t hidden = 0, intermediate = 0, n_layers = 0;  ///< intermediate: each expert's, in an MoE model
  size_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  size_t vocab = 0;
  size_t max_positions = 0;
  float rms_norm_eps = 1e-6f;
  kernels::rope_config rope;   ///< the rotary dimension, theta and the rope_scaling rule
  bool tie_embeddings = false;
  /// The checkpoint has an LM head (its own, or tied to the embedding). False for a bare
  /// transformer ("LlamaModel", "Qwen3Model", ...: how embedding models such as e5-mistral ship,
  /// and a ...ForCausalLM checkpoint whose lm_head.weight is missing and not tied): it serves
  /// embeddings only; the loader then lets the embedding stand in for the head it never uses.
  bool has_lm_head = true;
  /// A multimodal checkpoint's language model (Gemma3ForConditionalGeneration,
  /// Mistral3ForConditionalGeneration: config_multimodal.hpp); its tensors sit under
  /// language_model.* (tensor_store::take_language_model) and the vision tower is never read.
  bool language_model_of_multimodal = false;
  /// A sequence classifier (…ForSequenceClassification: vLLM's classify and score tasks): the
  /// last position's final hidden state times `score` (labels × hidden) gives its logits, in place
  /// of an LM head's. labels 0: not one.
  struct classifier_config {
    size_t labels = 0;
    std::vector<std::string> names;  ///< by index: id2label's, else LABEL_i
    /// vLLM's classifier_from_token (a causal LM's checkpoint turned classifier, e.g. through
    /// --hf-overrides): the score rows are the LM head's rows of these tokens; with `two_way`
    /// (method from_2_way_softmax, or is_original_qwen3_reranker) one row, the second token's
    /// minus the first's. Empty: the checkpoint's score.weight.
    std::vector<std::string> from_tokens;
    bool two_way = false;
    /// How a cross-encoder tokenizes a pair (vLLM's use_pad_token): the tokenizer's pair template
    /// (true: a checkpoint's own head), or both texts as one string (false: the default with a
    /// classifier_from_token method — an LLM as reranker).
    bool use_pad_token = true;
    /// sentence-transformers' activation_fn (or sbert_ce_default_activation_function) is
    /// Identity: /score gives the raw logit (else a sigmoid).
    bool score_identity = false;
    /// A Qwen2 reward model (Qwen2ForRewardModel: 1 label, Qwen2ForProcessRewardModel: 2):
    /// the head is score.0 (hidden × hidden, with bias), ReLU, score.2 (labels × hidden, with
    /// bias), and every position is scored (vLLM's reward task: /pooling's token_classify).
    bool reward = false;
  } classifier;
  bool qkv_bias = false;       ///< Qwen2, or Llama / Qwen3 with attention_bias
  bool o_bias = false;         ///< Llama / Qwen3 with attention_bias
  /// Qwen3: q and k are RMS-normalised per head (weights of head_dim, shared by the heads) after
  /// their projections, before RoPE.
  bool qk_norm = false;
  /// Phi-3: q, k and v are one tensor (self_attn.qkv_proj, their rows in that order), gate and
  /// up another (mlp.gate_up_proj, gate's rows first); the loader views each part.
  bool fused_projections = false;
  /// Mixture of experts (Qwen3-MoE, Mixtral, Qwen2-MoE): every layer's MLP is n_experts SwiGLU
  /// experts of `intermediate` each; a router (a linear layer) scores them per token, softmax,
  /// the experts_per_token best run, their outputs weighted by those probabilities
  /// (renormalised over the chosen when norm_topk_prob) and summed. n_experts 0: a dense MLP.
  /// Qwen2-MoE adds a shared expert every token runs (SwiGLU of shared_intermediate), its output
  /// scaled by sigmoid(shared_expert_gate · x); shared_intermediate 0: none.
  /// GPT-OSS (GptOssForCausalLM): the router has a bias (mlp.router), the experts_per_token
  /// highest logits are softmaxed (the same weights as norm_topk_prob's), every expert's gate,
  /// up and down have biases, and the activation is gpt_oss_glu with swiglu_limit (the
  /// checkpoint's fused, interleaved gate_up_proj split at load: gpt_oss_experts.hpp).
  struct moe_config {
    size_t n_experts = 0, experts_per_token = 0;
    bool norm_topk_prob = true;
    size_t shared_intermediate = 0;
    bool biases = false;       ///< GPT-OSS: router and expert biases
    float swiglu_limit = 0.0f;  ///< > 0: GPT-OSS's clamped SwiGLU (kernels::gpt_oss_glu) in place of SwiGLU
  } moe;
  /// GPT-OSS: each query head has a learned sink logit (self_attn.sinks) that joins its softmax's
  /// denominator (attention that may attend to nothing).
  bool attn_sinks = false;
  size_t sliding_window = 0;   ///< 0: none (Mistral's and Phi-3's sliding_window)
  /// Gemma 2 and 3, GPT-OSS: which layers use sliding_window (config.json's layer_types, else
  /// Gemma 2's and GPT-OSS's even layers, Gemma 3's all but every sliding_window_pattern-th).
  /// Empty: every layer does.
  std::vector<bool> sliding_layers;
  /// Ministral 3 (rope_parameters' llama_4_scaling_beta, Llama 4's attention temperature): each
  /// query times kernels::llama4_query_scale(position, beta, original) after the rotary; beta 0:
  /// none. `original`: rope_parameters' original_max_position_embeddings.
  struct query_temperature_config {
    double beta = 0.0, original = 0.0;
  } query_temperature;
  /// SmolLM3: the layers that apply no rotary to q and k (NoPE; config.json's no_rope_layers
  /// entries 0, else every no_rope_layer_interval-th layer). Empty: every layer rotates.
  std::vector<bool> nope_layers;
  /// Gemma 3: the sliding layers' rotary (rope_local_base_freq, unscaled); `rope` is the others'.
  std::optional<kernels::rope_config> rope_local;
  /// The Gemma family (GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, text only).
  struct gemma_config {
    bool on = false;
    /// Every RMSNorm multiplies by (1 + weight); the loader adds the 1 (in float32, as HF does).
    /// The embedding rows are scaled by sqrt(hidden) rounded to the embedding's dtype. The MLP is
    /// GeGLU with the tanh GELU (hidden_activation gelu_pytorch_tanh).
    /// Gemma 2 and 3 ("sandwich" norms): post_attention_layernorm normalises the attention's
    /// output before the residual add, pre_feedforward_layernorm the MLP's input and
    /// post_feedforward_layernorm its output.
    bool sandwich_norms = false;
    float attn_softcap = 0.0f;   ///< attn_logit_softcapping (0: none)
    float final_softcap = 0.0f;  ///< final_logit_softcapping, on the logits (0: none)
  } gemma;
  /// Attention's score scale: 1/sqrt(head_dim), or Gemma 2/3's query_pre_attn_scalar^-1/2, or
  /// Granite's attention_multiplier. 0: 1/sqrt(head_dim).
  double attn_scale = 0.0;
  /// Granite's multipliers: the embedding rows times embedding_multiplier, each block's output
  /// times residual_multiplier before its residual add, the logits divided by logits_scaling.
  struct scaling_config {
    float embedding = 1.0f, residual = 1.0f, logits_divisor = 1.0f;
  } scaling;
  /// An AWQ, GPTQ or compressed-tensors (pack-quantized) checkpoint (config.json's
  /// quantization_config): its linear layers are X.qweight, X.qzeros and X.scales (GPTQ: and
  /// X.g_idx), or X.weight_packed, X.weight_scale (and X.weight_zero_point, X.weight_g_idx,
  /// X.weight_shape), instead of X.weight; the loader unpacks them into int4 or int8 blocks
  /// (packed_weights.cpp). fp8: quant_method fp8 (or compressed with `float8`): X.weight is
  /// F8_E4M3 beside a float scale (fp8_weights.hpp). none: plain weights.
  struct packed_config {
    /// mxfp4: GPT-OSS's quant_method mxfp4 — its experts' gate_up_proj and down_proj are
    /// _blocks (U8 e2m1 pairs) and _scales (U8 E8M0 exponents), held as kernels::dtype::mxfp4.
    enum class method : uint8_t { none, awq, gptq, compressed, fp8, mxfp4 } kind = method::none;
    int bits = 0;                 ///< 4 (AWQ, GPTQ, compressed) or 8 (GPTQ, compressed)
    size_t group_size = 0;        ///< input elements per scale and zero; 0: the whole row (GPTQ's -1, a channel strategy)
    bool zeros_plus_one = false;  ///< GPTQ's own checkpoint format stores each zero less one
    bool symmetric = false;       ///< compressed: no zero points
    bool act_order = false;       ///< each layer has a g_idx (GPTQ's desc_act, compressed-tensors' actorder "group")
    /// FP8 weights (kind fp8, or compressed-tensors' float-quantized format): one scale per
    /// tensor, per output (channel), per group of group_size inputs of an output, or per
    /// block of block_rows × block_cols.
    bool float8 = false;
    enum class fp8_scales : uint8_t { tensor, channel, group, block } scales = fp8_scales::tensor;
    size_t block_rows = 0, block_cols = 0;
  } packed;
  std::vector<int32_t> bos_ids, eos_ids;  ///< load_config merges generation_config.json's in
  /// The model's recommended sampling (generation_config.json's temperature, top_p, top_k):
  /// the API's defaults for requests that do not set them, as vLLM applies them.
  struct sampling_defaults {
    std::optional<float> temperature, top_p;
    std::optional<int> top_k;
    bool operator==(const sampling_defaults&) const = default;
  } sampling;
};

/// Whether layer `layer` is a sliding-window layer.
inline bool layer_sliding(const model_config& c, size_t layer) {
  return c.sliding_layers.empty() ? c.sliding_window > 0 : static_cast<bool>(c.sliding_layers[layer]);
}

/// Whether layer `layer` leaves q and k unrotated (SmolLM3's NoPE layers).
inline bool layer_nope(const model_config& c, size_t layer) { return !c.nope_layers.empty() && c.nope_layers[layer]; }

/// Layer `layer`'s sliding window (0: it attends to every earlier position).
inline size_t layer_window(const model_config& c, size_t layer) { return layer_sliding(c, layer) ? c.sliding_window : 0; }

/// Layer `layer`'s rotary configuration.
inline const kernels::rope_config& layer_rope(const model_config& c, size_t layer) {
  return c.rope_local && layer_sliding(c, layer) ? *c.rope_local : c.rope;
}

/// The model families the CUDA backend does not run yet ("mixture-of-experts models", "Gemma
/// models", "Granite models"), or null.
inline const char* cpu_only_family(const model_config& c) {
  if (c.moe.n_experts > 0) return "mixture-of-experts models";
  if (c.gemma.on) return "Gemma models";
  if (c.arch == architecture::granite) return "Granite models";
  return nullptr;
}

/// Parses config.json text. Errors name the missing or invalid field.
[[nodiscard]] result<model_config> parse_config(const std::string& json_text);

/// A longrope model's factors for a server granting `max_model_len` positions (0, or more than
/// the model's max_position_embeddings: that): the long ones when it exceeds original_max_position_embeddings,
/// else the short ones — vLLM's rule, so a sequence's rotary never changes as it grows (HF
/// switches per forward pass). Other models: unchanged.
void choose_longrope(model_config& c, size_t max_model_len);

/// Reads and parses DIR/config.json, then merges DIR/generation_config.json when present:
/// its eos_token_id (an int or a list) is appended to config.json's eos ids without
/// duplicates, its bos_token_id is used only where config.json has none, and its temperature,
/// top_p and top_k become `sampling` (top_p outside [0, 1], temperature < 0 or a negative
/// top_k are errors; top_k 0 means off; `do_sample: false` is ignored, as vLLM does). A malformed
/// generation_config.json (bad JSON, or ids that are not non-negative ints) is an invalid_request error
/// naming that file; a missing one is fine.
[[nodiscard]] result<model_config> load_config(const std::string& model_dir);
/// load_config with vLLM's --hf-overrides: `hf_overrides`, a JSON object, changes config.json
/// before it is parsed (apply_hf_overrides); "" changes nothing.
[[nodiscard]] result<model_config> load_config(const std::string& model_dir, const std::string& hf_overrides);

/// vLLM's --hf-overrides JSON on config.json's text: each key of the object replaces the
/// config's value (null: removes it, so the key takes its default — vLLM sets None), except that
/// an object given for a nested model config (an object with its own model_type: text_config,
/// vision_config...) updates it key by key, as vLLM updates a sub-config; other objects
/// (rope_scaling, quantization_config) are replaced whole. invalid_request when the overrides are
/// not a JSON object, are nested deeper than 16 levels, or config.json is not an object.
[[nodiscard]] result<std::string> apply_hf_overrides(const std::string& config_text, const std::string& hf_overrides);

/// vLLM's --generation-config DIR: the sampling defaults become DIR/generation_config.json's
/// (those it leaves out: none), and its eos/bos ids merge in as load_config merges the model's.
/// invalid_request when DIR has no such file; load_config's errors for a malformed one.
[[nodiscard]] status load_generation_config(model_config& c, const std::string& dir);

/// vLLM's --override-generation-config JSON: the object's temperature, top_p and top_k replace
/// those sampling defaults (the others stay), checked as generation_config.json's are. Another
/// key (vLLM takes more, e.g. repetition_penalty) is an invalid_request error naming it.
[[nodiscard]] status override_generation_config(model_config& c, const std::string& json_text);

}  // namespace llmesh::model
