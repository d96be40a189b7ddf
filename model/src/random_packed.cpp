// Random AWQ / GPTQ / compressed-tensors packed and FP8 linear layers (random_packed.hpp). Every tensor comes from its own
// stream keyed by (seed, tensor name), as random_model.cpp's do.
#include "random_packed.hpp"

#include <cstring>
#include <functional>
#include <numeric>

#include "random_fill.hpp"

namespace llmesh::model::detail {
namespace {

constexpr int awq_order[8] = {0, 2, 4, 6, 1, 3, 5, 7};  ///< AutoAWQ's: nibble p of a word holds output 8·(o / 8) + awq_order[p]

struct stream {
  uint64_t state;
  stream(uint64_t seed, const std::string& name) : state(seed ^ name_hash(name)) {}
  uint32_t below(uint32_t n) { return static_cast<uint32_t>((splitmix64(state) >> 32) % n); }
  float unit() { return static_cast<float>(splitmix64(state) >> 40) * 0x1.0p-24f; }
};

void put(std::span<uint8_t> out, size_t at, uint32_t v) { std::memcpy(out.data() + 4 * at, &v, 4); }

/// The group of each input: in order (i / group), or, act-order, group j / group for the input
/// at place j of a random permutation (GPTQ's desc_act orders inputs by their Hessian).
std::vector<uint32_t> groups_of(uint64_t seed, const std::string& x, size_t in, size_t group, bool act_order) {
  std::vector<uint32_t> g(in);
  if (!act_order) {
    for (size_t i = 0; i < in; ++i) g[i] = static_cast<uint32_t>(i / group);
    return g;
  }
  std::vector<size_t> perm(in);
  std::iota(perm.begin(), perm.end(), 0);
  stream r(seed, x + ".g_idx");
  for (size_t i = in; i-- > 1;) std::swap(perm[i], perm[r.below(static_cast<uint32_t>(i + 1))]);
  for (size_t j = 0; j < in; ++j) g[perm[j]] = static_cast<uint32_t>(j / group);
  return g;
}

}  // namespace

result<nlohmann::ordered_json> packed_quantization_config(const std::string& packed, size_t group_size) {
  if (packed == "awq") {
    return nlohmann::ordered_json{{"quant_method", "awq"}, {"bits", 4}, {"group_size", group_size}, {"version", "gemm"},
                                  {"zero_point", true}, {"modules_to_not_convert", nullptr}};
  }
  if (packed == "gptq" || packed == "gptq-act-order" || packed == "gptq8") {
    const bool eight = packed == "gptq8";
    return nlohmann::ordered_json{{"quant_method", "gptq"}, {"bits", eight ? 8 : 4}, {"group_size", group_size},
                                  {"desc_act", packed == "gptq-act-order"}, {"sym", eight}, {"true_sequential", true},
                                  {"checkpoint_format", "gptq"}};
  }
  if (packed == "ct-w4a16" || packed == "ct-w4a16-asym" || packed == "ct-w8a16") {  // llm-compressor's schemes
    const bool eight = packed == "ct-w8a16";
    nlohmann::ordered_json weights{{"num_bits", eight ? 8 : 4}, {"type", "int"}, {"symmetric", packed != "ct-w4a16-asym"},
                                   {"strategy", eight ? "channel" : "group"}, {"group_size", eight ? nullptr : nlohmann::ordered_json(group_size)},
                                   {"dynamic", false}, {"actorder", nullptr}, {"observer", "minmax"}};
    return nlohmann::ordered_json{
        {"quant_method", "compressed-tensors"}, {"format", "pack-quantized"}, {"quantization_status", "compressed"},
        {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", nullptr},
                                        {"output_activations", nullptr}}}}},
        {"ignore", {"lm_head"}}, {"kv_cache_scheme", nullptr}, {"sparsity_config", nlohmann::ordered_json::object()}};
  }
  if (packed == "fp8") {  // AutoFP8's static scheme: per-tensor scales, an input_scale beside each
    return nlohmann::ordered_json{{"quant_method", "fp8"}, {"activation_scheme", "static"}};
  }
  if (packed == "fp8-block") {  // Qwen3's and DeepSeek's FP8 releases (blocks of 128 there)
    return nlohmann::ordered_json{{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"fmt", "e4m3"},
                                  {"weight_block_size", {group_size, group_size}}};
  }
  if (packed == "ct-fp8" || packed == "ct-fp8-block" || packed == "ct-fp8-group") {  // llm-compressor's FP8_DYNAMIC, FP8_BLOCK
    const bool block = packed == "ct-fp8-block", group = packed == "ct-fp8-group";
    nlohmann::ordered_json weights{{"num_bits", 8}, {"type", "float"}, {"symmetric", true},
                                   {"strategy", block ? "block" : group ? "group" : "channel"},
                                   {"group_size", group ? nlohmann::ordered_json(group_size) : nullptr},
                                   {"block_structure", block ? nlohmann::ordered_json{group_size, group_size} : nullptr},
                                   {"dynamic", false}, {"actorder", nullptr}, {"observer", "minmax"}};
    nlohmann::ordered_json inputs{{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"strategy", block ? "group" : "token"},
                                  {"group_size", block ? nlohmann::ordered_json(group_size) : nullptr}, {"dynamic", true}};
    return nlohmann::ordered_json{
        {"quant_method", "compressed-tensors"}, {"format", "float-quantized"}, {"quantization_status", "compressed"},
        {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", inputs},
                                        {"output_activations", nullptr}}}}},
        {"ignore", {"lm_head"}}, {"kv_cache_scheme", nullptr}, {"sparsity_config", nlohmann::ordered_json::object()}};
  }
  return make_error(errc::invalid_request,
                    "--packed must be awq, gptq, gptq-act-order, gptq8, ct-w4a16, ct-w4a16-asym, ct-w8a16, fp8, fp8-block, ct-fp8, "
                    "ct-fp8-block or ct-fp8-group, not '" + packed + "'");
}

