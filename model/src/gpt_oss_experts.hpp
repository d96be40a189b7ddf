// GPT-OSS's experts (private to the model library): each layer's fused expert tensors split into
// the per-expert matrices and biases bind_experts reads.
//
// A GPT-OSS layer holds all its experts in four tensors under model.layers.L.mlp.experts.:
// gate_up_proj and down_proj with their biases gate_up_proj_bias [E, 2I] and down_proj_bias
// [E, hidden]. gate_up's outputs interleave gate and up (HF's gate_up[..., ::2] and [..., 1::2]).
// The weights come in one of two forms:
// - MXFP4 (quantization_config quant_method mxfp4: OpenAI's release): X_blocks, U8 [E, out,
//   in / 32, 16] — byte j of a group of 32 holds element 2j in its low nibble, 2j + 1 in its
//   high one, each an e2m1 code — and X_scales, U8 [E, out, in / 32], the group's E8M0 exponent
//   (value = e2m1 · 2^(scale − 127), HF's convert_moe_packed_tensors). Each group becomes one
//   kernels::dtype::mxfp4 block (0.625 bytes a weight): every weight keeps its value exactly.
// - plain (the BF16 re-releases): X [E, in, out], HF's parameters, transposed here into [out, in]
//   rows of the checkpoint's dtype.
// Either way expert e becomes mlp.experts.e.{gate,up,down}_proj.weight [out, in] and
// .bias (float32), as Qwen3-MoE names its experts.
#pragma once

#include "llmesh/common/error.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/safetensors.hpp"
#include "rank_parts.hpp"

namespace llmesh::model::detail {

/// Splits every layer's experts of a GPT-OSS checkpoint in `store` as above (root: "model." or
/// "" for a bare transformer). Errors name the tensor: not_found when one is missing;
/// invalid_request when one is misshapen, a scale byte exceeds 252 (255 is E8M0's NaN; above 252
/// e2m1 · 2^(scale − 127) overflows float32) or the MXFP4 form is missing its
/// quantization_config (and naming config.json when hidden or intermediate size is no multiple of
/// 32); unsupported for 8-bit float experts; io_error when memory runs out. `part_of` and `own` as for unpack_packed_weights: the MXFP4 form writes only what
/// the held ranks read (the rest stays address space without memory); the plain form is written
/// whole.
[[nodiscard]] status split_gpt_oss_experts(tensor_store& store, const model_config& c, const std::string& root,
                                           const part_of_tensor& part_of = {}, std::vector<own_columns>* own = nullptr);

}  // namespace llmesh::model::detail
