// RoPE on the device fused with the KV-cache write, bit-identical to rope_cpu.cpp + kv_write:
// x[i] = a·cos − b·sin, x[i+r/2] = b·cos + a·sin with a = x[i], b = x[i+r/2] for i < r/2 (r the
// rotary dimension; the rest of each head passes), then the token's rotated k and its v stored
// at its cache slot. One block per token.
// Layout: q [T][n_heads][hd], k/v [T][n_kv_heads][hd]; cos/sin tables [position][r/2];
// cache [slot][n_kv_heads][hd] float32.
#include "device/cuda_common.cuh"
#include "llmesh/kernels/cuda_ops.hpp"

namespace llmesh::kernels::cuda {
namespace {

__global__ void rope_kv_kernel(rope_kv_args a) {
  const unsigned t = blockIdx.x;
  const int32_t slot = a.slot[t];
  if (slot < 0) return;  // batch padding
  const unsigned hd = static_cast<unsigned>(a.head_dim);
  const unsigned rot = !a.rotate ? 0u : a.rotary_dim != 0 ? static_cast<unsigned>(a.rotary_dim) : hd, half = rot / 2;
  const unsigned nq = static_cast<unsigned>(a.n_heads), nkv = static_cast<unsigned>(a.n_kv_heads);
  const size_t p = static_cast<size_t>(a.pos[t]);
  const float* c = a.cos + p * half;
  const float* sn = a.sin + p * half;
  // One warp per head (q heads, then kv heads); lanes walk the head's first half.
  for (unsigned h = threadIdx.x / 32; h < nq + nkv; h += blockDim.x / 32) {
    const bool is_q = h < nq;
    const unsigned hh = is_q ? h : h - nq;
    float* x = is_q ? a.q + (static_cast<size_t>(t) * nq + hh) * hd : a.k + (static_cast<size_t>(t) * nkv + hh) * hd;
    float* kc = is_q ? nullptr : a.k_cache + (static_cast<size_t>(slot) * nkv + hh) * hd;
    for (unsigned i = threadIdx.x & 31u; i < half; i += 32) {
      float va = x[i], vb = x[i + half];
      float ra = va * c[i] - vb * sn[i];
      float rb = vb * c[i] + va * sn[i];
      x[i] = ra;
      x[i + half] = rb;
      if (kc) {
        kc[i] = ra;
        kc[i + half] = rb;
      }
    }
    if (kc) {
      for (unsigned i = rot + (threadIdx.x & 31u); i < hd; i += 32) kc[i] = x[i];  // the part that does not rotate
    }
    if (is_q && a.q_scale != nullptr) {  // after the rotation, as the CPU scales the rotated row
      const float qs = a.q_scale[p];
      __syncwarp();
      if (qs != 1.0f) {
        for (unsigned i = threadIdx.x & 31u; i < hd; i += 32) x[i] *= qs;
      }
    }
  }
  const size_t kv = static_cast<size_t>(nkv) * hd;
  float* vc = a.v_cache + static_cast<size_t>(slot) * kv;
  for (size_t j = threadIdx.x; j < kv; j += blockDim.x) vc[j] = a.v[t * kv + j];
}

}  // namespace

status rope_kv(const rope_kv_args& a, stream_t s) {
  if (a.n_tokens == 0) return ok_status();
  rope_kv_kernel<<<static_cast<unsigned>(a.n_tokens), 256, 0, s>>>(a);
  return detail::launched("rope_kv");
}

}  // namespace llmesh::kernels::cuda
