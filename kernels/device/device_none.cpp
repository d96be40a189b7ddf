// Device discovery in a build without CUDA.
#include "llmesh/kernels/device.hpp"

namespace llmesh::kernels {

bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }
size_t cuda_device_memory(int) { return 0; }
std::string device_summary() { return "cuda: not compiled"; }

}  // namespace llmesh::kernels
