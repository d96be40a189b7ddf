// How a rank's executor adds its sequences' LoRA deltas to a projection's output (private to
// shard_executor.cpp). Rows are grouped by adapter, and each group runs as two small matmuls
// (x·Aᵀ, then ·Bᵀ) in the canonical reduction order, so a row's delta does not depend on which
// rows share the step, nor on how its sequence is chunked.
#pragma once

#include <span>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/matmul.hpp"
#include "llmesh/kernels/thread_pool.hpp"
#include "llmesh/model/lora.hpp"
#include "llmesh/model/shard_executor.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model::detail {

/// One projection of a rank: y[row][0..n_out) += scale · (x[row][0..n_in) · A[:, in0..in0+n_in)ᵀ)
/// · B[out0..out0+n_out, :]ᵀ. A column-parallel slice has in0 = 0 and its rows' out0; a
/// row-parallel one its columns' in0 and out0 = 0 (the all-reduce then sums the ranks' parts).
struct lora_job {
  lora_target target;
  const float* x;
  size_t ldx, in0, n_in;
  float* y;
  size_t ldy, out0, n_out;
};

class lora_runner {
 public:
  /// Groups the batch's token rows by adapter (step_sequence::lora >= 0), each group holding
  /// its adapter (step_sequence::adapter, else m.loras()'s, held until the next plan).
  /// not_found: an id names no loaded adapter (no group is planned then).
  [[nodiscard]] status plan(std::span<const step_sequence> batch, const model& m);
  bool active() const { return !groups_.empty(); }
  /// Runs the base projections `base` and adds the planned rows' deltas of layer `layer` to
  /// every job's output: the deltas' x·Aᵀ matmuls share the base projections' parallel region,
  /// their ·Bᵀ and the adds follow (each output's operations and their order are the same
  /// either way). Without adapters in the step: the base projections alone.
  [[nodiscard]] status project(std::span<const kernels::matmul_args> base, size_t layer,
                               std::span<const lora_job> jobs, kernels::thread_pool& pool);

 private:
  struct group {
    int32_t adapter;
    const lora_adapter* a;
    std::shared_ptr<const lora_adapter> pin;  ///< set when this step looked the adapter up
    std::vector<size_t> rows;
  };
  /// One (group, job) pair with a pair for that projection: its rows' t and u offsets.
  struct part {
    const lora_pair* p;
    size_t job;
    const group* g;
    size_t t0, u0;
  };
  /// Gathers the inputs and appends the deltas' x·Aᵀ matmuls to `first`.
  void begin(size_t layer, std::span<const lora_job> jobs, std::vector<kernels::matmul_args>& first);
  /// After `first` ran: the ·Bᵀ matmuls and y += scale · u.
  [[nodiscard]] status finish(kernels::thread_pool& pool);

  std::vector<group> groups_;
  std::vector<lora_job> jobs_;
  std::vector<part> parts_;
  std::vector<kernels::matmul_args> second_;
  std::vector<float> x_, t_, u_;  ///< gathered rows, x·Aᵀ, and ·Bᵀ
};

}  // namespace llmesh::model::detail
