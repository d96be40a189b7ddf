// Collectives between GPU shards of one replica, on device memory and a stream: NCCL behind the
// same shape of interface as the host communicator. The unique id that joins a group is plain
// bytes: rank 0 makes it and the caller carries it to the other ranks (over the mesh's control
// plane between processes); this module never sees the network. Defined in CUDA builds only.
#pragma once

#include <array>
#include <chrono>
#include <memory>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/cuda_runtime.hpp"

namespace llmesh::kernels {

/// One rank's handle on a device group. Every rank must enqueue the same collectives in the
/// same order. A dead or stuck peer never hangs a caller: wait() gives up at the deadline,
/// aborts the group (ncclCommAbort) and returns shard_failed; so does every later call.
/// Thread affinity: one thread at a time.
class device_communicator {
 public:
  virtual ~device_communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// data[i] = Σ_r data_r[i] (n floats of device memory), enqueued on s.
  [[nodiscard]] virtual status all_reduce_sum(float* data, size_t n, cuda::stream_t s) = 0;
  /// out[r·n .. (r+1)·n) = rank r's in[0..n), enqueued on s.
  [[nodiscard]] virtual status all_gather(const float* in, size_t n, float* out, cuda::stream_t s) = 0;
  /// Waits for the work enqueued on s; on a peer's failure or at the deadline, aborts the group.
  [[nodiscard]] virtual status wait(cuda::stream_t s) = 0;
  /// Aborts the group: peers blocked in a collective with this rank fail instead of waiting.
  virtual void abort() = 0;
};

/// NCCL's ncclUniqueId as bytes (128).
using nccl_id = std::array<char, 128>;

/// Makes the id rank 0 hands to its peers.
[[nodiscard]] result<nccl_id> nccl_make_id();

/// Joins the group `id` as `rank` of `size` on CUDA device `device`. Initialisation is
/// non-blocking and bounded by `timeout`, as is every later wait(). NCCL refuses two ranks of
/// one group on the same device (ncclInvalidUsage): that is reported as invalid_request.
[[nodiscard]] result<std::unique_ptr<device_communicator>> nccl_connect(const nccl_id& id, int rank, int size,
                                                                         int device, std::chrono::milliseconds timeout);

}  // namespace llmesh::kernels
