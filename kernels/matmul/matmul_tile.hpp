// Private: the register-tiled matmul micro-kernel, written once over a 16-lane vector type V
// and instantiated by each instruction-set translation unit (matmul_avx512.cpp,
// matmul_avx2.cpp), which is compiled with that set's flags.
//
// A tile computes MR rows of x against NR rows of w, with one 16-lane accumulator per output
// (inner-product form). Both operands are read along k, which is how HF stores weights
// ([out, in]) and activations, so no packing copy is needed and each output keeps the
// canonical reduction order of matmul.hpp whatever MR, NR or the thread split are.
//
// V is one native vector of V::width lanes (16 for AVX-512, 8 for AVX2); a canonical 16-lane
// accumulator is P = 16 / width registers ("parts"), each holding lanes [p·width, (p+1)·width).
// Per 16-wide step of k the tile walks the parts one at a time: load NR weight parts, then
// for each x row load one x part and issue NR fused multiply-adds. Registers in use:
// MR·NR·P accumulators + NR weights + 1 x, which sizes the tiles (4×6 on AVX-512, 3×2 on AVX2).
//
// V must provide: using reg; width; zero(); load_x(const float*); store(float*, reg);
// load_w<dtype>(const void* w, size_t chunk_start, int part) for f32/f16/bf16;
// load_q8(const uint8_t* block, size_t at): width int8 values from block + at, dequantized as
// float(q) * the block's scale (its first 4 bytes), so the products are those of the
// dequantized weights; fma(reg a, reg b, reg c) =
// a*b+c; pos(q): where element q of a 16-chunk sits in V's register layout (q for the
// natural layout); fold(const reg* parts) -> float in the canonical fold order.
// A V with a permuted layout expects x already permuted the same way (matmul_cpu.cpp packs it).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "matmul/matmul_isa.hpp"

namespace llmesh::kernels::detail {

/// Accumulates k in [k0, k1) (k0 a multiple of 16) for an MR × NR tile at rows i0, columns j0.
/// `part` carries the 16-lane accumulators between k blocks (MR·NR·16 floats): loaded when
/// k0 > 0, stored when k1 < k; the last block folds and writes y. With one block, part is
/// unused. Splitting k this way keeps every lane's sum sequential in k: same bits.
template <class V, int MR, int NR, dtype WT>
void matmul_tile(const matmul_args& a, size_t i0, size_t j0, size_t k0, size_t k1, float* part) {
  using reg = typename V::reg;
  constexpr int W = V::width;
  constexpr int P = 16 / W;
  const float* x = a.x + i0 * a.ldx;
  const size_t w_row0 = j0 * a.ldw;
  reg acc[MR][NR][P];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n)
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) acc[m][n][p] = k0 > 0 ? V::load_x(part + ((m * NR + n) * P + p) * W) : V::zero();

  // q8: each row starts on a block (ldw is whole blocks), and a 16-chunk never leaves its
  // block, so one byte offset per step serves every row: no address arithmetic per load.
  [[maybe_unused]] const uint8_t* q8_row[NR] = {};
  [[maybe_unused]] size_t q8_next = 0;  // bytes from a row to the same row of the next tile
  if constexpr (WT == dtype::q8) {
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) q8_row[n] = static_cast<const uint8_t*>(a.w) + dtype_offset(WT, w_row0 + n * a.ldw);
    q8_next = dtype_offset(WT, NR * a.ldw);
  }
  size_t kk = k0;
  for (; kk + 16 <= k1; kk += 16) {
    [[maybe_unused]] const size_t q8_block_at = kk / q8_block * q8_block_bytes;  // q8: this step's block
    if (MR == 1 || i0 == 0) {
      // Decode streams weights from memory with no reuse, one page-sized row after another,
      // which the hardware prefetcher restarts at every page: prefetch the next tile's rows
      // (the next NR rows) at the pace this tile consumes its own. With more x rows, the first
      // x tile (i0 == 0: gemm_block starts every block there) streams the weight block from
      // memory and prefetches likewise; later tiles find it in cache (batches of 4-16 rows:
      // 10-25 % faster on AVX2 than without). Into every cache level
      // (T0): on a Xeon with AVX-512 the non-temporal hint left a 128 M-weight decode matmul
      // at 55-65 % of the read bandwidth, T0 reaches ~100 % (bf16 and q8, both ISAs).
      // The last tile's "next rows" lie past the weights: the addresses are formed as
      // integers (a prefetch never faults; a pointer past its array would be undefined).
      if constexpr (WT == dtype::q8) {
        const size_t ahead = q8_next + q8_block_at;
#pragma GCC unroll 8
        for (int n = 0; n < NR; ++n) __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(q8_row[n]) + ahead), 0, 3);
      } else {
        const uintptr_t next = reinterpret_cast<uintptr_t>(a.w) + (w_row0 + NR * a.ldw) * dtype_size(WT);
#pragma GCC unroll 8
        for (int n = 0; n < NR; ++n) __builtin_prefetch(reinterpret_cast<const void*>(next + (n * a.ldw + kk) * dtype_size(WT)), 0, 3);
      }
    }
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) {
      reg wv[NR];
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n) {
        if constexpr (WT == dtype::q8) {
          wv[n] = V::load_q8(q8_row[n] + q8_block_at, 4 + kk % q8_block + static_cast<size_t>(p) * W);
        } else {
          wv[n] = V::template load_w<WT>(a.w, w_row0 + n * a.ldw + kk, p);
        }
        asm("" : "+x"(wv[n]));  // same reason as for x below
      }
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        reg xv = V::load_x(x + m * a.ldx + kk + p * W);
        // Keep x in a register: otherwise GCC folds the load into each of the NR FMAs as a
        // memory operand, and the tile becomes load-bound instead of FMA-bound.
        asm("" : "+x"(xv));
