// FP8 KV-cache scales: compressed-tensors' kv_cache_scheme and the per-layer scale tensors
// (kv_scales.hpp).
#include "kv_scales.hpp"

#include <algorithm>
#include <cmath>

namespace llmesh::model::detail {
namespace {

using json = nlohmann::json;

error refused(const std::string& msg) {
  return make_error(errc::unsupported, "config.json: quantization_config: kv_cache_scheme: " + msg +
                                           " (llmesh reads 8-bit float KV scales, one per tensor, as vLLM does)");
}

/// The scalar tensor `name`, or 0 when absent.
result<float> scalar(const tensor_store& store, const std::string& name) {
  if (!store.contains(name)) return 0.0f;
  auto t = store.get(name);
  if (!t) return t.take_error();
  if (t->elements() != 1 || t->shape.size() > 1) {
    return make_error(errc::invalid_request, "tensor '" + name + "' has shape " + shape_string(t->shape) +
                                                 "; a KV-cache scale is one number ([] or [1])");
  }
  if (kernels::is_quantized(t->type) || kernels::is_f8(t->type)) {
    return make_error(errc::invalid_request, "tensor '" + name + "' is " + std::string(kernels::dtype_name(t->type)) +
                                                 "; a KV-cache scale is F32, BF16 or F16");
  }
  const float s = kernels::load_as_f32(t->data, t->type, 0);
  if (!(s > 0.0f) || !std::isfinite(s)) {
    return make_error(errc::invalid_request, "tensor '" + name + "' is " + std::to_string(s) +
                                                 "; a KV-cache scale must be finite and positive");
  }
  return s;
}

}  // namespace

status check_kv_cache_scheme(const json& scheme) {
  if (scheme.is_null()) return ok_status();
  if (!scheme.is_object()) return make_error(errc::invalid_request, "config.json: quantization_config: kv_cache_scheme must be an object or null");
  const std::string type = scheme.contains("type") && scheme["type"].is_string() ? scheme["type"].get<std::string>() : "";
  if (type != "float") return refused("type '" + type + "' (not float)");
  if (!scheme.contains("num_bits") || scheme["num_bits"] != 8) return refused("num_bits other than 8");
  const std::string strategy =
      scheme.contains("strategy") && scheme["strategy"].is_string() ? scheme["strategy"].get<std::string>() : "";
  if (strategy != "tensor") return refused("strategy '" + strategy + "' (not tensor)");
  if (!scheme.contains("symmetric") || scheme["symmetric"] != true) return refused("asymmetric scales");
  if (scheme.contains("dynamic") && scheme["dynamic"] == true) return refused("dynamic scales");
  return ok_status();
}

result<kv_scale_pair> read_kv_scales(const tensor_store& store, const std::string& prefix) {
  kv_scale_pair out;
  // A real checkpoint's layer holds one spelling; should it hold several, the largest is used.
  for (const char* k : {"k_scale", "k_proj.k_scale", "k_proj.output_scale", "kv_scale"}) {
    auto s = scalar(store, prefix + k);
    if (!s) return s.take_error();
    out.k = std::max(out.k, *s);
  }
  for (const char* v : {"v_scale", "v_proj.v_scale", "v_proj.output_scale"}) {
    auto s = scalar(store, prefix + v);
    if (!s) return s.take_error();
    out.v = std::max(out.v, *s);
  }
  if (out.k == 0.0f && out.v > 0.0f) {  // vLLM asserts a k_scale wherever there is a v_scale
    return make_error(errc::invalid_request, "tensor '" + prefix + "v_scale' (or its like) has no key scale beside it (" +
                                                 prefix + "k_scale)");
  }
  if (out.v == 0.0f) out.v = out.k;  // the deprecated kv_scale (or a lone k_scale) serves both, as in vLLM
  return out;
}

}  // namespace llmesh::model::detail
