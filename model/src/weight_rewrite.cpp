// Rewriting a loaded model's matrices in another type at load (weight_rewrite.hpp).
#include "weight_rewrite.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "llmesh/kernels/quantize.hpp"
#include "load_threads.hpp"

namespace llmesh::model::detail {
namespace {

/// Adds `w` to `targets` (beside a target over the same bytes, if any) unless it is empty,
/// of type `to` already, or quantized (a quantized GGUF's tensors arrive so) unless a K-quant
/// int4 or fp8 matrix is to become int8 (`--quantization int8` on a Q4_K_M file, an AWQ or an
/// FP8 checkpoint: the CPU decodes int8 faster, where memory bandwidth is not what limits it).
void add_target(std::vector<convert_target>& targets, weight_matrix* w, std::string name, kernels::dtype to,
                matrix_part part = {}) {
  if (w->rows == 0 || w->type == to) return;
  const bool to_int8 = (kernels::is_k_quant(w->type) || w->type == kernels::dtype::q4 || w->type == kernels::dtype::fp8) &&
                       to == kernels::dtype::q8;
  if (kernels::is_quantized(w->type) && !to_int8) return;
  for (auto& t : targets) {
    if (t.w().data == w->data && t.w().type == w->type && t.w().rows == w->rows && t.w().cols == w->cols) {
      t.views.push_back(w);
      if (t.part.skip != part.skip || t.part.rows != part.rows || t.part.cols != part.cols) t.part = {};  // read as both: whole
      return;
    }
  }
  convert_target t;
  t.views = {w};
  t.name = std::move(name);
  t.part = std::move(part);
  targets.push_back(std::move(t));
}

/// The layer vLLM fuses target `name` (targets_of's names) into, which online FP8 gives one
/// scale: a layer's q, k and v projections; the gate and up projections of a dense MLP, an
/// expert or the shared expert; else the target alone.
std::string fused_layer_of(const std::string& name) {
  const size_t sp = name.rfind(' ');
  const std::string head = sp == std::string::npos ? "" : name.substr(0, sp + 1);
  const std::string last = sp == std::string::npos ? name : name.substr(sp + 1);
  if (last == "q_proj" || last == "k_proj" || last == "v_proj") return head + "qkv";
  if (last == "gate_proj" || last == "up_proj" || last == "gate" || last == "up") return head + "gate_up";
  return name;
}

}  // namespace

std::vector<convert_target> targets_of(model_weights& w, kernels::dtype to, bool everything, const model_config& c,
                                       const std::optional<rank_set>& ranks) {
  using R = matrix_role;
  auto part = [&](R role, size_t expert = 0) { return ranks ? part_read(c, *ranks, role, expert) : matrix_part{}; };
  std::vector<convert_target> targets;
  // A row-parallel matrix of one rank: its columns, as a matrix of their own.
  auto add_own = [&](weight_matrix* m, const std::string& name, R role, size_t expert = 0) {
    const size_t before = targets.size();
    add_target(targets, m, name, to, part(role, expert));
    if (targets.size() > before && targets.back().part.own) targets.back().own_cols = targets.back().part.cols.front();
  };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    auto& l = w.layers[i];
    const std::string p = "layer " + std::to_string(i) + " ";
    for (auto [m, n, role] : {std::tuple{&l.q, "q_proj", R::q}, {&l.k, "k_proj", R::k}, {&l.v, "v_proj", R::v}, {&l.o, "o_proj", R::o},
                              {&l.gate, "gate_proj", R::gate}, {&l.up, "up_proj", R::up}, {&l.down, "down_proj", R::down}}) {
      if (role == R::o || role == R::down) add_own(m, p + n, role);
      else add_target(targets, m, p + n, to, part(role));  // an MoE layer has no dense MLP
    }
    if (everything) {
      add_target(targets, &l.router, p + "router", to);
      add_target(targets, &l.shared_gate, p + "shared_expert_gate", to);  // the sigmoid gate, not the expert's gate_proj
    }
    for (size_t e = 0; e < l.experts.size(); ++e) {
      auto& x = l.experts[e];
      const std::string ep = p + "expert " + std::to_string(e) + " ";
      add_target(targets, &x.gate, ep + "gate", to, part(R::expert_gate, e));
      add_target(targets, &x.up, ep + "up", to, part(R::expert_up, e));
      add_own(&x.down, ep + "down", R::expert_down, e);
    }
    if (l.shared.gate.rows > 0) {
      add_target(targets, &l.shared.gate, p + "shared expert gate", to, part(R::shared_gate));
      add_target(targets, &l.shared.up, p + "shared expert up", to, part(R::shared_up));
      add_own(&l.shared.down, p + "shared expert down", R::shared_down);
    }
  }
  if (everything) add_target(targets, &w.embed, "embed_tokens", to);
  add_target(targets, &w.lm_head, "lm_head", to, part(R::lm_head));  // tied, with the embedding's target: whole
  return targets;
}

