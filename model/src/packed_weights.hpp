// AWQ and GPTQ checkpoints (private to the model library): their quantization_config, and
// their packed linear layers unpacked into the kernels' int8 blocks.
//
// Both store a linear layer X of [out, in] as integer quants q (4 bits; GPTQ also 8) packed
// eight (four) to an int32, and per group of `group_size` inputs and per output a float16
// scale s and an integer zero z, also packed: w[o][i] = s[g(i)][o] · (q[i][o] − z[g(i)][o]).
// - GPTQ (AutoGPTQ, GPTQModel, optimum): X.qweight [in / pack, out], input i in bits
//   bits·(i % pack) of word [i / pack][o]; X.qzeros [groups, out / pack], output o in bits
//   bits·(o % pack) of word [g][o / pack], stored less one in the "gptq" checkpoint format (the
//   default; "gptq_v2" stores it as is); X.scales [groups, out]; X.g_idx [in], input i's group
//   (desc_act reorders them; without g_idx, g(i) = i / group_size).
// - AWQ (AutoAWQ's GEMM version): X.qweight [in, out / 8], output o in bits 4·p of word
//   [i][o / 8] where p is AWQ's interleave (0, 4, 1, 5, 2, 6, 3, 7)[o % 8]; X.qzeros
//   [groups, out / 8] packed alike; X.scales [groups, out]; g(i) = i / group_size.
//
// Each X.weight becomes a q8 matrix [out, in] (dtype.hpp): where every 32-input block of a
// row lies in one group (group sizes that are multiples of 32 and a g_idx constant on each
// block), the block's scale is s and its values q − z, which int8 holds (4 bits: −16..15;
// GPTQ's 8 bits when every q − z of the tensor fits): exactly the checkpoint's values.
// Otherwise (act-order GPTQ, 8-bit zeros that do not fit) the tensor is decoded to float32
// and quantized as --quantization int8 does (blocks of 32, max|w| / 127): within half a step.
#pragma once

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/safetensors.hpp"

namespace llmesh::model::detail {

/// config.json's quantization_config into c.packed: none without one; AWQ (GEMM, 4 bits, with
/// zero points) and GPTQ (4 or 8 bits, "gptq" or "gptq_v2" format) read; other methods
/// (fp8, bitsandbytes, compressed-tensors, ...) and variants unsupported, naming them.
[[nodiscard]] status parse_packed_config(const nlohmann::json& j, model_config& c);

/// Adds X.weight (q8) to `store` for every X.qweight in it, as above; invalid_request naming
/// the tensor when a companion is missing or misshapen, a scale is not finite, a g_idx entry
/// is out of range or X.weight is there too. How many of them were exact goes to `exact`.
[[nodiscard]] status unpack_packed_weights(tensor_store& store, const model_config::packed_config& p, size_t* exact = nullptr,
                                          size_t* requantized = nullptr);

}  // namespace llmesh::model::detail
