// Builds without CUDA: the GPU executor does not exist; asking for it is a clear error.
#include "llmesh/model/cuda_executor.hpp"

namespace llmesh::model {

bool cuda_available() { return false; }

result<std::unique_ptr<step_executor>> make_cuda_executor(std::shared_ptr<const model>, shard_layout, kv_cache_config,
                                                          cuda_options, kernels::device_communicator*) {
  return make_error(errc::invalid_request, "this llmesh was built without CUDA");
}

result<std::unique_ptr<step_executor>> make_cuda_executor_random(const model_config&, kernels::dtype, uint64_t,
                                                                 kv_cache_config, cuda_options) {
  return make_error(errc::invalid_request, "this llmesh was built without CUDA");
}

}  // namespace llmesh::model
