// LoRA adapters (PEFT's format) served beside their base model: vLLM's --lora-modules. A
// request names an adapter; its sequences' projections then add scale · (x Aᵀ) Bᵀ to the base
// model's output, row by row, so sequences with different adapters (or none) share a step.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/dtype.hpp"
#include "llmesh/model/config.hpp"

namespace llmesh::model {

/// An adapter to load: the name requests use and its directory (adapter_config.json and
/// adapter_model.safetensors, as PEFT's save_pretrained writes them).
struct lora_source {
  std::string name, path;
  bool operator==(const lora_source&) const = default;
};

/// Parses one --lora-modules value: NAME=PATH, or vLLM's JSON form
/// {"name": NAME, "path": PATH[, "base_model_name": ...]}. Names are 1..128 characters of
/// letters, digits and -_.:/ (they stand where a model name does).
[[nodiscard]] result<lora_source> parse_lora_source(std::string_view spec);

/// Whether `name` may name an adapter: 1..128 letters, digits and -_.:/.
bool valid_lora_name(std::string_view name);

/// Refuses two adapters with the same name, or one named like the base model `base_name`.
[[nodiscard]] status check_lora_names(const std::vector<lora_source>& loras, const std::string& base_name);

/// The seven projections an adapter may target.
enum class lora_target : uint8_t { q, k, v, o, gate, up, down };
inline constexpr size_t lora_target_count = 7;

/// PEFT's module name of a target: "q_proj" .. "down_proj".
std::string_view lora_target_name(lora_target t);
/// The target a module name names, or nullopt.
std::optional<lora_target> parse_lora_target(std::string_view name);
/// Whether the target is an MLP projection (PEFT's "mlp." block) rather than attention's ("self_attn.").
inline bool lora_target_in_mlp(lora_target t) { return t >= lora_target::gate; }
/// [out, in] of the base model's projection `t`.
std::pair<size_t, size_t> lora_projection_shape(const model_config& c, lora_target t);

/// A row-major matrix of an adapter, held in its file's dtype when that is F16 or BF16 (their
/// values widen to float32 exactly, so the matmul's numbers are those of a float32 copy), else
/// in float32.
struct lora_matrix {
  kernels::dtype type = kernels::dtype::f32;
  std::vector<uint8_t> bytes;
  /// Element i (row-major) as float32.
  float value(size_t i) const { return kernels::load_as_f32(bytes.data(), type, i); }
  /// The address of element i.
  const void* at(size_t i) const { return bytes.data() + kernels::dtype_offset(type, i); }
};

/// One projection's low-rank pair: A [r][in], B [out][r]; delta = scale · B·A.
/// r == 0: the adapter leaves this projection alone.
struct lora_pair {
  size_t r = 0, in = 0, out = 0;
  float scale = 0.0f;
  lora_matrix a, b;
};

struct lora_layer {
  lora_pair pairs[lora_target_count];
  const lora_pair& operator[](lora_target t) const { return pairs[static_cast<size_t>(t)]; }
  lora_pair& operator[](lora_target t) { return pairs[static_cast<size_t>(t)]; }
};

/// A loaded adapter (immutable once loaded), held by shared_ptr (lora_set): whoever copies a
/// step's raw pointer to it beyond the step pins it with shared_from_this().
struct lora_adapter : std::enable_shared_from_this<lora_adapter> {
  std::string name, path;
  size_t max_rank = 0;
  std::vector<lora_layer> layers;  ///< one per decoder layer of the base model
  size_t bytes() const;
};

/// Loads DIR/adapter_config.json and DIR/adapter_model.safetensors for a base model of config
/// `cfg`. Targets come from the tensors present (q/k/v/o_proj of self_attn, gate/up/down_proj
/// of mlp); scale = lora_alpha / r (use_rslora: lora_alpha / sqrt(r)), r taken per projection
/// from its tensors (so rank_pattern needs nothing more). Refused by name: DoRA, bias other
/// than "none", modules_to_save, fan_in_fan_out, alpha_pattern, extra vocabulary, tensors of
/// other modules (embeddings, LM head, MoE experts, fused projections), shapes that do not fit
/// the base model, ranks above 512, non-finite values.
[[nodiscard]] result<lora_adapter> load_lora(const lora_source& src, const model_config& cfg);

/// vLLM's --lora-dtype: every matrix of `a` rewritten as `to` (float32, bfloat16 or float16):
/// widening is exact, narrowing rounds to nearest even; a value float16 cannot hold is an
/// invalid_request naming the adapter.
[[nodiscard]] status cast_lora(lora_adapter& a, kernels::dtype to);

}  // namespace llmesh::model
