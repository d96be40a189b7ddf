// Private: which part of each split weight matrix a set of tensor-parallel ranks reads
// (load_options::ranks), so that a spread replica's node writes only those parts of the
// matrices it rewrites at load (int8, --dtype, packed 4/8-bit layers, GGUF's repacked blocks).
// The parts follow make_shard_layout: q, k, v, gate, up and the LM head by rows (column
// parallel), o_proj and down_proj by columns (row parallel), routed experts whole or not at all
// under expert parallelism.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "llmesh/kernels/dtype.hpp"
#include "llmesh/kernels/quantize.hpp"
#include "llmesh/model/weights.hpp"
#include "load_threads.hpp"

namespace llmesh::model::detail {

using spans = std::vector<std::pair<size_t, size_t>>;  ///< half-open [begin, end), sorted, disjoint

/// The part of one [rows, cols] matrix some ranks read: none of it (`skip`), or the rows in
/// `rows` (empty: every row) and, within each, the columns in `cols` (empty: every column).
struct matrix_part {
  bool skip = false;
  spans rows, cols;
  /// Held for one rank, a row-parallel matrix (one span of columns): written, where its
  /// columns fall on whole blocks (and a packed layer is taken exactly), as a matrix of its own
  /// (model::column_slice), the full matrix's bytes never touched (but for online fp8's one
  /// read of the whole matrix for its scale).
  bool own = false;
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

/// A row-parallel matrix's columns [c0, c0 + w.cols) of the full matrix at `full`, held as `w`.
struct own_columns {
  const void* full;
  size_t c0;
  weight_matrix w;
};

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

/// `bytes` rounded up to a whole 2 MiB huge page: where small pages begin without sharing one.
constexpr size_t huge_page_end(size_t bytes) {
  constexpr size_t huge_page = size_t{2} << 20;
  return (bytes + huge_page - 1) / huge_page * huge_page;
}

/// Where each of `n` matrices written at load lies in one weight_mapping: those written whole
/// or by rows of a large matrix, then the own columns' matrices (`own_bytes` > 0), under huge
/// pages; from `huge` on, those `small` says are held in small parts (and the full matrices of
/// own columns, never written), under small pages. Each 64-byte aligned.
struct weight_layout {
  std::vector<size_t> at, own_at;  ///< by matrix: where it lies, and its own columns (if any)
  size_t huge = 0, total = 0;
};
weight_layout lay_out_weights(size_t n, const std::function<bool(size_t)>& small, const std::function<size_t(size_t)>& bytes,
                              const std::function<size_t(size_t)>& own_bytes);

/// A matrix [out, in] written at load in blocks of 32 inputs (q8, q4 or fp8: an unpacked
/// packed layer, an FP8 layer), and what of it the held ranks read.
struct block_layer {
  size_t in = 0, out = 0;
  kernels::dtype type = kernels::dtype::q8;
  matrix_part part;         ///< what is written (load_options::ranks; default: all)
  spans cols;               ///< the part's columns, on blocks of 32 (empty: whole rows)
  bool own = false;         ///< cols (one span) written as a matrix of their own (part.own)
  uint8_t* full = nullptr;  ///< the [out, in] matrix of blocks
  uint8_t* bytes = nullptr; ///< where rows are written: `full`, or (own) the columns' matrix
  size_t row_bytes() const { return kernels::dtype_bytes(type, kernels::q8_row_elements(in)); }
  /// Inputs of a written row, its bytes, and the block of `full` its first block is.
  size_t written_in() const { return own ? cols.front().second - cols.front().first : in; }
  size_t written_row_bytes() const { return kernels::dtype_bytes(type, kernels::q8_row_elements(written_in())); }
  size_t first_block() const { return own ? cols.front().first / kernels::q8_block : 0; }
  /// Whether the block of 32 inputs from i0 is written.
  bool holds(size_t i0) const {
    if (cols.empty()) return true;
    for (const auto& [b, e] : cols) {
      if (i0 >= b && i0 < e) return true;
    }
    return false;
  }
};
static_assert(kernels::q4_block == kernels::q8_block, "a column span on blocks of 32 is whole blocks of each");

/// One anonymous mapping of `total` bytes for weights written at load, whose pages take memory
/// only once written (MAP_NORESERVE): huge pages advised for [0, huge), fewer TLB misses while
/// decode streams them; small pages after, where parts held in small pieces lie (a huge page
/// would back other ranks' rows). io_error naming `what` when it cannot be had; null for 0.
[[nodiscard]] result<std::shared_ptr<uint8_t>> weight_mapping(size_t huge, size_t total, const std::string& what);

/// One weight_mapping (named `what`) for every layer's blocks: those written whole or by rows
/// of a large matrix, and own columns' matrices, first, under huge pages; those held in small
/// parts (by columns, not at all, by rows of a small matrix; and the full matrices of own
/// columns, never written) after, under small pages, so only what is written takes memory.
/// Points each layer's full and bytes there; the mapping's owner, or io_error.
template <class Layer>
[[nodiscard]] result<std::shared_ptr<uint8_t>> map_block_layers(std::vector<Layer>& layers, const std::string& what) {
  auto bytes_of = [](const block_layer& l) { return l.out * l.row_bytes(); };
  const auto layout = lay_out_weights(
      layers.size(), [&](size_t i) { return layers[i].own || small_pages(layers[i].part, bytes_of(layers[i])); },
      [&](size_t i) { return bytes_of(layers[i]); },
      [&](size_t i) { return layers[i].own ? layers[i].out * layers[i].written_row_bytes() : 0; });
  auto mapped = weight_mapping(layout.huge, layout.total, what);
  if (!mapped) return mapped.take_error();
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i].full = mapped->get() + layout.at[i];
    layers[i].bytes = layers[i].own ? mapped->get() + layout.own_at[i] : layers[i].full;
  }
  return mapped;
}

/// Calls write(layer, o0, o1) for every layer's rows of its part, 64 rows at a time, over the
/// hardware threads (for_each_item: the earliest failure is reported).
template <class Layer, class Write>
[[nodiscard]] status write_block_rows(const std::vector<Layer>& layers, Write&& write) {
  struct item {
    size_t layer, o0, o1;
  };
  std::vector<item> items;
  for (size_t i = 0; i < layers.size(); ++i) {
    for_row_runs(layers[i].part, layers[i].out, 64, [&](size_t o, size_t n) { items.push_back({i, o, o + n}); });
  }
  return for_each_item(items.size(), [&](size_t n) { return write(layers[items[n].layer], items[n].o0, items[n].o1); });
}

/// Lets the whole pages within [p, p + bytes) leave memory (an edge page may be a neighbour's);
/// a checkpoint's stay in the page cache, clean.
void let_go(const void* p, size_t bytes);

}  // namespace llmesh::model::detail
