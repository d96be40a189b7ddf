// Which part of each split weight matrix a set of tensor-parallel ranks reads (rank_parts.hpp).
#include "rank_parts.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "llmesh/model/shard_executor.hpp"

namespace llmesh::model::detail {
namespace {

/// `s` sorted and merged; empty when it covers [0, extent).
spans merged(spans s, size_t extent) {
  std::sort(s.begin(), s.end());
  spans out;
  for (const auto& [b, e] : s) {
    if (b >= e) continue;
    if (!out.empty() && b <= out.back().second) out.back().second = std::max(out.back().second, e);
    else out.push_back({b, e});
  }
  if (out.size() == 1 && out.front().first == 0 && out.front().second >= extent) out.clear();
  return out;
}

bool is_expert(matrix_role r) { return r == matrix_role::expert_gate || r == matrix_role::expert_up || r == matrix_role::expert_down; }

}  // namespace

matrix_part part_read(const model_config& c, const rank_set& ranks, matrix_role role, size_t expert) {
  using R = matrix_role;
  if (role == R::whole) return {};
  const size_t hd = c.head_dim, q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  spans rows, cols;
  bool expert_held = false, expert_parallel = false;
  for (int r : ranks.ranks) {
    auto l = make_shard_layout(c, r, ranks.tp, ranks.expert_parallel);
    if (!l) return {};
    const std::pair<size_t, size_t> q{l->q_head0 * hd, (l->q_head0 + l->n_heads) * hd};
    const std::pair<size_t, size_t> kv{l->kv_head0 * hd, (l->kv_head0 + l->n_kv_heads) * hd};
    const std::pair<size_t, size_t> inter{l->inter0, l->inter0 + l->n_inter};
    const std::pair<size_t, size_t> shared{l->shared0, l->shared0 + l->n_shared};
    expert_parallel = l->expert_parallel;
    switch (role) {
      case R::whole: break;
      case R::q: rows.push_back(q); break;
      case R::k: case R::v: rows.push_back(kv); break;
      case R::o: cols.push_back(q); break;
      case R::gate: case R::up: rows.push_back(inter); break;
      case R::down: cols.push_back(inter); break;
      case R::qkv:
        rows.push_back(q);
        rows.push_back({q_dim + kv.first, q_dim + kv.second});
        rows.push_back({q_dim + kv_dim + kv.first, q_dim + kv_dim + kv.second});
        break;
      case R::gate_up:
        rows.push_back(inter);
        rows.push_back({c.intermediate + inter.first, c.intermediate + inter.second});
        break;
      case R::lm_head: rows.push_back({l->vocab0, l->vocab0 + l->n_vocab}); break;
      case R::expert_gate: case R::expert_up: case R::expert_down:
        if (l->expert_parallel) {
          expert_held = expert_held || (expert >= l->expert0 && expert < l->expert0 + l->n_experts);
        } else if (role == R::expert_down) {
          cols.push_back(inter);
        } else {
          rows.push_back(inter);
        }
        break;
      case R::shared_gate: case R::shared_up: rows.push_back(shared); break;
      case R::shared_down: cols.push_back(shared); break;
    }
  }
  matrix_part p;
  if (is_expert(role) && expert_parallel) {
    p.skip = !expert_held;
    return p;
  }
  const size_t row_extent = role == R::q         ? q_dim
                            : role == R::k || role == R::v ? kv_dim
                            : role == R::qkv     ? q_dim + 2 * kv_dim
                            : role == R::gate_up ? 2 * c.intermediate
                            : role == R::lm_head ? c.vocab
                            : role == R::shared_gate || role == R::shared_up ? c.moe.shared_intermediate
                                                                             : c.intermediate;
  const size_t col_extent = role == R::o ? q_dim : role == R::shared_down ? c.moe.shared_intermediate : c.intermediate;
  p.rows = merged(std::move(rows), row_extent);
  p.cols = merged(std::move(cols), col_extent);
  p.own = ranks.ranks.size() == 1 && p.cols.size() == 1;
  return p;
}

std::pair<matrix_role, size_t> role_of(const std::string& full) {
  using R = matrix_role;
  std::string name = full.ends_with(".weight") ? full.substr(0, full.size() - 7) : full;
  if (name == "lm_head") return {R::lm_head, 0};
  const size_t at = name.find("layers.");
  if (at == std::string::npos) return {R::whole, 0};
  const size_t dot = name.find('.', at + 7);
  if (dot == std::string::npos) return {R::whole, 0};
  const std::string rest = name.substr(dot + 1);
  static const std::pair<const char*, R> plain[] = {
      {"self_attn.q_proj", R::q},          {"self_attn.k_proj", R::k},         {"self_attn.v_proj", R::v},
      {"self_attn.o_proj", R::o},          {"self_attn.qkv_proj", R::qkv},     {"mlp.gate_proj", R::gate},
      {"mlp.up_proj", R::up},              {"mlp.down_proj", R::down},         {"mlp.gate_up_proj", R::gate_up},
      {"mlp.shared_expert.gate_proj", R::shared_gate}, {"mlp.shared_expert.up_proj", R::shared_up},
      {"mlp.shared_expert.down_proj", R::shared_down}};
  for (const auto& [n, r] : plain) {
    if (rest == n) return {r, 0};
  }
  for (const char* moe : {"mlp.experts.", "block_sparse_moe.experts."}) {
    const std::string m = moe;
    if (!rest.starts_with(m)) continue;
    const size_t e_end = rest.find('.', m.size());
    if (e_end == std::string::npos || e_end == m.size()) return {R::whole, 0};
    const std::string number = rest.substr(m.size(), e_end - m.size()), what = rest.substr(e_end + 1);
    size_t e = 0;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), e);
    if (ec != std::errc() || end != number.data() + number.size()) return {R::whole, 0};
    if (what == "gate_proj" || what == "w1") return {R::expert_gate, e};
    if (what == "up_proj" || what == "w3") return {R::expert_up, e};
    if (what == "down_proj" || what == "w2") return {R::expert_down, e};
  }
  return {R::whole, 0};
}