#pragma GCC unroll 8
        for (int n = 0; n < NR; ++n) acc[m][n][p] = V::fma(xv, wv[n], acc[m][n][p]);
      }
    }
  }
  if (k1 < a.k) {  // more k blocks follow: park the lanes
    for (int m = 0; m < MR; ++m)
      for (int n = 0; n < NR; ++n)
        for (int p = 0; p < P; ++p) V::store(part + ((m * NR + n) * P + p) * W, acc[m][n][p]);
    return;
  }
  if (kk < a.k) {  // tail: zero-padded copies, i.e. fma(0, 0, acc) in the missing lanes
    const size_t rest = a.k - kk;
    alignas(64) float xt[MR][16] = {};
    alignas(64) float wt[NR][16] = {};
    for (int m = 0; m < MR; ++m)
      for (size_t q = 0; q < rest; ++q) xt[m][V::pos(q)] = x[m * a.ldx + kk + V::pos(q)];
    for (int n = 0; n < NR; ++n)
      for (size_t q = 0; q < rest; ++q) wt[n][V::pos(q)] = load_as_f32(a.w, WT, w_row0 + n * a.ldw + kk + q);
    for (int p = 0; p < P; ++p) {
      for (int m = 0; m < MR; ++m) {
        reg xv = V::load_x(&xt[m][p * W]);
        for (int n = 0; n < NR; ++n) acc[m][n][p] = V::fma(xv, V::load_x(&wt[n][p * W]), acc[m][n][p]);
      }
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

using tile_fn = void (*)(const matmul_args&, size_t, size_t, size_t, size_t, float*);

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
/// Blocking: a block of weight rows × a block of k sized to stay in L2 is read from memory
/// once; every x tile (MRMax rows × the k block, sized to stay in L1) passes over it. With
/// more than one k block, the tiles' lane accumulators wait in a per-thread buffer.
/// VB16 is the vector type used for bf16 weights (it may use a permuted layout).
template <class V, class VB16, int MRMax, int NRMax>
void gemm_block(const matmul_args& a, size_t m0, size_t m1, size_t n0, size_t n1) {
  static const auto t32 = make_table<V, dtype::f32, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto t16 = make_table<V, dtype::f16, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tb16 = make_table<VB16, dtype::bf16, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  static const auto tq8 = make_table<V, dtype::q8, MRMax, NRMax>(std::make_integer_sequence<int, MRMax>{});
  const auto& table = a.w_type == dtype::f32  ? t32
                      : a.w_type == dtype::f16 ? t16
                      : a.w_type == dtype::q8  ? tq8
                                               : tb16;
  const size_t kb = k_block_len(a.k, m1 - m0, MRMax);
  const size_t nb = n_block_rows(kb, a.w_type, NRMax);
  constexpr size_t part_floats = static_cast<size_t>(MRMax) * NRMax * 16;
  thread_local std::vector<float> parts;
  if (kb < a.k) parts.resize(((m1 - m0 + MRMax - 1) / MRMax) * ((nb + NRMax - 1) / NRMax) * part_floats);
  for (size_t jb = n0; jb < n1; jb += nb) {
    const size_t jb_end = std::min(n1, jb + nb);
    for (size_t k0 = 0; k0 < a.k; k0 += kb) {
      const size_t k1 = std::min(a.k, k0 + kb);
      float* part = kb < a.k ? parts.data() : nullptr;
      for (size_t i = m0; i < m1; i += MRMax) {
        const size_t mr = std::min<size_t>(MRMax, m1 - i);
        for (size_t j = jb; j < jb_end; j += NRMax, part = part ? part + part_floats : nullptr) {
          table[mr - 1][std::min<size_t>(NRMax, jb_end - j) - 1](a, i, j, k0, k1, part);
        }
      }
    }
  }
}

}  // namespace llmesh::kernels::detail
