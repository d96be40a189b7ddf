// Random AWQ / GPTQ / compressed-tensors packed and FP8 linear layers for `llmesh model random
// --packed` (private to random_model.cpp; the formats are packed_weights.hpp's and
// fp8_weights.hpp's).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/model/random_model.hpp"

namespace llmesh::model::detail {

/// config.json's quantization_config for `packed` (random_model_spec::packed's choices), or
/// invalid_request naming them.
[[nodiscard]] result<nlohmann::ordered_json> packed_quantization_config(const std::string& packed, size_t group_size);

/// Linear layer X ([out, in] as a plain checkpoint would hold X.weight) as X.qweight, X.qzeros,
/// X.scales (and GPTQ's X.g_idx), or FP8's X.weight and its scale (fp8_weights.hpp), with
/// values about uniform(−scale, scale). Deterministic in
/// (seed, X). invalid_request when `in` or `out` does not fit the packing or the groups.
[[nodiscard]] result<std::vector<tensor_spec>> random_packed_linear(uint64_t seed, const std::string& x, size_t out, size_t in,
                                                                    float scale, const std::string& packed, size_t group_size);

}  // namespace llmesh::model::detail
