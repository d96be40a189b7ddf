// Device copies of one rank's weights (private to the CUDA executor): uploaded slice by slice
// from the mapped safetensors (no second host copy; row-parallel slices with one strided copy)
// or generated on the device for benchmarks.
#pragma once

#include <vector>

#include "llmesh/kernels/cuda_runtime.hpp"
#include "llmesh/model/shard_executor.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model {

/// A weight matrix on the device: [rows][ld] in its stored dtype.
struct device_matrix {
  const void* data = nullptr;
  size_t rows = 0, cols = 0, ld = 0;
};

struct device_layer {
  const float *attn_norm = nullptr, *mlp_norm = nullptr;
  const float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr, *o_bias = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr;  ///< [head_dim]; null unless the model has qk_norm
  device_matrix q, k, v, o, gate, up, down;
};

/// Owns every allocation; the views above point into them.
struct device_weights {
  kernels::dtype type = kernels::dtype::bf16;
  device_matrix embed, lm_head;  ///< lm_head: this rank's vocabulary rows
  const float* final_norm = nullptr;
  std::vector<device_layer> layers;
  std::vector<kernels::cuda::buffer> owned;
  size_t bytes = 0;
};

/// Uploads rank `l`'s slice of `m`.
[[nodiscard]] result<device_weights> upload_weights(const model& m, const shard_layout& l);

/// Random weights (uniform, scaled by 1/sqrt(in features)) and unit norms, for a single rank.
[[nodiscard]] result<device_weights> random_weights(const model_config& cfg, kernels::dtype type, uint64_t seed);

}  // namespace llmesh::model
