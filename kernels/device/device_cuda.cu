// CUDA device discovery. Without a GPU, cudaGetDeviceCount fails (insufficient driver or stub
// library): that is reported as zero devices, and llmesh runs on the CPU.
#include <cuda_runtime.h>

#include <string>

#include "llmesh/kernels/device.hpp"

namespace llmesh::kernels {

bool cuda_compiled() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later CUDA calls start clean
    return 0;
  }
  return n;
}

size_t cuda_device_memory(int device) {
  if (device < 0 || device >= cuda_device_count()) return 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return prop.totalGlobalMem;
}

std::string device_summary() {
  int n = cuda_device_count();
  if (n == 0) return "cuda: compiled, no device";
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  return "cuda: " + std::to_string(n) + " x " + prop.name;
}

}  // namespace llmesh::kernels
