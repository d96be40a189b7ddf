// FP8 KV-cache scales in checkpoints (private to the model library): compressed-tensors'
// kv_cache_scheme, and each attention layer's k_scale / v_scale tensors as vLLM reads them.
//
// A checkpoint calibrated for an 8-bit float KV cache (llm-compressor's kv_cache_scheme,
// AutoFP8's and ModelOpt's FP8-KV releases) holds one float32 (or BF16/F16) scalar per layer for
// the keys and one for the values, under one of the names vLLM accepts (its
// maybe_remap_kv_scale_name and compressed-tensors' get_cache_scale), for prefix
// P = <layers>.<i>.self_attn.:
//   P.k_scale, P.v_scale                       (compressed-tensors, quant_method fp8)
//   P.k_proj.k_scale, P.v_proj.v_scale         (ModelOpt)
//   P.k_proj.output_scale, P.v_proj.output_scale (early compressed-tensors)
//   P.kv_scale                                 (deprecated: one scale for both)
// (several spellings in one layer: the largest). A key scale alone serves the values too, as
// vLLM duplicates it; a value scale alone is refused (vLLM asserts a key scale). They are read
// for quant_method fp8 (and fbgemm_fp8, whose releases carry none) and compressed-tensors
// checkpoints — vLLM's quantization configs with a KV-cache method — and ignored elsewhere.
// With `--kv-cache-dtype fp8` a key x is stored as e4m3(x / k_scale) and read back times
// k_scale (kernels/attention.hpp); without scales the cache uses 1, and other cache types
// ignore them, as vLLM does.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "llmesh/common/error.hpp"
#include "llmesh/model/safetensors.hpp"

namespace llmesh::model::detail {

/// compressed-tensors' kv_cache_scheme (null, or an object): accepted when it is an 8-bit
/// float, symmetric (stated), static scheme of strategy "tensor" (stated), as vLLM's
/// CompressedTensorsKVCacheMethod requires; unsupported naming the field otherwise.
[[nodiscard]] status check_kv_cache_scheme(const nlohmann::json& scheme);

/// One layer's scales; 0 where the checkpoint holds none.
struct kv_scale_pair {
  float k = 0.0f, v = 0.0f;
};

/// The scales of the layer whose attention tensors start with `prefix` ("model.layers.3.self_attn.").
/// invalid_request naming the tensor when one is not a single finite positive number, or a
/// value scale has no key scale.
[[nodiscard]] result<kv_scale_pair> read_kv_scales(const tensor_store& store, const std::string& prefix);

}  // namespace llmesh::model::detail
