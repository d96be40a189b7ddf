// Private: the register-tiled matmul micro-kernel, written once over a 16-lane vector type V
// and instantiated by each instruction-set translation unit (matmul_avx512.cpp,
// matmul_avx2.cpp), which is compiled with that set's flags.
//
// A tile computes MR rows of x against NR rows of w, with one 16-lane accumulator per output
// (inner-product form). Both operands are read along k, which is how HF stores weights
// ([out, in]) and activations, so no packing copy is needed and each output keeps the
// canonical reduction order of matmul.hpp whatever MR, NR or the thread split are.
//
// V must provide: zero(), load_x(const float*), load_x_tail(const float*, size_t n),
// load_w<dtype>(const void*, size_t idx), load_w_tail<dtype>(const void*, size_t idx, size_t n),
// fma(V a, V b, V c) = a*b+c per lane, fold(V) -> float in the canonical fold order.
#pragma once

#include <algorithm>

#include "matmul/matmul_isa.hpp"

namespace llmesh::kernels::detail {

template <class V, int MR, int NR, dtype WT>
void matmul_tile(const matmul_args& a, size_t i0, size_t j0) {
  const float* x = a.x + i0 * a.ldx;
  const size_t w_row0 = j0 * a.ldw;
  V acc[MR][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) acc[m][n] = V::zero();

  size_t kk = 0;
  for (; kk + 16 <= a.k; kk += 16) {
    V xv[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) xv[m] = V::load_x(x + m * a.ldx + kk);
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      V wv = V::template load_w<WT>(a.w, w_row0 + n * a.ldw + kk);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) acc[m][n] = V::fma(xv[m], wv, acc[m][n]);
    }
  }
  if (kk < a.k) {  // tail: zero-padded lanes, i.e. fma(0, 0, acc), like the portable path
    size_t rest = a.k - kk;
    V xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = V::load_x_tail(x + m * a.ldx + kk, rest);
    for (int n = 0; n < NR; ++n) {
      V wv = V::template load_w_tail<WT>(a.w, w_row0 + n * a.ldw + kk, rest);
      for (int m = 0; m < MR; ++m) acc[m][n] = V::fma(xv[m], wv, acc[m][n]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
    float* y = a.y + (i0 + m) * a.ldy + j0;
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      float v = V::fold(acc[m][n]);
      y[n] = a.bias ? v + a.bias[j0 + n] : v;
    }
  }
}

using tile_fn = void (*)(const matmul_args&, size_t, size_t);

template <class V, dtype WT, int MR, int... Ns>
constexpr void fill_row(tile_fn* row, std::integer_sequence<int, Ns...>) {
  ((row[Ns] = &matmul_tile<V, MR, Ns + 1, WT>), ...);
}

template <class V, dtype WT, int MRMax, int NRMax, int... Ms>
constexpr auto make_table(std::integer_sequence<int, Ms...>) {
  std::array<std::array<tile_fn, NRMax>, MRMax> t{};
  ((fill_row<V, WT, Ms + 1>(t[Ms].data(), std::make_integer_sequence<int, NRMax>{})), ...);
  return t;
}

/// Rows [m0, m1) × columns [n0, n1) with MRMax × NRMax tiles (smaller ones at the edges).
/// Loop order: each weight tile stays in L1 while every x tile of the block passes over it.
template <class V, int MRMax, int NRMax>
void gemm_block(const matmul_args& a, size_t m0, size_t m1, size_t n0, size_t n1) {
  static const auto t32 = make_table<V, dtype::f32, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto t16 = make_table<V, dtype::f16, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tb16 = make_table<V, dtype::bf16, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  const auto& table = a.w_type == dtype::f32 ? t32 : (a.w_type == dtype::f16 ? t16 : tb16);
  for (size_t j = n0; j < n1; j += NRMax) {
    size_t nr = std::min<size_t>(NRMax, n1 - j);
    for (size_t i = m0; i < m1; i += MRMax) {
      size_t mr = std::min<size_t>(MRMax, m1 - i);
      table[mr - 1][nr - 1](a, i, j);
    }
  }
}

}  // namespace llmesh::kernels::detail
