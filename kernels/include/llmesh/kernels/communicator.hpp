// The collective operations tensor-parallel shards meet in, behind one interface: shared memory
// between threads here; between processes, actors::tensor_communicator implements it over the
// transport (UCX in `llmesh node`). NCCL on GPUs sits behind kernels::device_communicator
// (device_communicator.hpp), on device memory and a stream.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::kernels {

/// One rank's handle on its group. Every rank must call the same collectives in the same order.
/// Results are deterministic: sums are taken in rank order 0, 1, ..., size-1, and every rank
/// receives the same bits. A collective returns shard_failed once the group has been aborted
/// (a peer failed), so a failing rank never leaves its peers waiting forever.
///
/// Thread affinity: each rank's handle is used by one thread at a time.
class communicator {
 public:
  virtual ~communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  /// data[i] = Σ_r data_r[i] over all ranks (all ranks pass the same length).
  [[nodiscard]] virtual status all_reduce_sum(std::span<float> data) = 0;

  /// out = concatenation of every rank's `in`, in rank order (sizes may differ per rank;
  /// out.size() must equal their sum).
  [[nodiscard]] virtual status all_gather(std::span<const float> in, std::span<float> out) = 0;

  /// Marks the group failed and wakes every rank waiting in a collective.
  virtual void abort() = 0;
};

/// Creates `size` communicators that talk through shared memory; rank i is element i.
/// Each must be driven by its own thread.
std::vector<std::unique_ptr<communicator>> make_local_communicators(int size);

}  // namespace llmesh::kernels
