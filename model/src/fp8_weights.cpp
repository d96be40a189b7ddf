// FP8 checkpoints: quantization_config, and F8_E4M3 layers into fp8 blocks (fp8_weights.hpp).
#include "fp8_weights.hpp"

#include <cmath>
#include <cstring>

#include "llmesh/kernels/quantize.hpp"
#include "load_threads.hpp"

namespace llmesh::model::detail {
namespace {

using json = nlohmann::json;
namespace k = kernels;
using scales_kind = model_config::packed_config::fp8_scales;

error bad(const std::string& msg) { return make_error(errc::invalid_request, "config.json: quantization_config: " + msg); }
error refused(const std::string& msg) {
  return make_error(errc::unsupported, "config.json: quantization_config: " + msg +
                                           "; llmesh reads FP8 checkpoints with F8_E4M3 weights and a scale per tensor, "
                                           "channel, group or block (of multiples of 32 inputs)");
}

/// A [rows, cols] pair of positive integers (weight_block_size, block_structure) into p's block.
status block_shape(const json& v, const char* key, model_config::packed_config& p) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_unsigned() || !v[1].is_number_unsigned() || v[0].get<size_t>() == 0 ||
      v[1].get<size_t>() == 0 || v[0].get<size_t>() > (size_t{1} << 30) || v[1].get<size_t>() > (size_t{1} << 30)) {
    return bad(std::string("'") + key + "' must be two positive integers [rows, columns]");
  }
  p.scales = scales_kind::block;
  p.block_rows = v[0].get<size_t>();
  p.block_cols = v[1].get<size_t>();
  if (p.block_cols % k::q8_block != 0) {
    return refused(std::string("'") + key + "' columns of " + std::to_string(p.block_cols) + " (not a multiple of 32)");
  }
  return ok_status();
}

/// One FP8 layer, checked, ready to write (as fp8 blocks).
struct fp8_layer : block_layer {
  fp8_layer() { type = k::dtype::fp8; }
  std::string name;  ///< X (its tensors are X.weight and the scale)
  std::string scale_name;
  tensor_view w, s;
  scales_kind kind = scales_kind::tensor;
  size_t rows_per = 1, cols_per = 1, scale_cols = 1;  ///< a scale's span, and the scale tensor's row length
  float scale(size_t o, size_t i) const {
    switch (kind) {
      case scales_kind::tensor: return k::load_as_f32(s.data, s.type, 0);
      case scales_kind::channel: return k::load_as_f32(s.data, s.type, o);
      case scales_kind::group: case scales_kind::block: break;
    }
    return k::load_as_f32(s.data, s.type, (o / rows_per) * scale_cols + i / cols_per);
  }
};

result<fp8_layer> layer_of(const tensor_store& store, const model_config::packed_config& p, const std::string& weight) {
  fp8_layer l;
  l.name = weight.substr(0, weight.size() - std::string(".weight").size());
  auto w = store.get(weight);
  if (!w) return w.take_error();
  l.w = *w;
  if (l.w.shape.size() != 2 || l.w.shape[0] == 0 || l.w.shape[1] == 0) {
    return make_error(errc::invalid_request, "tensor '" + weight + "' (F8_E4M3) has shape " + shape_string(l.w.shape) + ", not a matrix");
  }
  l.out = l.w.shape[0];
  l.in = l.w.shape[1];
  for (const char* suffix : {".weight_scale_inv", ".weight_scale"}) {
    if (store.contains(l.name + suffix)) {
      l.scale_name = l.name + suffix;
      break;
    }
  }
  if (l.scale_name.empty()) {
    if (store.contains_integers(l.name + ".weight_scale")) {
      return make_error(errc::invalid_request, "tensor '" + l.name + ".weight_scale' holds integers, not a float scale");
    }
    return make_error(errc::invalid_request, "missing tensor '" + l.name + ".weight_scale' (or '.weight_scale_inv') beside " + weight);
  }
  auto s = store.get(l.scale_name);
  if (!s) return s.take_error();
  l.s = *s;
  if (k::is_f8(l.s.type)) return make_error(errc::unsupported, "tensor '" + l.scale_name + "' is an 8-bit float; FP8 scales must be F32, BF16 or F16");
  const auto& shape = l.s.shape;
  std::vector<size_t> need;
  l.kind = p.scales;
  if (p.scales == scales_kind::tensor || p.scales == scales_kind::channel) {
    // The scale's shape tells which: a per-tensor checkpoint's fused layers may be saved per output.
    const size_t n = l.s.elements();
    if (n == 1 && shape.size() <= 2) {
      l.kind = scales_kind::tensor;
    } else if (n == l.out && (shape == std::vector<size_t>{l.out} || shape == std::vector<size_t>{l.out, 1})) {
      l.kind = scales_kind::channel;
    } else {
      need = {l.out, 1};
    }
  } else if (p.scales == scales_kind::group) {
    l.cols_per = p.group_size;
    l.scale_cols = (l.in + p.group_size - 1) / p.group_size;
    if (shape != std::vector<size_t>{l.out, l.scale_cols}) need = {l.out, l.scale_cols};
  } else {
    l.rows_per = p.block_rows;
    l.cols_per = p.block_cols;
    l.scale_cols = (l.in + p.block_cols - 1) / p.block_cols;
    const std::vector<size_t> blocks{(l.out + p.block_rows - 1) / p.block_rows, l.scale_cols};
    if (shape != blocks) need = blocks;
  }
  if (!need.empty()) {
    return make_error(errc::invalid_request, "tensor '" + l.scale_name + "' has shape " + shape_string(shape) + ", " + weight + " " +
                                                 shape_string(l.w.shape) + " needs " + shape_string(need));
  }
  for (size_t i = 0; i < l.s.elements(); ++i) {
    const float v = k::load_as_f32(l.s.data, l.s.type, i);
    if (!std::isfinite(v) || std::fabs(v) >= 0x1p64f) {
      return make_error(errc::invalid_request, "tensor '" + l.scale_name + "' holds " + std::to_string(v) + " (scales must be finite, below 2^64)");
    }
  }
  return l;
}

