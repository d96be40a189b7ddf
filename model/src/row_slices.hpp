// A rank's own int8 copy of a K-quant matrix's row-parallel slice (private to shard_executor).
//
// A row-parallel split (o_proj, down_proj at --tp > 1) gives each rank columns [c0, c0 + k) of
// every row. The kernels read K-quant rows (Q4_K, Q5_K, Q6_K) in place only in whole
// super-blocks of 256, so a slice that starts or ends inside one (Qwen2.5-1.5B's intermediate
// 8960 at --tp 2: 4480 columns a rank) is decoded and quantized to int8 blocks by that rank
// instead, as `--quantization int8` does (about 1.1 bytes per weight instead of 0.56-0.82).
#pragma once

#include <memory>
#include <optional>

#include "llmesh/common/error.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model::detail {

struct row_slice {
  weight_matrix w;                 ///< [rows, k] as dtype::q8; its columns start at the slice's c0
  std::shared_ptr<uint8_t[]> bytes;
};

/// Columns [c0, c0 + k) of `w` as an int8 matrix of their own when `w` is a K-quant matrix and
/// they do not fall on whole super-blocks; nullopt when the kernels read them in place.
/// invalid_request when a decoded value is not finite (it cannot be quantized).
[[nodiscard]] result<std::optional<row_slice>> k_quant_slice(const weight_matrix& w, size_t c0, size_t k);

}  // namespace llmesh::model::detail
