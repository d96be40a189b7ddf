// AWQ, GPTQ and compressed-tensors checkpoints (private to the model library): their
// quantization_config, and their packed linear layers unpacked into the kernels' int4 or int8
// blocks.
//
// All store a linear layer X of [out, in] as integer quants q (4 bits; GPTQ and
// compressed-tensors also 8) packed eight (four) to an int32, and per group of `group_size`
// inputs and per output a float scale s and an integer zero z (compressed-tensors' symmetric
// schemes: none, 0), also packed: w[o][i] = s[g(i)][o] · (q[i][o] − z[g(i)][o]).
// - GPTQ (AutoGPTQ, GPTQModel, optimum): X.qweight [in / pack, out], input i in bits
//   bits·(i % pack) of word [i / pack][o]; X.qzeros [groups, out / pack], output o in bits
//   bits·(o % pack) of word [g][o / pack], stored less one in the "gptq" checkpoint format (the
//   default; "gptq_v2" stores it as is); X.scales [groups, out]; X.g_idx [in], input i's group
//   (desc_act reorders them; without g_idx, g(i) = i / group_size).
// - AWQ (AutoAWQ's GEMM version): X.qweight [in, out / 8], output o in bits 4·p of word
//   [i][o / 8] where p is AWQ's interleave (0, 4, 1, 5, 2, 6, 3, 7)[o % 8]; X.qzeros
//   [groups, out / 8] packed alike; X.scales [groups, out]; g(i) = i / group_size.
// - compressed-tensors' pack-quantized format (llm-compressor's W4A16, W8A16): X.weight_packed
//   [out, ceil(in / pack)], input i in bits bits·(i % pack) of word [o][i / pack], as the
//   signed quant plus 2^(bits-1); X.weight_scale [out, groups] (one group per channel: the
//   whole row); X.weight_zero_point [ceil(out / pack), groups] packed along the outputs the
//   same way (asymmetric schemes); X.weight_g_idx [in] (actorder "group"); X.weight_shape
//   ([out, in], int32 or int64).
//
// Each X.weight becomes a q4 or q8 matrix [out, in] (dtype.hpp). Where every 32-input block of
// a row lies in one group (group sizes that are multiples of 32 and a g_idx constant on each
// block), it is held exactly: 4 bits as q4 blocks (factor s, offset s·z, the stored nibbles;
// compressed-tensors' signed quants and zeros shifted by 8), when every s·z is exact in
// float32 (float16 and bfloat16 scales: always), else as q8 blocks of scale s and values
// q − z (4 bits: −16..15); 8 bits as q8 only when every zero of the tensor is the middle one
// (GPTQ's 128 or compressed-tensors' 0: symmetric). Otherwise (act-order, 8-bit asymmetric
// zeros) the tensor is decoded to float32 and quantized as --quantization int8 does (blocks of
// 32, max|w| / 127): within half a step. q4 and exact q8 give the same values (f·(q − z),
// rounded once; a zero's sign aside). The rows live in one anonymous mapping; the packed tensors' pages then leave
// resident memory.
#pragma once

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/safetensors.hpp"
#include "rank_parts.hpp"

namespace llmesh::model::detail {

/// config.json's quantization_config into c.packed: none without one; AWQ (GEMM, 4 bits, with
/// zero points), GPTQ (4 or 8 bits, "gptq" or "gptq_v2" format) and compressed-tensors
/// (pack-quantized, one config group of int weights, 4 or 8 bits, group or channel strategy,
/// no activation or KV-cache quantization) read; other methods (fp8, bitsandbytes, ...) and
/// variants unsupported, naming them.
[[nodiscard]] status parse_packed_config(const nlohmann::json& j, model_config& c);

/// Adds X.weight (q4 or q8) to `store` for every X.qweight (X.weight_packed) in it, as above;
/// invalid_request naming the tensor when a companion is missing, of the wrong kind or
/// misshapen, a scale is not finite, a g_idx entry is out of range, act-order has no g_idx or
/// X.weight is there too; io_error when memory runs out. With `part_of`, only the part of
/// each layer it names is unpacked (load_options::ranks), the rest left unwritten; with `own`
/// too, a part that is one rank's columns (matrix_part::own) on whole blocks is written as a
/// matrix of its own, listed there (model::column_slice), its full matrix never touched.
[[nodiscard]] status unpack_packed_weights(tensor_store& store, const model_config::packed_config& p,
                                           const part_of_tensor& part_of = {}, std::vector<own_columns>* own = nullptr);

}  // namespace llmesh::model::detail
