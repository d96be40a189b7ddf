// GPT-OSS's fused expert tensors into per-expert matrices (gpt_oss_experts.hpp).
#include "gpt_oss_experts.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "llmesh/kernels/dtype.hpp"
#include "load_threads.hpp"
#include "rank_parts.hpp"

namespace llmesh::model::detail {
namespace {

namespace k = kernels;

error misshapen(const std::string& name, const tensor_view& t, const std::string& want) {
  return make_error(errc::invalid_request, "tensor '" + name + "' has shape " + shape_string(t.shape) + ", expected " + want);
}

/// One layer's new tensors: their bytes live in `bytes`, which the store keeps.
struct layer_out {
  std::shared_ptr<std::vector<uint8_t>> bytes;
  struct item {
    std::string name;
    k::dtype type;
    std::vector<size_t> shape;
    size_t offset, size;
  };
  std::vector<item> items;
  size_t used = 0;
  size_t reserve(const std::string& name, k::dtype type, std::vector<size_t> shape, size_t size) {
    const size_t at = (used + 63) / 64 * 64;  // rows start aligned
    items.push_back({name, type, std::move(shape), at, size});
    used = at + size;
    return at;
  }
  status publish(tensor_store& store) const {
    for (const auto& it : items) {
      tensor_view t;
      t.type = it.type;
      t.shape = it.shape;
      t.data = bytes->data() + it.offset;
      t.bytes = it.size;
      LLMESH_TRY(store.add(it.name, std::move(t), bytes));
    }
    return ok_status();
  }
};

/// One expert's MXFP4 matrix [out, in] to write as mxfp4 blocks (block_layer: what the held
/// ranks read of it, where it goes): its rows are the checkpoint's rows first, first + stride, ...
/// of expert e's [out', in / 32, 16] blocks and [out', in / 32] exponents.
struct mx_layer : block_layer {
  mx_layer() { type = k::dtype::mxfp4; }
  std::string name;      ///< the per-expert name, without ".weight"
  std::string checkpoint;  ///< the fused tensor's name, without "_blocks"
  const uint8_t* blocks = nullptr;
  const uint8_t* scales = nullptr;
  size_t first = 0, stride = 1;
};

/// Rows [o0, o1) of `l`: each held group of 32 as one mxfp4 block (q4's nibble order).
status repack_rows(const mx_layer& l, size_t o0, size_t o1) {
  const size_t groups = l.in / 32, row_bytes = l.written_row_bytes();
  for (size_t o = o0; o < o1; ++o) {
    const size_t src_row = l.first + o * l.stride;
    for (size_t g = 0; g < groups; ++g) {
      if (!l.holds(g * 32)) continue;
      const uint8_t e8 = l.scales[src_row * groups + g];
      if (e8 > k::mxfp4_max_exponent) {
        return make_error(errc::invalid_request, "tensor '" + l.checkpoint + "_scales' holds the exponent " + std::to_string(e8) +
                                                     (e8 == 255 ? " (E8M0's NaN)" : ", beyond float32's range"));
      }
      uint8_t* out = l.bytes + o * row_bytes + (g - l.first_block()) * k::mxfp4_block_bytes;
      const float s = k::mxfp4_scale(e8);
      std::memcpy(out, &s, 4);
      const uint8_t* in = l.blocks + (src_row * groups + g) * 16;
      uint8_t q[32];
      for (size_t j = 0; j < 16; ++j) {
        q[2 * j] = in[j] & 0xF;
        q[2 * j + 1] = in[j] >> 4;
      }
      for (size_t i = 0; i < 16; ++i) out[4 + i] = static_cast<uint8_t>(q[i] | q[i + 16] << 4);
    }
  }
  return ok_status();
}

/// One [E, a, b] plain tensor's expert e as a [b, a] matrix (its columns from `c0`, every
/// `c_stride`-th, n of them) at dst: a transpose in the element's own bytes, in tiles of 64 × 64
/// (reading along the source's rows: one row at a time would miss the cache on every element).
void transpose_rows(const tensor_view& t, size_t e, size_t c0, size_t c_stride, size_t n, uint8_t* dst) {
  const size_t a = t.shape[1], b = t.shape[2], sz = k::dtype_size(t.type);
  const auto* src = static_cast<const uint8_t*>(t.data) + e * a * b * sz;
  constexpr size_t tile = 64;
  for (size_t i0 = 0; i0 < a; i0 += tile) {
    for (size_t r0 = 0; r0 < n; r0 += tile) {
      for (size_t i = i0; i < std::min(a, i0 + tile); ++i) {
        for (size_t r = r0; r < std::min(n, r0 + tile); ++r) {
          std::memcpy(dst + (r * a + i) * sz, src + (i * b + c0 + r * c_stride) * sz, sz);
        }
      }
    }
  }
}

status split_layer(tensor_store& store, const model_config& c, const std::string& p, bool mx, std::vector<mx_layer>& mx_out) {
  const size_t E = c.moe.n_experts, I = c.intermediate, H = c.hidden;
  const std::string gu = p + "gate_up_proj", dn = p + "down_proj";
  auto gu_bias = store.get(gu + "_bias");
  if (!gu_bias) return gu_bias.take_error();
  if (gu_bias->shape != std::vector<size_t>{E, 2 * I}) return misshapen(gu + "_bias", *gu_bias, shape_string({E, 2 * I}));
  auto dn_bias = store.get(dn + "_bias");
  if (!dn_bias) return dn_bias.take_error();
  if (dn_bias->shape != std::vector<size_t>{E, H}) return misshapen(dn + "_bias", *dn_bias, shape_string({E, H}));

  layer_out out;
  tensor_view gu_b, gu_s, dn_b, dn_s, gu_w, dn_w;
  if (mx) {
    if (H % 32 != 0 || I % 32 != 0) {
      return make_error(errc::invalid_request, "config.json: an MXFP4 checkpoint needs hidden_size and intermediate_size in multiples of 32");
    }
    auto get = [&](const std::string& name, std::vector<size_t> shape, tensor_view& dst) -> status {
      auto t = store.get_u8(name);
      if (!t) return t.take_error();
      if (t->shape != shape) return misshapen(name, *t, shape_string(shape));
      dst = *t;
      return ok_status();
    };
    LLMESH_TRY(get(gu + "_blocks", {E, 2 * I, H / 32, 16}, gu_b));
    LLMESH_TRY(get(gu + "_scales", {E, 2 * I, H / 32}, gu_s));
    LLMESH_TRY(get(dn + "_blocks", {E, H, I / 32, 16}, dn_b));
    LLMESH_TRY(get(dn + "_scales", {E, H, I / 32}, dn_s));
  } else {
    if (store.contains_integers(gu + "_blocks")) {
      return make_error(errc::invalid_request, "tensor '" + gu + "_blocks' is MXFP4, but config.json has no quantization_config "
                                                                 "with quant_method mxfp4");
    }
    auto get = [&](const std::string& name, std::vector<size_t> shape, tensor_view& dst) -> status {
      auto t = store.get(name);
      if (!t) return t.take_error();
      if (t->shape != shape) return misshapen(name, *t, shape_string(shape));
      if (k::is_f8(t->type)) return make_error(errc::unsupported, "tensor '" + name + "' is an 8-bit float; GPT-OSS's experts must be F32, F16, BF16 or MXFP4");
      dst = *t;
      return ok_status();
    };
    LLMESH_TRY(get(gu, {E, H, 2 * I}, gu_w));
    LLMESH_TRY(get(dn, {E, I, H}, dn_w));
  }
  if (mx) {  // the matrices are written with every layer's, where the held ranks read them (split_gpt_oss_experts)
    for (size_t e = 0; e < E; ++e) {
      const std::string x = p + std::to_string(e) + ".";
      for (auto [what, src, n_out, n_in, first, stride] :
           {std::tuple{"gate_proj", &gu_b, I, H, size_t{0}, size_t{2}}, std::tuple{"up_proj", &gu_b, I, H, size_t{1}, size_t{2}},
            std::tuple{"down_proj", &dn_b, H, I, size_t{0}, size_t{1}}}) {
        mx_layer l;
        l.name = x + what;
        l.checkpoint = src == &gu_b ? gu : dn;
        l.out = n_out;
        l.in = n_in;
        const size_t rows = src->shape[1], groups = n_in / 32;
        l.blocks = static_cast<const uint8_t*>(src->data) + e * rows * groups * 16;
        l.scales = static_cast<const uint8_t*>((src == &gu_b ? gu_s : dn_s).data) + e * rows * groups;
        l.first = first;
        l.stride = stride;
        mx_out.push_back(std::move(l));
      }
    }
  }
  const k::dtype wt = gu_w.type, dt = dn_w.type;
  struct expert_at {
    size_t gate, up, down, gate_b, up_b, down_b;
  };
  std::vector<expert_at> at(E);
  for (size_t e = 0; e < E; ++e) {
    const std::string x = p + std::to_string(e) + ".";
    if (!mx) {
      at[e].gate = out.reserve(x + "gate_proj.weight", wt, {I, H}, k::dtype_bytes(wt, I * H));
      at[e].up = out.reserve(x + "up_proj.weight", wt, {I, H}, k::dtype_bytes(wt, I * H));
      at[e].down = out.reserve(x + "down_proj.weight", dt, {H, I}, k::dtype_bytes(dt, H * I));
    }
    at[e].gate_b = out.reserve(x + "gate_proj.bias", k::dtype::f32, {I}, I * 4);
    at[e].up_b = out.reserve(x + "up_proj.bias", k::dtype::f32, {I}, I * 4);
    at[e].down_b = out.reserve(x + "down_proj.bias", k::dtype::f32, {H}, H * 4);
  }
  try {
    out.bytes = std::make_shared<std::vector<uint8_t>>(out.used);
  } catch (const std::bad_alloc&) {
    return make_error(errc::io_error, "out of memory splitting " + p);
  }
  uint8_t* base = out.bytes->data();
  LLMESH_TRY(for_each_item(E, [&](size_t e) -> status {
    const auto& a = at[e];
    if (!mx) {
      transpose_rows(gu_w, e, 0, 2, I, base + a.gate);
      transpose_rows(gu_w, e, 1, 2, I, base + a.up);
      transpose_rows(dn_w, e, 0, 1, H, base + a.down);
    }
    auto* gbias = reinterpret_cast<float*>(base + a.gate_b);
    auto* ubias = reinterpret_cast<float*>(base + a.up_b);
    auto* dbias = reinterpret_cast<float*>(base + a.down_b);
    for (size_t r = 0; r < I; ++r) {
      gbias[r] = k::load_as_f32(gu_bias->data, gu_bias->type, e * 2 * I + 2 * r);
      ubias[r] = k::load_as_f32(gu_bias->data, gu_bias->type, e * 2 * I + 2 * r + 1);
    }
    for (size_t o = 0; o < H; ++o) dbias[o] = k::load_as_f32(dn_bias->data, dn_bias->type, e * H + o);
    return ok_status();
  }));
  return out.publish(store);
}

}  // namespace

status split_gpt_oss_experts(tensor_store& store, const model_config& c, const std::string& root, const part_of_tensor& part_of,
                             std::vector<own_columns>* own) {
  const bool mx = c.packed.kind == model_config::packed_config::method::mxfp4;
  std::vector<mx_layer> layers;
  for (size_t l = 0; l < c.n_layers; ++l) {
    LLMESH_TRY(split_layer(store, c, root + "layers." + std::to_string(l) + ".mlp.experts.", mx, layers));
  }
  if (layers.empty()) return ok_status();
  // Every layer's MXFP4 matrices in one mapping whose pages take memory only where written: a
  // spread replica's node writes the parts its ranks read (its experts, its rows of gate and
  // up, its columns of down — as a matrix of their own where one rank's).
  for (auto& l : layers) {
    if (!part_of) continue;
    l.part = part_of(l.name);
    l.cols = aligned_cols(l.part, k::mxfp4_block, l.in);
    l.own = own != nullptr && l.part.own && !l.cols.empty();
  }
  auto mapped = map_block_layers(layers, "MXFP4 experts");
  if (!mapped) return mapped.take_error();
  const std::shared_ptr<uint8_t> owner = std::move(*mapped);
  LLMESH_TRY(write_block_rows(layers, repack_rows));
  for (auto& l : layers) {
    tensor_view t;
    t.type = k::dtype::mxfp4;
    t.shape = {l.out, l.in};
    t.data = l.full;
    t.bytes = l.out * l.row_bytes();
    LLMESH_TRY(store.add(l.name + ".weight", std::move(t), owner));
    if (l.own) own->push_back({l.full, l.cols.front().first, weight_matrix{l.bytes, k::dtype::mxfp4, l.out, l.written_in()}});
  }
  for (const std::string suffix : {"_blocks", "_scales"}) {  // the checkpoint's bytes leave resident memory (page cache, clean)
    for (size_t l = 0; mx && l < c.n_layers; ++l) {
      for (const char* x : {"gate_up_proj", "down_proj"}) {
        if (auto t = store.get_u8(root + "layers." + std::to_string(l) + ".mlp.experts." + x + suffix)) let_go(t->data, t->bytes);
      }
    }
  }
  return ok_status();
}

}  // namespace llmesh::model::detail
