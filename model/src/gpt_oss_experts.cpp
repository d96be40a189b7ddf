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

/// out rows [r0, r0 + n) of expert e's [out, in] MXFP4 matrix (rows `stride` apart in the
/// checkpoint's, starting at `first`) as mxfp4 rows at dst.
status repack_rows(const uint8_t* blocks, const uint8_t* scales, size_t groups, size_t first, size_t stride, size_t n,
                   uint8_t* dst, const std::string& name) {
  for (size_t r = 0; r < n; ++r) {
    const size_t src_row = first + r * stride;
    for (size_t g = 0; g < groups; ++g) {
      const uint8_t e8 = scales[src_row * groups + g];
      if (e8 > 252) {
        return make_error(errc::invalid_request, "tensor '" + name + "_scales' holds the exponent " + std::to_string(e8) +
                                                     (e8 == 255 ? " (E8M0's NaN)" : ", beyond float32's range"));
      }
      uint8_t* out = dst + (r * groups + g) * k::mxfp4_block_bytes;
      const float s = std::ldexp(1.0f, static_cast<int>(e8) - 128);
      std::memcpy(out, &s, 4);
      const uint8_t* in = blocks + (src_row * groups + g) * 16;
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

status split_layer(tensor_store& store, const model_config& c, const std::string& p, bool mx) {
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
  const k::dtype wt = mx ? k::dtype::mxfp4 : gu_w.type, dt = mx ? k::dtype::mxfp4 : dn_w.type;
  struct expert_at {
    size_t gate, up, down, gate_b, up_b, down_b;
  };
  std::vector<expert_at> at(E);
  for (size_t e = 0; e < E; ++e) {
    const std::string x = p + std::to_string(e) + ".";
    at[e].gate = out.reserve(x + "gate_proj.weight", wt, {I, H}, k::dtype_bytes(wt, I * H));
    at[e].up = out.reserve(x + "up_proj.weight", wt, {I, H}, k::dtype_bytes(wt, I * H));
    at[e].down = out.reserve(x + "down_proj.weight", dt, {H, I}, k::dtype_bytes(dt, H * I));
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
    if (mx) {
      const auto* gb = static_cast<const uint8_t*>(gu_b.data) + e * 2 * I * (H / 32) * 16;
      const auto* gs = static_cast<const uint8_t*>(gu_s.data) + e * 2 * I * (H / 32);
      LLMESH_TRY(repack_rows(gb, gs, H / 32, 0, 2, I, base + a.gate, gu));
      LLMESH_TRY(repack_rows(gb, gs, H / 32, 1, 2, I, base + a.up, gu));
      const auto* db = static_cast<const uint8_t*>(dn_b.data) + e * H * (I / 32) * 16;
      const auto* ds = static_cast<const uint8_t*>(dn_s.data) + e * H * (I / 32);
      LLMESH_TRY(repack_rows(db, ds, I / 32, 0, 1, H, base + a.down, dn));
    } else {
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

status split_gpt_oss_experts(tensor_store& store, const model_config& c, const std::string& root) {
  const bool mx = c.packed.kind == model_config::packed_config::method::mxfp4;
  for (size_t l = 0; l < c.n_layers; ++l) {
    LLMESH_TRY(split_layer(store, c, root + "layers." + std::to_string(l) + ".mlp.experts.", mx));
  }
  return ok_status();
}

}  // namespace llmesh::model::detail