namespace {

/// compressed-tensors' pack-quantized layer (packed_weights.hpp): signed quants stored plus
/// 2^(bits-1), eight (four) to an int32 along each output's inputs; zero points (asymmetric)
/// packed along the outputs; weight_shape as int64, as torch.tensor(weight.shape) saves it.
std::vector<tensor_spec> compressed_linear(uint64_t seed, const std::string& x, size_t out, size_t in, float scale,
                                           const std::string& packed, size_t group_size) {
  using k = kernels::dtype;
  const bool eight = packed == "ct-w8a16", asym = packed == "ct-w4a16-asym";
  const int bits = eight ? 8 : 4;
  const size_t pack = 32 / static_cast<size_t>(bits), levels = size_t{1} << bits, groups = eight ? 1 : in / group_size;
  std::vector<tensor_spec> t;
  t.push_back({x + ".weight_packed", k::f32, {out, in / pack}, [=](std::span<uint8_t> b) {
                 stream r(seed, x + ".weight_packed");
                 for (size_t o = 0; o < out; ++o) {
                   for (size_t c = 0; c < in / pack; ++c) {
                     uint32_t w = 0;
                     for (size_t j = 0; j < pack; ++j) w |= r.below(static_cast<uint32_t>(levels)) << (bits * j);
                     put(b, o * (in / pack) + c, w);
                   }
                 }
               }, 4});
  if (asym) {
    t.push_back({x + ".weight_zero_point", k::f32, {(out + pack - 1) / pack, groups}, [=](std::span<uint8_t> b) {
                   stream r(seed, x + ".weight_zero_point");
                   std::vector<uint32_t> words((out + pack - 1) / pack * groups, 0);
                   for (size_t o = 0; o < out; ++o) {
                     for (size_t g = 0; g < groups; ++g) words[(o / pack) * groups + g] |= (6 + r.below(5)) << (bits * (o % pack));  // zero −2..2
                   }
                   for (size_t w = 0; w < words.size(); ++w) put(b, w, words[w]);
                 }, 4});
  }
  t.push_back({x + ".weight_shape", k::f32, {2}, [=](std::span<uint8_t> b) {
                 const int64_t shape[2] = {static_cast<int64_t>(out), static_cast<int64_t>(in)};
                 std::memcpy(b.data(), shape, sizeof shape);
               }, 8});
  const float step = scale / static_cast<float>(levels / 2);
  t.push_back({x + ".weight_scale", k::f16, {out, groups}, [=](std::span<uint8_t> b) {
                 stream r(seed, x + ".weight_scale");
                 for (size_t i = 0; i < out * groups; ++i) {
                   const uint16_t h = kernels::f32_to_f16(step * (0.75f + 0.5f * r.unit()));
                   std::memcpy(b.data() + 2 * i, &h, 2);
                 }
               }});
  return t;
}

/// An FP8 layer (fp8_weights.hpp): X.weight F8_E4M3, codes of values uniform over about
/// ±448·0.9, and its scale (about scale / 400 each): "fp8" one F32 per tensor, shape [], with
/// X.input_scale; "fp8-block" F32 X.weight_scale_inv per block of group_size × group_size;
/// "ct-fp8" BF16 per output [out, 1]; "ct-fp8-block" F32 per block; "ct-fp8-group" F16 per
/// group of group_size inputs [out, ceil(in / group_size)].
std::vector<tensor_spec> fp8_linear(uint64_t seed, const std::string& x, size_t out, size_t in, float scale, const std::string& packed,
                                    size_t group_size) {
  using k = kernels::dtype;
  std::vector<tensor_spec> t;
  t.push_back({x + ".weight", k::f8_e4m3, {out, in}, [=](std::span<uint8_t> b) {
                 stream r(seed, x + ".weight");
                 for (size_t i = 0; i < out * in; ++i) b[i] = kernels::f32_to_f8_e4m3((2.0f * r.unit() - 1.0f) * 403.0f);
               }});
  const bool block = packed.ends_with("-block"), group = packed == "ct-fp8-group";
  const size_t bo = block ? (out + group_size - 1) / group_size : out, bi = block || group ? (in + group_size - 1) / group_size : 1;
  std::vector<size_t> shape = packed == "fp8" ? std::vector<size_t>{} : std::vector<size_t>{bo, bi};
  const size_t n = packed == "fp8" ? 1 : bo * bi;
  const k type = packed == "ct-fp8" ? k::bf16 : group ? k::f16 : k::f32;
  const std::string name = x + (packed == "fp8-block" ? ".weight_scale_inv" : ".weight_scale");
  t.push_back({name, type, shape, [=](std::span<uint8_t> b) {
                 stream r(seed, name);
                 for (size_t i = 0; i < n; ++i) {
                   const float v = scale / 400.0f * (0.75f + 0.5f * r.unit());
                   if (type != k::f32) {
                     const uint16_t h = type == k::bf16 ? kernels::f32_to_bf16(v) : kernels::f32_to_f16(v);
                     std::memcpy(b.data() + 2 * i, &h, 2);
                   } else {
                     std::memcpy(b.data() + 4 * i, &v, 4);
                   }
                 }
               }});
  if (packed == "fp8") {
    t.push_back({x + ".input_scale", k::f32, {}, [](std::span<uint8_t> b) {
                   const float v = 0.01f;
                   std::memcpy(b.data(), &v, 4);
                 }});
  }
  return t;
}

}  // namespace