/// Output rows [o0, o1) of a layer into its fp8 bytes.
status write_rows(const fp8_layer& l, size_t o0, size_t o1) {
  const auto* codes = static_cast<const uint8_t*>(l.w.data);
  const size_t row_bytes = l.written_row_bytes();
  for (size_t o = o0; o < o1; ++o) {
    uint8_t* dst = l.bytes + o * row_bytes;
    for (size_t b = 0; b * k::q8_block < l.in; ++b) {
      const size_t i0 = b * k::q8_block, n = std::min(k::q8_block, l.in - i0);
      if (!l.holds(i0)) continue;
      const float s = l.scale(o, i0);
      uint8_t* block = dst + (b - l.first_block()) * k::q8_block_bytes;
      std::memcpy(block, &s, 4);
      std::memset(block + 4 + n, 0, k::q8_block - n);  // a short last block's padding
      const uint8_t* src = codes + o * l.in + i0;
      uint8_t nan = 0;
      for (size_t e = 0; e < n; ++e) {
        block[4 + e] = src[e];
        nan |= static_cast<uint8_t>((src[e] & 0x7f) == 0x7f);
      }
      if (nan) {
        return make_error(errc::invalid_request, "tensor '" + l.name + ".weight' holds a NaN (row " + std::to_string(o) + ")");
      }
    }
  }
  return ok_status();
}

}  // namespace

status parse_fp8_config(const json& q, model_config::packed_config& p) {
  p.kind = model_config::packed_config::method::fp8;
  p.float8 = true;
  p.bits = 8;
  const std::string fmt = q.contains("fmt") && q["fmt"].is_string() ? q["fmt"].get<std::string>() : "e4m3";
  if (fmt != "e4m3") return refused("fp8 fmt '" + fmt + "' is not supported (e4m3 is)");
  if (q.contains("activation_scheme") && !q["activation_scheme"].is_null()) {
    const json& a = q["activation_scheme"];
    if (!a.is_string() || (a != "dynamic" && a != "static")) return bad("'activation_scheme' must be dynamic or static");
  }
  if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
    return block_shape(q["weight_block_size"], "weight_block_size", p);
  }
  p.scales = scales_kind::tensor;
  return ok_status();
}

