// A model held for some ranks (load_options::ranks): each rank's own copy of the columns it
// reads of the row-parallel matrices. A row of o_proj or down_proj is a few KiB, so a rank's
// half of every row touches nearly every page of the matrix: only a copy of the columns,
// row after row, lets the rest of the matrix leave memory.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "llmesh/model/shard_executor.hpp"
#include "llmesh/model/weights.hpp"
#include "load_threads.hpp"
#include "rank_parts.hpp"

namespace llmesh::model {

status model::compact_columns() {
  if (!held_ranks_) return ok_status();
  struct want {
    const weight_matrix* full;
    size_t c0, k, offset;
  };
  std::vector<want> wants;
  auto add = [&](const weight_matrix& w, size_t c0, size_t k) {
    const size_t b = kernels::dtype_block(w.type);
    if (w.rows == 0 || k == 0 || k == w.cols) return;
    // Whole blocks only (a K-quant slice that cuts a super-block is made int8 by its rank from
    // the full matrix, which then stays).
    if (c0 % b != 0 || (k % b != 0 && c0 + k != w.cols)) return;
    if (column_slice(w, c0) != nullptr) return;  // written so at load (weight_rewrite.cpp)
    wants.push_back({&w, c0, k, 0});
  };
  const size_t hd = config_.head_dim;
  for (int r : held_ranks_->ranks) {
    auto l = make_shard_layout(config_, r, held_ranks_->tp, held_ranks_->expert_parallel);
    if (!l) return ok_status();  // the engine refuses this tp; nothing to copy
    for (const auto& lw : weights_.layers) {
      add(lw.o, l->q_head0 * hd, l->n_heads * hd);
      add(lw.down, l->inter0, l->n_inter);
      if (!l->expert_parallel) {
        for (const auto& x : lw.experts) add(x.down, l->inter0, l->n_inter);
      }
      add(lw.shared.down, l->shared0, l->n_shared);
    }
  }
  if (wants.empty()) return ok_status();
  auto row_bytes = [](const want& x) { return kernels::dtype_bytes(x.full->type, x.k); };  // a block type's k: whole blocks
  size_t total = 0;
  for (auto& x : wants) {
    x.offset = total;
    total += (x.full->rows * row_bytes(x) + 63) / 64 * 64;
  }
  auto mapped = detail::weight_mapping(total, total, "ranks' columns");  // every byte written: huge pages
  if (!mapped) return mapped.take_error();
  const std::shared_ptr<uint8_t> bytes = std::move(*mapped);
  LLMESH_TRY(detail::for_each_item(wants.size(), [&](size_t i) -> status {
    const want& x = wants[i];
    const weight_matrix& w = *x.full;
    const auto* src = static_cast<const uint8_t*>(w.data);
    const size_t from_row = kernels::dtype_bytes(w.type, w.ld()), n = row_bytes(x);
    for (size_t r = 0; r < w.rows; ++r) {
      std::memcpy(bytes.get() + x.offset + r * n, src + r * from_row + kernels::dtype_offset(w.type, x.c0), n);
    }
    return ok_status();
  }));
  for (const auto& x : wants) {
    column_slices_.push_back({x.full->data, x.c0, weight_matrix{bytes.get() + x.offset, x.full->type, x.full->rows, x.k}});
  }
  sort_column_slices();
  column_bytes_ = std::move(bytes);
  // The full matrices are read no more: their pages leave memory (a checkpoint's stay in the
  // page cache, clean). Interior pages only: a neighbour may share an edge page.
  for (const auto& x : wants) detail::let_go(x.full->data, x.full->bytes());
  return ok_status();
}

void model::sort_column_slices() {
  std::sort(column_slices_.begin(), column_slices_.end(),
            [](const held_columns& a, const held_columns& b) { return std::tie(a.full, a.c0) < std::tie(b.full, b.c0); });
}

const weight_matrix* model::column_slice(const weight_matrix& full, size_t c0) const {
  auto it = std::lower_bound(column_slices_.begin(), column_slices_.end(), std::pair{full.data, c0},
                             [](const held_columns& a, const std::pair<const void*, size_t>& key) {
                               return std::tie(a.full, a.c0) < std::tie(key.first, key.second);
                             });
  return it != column_slices_.end() && it->full == full.data && it->c0 == c0 ? &it->w : nullptr;
}

size_t model::resident_weight_bytes() const {
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  auto add = [&](const weight_matrix& w) {
    if (w.rows == 0) return;
    const auto b = reinterpret_cast<uintptr_t>(w.data);
    ranges.push_back({b / page * page, (b + w.bytes() + page - 1) / page * page});
  };
  add(weights_.embed);
  add(weights_.lm_head);
  for (const auto& l : weights_.layers) {
    for (const weight_matrix* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.router, &l.shared_gate, &l.shared.gate,
                                   &l.shared.up, &l.shared.down}) {
      add(*w);
    }
    for (const auto& x : l.experts) {
      add(x.gate);
      add(x.up);
      add(x.down);
    }
  }
  for (const auto& s : column_slices_) add(s.w);
  std::sort(ranges.begin(), ranges.end());
  size_t resident = 0;
  std::vector<unsigned char> in;
  for (size_t i = 0; i < ranges.size();) {
    auto [b, e] = ranges[i];
    for (++i; i < ranges.size() && ranges[i].first <= e; ++i) e = std::max(e, ranges[i].second);
    in.assign((e - b) / page, 0);
    if (::mincore(reinterpret_cast<void*>(b), e - b, in.data()) != 0) continue;
    for (unsigned char c : in) resident += (c & 1) * page;
  }
  return resident;
}

}  // namespace llmesh::model