result<std::vector<tensor_spec>> random_packed_linear(uint64_t seed, const std::string& x, size_t out, size_t in, float scale,
                                                      const std::string& packed, size_t group_size) {
  if (packed == "fp8" || packed == "fp8-block" || packed.starts_with("ct-fp8")) {
    return fp8_linear(seed, x, out, in, scale, packed, group_size);
  }
  const bool awq = packed == "awq", eight = packed == "gptq8" || packed == "ct-w8a16", act_order = packed == "gptq-act-order";
  const int bits = eight ? 8 : 4;
  const size_t pack = 32 / static_cast<size_t>(bits), levels = size_t{1} << bits;
  if (group_size == 0 || in % group_size != 0 || in % pack != 0 || out % pack != 0) {
    return make_error(errc::invalid_request, x + ": [" + std::to_string(out) + ", " + std::to_string(in) +
                                                 "] does not split into groups of " + std::to_string(group_size) +
                                                 " inputs and words of " + std::to_string(pack));
  }
  if (packed.starts_with("ct-")) return compressed_linear(seed, x, out, in, scale, packed, group_size);
  const size_t groups = in / group_size;
  using k = kernels::dtype;
  std::vector<tensor_spec> t;
  // Quants uniform over their range; zeros near the middle (GPTQ stores them less one; 8 bits:
  // symmetric, 128); float16 scales of about scale / (levels / 2), so w spans about ±scale.
  auto quant = [=](stream& r) { return r.below(static_cast<uint32_t>(levels)); };
  auto zero = [=](stream& r) -> uint32_t {
    if (eight) return 128 - 1;
    const uint32_t z = 6 + r.below(5);  // 6..10
    return awq ? z : z - 1;
  };
  if (awq) {
    // `rows` rows of `out` values drawn in order, packed along the outputs in AutoAWQ's order.
    auto awq_rows = [=](const std::string& name, size_t rows, std::function<uint32_t(stream&)> draw) {
      return tensor_spec{name, k::f32, {rows, out / 8}, [=](std::span<uint8_t> b) {
                           stream r(seed, name);
                           std::vector<uint32_t> v(out);
                           for (size_t i = 0; i < rows; ++i) {
                             for (auto& x : v) x = draw(r);
                             for (size_t c = 0; c < out / 8; ++c) {
                               uint32_t w = 0;
                               for (int p = 0; p < 8; ++p) w |= v[8 * c + static_cast<size_t>(awq_order[p])] << (4 * p);
                               put(b, i * (out / 8) + c, w);
                             }
                           }
                         }, 4};
    };
    t.push_back(awq_rows(x + ".qweight", in, quant));
    t.push_back(awq_rows(x + ".qzeros", groups, zero));
  } else {
    t.push_back({x + ".qweight", k::f32, {in / pack, out}, [=](std::span<uint8_t> b) {
                   stream r(seed, x + ".qweight");
                   std::vector<uint32_t> words(in / pack * out, 0);
                   for (size_t i = 0; i < in; ++i) {
                     for (size_t o = 0; o < out; ++o) words[(i / pack) * out + o] |= quant(r) << (bits * (i % pack));
                   }
                   for (size_t w = 0; w < words.size(); ++w) put(b, w, words[w]);
                 }, 4});
    t.push_back({x + ".qzeros", k::f32, {groups, out / pack}, [=](std::span<uint8_t> b) {
                   stream r(seed, x + ".qzeros");
                   std::vector<uint32_t> words(groups * (out / pack), 0);
                   for (size_t g = 0; g < groups; ++g) {
                     for (size_t o = 0; o < out; ++o) words[g * (out / pack) + o / pack] |= zero(r) << (bits * (o % pack));
                   }
                   for (size_t w = 0; w < words.size(); ++w) put(b, w, words[w]);
                 }, 4});
    t.push_back({x + ".g_idx", k::f32, {in}, [=](std::span<uint8_t> b) {
                   const auto g = groups_of(seed, x, in, group_size, act_order);
                   for (size_t i = 0; i < in; ++i) put(b, i, g[i]);
                 }, 4});
  }
  const float step = scale / static_cast<float>(levels / 2);
  t.push_back({x + ".scales", k::f16, {groups, out}, [=](std::span<uint8_t> b) {
                 stream r(seed, x + ".scales");
                 for (size_t i = 0; i < groups * out; ++i) {
                   const uint16_t h = kernels::f32_to_f16(step * (0.75f + 0.5f * r.unit()));
                   std::memcpy(b.data() + 2 * i, &h, 2);
                 }
               }});
  return t;
}

}  // namespace llmesh::model::detail
