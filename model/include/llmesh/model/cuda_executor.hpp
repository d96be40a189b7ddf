// The GPU executor: one tensor-parallel rank of a model on one CUDA device. Weights (in their
// stored dtype) and the paged KV cache (float32) live in device memory; a step runs the same
// forward pass as shard_executor with the kernels of kernels/cuda_ops.hpp, all-reduces through
// a device communicator (NCCL), and returns logits or greedy ids. Pure decode steps replay a
// CUDA graph captured per (batch bucket, partition bucket). Declared in every build; without
// CUDA in the build the factories return an error.
#pragma once

#include <cstdint>
#include <memory>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/device_communicator.hpp"
#include "llmesh/kernels/dtype.hpp"
#include "llmesh/model/shard_executor.hpp"

namespace llmesh::model {

struct cuda_options {
  int device = 0;
  /// Batch-invariant projections (CUDA-core kernels, fixed order) for every m; when false,
  /// steps with more than 2 tokens use cuBLASLt (bf16 activations; faster prefill and batched
  /// decode, but a row's numbers may change with its batch).
  bool deterministic = false;
  bool graphs = true;  ///< replay pure decode steps from CUDA graphs
  bool profile = false;  ///< time every op with events (disables graphs): profile_report()
};

/// True when this build has CUDA and the machine has at least one device.
bool cuda_available();

/// Uploads this rank's slice of `m` to the device. `comm` is required when layout.tp > 1.
[[nodiscard]] result<std::unique_ptr<step_executor>> make_cuda_executor(std::shared_ptr<const model> m,
                                                                        shard_layout layout, kv_cache_config kv,
                                                                        cuda_options opt,
                                                                        kernels::device_communicator* comm);

/// A single-rank executor with random weights of dtype `type` generated on the device (for
/// benchmarks of large shapes without writing their files).
[[nodiscard]] result<std::unique_ptr<step_executor>> make_cuda_executor_random(const model_config& cfg,
                                                                               kernels::dtype type, uint64_t seed,
                                                                               kv_cache_config kv, cuda_options opt);

}  // namespace llmesh::model