result<std::shared_ptr<uint8_t>> rewrite(std::vector<convert_target>& targets, kernels::dtype to, const char* what,
                                         const held_columns_of& held, std::vector<own_columns>& own, kernels::dtype through) {
  const bool blocks = to == kernels::dtype::q8 || to == kernels::dtype::fp8;
  auto ld_of = [blocks](size_t cols) { return blocks ? kernels::q8_row_elements(cols) : cols; };
  auto bytes_of = [&](size_t rows, size_t cols) { return (kernels::dtype_bytes(to, rows * ld_of(cols)) + 63) / 64 * 64; };
  // Where each target is written: whole rows, or the part's columns of each (where they start
  // and end on blocks of both types), or (own_cols) into a matrix of their own.
  std::vector<spans> cols(targets.size());
  std::vector<const weight_matrix*> from_held(targets.size(), nullptr);
  for (size_t i = 0; i < targets.size(); ++i) {
    auto& t = targets[i];
    const auto& w = t.w();
    cols[i] = aligned_cols(t.part, std::max(kernels::dtype_block(w.type), kernels::dtype_block(to)), w.cols);
    if (!t.own_cols) continue;
    if (held) from_held[i] = held(w, t.own_cols->first);
    if (cols[i].empty()) {  // the columns cut a block: whole rows, from a source written whole
      if (from_held[i] != nullptr) {
        return make_error(errc::invalid_request, t.name + ": this rank's columns from " + std::to_string(t.own_cols->first) +
                                                     " do not fall on blocks of " + std::to_string(kernels::dtype_block(to)));
      }
      t.own_cols.reset();
    }
  }
  // Matrices held whole or by rows, and own columns, first, under huge pages; those held in
  // small parts (by columns, not at all, or by rows of a small matrix: an expert's; and the
  // full views of own columns, never written) after, under small pages, which back only what
  // is written.
  const auto l = lay_out_weights(
      targets.size(),
      [&](size_t i) { return targets[i].own_cols || small_pages(targets[i].part, bytes_of(targets[i].w().rows, targets[i].w().cols)); },
      [&](size_t i) { return bytes_of(targets[i].w().rows, targets[i].w().cols); },
      [&](size_t i) {
        const auto& t = targets[i];
        return t.own_cols ? bytes_of(t.w().rows, t.own_cols->second - t.own_cols->first) : 0;
      });
  for (size_t i = 0; i < targets.size(); ++i) {
    targets[i].offset = l.at[i];
    targets[i].own_offset = l.own_at[i];
  }
  // fp8 (vLLM's online FP8): one scale per fused layer of vLLM's, max |w| / 448 over the whole
  // of it, whatever part the held ranks write, so every rank's part has the whole engine's scale.
  std::vector<float> fp8_scale(targets.size(), 0.0f);
  if (to == kernels::dtype::fp8) {
    // A target no held rank reads (an expert of another node) is not read at all; the pages of
    // one read only in part leave memory again after the scan.
    LLMESH_TRY(for_each_item(targets.size(), [&](size_t i) -> status {
      const convert_target& t = targets[i];
      if (t.part.skip) return ok_status();
      const weight_matrix& w = t.w();
      auto m = kernels::max_abs(w.data, w.type, w.rows, w.cols, 0, through);
      if (!m) return make_error(errc::invalid_request, t.name + ": " + m.err().message);
      fp8_scale[i] = *m;
      if (!t.part.whole() && !t.shared) let_go(w.data, w.bytes());
      return ok_status();
    }));
    std::map<std::string, float> fused;
    for (size_t i = 0; i < targets.size(); ++i) {
      float& m = fused[fused_layer_of(targets[i].name)];
      m = std::max(m, fp8_scale[i]);
    }
    for (size_t i = 0; i < targets.size(); ++i) fp8_scale[i] = fused[fused_layer_of(targets[i].name)] / 448.0f;
  }
  auto mapped = weight_mapping(l.huge, l.total, std::string(what) + " weights");
  if (!mapped) return mapped.take_error();
  if (l.total == 0) return mapped;
  const std::shared_ptr<uint8_t> store = std::move(*mapped);
  // Work items of up to 256 rows over every hardware thread; each writes its own bytes.
  struct item {
    size_t target, row0, rows;
  };
  std::vector<item> items;
  for (size_t i = 0; i < targets.size(); ++i) {
    for_row_runs(targets[i].part, targets[i].w().rows, 256, [&](size_t r, size_t n) { items.push_back({i, r, n}); });
  }
  auto failed = for_each_item(items.size(), [&](size_t k) -> status {
    const auto& it = items[k];
    const auto& t = targets[it.target];
    const weight_matrix& w = t.w();
    auto convert = [&](const uint8_t* src, size_t row0, size_t rows, size_t n, uint8_t* dst) -> status {
      auto s = to == kernels::dtype::q8    ? kernels::quantize_q8(src, w.type, rows, n, dst, row0)
               : to == kernels::dtype::fp8 ? kernels::quantize_fp8(src, w.type, rows, n, fp8_scale[it.target], dst, row0, through)
                                           : kernels::convert_rows(src, w.type, rows, n, dst, to, row0);
      if (!s) return make_error(errc::invalid_request, t.name + ": " + s.err().message);
      return ok_status();
    };
    const auto* base = static_cast<const uint8_t*>(w.data);
    auto at = [&](size_t r, size_t c0) { return base + kernels::dtype_offset(w.type, r * w.ld() + c0); };
    if (t.own_cols) {
      const auto [c0, c1] = *t.own_cols;
      const weight_matrix* h = from_held[it.target];
      for (size_t r = it.row0; r < it.row0 + it.rows; ++r) {
        const uint8_t* src = h ? static_cast<const uint8_t*>(h->data) + kernels::dtype_bytes(h->type, r * h->ld()) : at(r, c0);
        LLMESH_TRY(convert(src, r, 1, c1 - c0, store.get() + t.own_offset + kernels::dtype_bytes(to, r * ld_of(c1 - c0))));
      }
      return ok_status();
    }
    uint8_t* out = store.get() + t.offset;
    if (cols[it.target].empty()) return convert(at(it.row0, 0), it.row0, it.rows, w.cols, out + kernels::dtype_bytes(to, it.row0 * ld_of(w.cols)));
    for (size_t r = it.row0; r < it.row0 + it.rows; ++r) {
      for (const auto& [c0, c1] : cols[it.target]) {
        LLMESH_TRY(convert(at(r, c0), r, 1, c1 - c0, out + kernels::dtype_bytes(to, r * ld_of(w.cols) + c0)));
      }
    }
    return ok_status();
  });
  if (!failed) return failed.take_error();
  for (size_t i = 0; i < targets.size(); ++i) {
    auto& t = targets[i];
    if (!t.shared) let_go(t.w().data, t.w().bytes());
    if (from_held[i] != nullptr) let_go(from_held[i]->data, from_held[i]->bytes());
    if (t.own_cols) {
      const size_t k = t.own_cols->second - t.own_cols->first;
      own.push_back({store.get() + t.offset, t.own_cols->first, weight_matrix{store.get() + t.own_offset, to, t.w().rows, k}});
    }
    for (weight_matrix* v : t.views) {
      v->data = store.get() + t.offset;
      v->type = to;
    }
  }
  return store;
}
}  // namespace llmesh::model::detail
