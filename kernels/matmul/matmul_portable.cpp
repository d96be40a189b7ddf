// Portable matmul and dot: plain C++ in the canonical 16-lane order (see matmul.hpp).
// It is both the fallback for CPUs without AVX2 and the oracle the vector paths match bit for
// bit. std::fma is used explicitly; the build forbids implicit contraction.
#include <cmath>

#include "matmul/matmul_isa.hpp"

namespace llmesh::kernels {
namespace {

constexpr size_t lanes = 16;

/// Folds 16 lanes as i+8→i, i+4→i, i+2→i, i+1→i.
float fold16(float* v) {
  for (size_t half = 8; half >= 1; half /= 2) {
    for (size_t i = 0; i < half; ++i) v[i] = v[i] + v[i + half];
  }
  return v[0];
}

template <class LoadW>
float dot_lanes(const float* x, size_t k, LoadW load_w) {
  float acc[lanes] = {};
  size_t kk = 0;
  for (; kk + lanes <= k; kk += lanes) {
    for (size_t l = 0; l < lanes; ++l) acc[l] = std::fma(x[kk + l], load_w(kk + l), acc[l]);
  }
  if (kk < k) {  // the tail behaves exactly like a zero-padded vector: fma(0, 0, acc)
    for (size_t l = 0; l < lanes; ++l) {
      bool in = kk + l < k;
      acc[l] = std::fma(in ? x[kk + l] : 0.0f, in ? load_w(kk + l) : 0.0f, acc[l]);
    }
  }
  return fold16(acc);
}

float dot_portable(const float* a, const float* b, size_t n) {
  return dot_lanes(a, n, [b](size_t i) { return b[i]; });
}

void gemm_block_portable(const matmul_args& a, size_t m0, size_t m1, size_t n0, size_t n1) {
  for (size_t j = n0; j < n1; ++j) {
    for (size_t i = m0; i < m1; ++i) {
      const float* x = a.x + i * a.ldx;
      float v;
      switch (a.w_type) {
        case dtype::f32: {
          const float* w = static_cast<const float*>(a.w) + j * a.ldw;
          v = dot_lanes(x, a.k, [w](size_t q) { return w[q]; });
          break;
        }
        case dtype::f16: {
          const uint16_t* w = static_cast<const uint16_t*>(a.w) + j * a.ldw;
          v = dot_lanes(x, a.k, [w](size_t q) { return f16_to_f32(w[q]); });
          break;
        }
        case dtype::q8: case dtype::fp8: case dtype::q4: case dtype::mxfp4: case dtype::q2_k: case dtype::q3_k: case dtype::q4_k: case dtype::q5_k: case dtype::q6_k:
        case dtype::iq4_xs: {
          const auto* w = static_cast<const uint8_t*>(a.w) + dtype_offset(a.w_type, j * a.ldw);
          v = dot_lanes(x, a.k, [w, t = a.w_type](size_t q) { return load_as_f32(w, t, q); });
          break;
        }
        default: {
          const uint16_t* w = static_cast<const uint16_t*>(a.w) + j * a.ldw;
          v = dot_lanes(x, a.k, [w](size_t q) { return bf16_to_f32(w[q]); });
          break;
        }
      }
      a.y[i * a.ldy + j] = a.bias ? v + a.bias[j] : v;
    }
  }
}

}  // namespace

float dot_reference(const float* x, const void* w, dtype w_type, size_t k) {
  return dot_lanes(x, k, [w, w_type](size_t q) { return load_as_f32(w, w_type, q); });
}

namespace detail {
float weight_as_f32(const void* data, dtype t, size_t i) { return load_as_f32(data, t, i); }
isa_kernels portable_kernels() { return {gemm_block_portable, dot_portable, 1, 1, nullptr}; }
}  // namespace detail

}  // namespace llmesh::kernels
