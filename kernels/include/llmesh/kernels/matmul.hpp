// Matrix multiplication y = x · Wᵀ (+ bias) with float32 activations and F32/F16/BF16/Q8/Q4 or
// K-quant (Q2_K ... Q6_K, IQ4_XS) weights, and the canonical dot product every other reduction in llmesh uses.
//
// Reduction order (the batch- and chunk-invariance contract): every output element is one dot
// product over k, accumulated in 16 lanes — lane l sums the products of k ≡ l (mod 16) in
// increasing k with fused multiply-adds — then folded as lanes i+8→i, i+4→i, i+2→i, i+1→i.
// That order depends on nothing but k: not on m (the batch), not on the tiling or thread
// split, not on the instruction set. So a sequence's numbers are bit-identical whether it is
// decoded alone or in a batch, prefilled whole or in chunks, on AVX-512, AVX2 or portable code.
#pragma once

#include <cstddef>
#include <span>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/dtype.hpp"
#include "llmesh/kernels/thread_pool.hpp"

namespace llmesh::kernels {

/// One matmul: y[i][j] = dot(x[i][0..k), w[j][0..k)) (+ bias[j]) for i < m, j < n.
/// Layouts are row-major with explicit leading dimensions (in elements), so a weight slice
/// (a tensor-parallel shard's rows or columns) is used in place, without a copy.
struct matmul_args {
  const float* x = nullptr;  ///< activations [m][ldx]
  size_t ldx = 0;
  const void* w = nullptr;   ///< weights [n][ldw], HF [out, in] layout; block types: at a block boundary
  size_t ldw = 0;
  dtype w_type = dtype::f32;
  const float* bias = nullptr;  ///< optional [n]
  float* y = nullptr;        ///< output [m][ldy]
  size_t ldy = 0;
  size_t m = 0, n = 0, k = 0;
};

/// Runs several independent matmuls as one parallel region (e.g. q, k and v projections):
/// each thread takes the same fraction of every job's output rows.
/// Fails with invalid_request on null pointers, leading dimensions smaller than k / n, rows of
/// a block type that are not whole blocks (ldw a multiple of dtype_block), or K-quant jobs
/// whose k is not whole super-blocks.
[[nodiscard]] status matmul(std::span<const matmul_args> jobs, thread_pool& pool);

/// Single-job convenience form of matmul().
[[nodiscard]] status matmul(const matmul_args& job, thread_pool& pool);

/// The canonical dot product of two float32 vectors (reduction order above).
float dot(const float* a, const float* b, size_t n);

/// Reference implementation of one output element in the canonical order, in plain scalar
/// code: the oracle the vector kernels are tested against bit for bit.
float dot_reference(const float* x, const void* w, dtype w_type, size_t k);

}  // namespace llmesh::kernels
