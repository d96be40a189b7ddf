// The NCCL device communicator: a non-blocking communicator (config.blocking = 0) whose init,
// enqueues and completion are all polled against a deadline, so a dead peer ends in
// ncclCommAbort and a shard_failed error instead of a hang. Sums are NCCL's (ring or tree order,
// fixed for a given group and size): deterministic run to run, not equal to the CPU's rank order.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <thread>

#include "llmesh/kernels/device_communicator.hpp"

namespace llmesh::kernels {
namespace {

using clock_type = std::chrono::steady_clock;

error nccl_error(ncclResult_t r, const std::string& what) {
  errc code = r == ncclInvalidUsage || r == ncclInvalidArgument ? errc::invalid_request : errc::shard_failed;
  return make_error(code, what + ": " + ncclGetErrorString(r));
}

class nccl_communicator final : public device_communicator {
 public:
  nccl_communicator(ncclComm_t comm, int rank, int size, std::chrono::milliseconds timeout)
      : comm_(comm), rank_(rank), size_(size), timeout_(timeout) {}
  ~nccl_communicator() override {
    if (!comm_) return;
    if (aborted_) return;  // ncclCommAbort already freed it
    ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  status all_reduce_sum(float* data, size_t n, cuda::stream_t s) override {
    if (aborted_) return make_error(errc::shard_failed, "nccl: the group was aborted");
    return settle(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, s), "ncclAllReduce");
  }

  status all_gather(const float* in, size_t n, float* out, cuda::stream_t s) override {
    if (aborted_) return make_error(errc::shard_failed, "nccl: the group was aborted");
    return settle(ncclAllGather(in, out, n, ncclFloat32, comm_, s), "ncclAllGather");
  }

  status wait(cuda::stream_t s) override {
    if (aborted_) return make_error(errc::shard_failed, "nccl: the group was aborted");
    const auto deadline = clock_type::now() + timeout_;
    for (;;) {
      cudaError_t e = cudaStreamQuery(s);
      if (e == cudaSuccess) return ok_status();
      if (e != cudaErrorNotReady) {
        abort();
        return make_error(errc::shard_failed, std::string("nccl wait: ") + cudaGetErrorString(e));
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        abort();
        return nccl_error(async, "nccl: peer failure");
      }
      if (clock_type::now() > deadline) {
        abort();
        return make_error(errc::shard_failed, "nccl: collective did not complete within " +
                                                  std::to_string(timeout_.count()) + " ms; group aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void abort() override {
    if (aborted_ || !comm_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

 private:
  /// A non-blocking call may return ncclInProgress: poll until it has been enqueued.
  status settle(ncclResult_t r, const char* what) {
    const auto deadline = clock_type::now() + timeout_;
    while (r == ncclInProgress) {
      if (clock_type::now() > deadline) {
        abort();
        return make_error(errc::shard_failed, std::string(what) + ": not enqueued in time; group aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      ncclCommGetAsyncError(comm_, &r);
    }
    if (r != ncclSuccess) {
      abort();
      return nccl_error(r, what);
    }
    return ok_status();
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  bool aborted_ = false;
};

}  // namespace

result<nccl_id> nccl_make_id() {
  ncclUniqueId uid;
  ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess) return nccl_error(r, "ncclGetUniqueId");
  nccl_id id;
  static_assert(sizeof(uid) == sizeof(id));
  std::memcpy(id.data(), &uid, sizeof(uid));
  return id;
}

result<std::unique_ptr<device_communicator>> nccl_connect(const nccl_id& id, int rank, int size, int device,
                                                          std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) return make_error(errc::invalid_request, "nccl: rank outside the group");
  if (cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return make_error(errc::invalid_request, "nccl: no CUDA device " + std::to_string(device));
  }
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, uid, rank, &config);
  const auto deadline = clock_type::now() + timeout;
  while (r == ncclInProgress) {
    if (clock_type::now() > deadline) {
      ncclCommAbort(comm);
      return make_error(errc::shard_failed, "nccl: the group did not form within " + std::to_string(timeout.count()) +
                                                " ms (a rank is missing or dead)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    ncclCommGetAsyncError(comm, &r);
  }
  if (r != ncclSuccess) {
    if (comm) ncclCommAbort(comm);
    return nccl_error(r, "ncclCommInitRankConfig");
  }
  return std::unique_ptr<device_communicator>(new nccl_communicator(comm, rank, size, timeout));
}

}  // namespace llmesh::kernels
