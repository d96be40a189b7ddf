// Builds without CUDA: no NCCL; asking for a device group is a clear error.
#include "llmesh/kernels/device_communicator.hpp"

namespace llmesh::kernels {

result<nccl_id> nccl_make_id() { return make_error(errc::invalid_request, "this llmesh was built without CUDA/NCCL"); }

result<std::unique_ptr<device_communicator>> nccl_connect(const nccl_id&, int, int, int, std::chrono::milliseconds) {
  return make_error(errc::invalid_request, "this llmesh was built without CUDA/NCCL");
}

}  // namespace llmesh::kernels
