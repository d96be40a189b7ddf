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
enum class architecture { llama, mistral, qwen2, qwen3, phi3, qwen3_moe, mixtral };

/// Everything the forward pass needs to know about a model's shape.
struct model_config {
  architecture arch = architecture::llama;
  std::string arch_name;  ///< as spelled in config.json, e.g. "LlamaForCausalLM"
  size_t hidden = 0, intermediate = 0, n_layers = 0;  ///< intermediate: each expert's, in an MoE model
  size_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  size_t vocab = 0;
  size_t max_positions = 0;
  float rms_norm_eps = 1e-6f;
  kernels::rope_config rope;   ///< head_dim, theta and llama3 scaling
  bool tie_embeddings = false;
  bool qkv_bias = false;       ///< Qwen2, or Llama / Qwen3 with attention_bias
  bool o_bias = false;         ///< Llama / Qwen3 with attention_bias
  /// Qwen3: q and k are RMS-normalised per head (weights of head_dim, shared by the heads) after
  /// their projections, before RoPE.
  bool qk_norm = false;
  /// Phi-3: q, k and v are one tensor (self_attn.qkv_proj, their rows in that order), gate and
  /// up another (mlp.gate_up_proj, gate's rows first); the loader views each part.
  bool fused_projections = false;
  /// Mixture of experts (Qwen3-MoE, Mixtral): every layer's MLP is n_experts SwiGLU experts of
  /// `intermediate` each; a router (a linear layer) scores them per token, softmax, the
  /// experts_per_token best run, their outputs weighted by those probabilities (renormalised
  /// over the chosen when norm_topk_prob) and summed. n_experts 0: a dense MLP.
  struct moe_config {
    size_t n_experts = 0, experts_per_token = 0;
    bool norm_topk_prob = true;
  } moe;
  size_t sliding_window = 0;   ///< 0: none (Mistral's and Phi-3's sliding_window)
  std::vector<int32_t> bos_ids, eos_ids;  ///< load_config merges generation_config.json's in
  /// The model's recommended sampling (generation_config.json's temperature, top_p, top_k):
  /// the API's defaults for requests that do not set them, as vLLM applies them.
  struct sampling_defaults {
    std::optional<float> temperature, top_p;
    std::optional<int> top_k;
    bool operator==(const sampling_defaults&) const = default;
  } sampling;
};

/// Parses config.json text. Errors name the missing or invalid field.
[[nodiscard]] result<model_config> parse_config(const std::string& json_text);

/// Reads and parses DIR/config.json, then merges DIR/generation_config.json when present:
/// its eos_token_id (an int or a list) is appended to config.json's eos ids without
/// duplicates, its bos_token_id is used only where config.json has none, and its temperature,
/// top_p and top_k become `sampling` (top_p outside [0, 1], temperature < 0 or a negative
/// top_k are errors; top_k 0 means off; `do_sample: false` is ignored, as vLLM does). A malformed
/// generation_config.json (bad JSON, or ids that are not non-negative ints) is an invalid_request error
/// naming that file; a missing one is fine.
[[nodiscard]] result<model_config> load_config(const std::string& model_dir);

}  // namespace llmesh::model