status parse_compressed_fp8(const json& q, model_config::packed_config& p) {
  if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].size() != 1) {
    return refused("compressed-tensors with other than one config group is not supported");
  }
  const json& g = q["config_groups"].begin().value();
  if (!g.is_object()) return bad("config_groups' group must be an object");
  if (g.contains("output_activations") && !g["output_activations"].is_null()) {
    return refused("compressed-tensors with quantized output_activations is not supported");
  }
  if (g.contains("input_activations") && !g["input_activations"].is_null()) {
    const json& a = g["input_activations"];
    const std::string type = a.is_object() && a.contains("type") && a["type"].is_string() ? a["type"].get<std::string>() : "";
    if (type != "float") return refused("compressed-tensors FP8 weights with '" + type + "' input_activations are not supported (float are)");
  }
  if (!g.contains("weights") || !g["weights"].is_object()) return bad("config group has no 'weights'");
  const json& w = g["weights"];
  const std::string type = w.contains("type") && w["type"].is_string() ? w["type"].get<std::string>() : "int";
  if (type != "float") return refused("compressed-tensors format '" + std::string(q.value("format", "")) + "' with " + type + " weights is not supported");
  if (!w.contains("num_bits") || w["num_bits"] != 8) return refused("compressed-tensors float weights of other than 8 bits are not supported");
  if (w.contains("symmetric") && w["symmetric"] == false) return refused("compressed-tensors' asymmetric float weights are not supported");
  if (w.contains("dynamic") && w["dynamic"] == true) return refused("compressed-tensors' dynamic weight quantization is not supported");
  p.kind = model_config::packed_config::method::compressed;
  p.float8 = true;
  p.bits = 8;
  const std::string strategy = w.contains("strategy") && w["strategy"].is_string() ? w["strategy"].get<std::string>() : "tensor";
  if (strategy == "tensor") {
    p.scales = scales_kind::tensor;
  } else if (strategy == "channel") {
    p.scales = scales_kind::channel;
  } else if (strategy == "group") {
    if (!w.contains("group_size") || !w["group_size"].is_number_unsigned() || w["group_size"].get<size_t>() == 0 ||
        w["group_size"].get<size_t>() > (size_t{1} << 30)) {
      return bad("'group_size' must be a positive integer");
    }
    p.scales = scales_kind::group;
    p.group_size = w["group_size"].get<size_t>();
    if (p.group_size % k::q8_block != 0) return refused("FP8 group_size " + std::to_string(p.group_size) + " (not a multiple of 32)");
  } else if (strategy == "block") {
    if (!w.contains("block_structure")) return bad("strategy 'block' needs 'block_structure'");
    return block_shape(w["block_structure"], "block_structure", p);
  } else {
    return refused("compressed-tensors' float weight strategy '" + strategy + "' is not supported (tensor, channel, group and block are)");
  }
  return ok_status();
}

status convert_fp8_weights(tensor_store& store, const model_config::packed_config& p, const part_of_tensor& part_of,
                           std::vector<own_columns>* own) {
  std::vector<fp8_layer> layers;
  for (const auto& n : store.names()) {
    auto t = store.get(n);
    if (!t || !k::is_f8(t->type)) continue;
    if (t->type == k::dtype::f8_e5m2) return make_error(errc::unsupported, "tensor '" + n + "' is F8_E5M2: FP8 weights must be F8_E4M3");
    if (!p.float8) return make_error(errc::invalid_request, "tensor '" + n + "' is F8_E4M3, but config.json has no FP8 quantization_config");
    if (!n.ends_with(".weight") || n.size() == 7) {
      return make_error(errc::invalid_request, "tensor '" + n + "' is F8_E4M3 but not a layer's weight");
    }
    auto l = layer_of(store, p, n);
    if (!l) return l.take_error();
    if (part_of) {
      l->part = part_of(l->name);
      l->cols = aligned_cols(l->part, k::q8_block, l->in);
      l->own = own != nullptr && l->part.own && !l->cols.empty();
    }
    layers.push_back(std::move(*l));
  }
  if (layers.empty()) return ok_status();
  auto mapped = map_block_layers(layers, "FP8 weights");
  if (!mapped) return mapped.take_error();
  const std::shared_ptr<uint8_t> owner = std::move(*mapped);
  LLMESH_TRY(write_block_rows(layers, write_rows));
  for (auto& l : layers) {
    tensor_view t;
    t.type = k::dtype::fp8;
    t.shape = {l.out, l.in};
    t.data = l.full;
    t.bytes = l.out * l.row_bytes();
    LLMESH_TRY(store.replace(l.name + ".weight", std::move(t), owner));
    if (l.own) own->push_back({l.full, l.cols.front().first, weight_matrix{l.bytes, k::dtype::fp8, l.out, l.written_in()}});
    let_go(l.w.data, l.w.bytes);  // the checkpoint's codes leave resident memory (page cache, clean)
  }
  return ok_status();
}

}  // namespace llmesh::model::detail
