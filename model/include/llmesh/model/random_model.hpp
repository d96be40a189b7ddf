// `llmesh model random`: writes a deterministic random model as a loadable HF directory
// (config.json, safetensors — single or sharded —, tokenizer.json, tokenizer_config.json,
// generation_config.json). Used for tests, golden files and benchmarks at any shape.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/dtype.hpp"

namespace llmesh::model {

struct random_model_spec {
  std::string arch = "llama";  ///< llama | mistral | qwen2 | qwen3 | phi3 | qwen3_moe | mixtral | qwen2_moe | gemma | gemma2 | gemma3 | granite | gpt_oss | smollm3 | ministral3
  size_t hidden = 64, intermediate = 160, n_layers = 2;
  size_t n_heads = 4, n_kv_heads = 2, head_dim = 0;  ///< head_dim 0: hidden / n_heads (omitted from config)
  size_t vocab = 517;                                ///< at least 258: 256 byte tokens + BOS + EOS
  /// qwen3_moe, mixtral, qwen2_moe, gpt_oss: experts per layer and per token (0: 8 and 2); intermediate is
  /// each expert's. qwen2_moe: the shared expert's intermediate size (0: 2 × intermediate).
  size_t n_experts = 0, experts_per_token = 0, shared_intermediate = 0;
  size_t max_positions = 2048;
  kernels::dtype dtype = kernels::dtype::f32;
  bool tie_embeddings = false;
  bool attention_bias = false;  ///< Llama and Qwen3 (Qwen2 always has q/k/v biases)
  double rope_theta = 10000.0;
  bool llama3_scaling = false;  ///< rope_scaling {rope_type: llama3, factor 8, low 1, high 4, original 8192 / 64}
  bool linear_scaling = false;  ///< rope_scaling {rope_type: linear, factor 8} (Gemma 3: its global layers')
  /// rope_scaling {rope_type: yarn, factor 4, original_max_position_embeddings 256} (Qwen's
  /// long-context recipe; 256 so tiny test contexts straddle its ramp).
  bool yarn_scaling = false;
  /// rope_scaling {type: longrope, short_factor 1 + 0.05·i, long_factor 1 + 0.5·i} with a top-level
  /// original_max_position_embeddings of 64 (Phi-3.5's layout).
  bool longrope_scaling = false;
  bool dynamic_scaling = false;  ///< rope_scaling {type: dynamic, factor 4} (dynamic NTK, vLLM's fixed base)
  double partial_rotary = 1.0;  ///< partial_rotary_factor (written when not 1; Phi-4-mini's 0.75)
  size_t sliding_window = 0;    ///< Mistral, Phi-3, Mixtral, Gemma 2/3; 0 writes null
  /// Gemma 2/3: attn_logit_softcapping and final_logit_softcapping (negative: Gemma 2's 50 and 30,
  /// Gemma 3's none; 0 writes null), query_pre_attn_scalar (0: head_dim), and Gemma 3's
  /// sliding_window_pattern (0: 6).
  float attn_softcap = -1.0f, final_softcap = -1.0f;
  double query_pre_attn_scalar = 0.0;
  size_t sliding_pattern = 0;
  float rms_norm_eps = 1e-5f;
  uint64_t seed = 1;
  size_t shards = 1;            ///< >1 writes model-0000i-of-0000n.safetensors + index
  /// A bare transformer as embedding models ship (llama, mistral, qwen2, qwen3, gemma, gemma2):
  /// architectures "<Arch>Model", tensors without the "model." prefix and no lm_head (with
  /// tie_embeddings false). Every tensor holds the values it has in the full checkpoint.
  bool base_model = false;
  /// A sequence classifier ("<Arch>ForSequenceClassification"): id2label LABEL_0.. of this many
  /// labels and score.weight [labels, hidden] in place of lm_head (0: a causal LM).
  size_t classifier_labels = 0;
  /// With arch qwen2 and classifier_labels 1 or 2: a reward model in place of a sequence
  /// classifier, Qwen2ForRewardModel (1) or Qwen2ForProcessRewardModel (2), its head score.0
  /// [hidden, hidden] and score.2 [labels, hidden], each with a bias.
  bool reward = false;
  /// The decoder layers' linear weights as an AWQ, GPTQ or compressed-tensors checkpoint stores
  /// them (packed_weights.hpp): "awq" (4 bits, zero points), "gptq" (4 bits, zero points, g_idx
  /// in order), "gptq-act-order" (desc_act: g_idx a random assignment of groups), "gptq8" (8
  /// bits, symmetric), "ct-w4a16" (pack-quantized, 4 bits, symmetric groups), "ct-w4a16-asym"
  /// (with zero points), "ct-w8a16" (8 bits, symmetric, per channel); random quants, zeros and
  /// float16 scales of the size of the plain weights; or as an FP8 checkpoint stores them
  /// (fp8_weights.hpp): "fp8" (quant_method fp8, static: a float32 scale per tensor and an
  /// input_scale), "fp8-block" (weight_block_size [group_size, group_size], weight_scale_inv),
  /// "ct-fp8" (compressed-tensors FP8_DYNAMIC: bfloat16 scales per output), "ct-fp8-block"
  /// (FP8_BLOCK), "ct-fp8-group" (float16 scales per group of group_size inputs);
  /// quantization_config in config.json; with arch gpt_oss, "mxfp4" (OpenAI's release: the
  /// experts' _blocks and _scales, random codes, exponents near the plain weights' scale;
  /// gpt_oss_experts.hpp). "": plain weights (gpt_oss: the experts as HF's [E, in, out]
  /// parameters). gpt_oss always has attention biases and sinks, alternating sliding layers
  /// (even ones; the window is sliding_window) and, with yarn_scaling, OpenAI's yarn fields.
  std::string packed;
  size_t group_size = 32;  ///< inputs per scale and zero of a packed layer
  /// With an FP8 or compressed-tensors `packed`: an FP8 KV-cache calibration as such checkpoints
  /// ship it — each layer's self_attn.k_scale and self_attn.v_scale (scalars in the model's
  /// dtype, about 0.01 to 0.03; kv_scales.hpp) and, for compressed-tensors, its kv_cache_scheme.
  bool kv_scales = false;
};

/// Writes the model into `dir` (created if missing). Same spec, same bytes, on every machine.
[[nodiscard]] status write_random_model(const random_model_spec& spec, const std::string& dir);

/// A tensor to write: its bytes are produced by `fill` when the writer reaches it, so a
/// multi-GB model never sits in memory whole.
struct tensor_spec {
  std::string name;
  kernels::dtype type = kernels::dtype::f32;
  std::vector<size_t> shape;
  std::function<void(std::span<uint8_t>)> fill;
  uint8_t int_bytes = 0;  ///< integer elements (type unused): 1 writes "U8", 4 "I32", 8 "I64" (packed and MXFP4 checkpoints' tensors)
};

/// Writes one safetensors file (header padded to 8 bytes, tensors in the given order).
[[nodiscard]] status write_safetensors(const std::string& path, const std::vector<tensor_spec>& tensors);

/// `llmesh model random-lora`: a deterministic random PEFT LoRA adapter for the model in
/// `model_dir` (its config.json gives the shapes), written into `dir` as PEFT's save_pretrained
/// does: adapter_config.json and adapter_model.safetensors.
struct random_lora_spec {
  size_t rank = 8;
  double alpha = 16.0;
  bool rslora = false;
  /// Any of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj.
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  kernels::dtype dtype = kernels::dtype::f32;
  uint64_t seed = 1;
  /// The size of B's values relative to what keeps the delta about as large as the base
  /// projection's output (1: a clearly different model; trained adapters are smaller).
  float strength = 1.0f;
};
[[nodiscard]] status write_random_lora(const random_lora_spec& spec, const std::string& model_dir, const std::string& dir);

/// Parses an architecture name for `model random` ("llama", "mistral", "qwen2", "qwen3", "phi3",
/// "qwen3_moe", "mixtral", "qwen2_moe", "gemma", "gemma2", "gemma3", "granite").
[[nodiscard]] result<std::string> config_architecture_name(const std::string& arch);

}  // namespace llmesh::model
