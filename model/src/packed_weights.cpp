// AWQ and GPTQ checkpoints: quantization_config, and packed layers into int8 blocks (formats
// and rules in packed_weights.hpp).
#include "packed_weights.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "llmesh/kernels/quantize.hpp"
#include "load_threads.hpp"

namespace llmesh::model::detail {
namespace {

using json = nlohmann::json;
namespace k = kernels;
using method = model_config::packed_config::method;

error bad(const std::string& msg) { return make_error(errc::invalid_request, "config.json: quantization_config: " + msg); }
error refused(const std::string& msg) {
  return make_error(errc::unsupported, "config.json: quantization_config: " + msg +
                                           "; llmesh reads AWQ (GEMM) and GPTQ checkpoints and GGUF files, or load the "
                                           "unquantized checkpoint (with --quantization int8)");
}

/// An integer field under any of `keys` (older AutoAWQ configs: w_bit, q_group_size), or
/// `fallback`.
result<int64_t> integer(const json& q, std::initializer_list<const char*> keys, int64_t fallback) {
  for (const char* key : keys) {
    if (!q.contains(key) || q[key].is_null()) continue;
    if (!q[key].is_number_integer()) return bad(std::string("'") + key + "' must be an integer");
    return q[key].get<int64_t>();
  }
  return fallback;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

/// The int32 word `w` of a little-endian int32 tensor (safetensors holds them unaligned).
uint32_t word(const tensor_view& t, size_t w) {
  uint32_t v;
  std::memcpy(&v, static_cast<const uint8_t*>(t.data) + 4 * w, 4);
  return v;
}

std::string shape_str(const std::vector<size_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// One packed layer, checked, ready to unpack.
struct packed_layer {
  std::string name;  ///< X (its tensors are X.qweight, ...)
  tensor_view qweight, qzeros, scales;
  std::vector<uint32_t> group;  ///< per input, its group
  size_t in = 0, out = 0, groups = 0;
  bool exact = true;  ///< every 32-input block in one group, every q − z within int8
  std::shared_ptr<uint8_t[]> bytes;
};

constexpr int awq_slot[8] = {0, 4, 1, 5, 2, 6, 3, 7};  ///< output o % 8's nibble in an AWQ word

/// Quant q[i][o] of every input i of output o, into q (in entries).
void quants(const packed_layer& l, const model_config::packed_config& p, size_t o, std::vector<int>& q) {
  const int bits = p.bits, pack = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  for (size_t i = 0; i < l.in; ++i) {
    q[i] = p.kind == method::awq
               ? static_cast<int>((word(l.qweight, i * (l.out / 8) + o / 8) >> (4 * awq_slot[o % 8])) & mask)
               : static_cast<int>((word(l.qweight, (i / pack) * l.out + o) >> (bits * (i % pack))) & mask);
  }
}

/// Zero z[g][o].
int zero(const packed_layer& l, const model_config::packed_config& p, size_t g, size_t o) {
  const int bits = p.bits, pack = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  const size_t per_row = l.out / static_cast<size_t>(pack);
  if (p.kind == method::awq) return static_cast<int>((word(l.qzeros, g * per_row + o / 8) >> (4 * awq_slot[o % 8])) & mask);
  const int z = static_cast<int>((word(l.qzeros, g * per_row + o / static_cast<size_t>(pack)) >> (bits * (o % pack))) & mask);
  return p.zeros_plus_one ? z + 1 : z;
}

/// Output rows [o0, o1) of a layer into its q8 bytes.
status unpack_rows(const packed_layer& l, const model_config::packed_config& p, size_t o0, size_t o1) {
  std::vector<int> q(l.in);
  std::vector<float> row(l.in);
  const size_t row_bytes = k::dtype_bytes(k::dtype::q8, k::q8_row_elements(l.in));
  for (size_t o = o0; o < o1; ++o) {
    quants(l, p, o, q);
    uint8_t* dst = l.bytes.get() + o * row_bytes;
    if (l.exact) {
      for (size_t b = 0; b * k::q8_block < l.in; ++b) {
        const size_t i0 = b * k::q8_block, g = l.group[i0];
        const float s = k::load_as_f32(l.scales.data, l.scales.type, g * l.out + o);
        if (!std::isfinite(s)) return make_error(errc::invalid_request, l.name + ".scales: a scale is not finite");
        const int z = zero(l, p, g, o);
        uint8_t* block = dst + b * k::q8_block_bytes;
        std::memcpy(block, &s, 4);
        std::memset(block + 4, 0, k::q8_block);  // a short last block's padding
        for (size_t i = i0; i < std::min(l.in, i0 + k::q8_block); ++i) {
          block[4 + i - i0] = static_cast<uint8_t>(static_cast<int8_t>(q[i] - z));
        }
      }
      continue;
    }
    for (size_t i = 0; i < l.in; ++i) {  // exact in float32: an 11-bit scale times a 9-bit integer
      const size_t g = l.group[i];
      const float s = k::load_as_f32(l.scales.data, l.scales.type, g * l.out + o);
      if (!std::isfinite(s)) return make_error(errc::invalid_request, l.name + ".scales: a scale is not finite");
      row[i] = s * static_cast<float>(q[i] - zero(l, p, g, o));
    }
    LLMESH_TRY(k::quantize_q8(row.data(), k::dtype::f32, 1, l.in, dst, o));
  }
  return ok_status();
}

/// X's tensors, checked against each other: `name` is X.
result<packed_layer> layer_of(const tensor_store& store, const model_config::packed_config& p, const std::string& name) {
  packed_layer l;
  l.name = name;
  const size_t pack = 32 / static_cast<size_t>(p.bits);
  auto qweight = store.get_i32(name + ".qweight");
  if (!qweight) return qweight.take_error();
  auto qzeros = store.get_i32(name + ".qzeros");
  if (!qzeros) return make_error(errc::invalid_request, "missing tensor '" + name + ".qzeros' beside " + name + ".qweight");
  auto scales = store.get(name + ".scales");
  if (!scales) return make_error(errc::invalid_request, "missing tensor '" + name + ".scales' beside " + name + ".qweight");
  l.qweight = *qweight;
  l.qzeros = *qzeros;
  l.scales = *scales;
  auto misshapen = [&](const std::string& t, const std::vector<size_t>& has, const std::vector<size_t>& needs) {
    return make_error(errc::invalid_request, "tensor '" + name + t + "' has shape " + shape_str(has) + ", " + name +
                                                 ".qweight needs " + shape_str(needs));
  };
  if (l.qweight.shape.size() != 2 || l.qweight.shape[0] == 0 || l.qweight.shape[1] == 0) {
    return make_error(errc::invalid_request, "tensor '" + name + ".qweight' has shape " + shape_str(l.qweight.shape) + ", not a matrix");
  }
  l.in = p.kind == method::awq ? l.qweight.shape[0] : l.qweight.shape[0] * pack;
  l.out = p.kind == method::awq ? l.qweight.shape[1] * 8 : l.qweight.shape[1];
  const size_t group = p.group_size == 0 ? l.in : p.group_size;
  l.groups = (l.in + group - 1) / group;
  if (l.scales.shape != std::vector<size_t>{l.groups, l.out}) return misshapen(".scales", l.scales.shape, {l.groups, l.out});
  if (l.out % pack != 0 || l.qzeros.shape != std::vector<size_t>{l.groups, l.out / pack}) {
    return misshapen(".qzeros", l.qzeros.shape, {l.groups, l.out / pack});
  }
  l.group.resize(l.in);
  for (size_t i = 0; i < l.in; ++i) l.group[i] = static_cast<uint32_t>(i / group);
  if (p.kind == method::gptq) {
    if (auto g_idx = store.get_i32(name + ".g_idx"); g_idx) {  // act-order: each input's own group
      if (g_idx->shape != std::vector<size_t>{l.in}) return misshapen(".g_idx", g_idx->shape, {l.in});
      for (size_t i = 0; i < l.in; ++i) {
        const uint32_t g = word(*g_idx, i);
        if (g >= l.groups) {
          return make_error(errc::invalid_request, "tensor '" + name + ".g_idx' gives input " + std::to_string(i) + " group " +
                                                       std::to_string(static_cast<int32_t>(g)) + " of " + std::to_string(l.groups));
        }
        l.group[i] = g;
      }
    }
  }
  for (size_t i = 0; i < l.in && l.exact; ++i) l.exact = l.group[i] == l.group[i / k::q8_block * k::q8_block];
  if (p.bits == 8) {  // q in 0..255: q − z fits int8 only when z is 128 everywhere (symmetric)
    for (size_t g = 0; g < l.groups && l.exact; ++g) {
      for (size_t o = 0; o < l.out && l.exact; ++o) l.exact = zero(l, p, g, o) == 128;
    }
  }
  return l;
}

/// Every layer's rows, 64 at a time, over the hardware threads; the earliest failure is reported.
status unpack_all(std::vector<packed_layer>& layers, const model_config::packed_config& p) {
  struct item {
    size_t layer, o0, o1;
  };
  std::vector<item> items;
  constexpr size_t step = 64;
  for (size_t i = 0; i < layers.size(); ++i) {
    for (size_t o = 0; o < layers[i].out; o += step) items.push_back({i, o, std::min(layers[i].out, o + step)});
  }
  return for_each_item(items.size(), [&](size_t n) { return unpack_rows(layers[items[n].layer], p, items[n].o0, items[n].o1); });
}

}  // namespace

status parse_packed_config(const json& j, model_config& c) {
  c.packed = {};
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return ok_status();
  const json& q = j["quantization_config"];
  if (!q.is_object()) return bad("must be an object");
  if (!q.contains("quant_method") || !q["quant_method"].is_string()) return bad("missing 'quant_method'");
  const std::string m = q["quant_method"].get<std::string>();
  auto& p = c.packed;
  auto bits = integer(q, {"bits", "w_bit"}, 4);
  if (!bits) return bits.take_error();
  auto group = integer(q, {"group_size", "q_group_size"}, m == "gptq" ? -1 : 128);
  if (!group) return group.take_error();
  if (*group == 0 || *group < -1 || *group > (int64_t{1} << 30)) return bad("'group_size' must be positive or -1");
  p.group_size = *group == -1 ? 0 : static_cast<size_t>(*group);
  p.bits = static_cast<int>(*bits);
  if (m == "awq") {
    p.kind = method::awq;
    const std::string version = q.contains("version") && q["version"].is_string() ? lower(q["version"].get<std::string>()) : "gemm";
    if (version != "gemm") return refused("AWQ version '" + version + "' is not supported (GEMM is)");
    if (p.bits != 4) return refused("AWQ with " + std::to_string(p.bits) + " bits is not supported (4 is)");
    if (q.contains("zero_point") && q["zero_point"].is_boolean() && !q["zero_point"].get<bool>()) {
      return refused("AWQ without zero points is not supported");
    }
    if (p.group_size == 0) return refused("AWQ with group_size -1 is not supported");
    return ok_status();
  }
  if (m == "gptq") {
    p.kind = method::gptq;
    if (p.bits != 4 && p.bits != 8) return refused("GPTQ with " + std::to_string(p.bits) + " bits is not supported (4 and 8 are)");
    const std::string format = q.contains("checkpoint_format") && q["checkpoint_format"].is_string()
                                   ? q["checkpoint_format"].get<std::string>()
                                   : "gptq";
    if (format != "gptq" && format != "gptq_v2") return refused("GPTQ checkpoint_format '" + format + "' is not supported");
    p.zeros_plus_one = format == "gptq";
    return ok_status();
  }
  return refused("quant_method '" + m + "' is not supported");
}

status unpack_packed_weights(tensor_store& store, const model_config::packed_config& p, size_t* exact, size_t* requantized) {
  if (exact) *exact = 0;
  if (requantized) *requantized = 0;
  const std::string suffix = ".qweight";
  std::vector<packed_layer> layers;
  for (const auto& n : store.i32_names()) {
    if (n.size() <= suffix.size() || n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string name = n.substr(0, n.size() - suffix.size());
    if (p.kind == method::none) {
      return make_error(errc::invalid_request, "tensor '" + n + "' is packed, but config.json has no quantization_config");
    }
    if (store.contains(name + ".weight")) {
      return make_error(errc::invalid_request, "both '" + name + ".weight' and '" + n + "' are in the checkpoint");
    }
    auto l = layer_of(store, p, name);
    if (!l) return l.take_error();
    l->bytes.reset(new uint8_t[k::dtype_bytes(k::dtype::q8, l->out * k::q8_row_elements(l->in))]);
    layers.push_back(std::move(*l));
  }
  LLMESH_TRY(unpack_all(layers, p));
  for (auto& l : layers) {
    tensor_view t;
    t.type = k::dtype::q8;
    t.shape = {l.out, l.in};
    t.data = l.bytes.get();
    t.bytes = k::dtype_bytes(k::dtype::q8, l.out * k::q8_row_elements(l.in));
    LLMESH_TRY(store.add(l.name + ".weight", std::move(t), std::shared_ptr<const void>(l.bytes, l.bytes.get())));
    if (exact && l.exact) ++*exact;
    if (requantized && !l.exact) ++*requantized;
  }
  return ok_status();
}

}  // namespace llmesh::model::detail
