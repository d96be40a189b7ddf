// Embedding gather (weights in their dtype → float32 rows) and random fill for benchmark
// weights generated on the device. Layout: table [rows][hidden], row-major.
#include "device/cuda_common.cuh"
#include "llmesh/kernels/cuda_ops.hpp"

namespace llmesh::kernels::cuda {
namespace {

__global__ void embed_kernel(const void* table, dtype type, size_t hidden, const int32_t* ids, float* out) {
  const size_t t = blockIdx.y;
  const size_t base = static_cast<size_t>(ids[t]) * hidden;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < hidden; i += gridDim.x * blockDim.x) {
    out[t * hidden + i] = detail::load_w(table, type, base + i);
  }
}

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_kernel(void* dst, dtype type, size_t n, float scale, uint64_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float u = static_cast<float>(mix(seed ^ mix(i)) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    float v = (2.0f * u - 1.0f) * scale;
    switch (type) {
      case dtype::f32: static_cast<float*>(dst)[i] = v; break;
      case dtype::f16: static_cast<__half*>(dst)[i] = __float2half_rn(v); break;
      default: static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(v); break;
    }
  }
}

}  // namespace

status embed(const void* table, dtype type, size_t hidden, const int32_t* ids, size_t n, float* out, stream_t s) {
  if (n == 0) return ok_status();
  unsigned bx = detail::blocks_for(hidden, 256);
  dim3 grid(bx > 8 ? 8 : bx, static_cast<unsigned>(n));
  embed_kernel<<<grid, 256, 0, s>>>(table, type, hidden, ids, out);
  return detail::launched("embed");
}

status fill_random(void* dst, dtype type, size_t n, float scale, uint64_t seed, stream_t s) {
  if (n == 0) return ok_status();
  unsigned blocks = detail::blocks_for(n, 256);
  fill_kernel<<<blocks > 65536 ? 65536 : blocks, 256, 0, s>>>(dst, type, n, scale, seed);
  return detail::launched("fill_random");
}

}  // namespace llmesh::kernels::cuda
