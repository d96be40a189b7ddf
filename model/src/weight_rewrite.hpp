// Private: rewriting a loaded model's matrices in another type at load (model::quantize:
// --quantization int8 or online fp8; model::cast: --dtype) into one new anonymous mapping, on
// every hardware thread. Held for some ranks (load_options::ranks), only what they read is
// written; held for one rank, a row-parallel matrix's columns are written as a matrix of their
// own (model::column_slice) and its full view's pages are never touched (online fp8 reads all
// of a matrix once, for its scale, and lets those pages go).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/model/weights.hpp"
#include "rank_parts.hpp"

namespace llmesh::model::detail {

/// A matrix to rewrite in another dtype: every view of the same checkpoint bytes (a tied LM
/// head and the embedding) moves together.
struct convert_target {
  std::vector<weight_matrix*> views;
  std::string name;
  matrix_part part;  ///< what the held ranks read of it (load_options::ranks)
  /// Held for one rank, a row-parallel matrix: that rank's columns [first, second).
  std::optional<std::pair<size_t, size_t>> own_cols;
  size_t offset = 0, own_offset = 0;
  bool shared = false;  ///< its source rows are read elsewhere too (a tied LM head: the embedding)
  const weight_matrix& w() const { return *views.front(); }
};

/// The columns of a matrix already held as a matrix of their own (model::column_slice).
using held_columns_of = std::function<const weight_matrix*(const weight_matrix& full, size_t c0)>;

/// The matrices a rewrite to `to` takes: every layer's projections and experts; with
/// `everything` (--dtype) also the MoE router, the shared expert's gate and the embedding; the
/// LM head last (a tied one shares its embedding's target when that is taken). Each with the
/// part `ranks` read (nullopt: whole).
std::vector<convert_target> targets_of(model_weights& w, kernels::dtype to, bool everything, const model_config& c,
                                       const std::optional<rank_set>& ranks);

/// Rewrites every target as `to` (q8: quantize_q8; fp8: quantize_fp8 with max|w| / 448 of the
/// whole of vLLM's fused layer — q, k and v; gate and up — as its scale, each weight rounded
/// to `through` first (the --dtype vLLM would quantize from); else convert_rows)
/// into one new anonymous
/// mapping, over up to 64 hardware threads, and points the views there; a target with own
/// columns is written there (reading `held`'s copy of them when its source has one) and
/// listed in `own`. The checkpoint's pages of each rewritten matrix (not shared) then leave
/// this process's resident memory (they stay in the page cache, clean). On an error no view
/// has moved.
[[nodiscard]] result<std::shared_ptr<uint8_t>> rewrite(std::vector<convert_target>& targets, kernels::dtype to, const char* what,
                                                       const held_columns_of& held, std::vector<own_columns>& own,
                                                       kernels::dtype through = kernels::dtype::f32);

}  // namespace llmesh::model::detail
