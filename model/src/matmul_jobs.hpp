// How a rank's executor points the matmul kernel at its part of a weight (private to
// shard_executor.cpp and moe_block.cpp).
#pragma once

#include <vector>

#include "llmesh/kernels/matmul.hpp"
#include "llmesh/kernels/thread_pool.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model::detail {

/// Rows [row0, row0 + rows) of a [out, in] weight: a column-parallel slice, used in place.
inline const void* rows_from(const weight_matrix& w, size_t row0) {
  return static_cast<const uint8_t*>(w.data) + kernels::dtype_offset(w.type, row0 * w.ld());
}

/// Columns [col0, ...) of a [out, in] weight: a row-parallel slice, used in place with ldw = ld().
/// For q8 and q4, col0 is a multiple of the block (engine::create checks the layout).
inline const void* cols_from(const weight_matrix& w, size_t col0) {
  return static_cast<const uint8_t*>(w.data) + kernels::dtype_offset(w.type, col0);
}

inline kernels::matmul_args job(const float* x, size_t ldx, const weight_matrix& w, const void* wdata, float* y,
                                size_t ldy, size_t m, size_t n, size_t k, const float* bias) {
  kernels::matmul_args a;
  a.x = x;
  a.ldx = ldx;
  a.w = wdata;
  a.ldw = w.ld();
  a.w_type = w.type;
  a.bias = bias;
  a.y = y;
  a.ldy = ldy;
  a.m = m;
  a.n = n;
  a.k = k;
  return a;
}

inline const float* slice(const std::vector<float>& v, size_t from) { return v.empty() ? nullptr : v.data() + from; }

/// fn(r) for every row r < n_rows of `row_floats` floats each: on the pool when the rows hold
/// enough work to pay for waking it (a prefill), else here (a decode step's few rows). Each
/// row's result is the same either way.
template <class F>
void for_rows(kernels::thread_pool& pool, size_t n_rows, size_t row_floats, F&& fn) {
  if (n_rows * row_floats < (size_t{1} << 16)) {
    for (size_t r = 0; r < n_rows; ++r) fn(r);
    return;
  }
  pool.run([&](int th, int n_threads) {
    auto [b, e] = kernels::thread_pool::split(n_rows, th, n_threads);
    for (size_t r = b; r < e; ++r) fn(r);
  });
}

}  // namespace llmesh::model::detail