spans aligned_cols(const matrix_part& p, size_t block, size_t cols) {
  for (const auto& [b, e] : p.cols) {
    if (b % block != 0 || (e % block != 0 && e != cols)) return {};
  }
  return p.cols;
}

weight_layout lay_out_weights(size_t n, const std::function<bool(size_t)>& small, const std::function<size_t(size_t)>& bytes,
                              const std::function<size_t(size_t)>& own_bytes) {
  auto aligned = [](size_t b) { return (b + 63) / 64 * 64; };
  weight_layout l;
  l.at.assign(n, 0);
  l.own_at.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (small(i)) continue;
    l.at[i] = l.total;
    l.total += aligned(bytes(i));
  }
  for (size_t i = 0; i < n; ++i) {
    const size_t o = own_bytes(i);
    if (o == 0) continue;
    l.own_at[i] = l.total;
    l.total += aligned(o);
  }
  l.huge = l.total = huge_page_end(l.total);
  for (size_t i = 0; i < n; ++i) {
    if (!small(i)) continue;
    l.at[i] = l.total;
    l.total += aligned(bytes(i));
  }
  return l;
}

result<std::shared_ptr<uint8_t>> weight_mapping(size_t huge, size_t total, const std::string& what) {
  if (total == 0) return std::shared_ptr<uint8_t>();
  void* mem = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) {
    return make_error(errc::io_error, "cannot allocate " + std::to_string(total >> 20) + " MiB for the " + what);
  }
  auto* base = static_cast<uint8_t*>(mem);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  huge = (huge + page - 1) / page * page;
  if (huge > 0) ::madvise(base, std::min(huge, total), MADV_HUGEPAGE);  // optional
  if (total > huge) ::madvise(base + huge, total - huge, MADV_NOHUGEPAGE);
  return std::shared_ptr<uint8_t>(base, [total](uint8_t* p) { ::munmap(p, total); });
}

void let_go(const void* p, size_t bytes) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  const uintptr_t from = (begin + page - 1) / page * page, to = end / page * page;
  if (p != nullptr && to > from) ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
}

}  // namespace llmesh::model::detail
