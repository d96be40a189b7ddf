// FP8 checkpoints (private to the model library): their quantization_config, and their F8_E4M3
// linear layers written as the kernels' fp8 blocks.
//
// A layer X is X.weight, F8_E4M3 [out, in], beside a float scale (F32, BF16 or F16):
// w[o][i] = e4m3(q[o][i]) · s, where s is
// - one per tensor: X.weight_scale of shape [] or [1] (vLLM's and AutoFP8's quant_method fp8
//   without weight_block_size; compressed-tensors' strategy "tensor");
// - one per output: [out] or [out, 1] (compressed-tensors' strategy "channel", FP8_DYNAMIC;
//   quant_method fbgemm_fp8);
// - one per group of group_size inputs of an output: [out, ceil(in / group_size)]
//   (compressed-tensors' strategy "group");
// - one per block of block_rows × block_cols: [ceil(out / rows), ceil(in / cols)]
//   (quant_method fp8 with weight_block_size — Qwen3's and DeepSeek's FP8 releases, named
//   X.weight_scale_inv there — and compressed-tensors' strategy "block", FP8_BLOCK).
// The scale is s itself under either name (HF's "_inv" is the dequantization multiplier).
// Each layer becomes an fp8 matrix [out, in] (dtype.hpp): per block of 32 inputs, s then the 32
// stored codes, so every weight keeps its checkpoint value exactly (one multiply, as the
// dequantized weight is defined) in 1.125 bytes. Group and block widths must be multiples of
// 32 so a block of 32 has one scale. Activations stay float32 (weight-only, as vLLM's FP8
// Marlin path on GPUs without FP8 arithmetic); a static scheme's X.input_scale is not used.
#pragma once

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/safetensors.hpp"
#include "rank_parts.hpp"

namespace llmesh::model::detail {

/// quant_method "fp8" (vLLM's and transformers' FP8 config) or "fbgemm_fp8" (Meta's
/// Llama 3.1 FP8 releases: a weight_scale per output, [out, 1]) into p: fmt e4m3 (e5m2
/// refused), activation_scheme dynamic or static, weight_block_size [rows, cols] or none.
[[nodiscard]] status parse_fp8_config(const nlohmann::json& q, model_config::packed_config& p);

/// compressed-tensors' float-quantized format (llm-compressor's FP8, FP8_DYNAMIC, FP8_BLOCK)
/// into p: one config group of 8-bit float weights, symmetric, strategy tensor, channel,
/// group or block; float input activations (dynamic or static) allowed, computed in float32.
[[nodiscard]] status parse_compressed_fp8(const nlohmann::json& q, model_config::packed_config& p);

/// Replaces every F8_E4M3 X.weight in `store` with its fp8 matrix, as above; invalid_request
/// naming the tensor when the checkpoint has no FP8 quantization_config, the scale is missing,
/// misshapen, not finite or beyond 2^64, a code is NaN, or the tensor is no matrix;
/// unsupported for F8_E5M2 weights; io_error when memory runs out. `part_of` and `own` as for
/// unpack_packed_weights: only what the held ranks read is written.
[[nodiscard]] status convert_fp8_weights(tensor_store& store, const model_config::packed_config& p,
                                         const part_of_tensor& part_of = {}, std::vector<own_columns>* own = nullptr);

}  // namespace llmesh::model::detail
