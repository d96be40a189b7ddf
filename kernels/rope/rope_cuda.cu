// RoPE on the device fused with the KV-cache write, bit-identical to rope_cpu.cpp + kv_write:
// x[i] = a·cos − b·sin, x[i+d/2] = b·cos + a·sin with a = x[i], b = x[i+d/2], then the token's
// rotated k and its v stored at its cache slot. One block per token.
// Layout: q [T][n_heads][hd], k/v [T][n_kv_heads][hd]; cos/sin tables [position][hd/2];
// cache [slot][n_kv_heads][hd] float32.
#include "device/cuda_common.cuh"
#include "llmesh/kernels/cuda_ops.hpp"

namespace llmesh::kernels::cuda {
namespace {

__global__ void rope_kv_kernel(rope_kv_args a) {
  const size_t t = blockIdx.x;
  const int32_t slot = a.slot[t];
  if (slot < 0) return;  // batch padding
  const size_t half = a.head_dim / 2;
  const size_t p = static_cast<size_t>(a.pos[t]);
  const float* c = a.cos + p * half;
  const float* sn = a.sin + p * half;
  const size_t q_pairs = a.n_heads * half, k_pairs = a.n_kv_heads * half;
  for (size_t j = threadIdx.x; j < q_pairs + k_pairs; j += blockDim.x) {
    const bool is_q = j < q_pairs;
    const size_t jj = is_q ? j : j - q_pairs;
    const size_t h = jj / half, i = jj % half;
    float* x = is_q ? a.q + (t * a.n_heads + h) * a.head_dim : a.k + (t * a.n_kv_heads + h) * a.head_dim;
    float va = x[i], vb = x[i + half];
    float ra = va * c[i] - vb * sn[i];
    float rb = vb * c[i] + va * sn[i];
    x[i] = ra;
    x[i + half] = rb;
    if (!is_q) {
      float* kc = a.k_cache + (static_cast<size_t>(slot) * a.n_kv_heads + h) * a.head_dim;
      kc[i] = ra;
      kc[i + half] = rb;
    }
  }
  const size_t kv = a.n_kv_heads * a.head_dim;
  float* vc = a.v_cache + static_cast<size_t>(slot) * kv;
  for (size_t j = threadIdx.x; j < kv; j += blockDim.x) vc[j] = a.v[t * kv + j];
}

}  // namespace

status rope_kv(const rope_kv_args& a, stream_t s) {
  if (a.n_tokens == 0) return ok_status();
  rope_kv_kernel<<<static_cast<unsigned>(a.n_tokens), 128, 0, s>>>(a);
  return detail::launched("rope_kv");
}

}  // namespace llmesh::kernels::cuda
