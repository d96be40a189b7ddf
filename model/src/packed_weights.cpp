// AWQ, GPTQ and compressed-tensors checkpoints: quantization_config, and packed layers into
// int4 or int8 blocks (formats and rules in packed_weights.hpp).
#include "packed_weights.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#include "llmesh/kernels/quantize.hpp"
#include "fp8_weights.hpp"
#include "kv_scales.hpp"
#include "load_threads.hpp"

namespace llmesh::model::detail {
namespace {

using json = nlohmann::json;
namespace k = kernels;
using method = model_config::packed_config::method;

error bad(const std::string& msg) { return make_error(errc::invalid_request, "config.json: quantization_config: " + msg); }
error refused(const std::string& msg) {
  return make_error(errc::unsupported, "config.json: quantization_config: " + msg +
                                           "; llmesh reads AWQ (GEMM), GPTQ, FP8, compressed-tensors (W4A16, W8A16, FP8) and GPT-OSS's MXFP4 checkpoints and GGUF files, or load the "
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

/// One packed layer, checked, ready to unpack: written as q8 blocks, or q4 where exact, 4
/// bits, and every scale·zero exact in float32 (block_layer::type).
struct packed_layer : block_layer {
  std::string name;         ///< X (its tensors are X.qweight, ... or X.weight_packed, ...)
  std::string scales_name;  ///< X.scales or X.weight_scale
  tensor_view qweight, qzeros, scales;
  bool has_zeros = true;        ///< compressed-tensors' symmetric schemes store none (zero 0)
  std::vector<uint32_t> group;  ///< per input, its group
  size_t groups = 0;
  bool exact = true;  ///< every 32-input block in one group, every q − z within int8
};

/// What a stored 4-bit quant is offset by in a q4 nibble: compressed-tensors' quants() are
/// signed (stored − 8), AWQ's and GPTQ's the stored nibble.
int nibble_offset(const model_config::packed_config& p) { return p.kind == method::compressed ? 8 : 0; }

constexpr int awq_slot[8] = {0, 4, 1, 5, 2, 6, 3, 7};  ///< output o % 8's nibble in an AWQ word

/// Quant q[i][o] of every input i of output o, into q (in entries); compressed-tensors' as
/// signed values (stored plus 2^(bits-1)).
void quants(const packed_layer& l, const model_config::packed_config& p, size_t o, std::vector<int>& q) {
  const int bits = p.bits, pack = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  if (p.kind == method::compressed) {  // [out, ceil(in / pack)]: a row per output
    const size_t words = (l.in + static_cast<size_t>(pack) - 1) / static_cast<size_t>(pack);
    const int offset = 1 << (bits - 1);
    for (size_t i = 0; i < l.in; ++i) {
      q[i] = static_cast<int>((word(l.qweight, o * words + i / static_cast<size_t>(pack)) >> (bits * (i % pack))) & mask) - offset;
    }
    return;
  }
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
  if (p.kind == method::compressed) {  // [ceil(out / pack), groups], packed along the outputs
    if (!l.has_zeros) return 0;
    return static_cast<int>((word(l.qzeros, (o / static_cast<size_t>(pack)) * l.groups + g) >> (bits * (o % pack))) & mask) -
           (1 << (bits - 1));
  }
  const size_t per_row = l.out / static_cast<size_t>(pack);
  if (p.kind == method::awq) return static_cast<int>((word(l.qzeros, g * per_row + o / 8) >> (4 * awq_slot[o % 8])) & mask);
  const int z = static_cast<int>((word(l.qzeros, g * per_row + o / static_cast<size_t>(pack)) >> (bits * (o % pack))) & mask);
  return p.zeros_plus_one ? z + 1 : z;
}

/// Scale s[g][o]: AWQ's and GPTQ's [groups, out], compressed-tensors' [out, groups].
float scale(const packed_layer& l, const model_config::packed_config& p, size_t g, size_t o) {
  return k::load_as_f32(l.scales.data, l.scales.type, p.kind == method::compressed ? o * l.groups + g : g * l.out + o);
}

/// Output row o of a q4 layer: per block of 32 inputs (one group), the factor s, the offset
/// s·(z + nibble_offset) (exact: set_groups checked) and the stored nibbles; the padding of a
/// short last block is nibble 0 (never read: the kernels stop at the row's length).
status unpack_q4_row(const packed_layer& l, const model_config::packed_config& p, size_t o, const std::vector<int>& q, uint8_t* dst) {
  const int off = nibble_offset(p);
  for (size_t b = 0; b * k::q4_block < l.in; ++b) {
    const size_t i0 = b * k::q4_block, g = l.group[i0];
    if (!l.holds(i0)) continue;
    const float s = scale(l, p, g, o);
    if (!std::isfinite(s)) return make_error(errc::invalid_request, l.scales_name + ": a scale is not finite");
    const int z = zero(l, p, g, o) + off;
    const float m = s * static_cast<float>(z);
    uint8_t* block = dst + (b - l.first_block()) * k::q4_block_bytes;
    std::memcpy(block, &s, 4);
    std::memcpy(block + 4, &m, 4);
    std::memset(block + 8, 0, k::q4_block / 2);
    for (size_t e = 0; e < k::q4_block; ++e) {
      const int u = i0 + e < l.in ? q[i0 + e] + off : 0;
      block[8 + e % 16] |= static_cast<uint8_t>((u & 0xF) << (e < 16 ? 0 : 4));
    }
  }
  return ok_status();
}

/// Output rows [o0, o1) of a layer into its q8 (or q4) bytes.
status unpack_rows(const packed_layer& l, const model_config::packed_config& p, size_t o0, size_t o1) {
  std::vector<int> q(l.in);
  std::vector<float> row(l.in);
  const size_t row_bytes = l.written_row_bytes();
  for (size_t o = o0; o < o1; ++o) {
    quants(l, p, o, q);
    uint8_t* dst = l.bytes + o * row_bytes;
    if (l.type == k::dtype::q4) {
      LLMESH_TRY(unpack_q4_row(l, p, o, q, dst));
      continue;
    }
    if (l.exact) {
      for (size_t b = 0; b * k::q8_block < l.in; ++b) {
        const size_t i0 = b * k::q8_block, g = l.group[i0];
        if (!l.holds(i0)) continue;
        const float s = scale(l, p, g, o);
        if (!std::isfinite(s)) return make_error(errc::invalid_request, l.scales_name + ": a scale is not finite");
        const int z = zero(l, p, g, o);
        uint8_t* block = dst + (b - l.first_block()) * k::q8_block_bytes;
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
      const float s = scale(l, p, g, o);
      if (!std::isfinite(s)) return make_error(errc::invalid_request, l.scales_name + ": a scale is not finite");
      row[i] = s * static_cast<float>(q[i] - zero(l, p, g, o));
    }
    LLMESH_TRY(k::quantize_q8(row.data(), k::dtype::f32, 1, l.in, dst, o));
  }
  return ok_status();
}

/// A packed layer's companion tensor `t` (int32, or float when `floats`): missing ones are
/// named with the tensor they belong beside; one of the wrong kind keeps get()'s reason.
result<tensor_view> companion(const tensor_store& store, const std::string& t, const std::string& beside, bool floats) {
  auto v = floats ? store.get(t) : store.get_i32(t);
  if (v) return v;
  if (!store.contains(t) && !store.contains_integers(t)) return make_error(errc::invalid_request, "missing tensor '" + t + "' beside " + beside);
  return make_error(errc::invalid_request, floats || !store.contains(t) ? v.err().message : "tensor '" + t + "' holds floats, not int32");
}

std::string shape_mismatch(const std::string& tensor, const std::vector<size_t>& has, const std::string& by,
                           const std::vector<size_t>& needs) {
  return "tensor '" + tensor + "' has shape " + shape_string(has) + ", " + by + " needs " + shape_string(needs);
}

/// Each input's group: in order (i / group), or as `g_idx` (int32 [in], act-order) gives them
/// when the checkpoint has it; then whether the layer can be held exactly.
status set_groups(const tensor_store& store, const model_config::packed_config& p, const std::string& g_idx_name,
                  const std::string& by, packed_layer& l) {
  const size_t group = p.group_size == 0 ? l.in : p.group_size;
  l.group.resize(l.in);
  for (size_t i = 0; i < l.in; ++i) l.group[i] = static_cast<uint32_t>(i / group);
  const bool has_g_idx = !g_idx_name.empty() && (store.contains(g_idx_name) || store.contains_integers(g_idx_name));
  if (p.act_order && !has_g_idx) {
    return make_error(errc::invalid_request, "quantization_config's desc_act (act-order) needs " + g_idx_name + ", which is missing");
  }
  if (has_g_idx) {  // act-order: each input's own group
    auto g_idx = companion(store, g_idx_name, by, false);
    if (!g_idx) return g_idx.take_error();
    if (g_idx->shape != std::vector<size_t>{l.in}) {
      return make_error(errc::invalid_request, shape_mismatch(g_idx_name, g_idx->shape, by, {l.in}));
    }
    for (size_t i = 0; i < l.in; ++i) {
      const uint32_t g = word(*g_idx, i);
      if (g >= l.groups) {
        return make_error(errc::invalid_request, "tensor '" + g_idx_name + "' gives input " + std::to_string(i) + " group " +
                                                     std::to_string(static_cast<int32_t>(g)) + " of " + std::to_string(l.groups));
      }
      l.group[i] = g;
    }
  }
  for (size_t i = 0; i < l.in && l.exact; ++i) l.exact = l.group[i] == l.group[i / k::q8_block * k::q8_block];
  if (p.bits == 8) {  // 8 bits: q − z fits int8 only with the middle zero everywhere (symmetric)
    const int middle = p.kind == method::compressed ? 0 : 128;
    for (size_t g = 0; g < l.groups && l.exact; ++g) {
      for (size_t o = 0; o < l.out && l.exact; ++o) l.exact = zero(l, p, g, o) == middle;
    }
  }
  // 4 bits in whole blocks: int4 blocks, when every offset s·(z + nibble_offset) is exact
  // (float16 and bfloat16 scales always are; a float32 scale of more than 20 significant bits,
  // or one near the smallest floats, may not be: such a layer stays int8).
  bool q4 = l.exact && p.bits == 4;
  for (size_t g = 0; g < l.groups && q4; ++g) {
    for (size_t o = 0; o < l.out && q4; ++o) {
      const float s = scale(l, p, g, o), z = static_cast<float>(zero(l, p, g, o) + nibble_offset(p));
      q4 = std::fma(s, z, -(s * z)) == 0.0f;  // false for a non-finite scale too (unpack_rows names it)
    }
  }
  if (q4) l.type = k::dtype::q4;
  return ok_status();
}

/// compressed-tensors' pack-quantized X: X.weight_packed int32 [out, ceil(in / pack)], input i
/// in bits bits·(i % pack) of word [o][i / pack], stored plus 2^(bits-1); X.weight_shape
/// (int32 or int64 [2]: out, in; without it, in fills the words); X.weight_scale [out, groups];
/// asymmetric: X.weight_zero_point int32 [ceil(out / pack), groups] packed along the outputs
/// likewise; X.weight_g_idx (act-order).
result<packed_layer> compressed_layer_of(const tensor_store& store, const model_config::packed_config& p, const std::string& name) {
  packed_layer l;
  l.name = name;
  l.scales_name = name + ".weight_scale";
  const std::string packed = name + ".weight_packed", by = packed;
  const size_t pack = 32 / static_cast<size_t>(p.bits);
  auto qweight = store.get_i32(packed);
  if (!qweight) return qweight.take_error();
  auto scales = companion(store, l.scales_name, packed, true);
  if (!scales) return scales.take_error();
  l.qweight = *qweight;
  l.scales = *scales;
  if (l.qweight.shape.size() != 2 || l.qweight.shape[0] == 0 || l.qweight.shape[1] == 0) {
    return make_error(errc::invalid_request, "tensor '" + packed + "' has shape " + shape_string(l.qweight.shape) + ", not a matrix");
  }
  l.out = l.qweight.shape[0];
  l.in = l.qweight.shape[1] * pack;
  if (auto shape = store.integers(name + ".weight_shape"); shape) {  // the true input count (the last word may be padded)
    const bool fits = shape->size() == 2 && (*shape)[0] == static_cast<int64_t>(l.out) && (*shape)[1] > 0 &&
                      static_cast<size_t>((*shape)[1]) <= l.in && static_cast<size_t>((*shape)[1]) + pack > l.in;
    if (!fits) {
      std::string given;
      for (int64_t v : *shape) given += (given.empty() ? "" : ", ") + std::to_string(v);
      return make_error(errc::invalid_request, "tensor '" + name + ".weight_shape' gives [" + given + "], " + packed + " holds " +
                                                   shape_string(l.qweight.shape) + " words");
    }
    l.in = static_cast<size_t>((*shape)[1]);
  }
  const size_t group = p.group_size == 0 ? l.in : p.group_size;
  l.groups = (l.in + group - 1) / group;
  if (l.scales.shape != std::vector<size_t>{l.out, l.groups}) {
    return make_error(errc::invalid_request, shape_mismatch(l.scales_name, l.scales.shape, by, {l.out, l.groups}));
  }
  l.has_zeros = !p.symmetric;
  if (l.has_zeros) {
    auto zeros = companion(store, name + ".weight_zero_point", packed, false);
    if (!zeros) return zeros.take_error();
    l.qzeros = *zeros;
    const std::vector<size_t> need{(l.out + pack - 1) / pack, l.groups};
    if (l.qzeros.shape != need) return make_error(errc::invalid_request, shape_mismatch(name + ".weight_zero_point", l.qzeros.shape, by, need));
  }
  LLMESH_TRY(set_groups(store, p, name + ".weight_g_idx", by, l));
  return l;
}

/// AWQ's and GPTQ's X, checked against each other: `name` is X.
result<packed_layer> layer_of(const tensor_store& store, const model_config::packed_config& p, const std::string& name) {
  if (p.kind == method::compressed) return compressed_layer_of(store, p, name);
  packed_layer l;
  l.name = name;
  l.scales_name = name + ".scales";
  const size_t pack = 32 / static_cast<size_t>(p.bits);
  auto qweight = store.get_i32(name + ".qweight");
  if (!qweight) return qweight.take_error();
  auto qzeros = companion(store, name + ".qzeros", name + ".qweight", false);
  if (!qzeros) return qzeros.take_error();
  auto scales = companion(store, name + ".scales", name + ".qweight", true);
  if (!scales) return scales.take_error();
  l.qweight = *qweight;
  l.qzeros = *qzeros;
  l.scales = *scales;
  auto misshapen = [&](const std::string& t, const std::vector<size_t>& has, const std::vector<size_t>& needs) {
    return make_error(errc::invalid_request, shape_mismatch(name + t, has, name + ".qweight", needs));
  };
  if (l.qweight.shape.size() != 2 || l.qweight.shape[0] == 0 || l.qweight.shape[1] == 0) {
    return make_error(errc::invalid_request, "tensor '" + name + ".qweight' has shape " + shape_string(l.qweight.shape) + ", not a matrix");
  }
  l.in = p.kind == method::awq ? l.qweight.shape[0] : l.qweight.shape[0] * pack;
  l.out = p.kind == method::awq ? l.qweight.shape[1] * 8 : l.qweight.shape[1];
  const size_t group = p.group_size == 0 ? l.in : p.group_size;
  l.groups = (l.in + group - 1) / group;
  if (l.scales.shape != std::vector<size_t>{l.groups, l.out}) return misshapen(".scales", l.scales.shape, {l.groups, l.out});
  if (l.out % pack != 0) {
    return make_error(errc::invalid_request, "tensor '" + name + ".qweight' has " + std::to_string(l.out) +
                                                 " outputs, which its zeros cannot pack " + std::to_string(pack) + " to a word");
  }
  if (l.qzeros.shape != std::vector<size_t>{l.groups, l.out / pack}) return misshapen(".qzeros", l.qzeros.shape, {l.groups, l.out / pack});
  // AWQ has no g_idx; a GPTQ checkpoint's may reorder the groups (act-order).
  LLMESH_TRY(set_groups(store, p, p.kind == method::gptq ? name + ".g_idx" : std::string(), name + ".qweight", l));
  return l;
}

/// Every layer's rows, 64 at a time, over the hardware threads; the earliest failure is reported.
status unpack_all(std::vector<packed_layer>& layers, const model_config::packed_config& p) {
  return write_block_rows(layers, [&](const packed_layer& l, size_t o0, size_t o1) -> status {
    try {
      return unpack_rows(l, p, o0, o1);
    } catch (const std::bad_alloc&) {
      return make_error(errc::io_error, l.name + ": out of memory while unpacking it");
    }
  });
}

/// compressed-tensors' quantization_config: one config group of integer weight-only
/// quantization (W4A16, W8A16; llm-compressor's schemes) in the pack-quantized format.
status parse_compressed(const json& q, model_config::packed_config& p) {
  const std::string format = q.contains("format") && q["format"].is_string() ? q["format"].get<std::string>() : "";
  if (q.contains("kv_cache_scheme")) LLMESH_TRY(check_kv_cache_scheme(q["kv_cache_scheme"]));  // its scales: kv_scales.hpp
  if (q.contains("sparsity_config") && q["sparsity_config"].is_object() && q["sparsity_config"].contains("format") &&
      q["sparsity_config"]["format"] != "dense") {
    return refused("compressed-tensors' sparsity_config is not supported");
  }
  // FP8 (float-quantized; early llm-compressor releases named it naive-quantized): fp8_weights.hpp.
  if (format == "float-quantized" || format == "naive-quantized") return parse_compressed_fp8(q, p);
  if (format != "pack-quantized") {
    return refused("compressed-tensors format '" + format + "' is not supported (pack-quantized, W4A16 and W8A16, and float-quantized, FP8, are)");
  }
  if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].size() != 1) {
    return refused("compressed-tensors with other than one config group is not supported");
  }
  const json& g = q["config_groups"].begin().value();
  if (!g.is_object()) return bad("config_groups' group must be an object");
  for (const char* act : {"input_activations", "output_activations"}) {
    if (g.contains(act) && !g[act].is_null()) {
      return refused(std::string("compressed-tensors with quantized ") + act + " (W8A8) is not supported (weight-only schemes are)");
    }
  }
  if (!g.contains("weights") || !g["weights"].is_object()) return bad("config group has no 'weights'");
  const json& w = g["weights"];
  const std::string type = w.contains("type") && w["type"].is_string() ? w["type"].get<std::string>() : "int";
  if (type != "int") return refused("compressed-tensors weights of type '" + type + "' are not supported (int are)");
  auto bits = integer(w, {"num_bits"}, 8);
  if (!bits) return bits.take_error();
  if (*bits < 1 || *bits > 32) return bad("'num_bits' must be 1..32");
  if (*bits != 4 && *bits != 8) return refused("compressed-tensors weights of " + std::to_string(*bits) + " bits are not supported (4 and 8 are)");
  p.kind = method::compressed;
  p.bits = static_cast<int>(*bits);
  p.symmetric = !w.contains("symmetric") || (w["symmetric"].is_boolean() && w["symmetric"].get<bool>());
  if (w.contains("dynamic") && w["dynamic"].is_boolean() && w["dynamic"].get<bool>()) {
    return refused("compressed-tensors' dynamic weight quantization is not supported");
  }
  // actorder "group" saves weight_g_idx; "weight" reorders before quantizing and keeps groups in order.
  p.act_order = w.contains("actorder") && w["actorder"] == "group";
  const std::string strategy = w.contains("strategy") && w["strategy"].is_string() ? w["strategy"].get<std::string>() : "";
  if (strategy == "channel") {
    p.group_size = 0;
    return ok_status();
  }
  if (strategy != "group") return refused("compressed-tensors' weight strategy '" + strategy + "' is not supported (group and channel are)");
  auto group = integer(w, {"group_size"}, 0);
  if (!group) return group.take_error();
  if (*group <= 0 || *group > (int64_t{1} << 30)) return bad("'group_size' must be positive");
  p.group_size = static_cast<size_t>(*group);
  return ok_status();
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
  if (m == "compressed-tensors") return parse_compressed(q, p);
  if (m == "fp8" || m == "fbgemm_fp8") return parse_fp8_config(q, p);  // fbgemm_fp8: Meta's FP8 releases, per-channel scales
  if (m == "mxfp4") {  // GPT-OSS's experts (gpt_oss_experts.hpp); modules_to_not_convert names the rest, which stay plain
    if (c.arch != architecture::gpt_oss) return refused("quant_method 'mxfp4' outside GPT-OSS's experts is not supported");
    p.kind = model_config::packed_config::method::mxfp4;
    return ok_status();
  }
  auto bits = integer(q, {"bits", "w_bit"}, 4);
  if (!bits) return bits.take_error();
  if (*bits < 1 || *bits > 32) return bad("'bits' must be 1..32");
  auto group = integer(q, {"group_size", "q_group_size"}, 128);  // AutoAWQ's and HF GPTQConfig's default
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
    p.act_order = q.contains("desc_act") && q["desc_act"].is_boolean() && q["desc_act"].get<bool>();
    return ok_status();
  }
  return refused("quant_method '" + m + "' is not supported");
}

status unpack_packed_weights(tensor_store& store, const model_config::packed_config& p, const part_of_tensor& part_of,
                             std::vector<own_columns>* own) {
  std::vector<packed_layer> layers;
  for (const auto& n : store.integer_names()) {
    const std::string suffix = n.ends_with(".qweight") ? ".qweight" : n.ends_with(".weight_packed") ? ".weight_packed" : "";
    if (suffix.empty() || n.size() == suffix.size()) continue;
    const std::string name = n.substr(0, n.size() - suffix.size());
    if (p.kind == method::none) {
      return make_error(errc::invalid_request, "tensor '" + n + "' is packed, but config.json has no quantization_config");
    }
    if (p.float8) return make_error(errc::invalid_request, "tensor '" + n + "' is packed, but config.json's quantization_config is FP8");
    if ((suffix == ".weight_packed") != (p.kind == method::compressed)) {
      return make_error(errc::invalid_request, "tensor '" + n + "' is not how config.json's quantization_config packs its layers");
    }
    if (store.contains(name + ".weight")) {
      return make_error(errc::invalid_request, "both '" + name + ".weight' and '" + n + "' are in the checkpoint");
    }
    auto l = layer_of(store, p, name);
    if (!l) return l.take_error();
    if (part_of) {
      l->part = part_of(name);
      // Columns only where whole blocks of 32 inputs are written exactly; a requantized row
      // (its scale from the whole row) is written whole.
      if (l->exact) l->cols = aligned_cols(l->part, k::q8_block, l->in);
      l->own = own != nullptr && l->part.own && !l->cols.empty();
    }
    layers.push_back(std::move(*l));
  }
  if (layers.empty()) return ok_status();
  // One anonymous mapping for every layer's int8 or int4 rows (an allocation that fails is an
  // error, not an exception).
  auto mapped = map_block_layers(layers, "unpacked weights");
  if (!mapped) return mapped.take_error();
  const std::shared_ptr<uint8_t> owner = std::move(*mapped);
  LLMESH_TRY(unpack_all(layers, p));
  for (auto& l : layers) {
    tensor_view t;
    t.type = l.type;
    t.shape = {l.out, l.in};
    t.data = l.full;
    t.bytes = l.out * l.row_bytes();
    LLMESH_TRY(store.add(l.name + ".weight", std::move(t), owner));
    if (l.own) own->push_back({l.full, l.cols.front().first, weight_matrix{l.bytes, l.type, l.out, l.written_in()}});
    // The packed pages leave resident memory (they stay in the page cache, clean).
    for (const tensor_view* v : {&l.qweight, &l.qzeros, &l.scales}) let_go(v->data, v->bytes);
  }
  return ok_status();
}

}  // namespace llmesh::model::detail
