// Private: which part of each split weight matrix a set of tensor-parallel ranks reads
// (load_options::ranks), so that a spread replica's node writes only those parts of the
// matrices it rewrites at load (int8, --dtype, packed 4/8-bit layers, GGUF's repacked blocks).
// The parts follow make_shard_layout: q, k, v, gate, up and the LM head by rows (column
// parallel), o_proj and down_proj by columns (row parallel), routed experts whole or not at all
// under expert parallelism.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "llmesh/kernels/dtype.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model::detail {

using spans = std::vector<std::pair<size_t, size_t>>;  ///< half-open [begin, end), sorted, disjoint

/// The part of one [rows, cols] matrix some ranks read: none of it (`skip`), or the rows in
/// `rows` (empty: every row) and, within each, the columns in `cols` (empty: every column).
struct matrix_part {
  bool skip = false;
  spans rows, cols;
  bool whole() const { return !skip && rows.empty() && cols.empty(); }
};

/// What a matrix is to the shard layout.
enum class matrix_role : uint8_t {
  whole,  ///< read by every rank (embedding, MoE router, shared expert gate, a classifier)
  q, k, v, o, gate, up, down,
  qkv, gate_up,  ///< Phi-3's fused projections
  lm_head,
  expert_gate, expert_up, expert_down,
  shared_gate, shared_up, shared_down,  ///< Qwen2-MoE's shared expert
};

/// The part of a matrix in `role` (of routed expert `expert`) that `ranks` read. Whole when a
/// rank's layout cannot be made (the engine refuses that tp later) or the ranks read all of it.
matrix_part part_read(const model_config& c, const rank_set& ranks, matrix_role role, size_t expert = 0);

/// The role of the checkpoint matrix named `name` (an HF name, with or without ".weight"),
/// and for a routed expert its number.
std::pair<matrix_role, size_t> role_of(const std::string& name);

/// The part of a checkpoint tensor (by its HF name) that load keeps; empty: every tensor whole.
using part_of_tensor = std::function<matrix_part(const std::string& hf_name)>;

/// `p`'s columns if every boundary is a multiple of `block` elements (or the row's end, `cols`);
/// else every column (a row written whole).
spans aligned_cols(const matrix_part& p, size_t block, size_t cols);

/// Calls f(row0, n) for runs of at most `step` rows of `p` (every row when p.rows is empty;
/// none when skipped) of a matrix of `rows` rows.
template <class F>
void for_row_runs(const matrix_part& p, size_t rows, size_t step, F&& f) {
  if (p.skip) return;
  const spans all{{0, rows}};
  for (const auto& [b, e] : p.rows.empty() ? all : p.rows) {
    for (size_t r = b; r < e; r += step) f(r, std::min(step, e - r));
  }
}

/// Whether a matrix of `bytes` held as `p` belongs under small pages: skipped, held by columns
/// (a row is a few KiB: most pages hold some of every rank's columns), or held by rows but
/// under 32 MiB (a huge page of 2 MiB would back much of what other ranks read).
inline bool small_pages(const matrix_part& p, size_t bytes) {
  return p.skip || !p.cols.empty() || (!p.rows.empty() && bytes < (size_t{32} << 20));
}

/// Advises huge pages for [base, base + huge) and none for [base + huge, base + total): the
/// matrices held by columns lie at the end, where a huge page would back every rank's columns.
void advise_pages(uint8_t* base, size_t huge, size_t total);

}  // namespace llmesh::model::detail
