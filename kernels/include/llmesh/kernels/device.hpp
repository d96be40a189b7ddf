// Which accelerators this build and this machine offer.
#pragma once

#include <cstddef>
#include <string>

namespace llmesh::kernels {

/// True when this build contains the CUDA kernels (built with nvcc).
bool cuda_compiled();

/// Number of usable CUDA devices; 0 without a driver, without a device, or without CUDA in the
/// build ("error or zero devices" both mean: run on the CPU).
int cuda_device_count();

/// Bytes of memory on CUDA device `device`; 0 when there is no such device (or no CUDA).
size_t cuda_device_memory(int device);

/// One line describing the accelerators, for logs and `llmesh bench`.
std::string device_summary();

}  // namespace llmesh::kernels
