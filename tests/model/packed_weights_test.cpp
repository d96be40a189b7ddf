// AWQ and GPTQ checkpoints (model/src/packed_weights.hpp): each packed layer becomes an int8
// matrix holding exactly s · (q − z) where every 32-input block lies in one group, else the
// --quantization int8 rule over those values; quantization_config's variants read or refused
// by name; broken packed tensors refused naming them. The values are checked against this
// file's own decoding of the packed words, written from AutoAWQ's and AutoGPTQ's packing loops;
// the forward pass against the PyTorch reference in tests/cli/golden_test.cpp (*_awq, *_gptq*).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "llmesh/kernels/quantize.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/random_model.hpp"
#include "llmesh/model/safetensors.hpp"
#include "checkpoint_edit.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using kernels::dtype;
using json = nlohmann::json;

random_model_spec packed_spec(const std::string& packed) {
  random_model_spec s;
  s.hidden = 64;
  s.intermediate = 128;
  s.n_layers = 1;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.vocab = 300;
  s.dtype = dtype::f16;
  s.seed = 21;
  s.packed = packed;
  s.group_size = 32;
  return s;
}

uint32_t word_at(const tensor_view& t, size_t i) {
  uint32_t w;
  std::memcpy(&w, static_cast<const uint8_t*>(t.data) + 4 * i, 4);
  return w;
}

/// compressed-tensors' layer x [out, in]: pack_to_int32 puts value j of each run of `pack` in
/// bits bits·j, as the signed value plus 2^(bits-1); weights along each output's inputs, zero
/// points (asymmetric) along the outputs of each group; scales [out, groups].
std::vector<float> decoded_compressed(const tensor_store& st, const std::string& x, int bits, size_t out, size_t in) {
  const size_t pack = 32 / static_cast<size_t>(bits);
  const int mask = (1 << bits) - 1, offset = 1 << (bits - 1);
  auto packed = st.get_i32(x + ".weight_packed");
  auto sc = st.get(x + ".weight_scale");
  EXPECT_TRUE(packed.ok() && sc.ok()) << x;
  const size_t groups = sc->shape[1], per_group = (in + groups - 1) / groups;
  auto zp = st.get_i32(x + ".weight_zero_point");
  std::vector<float> w(out * in);
  for (size_t o = 0; o < out; ++o) {
    for (size_t i = 0; i < in; ++i) {
      const size_t g = i / per_group;
      const int q = static_cast<int>((word_at(*packed, o * (in / pack) + i / pack) >> (bits * (i % pack))) & static_cast<uint32_t>(mask)) - offset;
      const int z = zp.ok() ? static_cast<int>((word_at(*zp, (o / pack) * groups + g) >> (bits * (o % pack))) & static_cast<uint32_t>(mask)) - offset : 0;
      w[o * in + i] = kernels::load_as_f32(sc->data, sc->type, o * groups + g) * static_cast<float>(q - z);
    }
  }
  return w;
}

/// Layer x's weights [out, in] decoded from the checkpoint's tensors: AutoAWQ packs output
/// 8c + order[p] into nibble p of word c (order 0, 2, 4, 6, 1, 3, 5, 7); AutoGPTQ packs input i
/// into bits bits·(i % pack) of row i / pack, zeros along the outputs likewise, less one (in
/// its "gptq" format; `plus_one` false: "gptq_v2").
std::vector<float> decoded(const tensor_store& st, const std::string& x, bool awq, int bits, size_t out, size_t in,
                           std::vector<uint32_t>* groups = nullptr, bool plus_one = true, size_t group_size = 32) {
  const size_t pack = 32 / static_cast<size_t>(bits);
  const uint32_t mask = (1u << bits) - 1;
  auto qw = st.get_i32(x + ".qweight"), qz = st.get_i32(x + ".qzeros");
  auto sc = st.get(x + ".scales");
  EXPECT_TRUE(qw.ok() && qz.ok() && sc.ok()) << x;
  std::vector<int> q(out * in), z(sc->shape[0] * out);
  if (awq) {
    const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    for (size_t i = 0; i < in; ++i) {
      for (size_t c = 0; c < out / 8; ++c) {
        for (int p = 0; p < 8; ++p) q[(8 * c + order[p]) * in + i] = static_cast<int>((word_at(*qw, i * (out / 8) + c) >> (4 * p)) & 15);
      }
    }
    for (size_t g = 0; g < sc->shape[0]; ++g) {
      for (size_t c = 0; c < out / 8; ++c) {
        for (int p = 0; p < 8; ++p) z[g * out + 8 * c + order[p]] = static_cast<int>((word_at(*qz, g * (out / 8) + c) >> (4 * p)) & 15);
      }
    }
  } else {
    for (size_t r = 0; r < in / pack; ++r) {
      for (size_t o = 0; o < out; ++o) {
        for (size_t j = 0; j < pack; ++j) q[o * in + r * pack + j] = static_cast<int>((word_at(*qw, r * out + o) >> (bits * j)) & mask);
      }
    }
    for (size_t g = 0; g < sc->shape[0]; ++g) {
      for (size_t c = 0; c < out / pack; ++c) {
        for (size_t j = 0; j < pack; ++j) {
          z[g * out + c * pack + j] = static_cast<int>((word_at(*qz, g * (out / pack) + c) >> (bits * j)) & mask) + (plus_one ? 1 : 0);
        }
      }
    }
  }
  std::vector<uint32_t> g(in);
  auto g_idx = st.get_i32(x + ".g_idx");
  for (size_t i = 0; i < in; ++i) g[i] = g_idx.ok() ? word_at(*g_idx, i) : static_cast<uint32_t>(i / group_size);
  if (groups) *groups = g;
  std::vector<float> w(out * in);
  for (size_t o = 0; o < out; ++o) {
    for (size_t i = 0; i < in; ++i) {
      const float s = kernels::load_as_f32(sc->data, sc->type, g[i] * out + o);
      w[o * in + i] = s * static_cast<float>(q[o * in + i] - z[g[i] * out + o]);
    }
  }
  return w;
}

std::vector<float> held(const weight_matrix& w) {
  std::vector<float> out(w.rows * w.cols);
  const size_t ld = kernels::q8_row_elements(w.cols);
  for (size_t r = 0; r < w.rows; ++r) {
    for (size_t c = 0; c < w.cols; ++c) out[r * w.cols + c] = kernels::load_as_f32(w.data, w.type, r * ld + c);
  }
  return out;
}

TEST(PackedWeights, AwqGptqAndCompressedTensorsLayersAreHeldExactlyAsInt4OrInt8) {
  using method = model_config::packed_config::method;
  for (const std::string packed : {"awq", "gptq", "gptq8", "ct-w4a16", "ct-w4a16-asym", "ct-w8a16"}) {
    SCOPED_TRACE(packed);
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(packed_spec(packed), dir.path()).ok());
    auto m = model::load(dir.path());
    ASSERT_TRUE(m.ok()) << m.err().message;
    const bool ct = packed.starts_with("ct-");
    EXPECT_EQ((*m)->config().packed.kind, packed == "awq" ? method::awq : ct ? method::compressed : method::gptq);
    const int bits = packed == "gptq8" || packed == "ct-w8a16" ? 8 : 4;
    EXPECT_EQ((*m)->quantized_weights(), bits == 4 ? "int4" : "int8");
    auto st = tensor_store::open(dir.path());
    ASSERT_TRUE(st.ok());
    const auto& l = (*m)->weights().layers[0];
    for (auto [x, w] : {std::pair{"model.layers.0.self_attn.q_proj", &l.q}, {"model.layers.0.self_attn.o_proj", &l.o},
                        {"model.layers.0.mlp.down_proj", &l.down}, {"model.layers.0.mlp.up_proj", &l.up}}) {
      SCOPED_TRACE(x);
      ASSERT_EQ(w->type, bits == 4 ? dtype::q4 : dtype::q8);
      const auto want = ct ? decoded_compressed(*st, x, bits, w->rows, w->cols) : decoded(*st, x, packed == "awq", bits, w->rows, w->cols);
      const auto got = held(*w);
      ASSERT_EQ(got.size(), want.size());
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
      EXPECT_EQ(differ, 0u) << "of " << got.size();
    }
    // The plain tensors stay as stored; the embedding is not packed.
    EXPECT_EQ((*m)->weights().embed.type, dtype::f16);
    EXPECT_EQ(l.attn_norm.size(), 64u);
  }
}

TEST(PackedWeights, ActOrderGptqIsRequantizedByTheInt8Rule) {
  // desc_act: the inputs of a 32-block belong to different groups, so no one scale holds them:
  // the matrix is the int8 rule over the decoded values (within half a step of each).
  testing::temp_dir dir;
  ASSERT_TRUE(write_random_model(packed_spec("gptq-act-order"), dir.path()).ok());
  auto m = model::load(dir.path());
  ASSERT_TRUE(m.ok()) << m.err().message;
  auto st = tensor_store::open(dir.path());
  ASSERT_TRUE(st.ok());
  const auto& w = (*m)->weights().layers[0].gate;
  std::vector<uint32_t> groups;
  const auto want = decoded(*st, "model.layers.0.mlp.gate_proj", false, 4, w.rows, w.cols, &groups);
  bool mixed = false;
  for (size_t i = 0; i < groups.size(); ++i) mixed |= groups[i] != groups[i / 32 * 32];
  ASSERT_TRUE(mixed) << "the test model's g_idx must mix groups within a block";
  std::vector<uint8_t> rule(kernels::dtype_bytes(dtype::q8, w.rows * kernels::q8_row_elements(w.cols)));
  ASSERT_TRUE(kernels::quantize_q8(want.data(), dtype::f32, w.rows, w.cols, rule.data()).ok());
  ASSERT_EQ(std::memcmp(rule.data(), w.data, rule.size()), 0);
  size_t differ = 0;
  const auto got = held(w);
  for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
  EXPECT_GT(differ, 0u) << "requantized values are not the checkpoint's";
}

/// llm-compressor's W4A16 quantization_config, changed by `change`.
json ct_config(const std::function<void(json&)>& change) {
  json q = {{"quant_method", "compressed-tensors"},
            {"format", "pack-quantized"},
            {"config_groups",
             {{"group_0",
               {{"targets", {"Linear"}},
                {"weights", {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"}, {"group_size", 32}}},
                {"input_activations", nullptr}}}}}};
  change(q);
  return q;
}

/// A packed model whose config.json's quantization_config is replaced (null: removed).
std::string with_quantization_config(const testing::temp_dir& dir, const json& q, const std::string& packed = "awq") {
  EXPECT_TRUE(write_random_model(packed_spec(packed), dir.path()).ok());
  json cfg = json::parse(testing::read_text(dir / "config.json"));
  if (q.is_null()) cfg.erase("quantization_config");
  else cfg["quantization_config"] = q;
  testing::write_text(dir / "config.json", cfg.dump());
  return dir.path();
}

TEST(PackedWeights, QuantizationConfigsReadOrRefusedByName) {
  const std::pair<json, std::string> refused[] = {
      {{{"quant_method", "mxfp4"}}, "quant_method 'mxfp4' outside GPT-OSS's experts is not supported"},
      {{{"quant_method", "compressed-tensors"}, {"format", "int-quantized"}}, "compressed-tensors format 'int-quantized' is not supported"},
      {ct_config([](json& q) { q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}}; }),
       "quantized input_activations (W8A8) is not supported"},
      {ct_config([](json& q) { q["config_groups"]["group_1"] = q["config_groups"]["group_0"]; }), "other than one config group"},
      {ct_config([](json& q) { q["config_groups"]["group_0"]["weights"]["type"] = "float"; }), "weights of type 'float'"},
      {ct_config([](json& q) { q["config_groups"]["group_0"]["weights"]["num_bits"] = 2; }), "weights of 2 bits"},
      {ct_config([](json& q) { q["config_groups"]["group_0"]["weights"]["strategy"] = "tensor"; }), "weight strategy 'tensor'"},
      {ct_config([](json& q) { q["kv_cache_scheme"] = {{"num_bits", 8}}; }), "kv_cache_scheme"},
      {ct_config([](json& q) { q["sparsity_config"] = {{"format", "sparse-24-bitmask"}}; }), "sparsity_config"},
      {{{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}}, "quant_method 'bitsandbytes' is not supported"},
      {{{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}, {"version", "GEMV"}}, "AWQ version 'gemv' is not supported"},
      {{{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}, {"zero_point", false}}, "AWQ without zero points"},
      {{{"quant_method", "gptq"}, {"bits", 3}, {"group_size", 32}}, "GPTQ with 3 bits is not supported"},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 32}, {"checkpoint_format", "marlin"}},
       "GPTQ checkpoint_format 'marlin' is not supported"},
  };
  for (const auto& [q, why] : refused) {
    SCOPED_TRACE(q.dump());
    testing::temp_dir dir;
    auto m = model::load(with_quantization_config(dir, q));
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.err().code, errc::unsupported);
    EXPECT_NE(m.err().message.find(why), std::string::npos) << m.err().message;
    EXPECT_NE(m.err().message.find("quantization_config"), std::string::npos) << m.err().message;
  }
  const std::pair<json, std::string> bad[] = {
      {json::array(), "must be an object"},
      {{{"bits", 4}}, "missing 'quant_method'"},
      {{{"quant_method", "awq"}, {"group_size", 0}}, "'group_size' must be positive or -1"},
      {{{"quant_method", "awq"}, {"bits", "4"}}, "'bits' must be an integer"},
      {{{"quant_method", "gptq"}, {"bits", 4294967300LL}}, "'bits' must be 1..32"},
  };
  for (const auto& [q, why] : bad) {
    SCOPED_TRACE(q.dump());
    testing::temp_dir dir;
    auto m = model::load(with_quantization_config(dir, q));
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.err().code, errc::invalid_request);
    EXPECT_NE(m.err().message.find(why), std::string::npos) << m.err().message;
  }
  // AutoAWQ's older keys (w_bit, q_group_size, version GEMM) read as the current ones.
  testing::temp_dir dir;
  auto m = model::load(with_quantization_config(
      dir, {{"quant_method", "awq"}, {"w_bit", 4}, {"q_group_size", 32}, {"version", "GEMM"}, {"zero_point", true}}));
  ASSERT_TRUE(m.ok()) << m.err().message;
  EXPECT_EQ((*m)->config().packed.group_size, 32u);
  // Packed tensors without a quantization_config say so.
  testing::temp_dir none;
  auto unset = model::load(with_quantization_config(none, nullptr));
  ASSERT_FALSE(unset.ok());
  EXPECT_NE(unset.err().message.find("is packed, but config.json has no quantization_config"), std::string::npos)
      << unset.err().message;
}

TEST(PackedWeights, BrokenPackedTensorsAreRefusedNamingThem) {
  const std::string q = "model.layers.0.self_attn.q_proj";
  struct broken {
    std::function<bool(tensor_spec&)> change;
    std::string why;
  };
  const std::vector<broken> cases = {
      {[&](tensor_spec& s) { return s.name != q + ".qzeros"; }, "missing tensor '" + q + ".qzeros'"},
      {[&](tensor_spec& s) { return s.name != q + ".scales"; }, "missing tensor '" + q + ".scales'"},
      {[&](tensor_spec& s) {
         if (s.name == q + ".scales") s.shape = {1, 128};
         return true;
       },
       "tensor '" + q + ".scales' has shape [1, 128]"},
      {[&](tensor_spec& s) {
         if (s.name == q + ".g_idx") {
           s.fill = [](std::span<uint8_t> out) {
             std::memset(out.data(), 0, out.size());
             const uint32_t far = 7;  // 64 inputs in groups of 32: groups 0 and 1 only
             std::memcpy(out.data() + 4 * 5, &far, 4);
           };
         }
         return true;
       },
       "tensor '" + q + ".g_idx' gives input 5 group 7 of 2"},
      {[&](tensor_spec& s) {
         if (s.name == q + ".scales") {
           s.fill = [](std::span<uint8_t> out) {
             std::memset(out.data(), 0, out.size());
             const uint16_t inf = 0x7c00;
             std::memcpy(out.data() + 6, &inf, 2);
           };
         }
         return true;
       },
       q + ".scales: a scale is not finite"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.why);
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(packed_spec("gptq"), dir.path()).ok());
    rewrite(dir, c.change);
    auto m = model::load(dir.path());
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.err().code, errc::invalid_request);
    EXPECT_NE(m.err().message.find(c.why), std::string::npos) << m.err().message;
  }
  // X.weight beside X.qweight: which one is meant is unclear.
  testing::temp_dir dir;
  ASSERT_TRUE(write_random_model(packed_spec("awq"), dir.path()).ok());
  rewrite(dir, [&](tensor_spec& s) {
    if (s.name == "model.layers.0.input_layernorm.weight") s.name = q + ".weight";
    return true;
  });
  auto m = model::load(dir.path());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.err().message.find("both '" + q + ".weight' and '" + q + ".qweight'"), std::string::npos) << m.err().message;
}

TEST(PackedWeights, RandomPackedModelsRefuseWhatTheFormatsCannotHold) {
  testing::temp_dir dir;
  auto s = packed_spec("awq4");
  auto bad = write_random_model(s, dir.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("--packed must be awq, gptq, gptq-act-order, gptq8, ct-w4a16"), std::string::npos) << bad.err().message;
  s = packed_spec("gptq");
  s.group_size = 48;  // 64 inputs do not split into groups of 48
  bad = write_random_model(s, dir.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("does not split into groups of 48"), std::string::npos) << bad.err().message;
}

/// Every int32 tensor named `suffix` of layer 0's q_proj filled with `word`, and its scales with 1.
void fill_q_proj(const testing::temp_dir& dir, const std::string& suffix, uint32_t word, const std::string& scales) {
  const std::string q = "model.layers.0.self_attn.q_proj";
  rewrite(dir, [&](tensor_spec& s) {
    if (s.name == q + suffix) {
      s.fill = [word](std::span<uint8_t> out) {
        for (size_t i = 0; i + 4 <= out.size(); i += 4) std::memcpy(out.data() + i, &word, 4);
      };
    }
    if (s.name == q + scales) {
      s.fill = [](std::span<uint8_t> out) {
        const uint16_t one = 0x3c00;  // float16 1.0
        for (size_t i = 0; i + 2 <= out.size(); i += 2) std::memcpy(out.data() + i, &one, 2);
      };
    }
    return true;
  });
}

TEST(PackedWeights, HandPackedWordsDecodeAsTheirPackersWroteThem) {
  // The word 0x76543210 holds 0, 1, ..., 7 in nibbles 0..7. With zeros of 0 and scales of 1:
  // AWQ (AutoAWQ's order_map: nibble p is output 8c + (0, 2, 4, 6, 1, 3, 5, 7)[p]) gives output
  // o the value (0, 4, 1, 5, 2, 6, 3, 7)[o % 8] at every input; GPTQ (input 8r + p in nibble p)
  // gives input i the value i % 8 less its zero (stored 0: 1 in the "gptq" format, 0 in
  // "gptq_v2"); compressed-tensors (input 8c + p in nibble p, less 8) i % 8 − 8.
  const uint32_t ramp = 0x76543210;
  const std::string q = "model.layers.0.self_attn.q_proj";
  struct want {
    std::string packed, format;
    std::function<float(size_t o, size_t i)> value;
  };
  const int awq_value[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  const std::vector<want> cases = {
      {"awq", "", [&](size_t o, size_t) { return static_cast<float>(awq_value[o % 8]); }},
      {"gptq", "gptq", [](size_t, size_t i) { return static_cast<float>(i % 8) - 1.0f; }},
      {"gptq", "gptq_v2", [](size_t, size_t i) { return static_cast<float>(i % 8); }},
      {"ct-w4a16", "", [](size_t, size_t i) { return static_cast<float>(i % 8) - 8.0f; }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.packed + " " + c.format);
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(packed_spec(c.packed), dir.path()).ok());
    const bool ct = c.packed == "ct-w4a16";
    fill_q_proj(dir, ct ? ".weight_packed" : ".qweight", ramp, ct ? ".weight_scale" : ".scales");
    if (!ct) fill_q_proj(dir, ".qzeros", 0, ct ? ".weight_scale" : ".scales");
    if (c.format == "gptq_v2") {
      json cfg = json::parse(testing::read_text(dir / "config.json"));
      cfg["quantization_config"]["checkpoint_format"] = "gptq_v2";
      testing::write_text(dir / "config.json", cfg.dump());
    }
    auto m = model::load(dir.path());
    ASSERT_TRUE(m.ok()) << m.err().message;
    const auto& w = (*m)->weights().layers[0].q;
    const auto got = held(w);
    size_t differ = 0;
    for (size_t o = 0; o < w.rows; ++o) {
      for (size_t i = 0; i < w.cols; ++i) differ += got[o * w.cols + i] != c.value(o, i);
    }
    EXPECT_EQ(differ, 0u) << "first row: " << got[0] << " " << got[1] << " " << got[2];
  }
}

TEST(PackedWeights, EightBitZerosOffTheMiddleAreRequantized) {
  // GPTQ's 8 bits hold q − z in int8 only with z = 128; a zero of 100 spans −100..155.
  testing::temp_dir dir;
  ASSERT_TRUE(write_random_model(packed_spec("gptq8"), dir.path()).ok());
  fill_q_proj(dir, ".qzeros", 0x63636363, ".none");  // stored 99: zero 100
  auto m = model::load(dir.path());
  ASSERT_TRUE(m.ok()) << m.err().message;
  auto st = tensor_store::open(dir.path());
  ASSERT_TRUE(st.ok());
  const auto& w = (*m)->weights().layers[0].q;
  const auto want = decoded(*st, "model.layers.0.self_attn.q_proj", false, 8, w.rows, w.cols);
  std::vector<uint8_t> rule(kernels::dtype_bytes(dtype::q8, w.rows * kernels::q8_row_elements(w.cols)));
  ASSERT_TRUE(kernels::quantize_q8(want.data(), dtype::f32, w.rows, w.cols, rule.data()).ok());
  EXPECT_EQ(std::memcmp(rule.data(), w.data, rule.size()), 0);
  // The other layers keep the middle zero: exact.
  const auto& k = (*m)->weights().layers[0].k;
  const auto k_want = decoded(*st, "model.layers.0.self_attn.k_proj", false, 8, k.rows, k.cols);
  EXPECT_EQ(held(k), k_want);
}

TEST(PackedWeights, ActOrderNeedsAnInt32GIdx) {
  const std::string q = "model.layers.0.self_attn.q_proj";
  testing::temp_dir dir;
  ASSERT_TRUE(write_random_model(packed_spec("gptq-act-order"), dir.path()).ok());
  rewrite(dir, [&](tensor_spec& s) { return s.name != q + ".g_idx"; });
  auto m = model::load(dir.path());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.err().message.find("desc_act (act-order) needs " + q + ".g_idx, which is missing"), std::string::npos)
      << m.err().message;
  testing::temp_dir floats;
  ASSERT_TRUE(write_random_model(packed_spec("gptq-act-order"), floats.path()).ok());
  rewrite(floats, [&](tensor_spec& s) {
    if (s.name == q + ".g_idx") s.int_bytes = 0;  // the same bytes as float32
    return true;
  });
  m = model::load(floats.path());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.err().message.find("tensor '" + q + ".g_idx' holds floats, not int32"), std::string::npos) << m.err().message;
}

TEST(PackedWeights, GptqGroupSizeMinusOneIsOneGroupPerRow) {
  // Every layer of 64 inputs in groups of 64 is one group a row: group_size -1 (GPTQ's "no
  // groups") reads the same file to the same values.
  auto spec = packed_spec("gptq");
  spec.intermediate = 64;
  spec.group_size = 64;
  testing::temp_dir dir;
  ASSERT_TRUE(write_random_model(spec, dir.path()).ok());
  auto grouped = model::load(dir.path());
  ASSERT_TRUE(grouped.ok()) << grouped.err().message;
  json cfg = json::parse(testing::read_text(dir / "config.json"));
  cfg["quantization_config"]["group_size"] = -1;
  testing::write_text(dir / "config.json", cfg.dump());
  auto whole = model::load(dir.path());
  ASSERT_TRUE(whole.ok()) << whole.err().message;
  EXPECT_EQ((*whole)->config().packed.group_size, 0u);
  const auto& a = (*grouped)->weights().layers[0];
  const auto& b = (*whole)->weights().layers[0];
  for (auto [x, y] : {std::pair{&a.q, &b.q}, {&a.down, &b.down}}) {
    ASSERT_EQ(x->type, dtype::q4);
    EXPECT_EQ(held(*x), held(*y));
  }
}

TEST(PackedWeights, AnAwqModelRunsAtTp2AndItsLogitsAreTp1s) {
  testing::temp_dir dir;
  ASSERT_TRUE(write_random_model(packed_spec("awq"), dir.path()).ok());
  auto m = model::load(dir.path());
  ASSERT_TRUE(m.ok()) << m.err().message;
  std::vector<std::vector<float>> logits;
  for (int tp : {1, 2}) {
    engine_options o;
    o.tp = tp;
    o.threads = 2;
    o.kv_tokens = 64;
    auto e = engine::create(*m, o);
    ASSERT_TRUE(e.ok()) << e.err().message;
    const std::vector<int32_t> prompt = {5, 17, 42, 99};
    const std::vector<int32_t> table = {0, 1, 2, 3};
    step_sequence s;
    s.tokens = prompt;
    s.block_table = table;
    logits.emplace_back();
    ASSERT_TRUE((*e)->forward(std::span(&s, 1), logits.back()).ok());
  }
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < logits[0].size(); ++i) {
    ASSERT_TRUE(std::isfinite(logits[0][i]));
    max_abs = std::max(max_abs, std::fabs(logits[0][i]));
    max_diff = std::max(max_diff, std::fabs(logits[0][i] - logits[1][i]));
  }
  EXPECT_LT(max_diff, 1e-4f * max_abs);
}

TEST(PackedWeights, ShortLastBlocksGiveTheLogitsOfTheDecodedWeightsBitForBit) {
  // Rows of 40 inputs in one group of 40: each row is a whole block and a short one of 8 (padded
  // nibbles, the kernels' tail). The AWQ model held as int4 gives the same logits, bit for bit,
  // as the same model whose packed layers are written out as float32 weights of their decoded
  // values (same values, same reduction order); --quantization int8 holds them as int8 blocks
  // of the same values too.
  auto spec = packed_spec("awq");
  spec.hidden = 40;
  spec.intermediate = 40;
  spec.n_heads = 4;
  spec.n_kv_heads = 4;  // AWQ packs 8 outputs to a word: k and v need 40 rows
  spec.group_size = 40;
  testing::temp_dir awq, f32;
  ASSERT_TRUE(write_random_model(spec, awq.path()).ok());
  ASSERT_TRUE(write_random_model(spec, f32.path()).ok());
  auto st = tensor_store::open(awq.path());
  ASSERT_TRUE(st.ok());
  rewrite(f32, [&](tensor_spec& t) {
    if (t.name.ends_with(".qzeros") || t.name.ends_with(".scales")) return false;
    if (!t.name.ends_with(".qweight")) return true;
    const std::string x = t.name.substr(0, t.name.size() - 8);
    const size_t in = t.shape[0], out = t.shape[1] * 8;
    const auto w = decoded(*st, x, true, 4, out, in, nullptr, true, 40);
    t = tensor_spec{x + ".weight", dtype::f32, {out, in}, [w](std::span<uint8_t> o) { std::memcpy(o.data(), w.data(), o.size()); }, 0};
    return true;
  });
  json cfg = json::parse(testing::read_text(f32 / "config.json"));
  cfg.erase("quantization_config");
  testing::write_text(f32 / "config.json", cfg.dump());
  auto logits_of = [](const std::string& dir, quantization q, dtype want) {
    load_options lo;
    lo.quant = q;
    auto m = model::load(dir, lo);
    EXPECT_TRUE(m.ok()) << m.err().message;
    if (!m.ok()) return std::vector<float>();
    EXPECT_EQ((*m)->weights().layers[0].down.type, want);
    engine_options o;
    o.threads = 2;
    o.kv_tokens = 64;
    auto e = engine::create(*m, o);
    EXPECT_TRUE(e.ok()) << e.err().message;
    const std::vector<int32_t> prompt = {5, 17, 42, 99, 3}, table = {0, 1, 2, 3};
    step_sequence s;
    s.tokens = prompt;
    s.block_table = table;
    std::vector<float> logits;
    EXPECT_TRUE((*e)->forward(std::span(&s, 1), logits).ok());
    return logits;
  };
  const auto four = logits_of(awq.path(), quantization::none, dtype::q4);
  const auto reference = logits_of(f32.path(), quantization::none, dtype::f32);
  ASSERT_FALSE(four.empty());
  ASSERT_EQ(four.size(), reference.size());
  EXPECT_EQ(std::memcmp(four.data(), reference.data(), four.size() * sizeof(float)), 0);
  load_options int8;
  int8.quant = quantization::int8;
  auto m = model::load(awq.path(), int8);
  ASSERT_TRUE(m.ok());
  const auto& down = (*m)->weights().layers[0].down;
  ASSERT_EQ(down.type, dtype::q8);
  EXPECT_EQ(held(down), decoded(*st, "model.layers.0.mlp.down_proj", true, 4, down.rows, down.cols, nullptr, true, 40));
}

TEST(PackedWeights, Float32ScalesWhoseOffsetsAreInexactStayInt8AndExact) {
  // An int4 block holds s·z as a float32: a scale of 24 significant bits times a zero is not
  // one, so that layer is held as int8 blocks of q − z (the same values); the rest is int4.
  const std::string q = "model.layers.0.self_attn.q_proj";
  testing::temp_dir dir;
  ASSERT_TRUE(write_random_model(packed_spec("awq"), dir.path()).ok());
  rewrite(dir, [&](tensor_spec& s) {
    if (s.name != q + ".scales") return true;
    size_t n = 1;
    for (size_t d : s.shape) n *= d;
    std::vector<uint8_t> halves(2 * n);
    s.fill(halves);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = kernels::load_as_f32(halves.data(), s.type, i) * (1.0f + 0x1.0p-22f + 0x1.0p-23f);
    s.type = dtype::f32;
    s.fill = [v](std::span<uint8_t> out) { std::memcpy(out.data(), v.data(), out.size()); };
    return true;
  });
  auto m = model::load(dir.path());
  ASSERT_TRUE(m.ok()) << m.err().message;
  EXPECT_EQ((*m)->quantized_weights(), "int4+int8");
  auto st = tensor_store::open(dir.path());
  ASSERT_TRUE(st.ok());
  const auto& l = (*m)->weights().layers[0];
  ASSERT_EQ(l.q.type, dtype::q8);
  EXPECT_EQ(l.k.type, dtype::q4);
  EXPECT_EQ(held(l.q), decoded(*st, q, true, 4, l.q.rows, l.q.cols));
}

TEST(PackedWeights, Int8QuantizationOfAnAwqModelKeepsItsValues) {
  // --quantization int8 turns int4 blocks into int8 ones of q − z with the same scale: the
  // same values, so the same logits, in 1.5x the memory.
  testing::temp_dir dir;
  ASSERT_TRUE(write_random_model(packed_spec("awq"), dir.path()).ok());
  auto four = model::load(dir.path());
  ASSERT_TRUE(four.ok()) << four.err().message;
  load_options o;
  o.quant = quantization::int8;
  auto eight = model::load(dir.path(), o);
  ASSERT_TRUE(eight.ok()) << eight.err().message;
  EXPECT_EQ((*eight)->quantized_weights(), "int8");
  const auto& a = (*four)->weights().layers[0];
  const auto& b = (*eight)->weights().layers[0];
  for (auto [x, y] : {std::pair{&a.q, &b.q}, {&a.o, &b.o}, {&a.gate, &b.gate}, {&a.down, &b.down}}) {
    ASSERT_EQ(x->type, dtype::q4);
    ASSERT_EQ(y->type, dtype::q8);
    EXPECT_EQ(held(*x), held(*y));
    EXPECT_EQ(y->bytes() * 2, x->bytes() * 3);
  }
}

TEST(PackedWeights, VllmQuantizationNamesMustNameTheCheckpointsMethod) {
  // vLLM's --quantization awq / gptq_marlin / compressed-tensors / gguf name the checkpoint's
  // own method: held as without the flag, refused for a checkpoint of another kind.
  EXPECT_EQ(parse_quantization("awq_marlin").value(), quantization::awq);
  EXPECT_EQ(parse_quantization("gptq_marlin").value(), quantization::gptq);
  EXPECT_EQ(quantization_name(parse_quantization("compressed-tensors").value()), "compressed-tensors");
  EXPECT_EQ(parse_quantization("bitsandbytes").err().code, errc::unsupported);
  EXPECT_NE(parse_quantization("bitsandbytes").err().message.find("--quantization bitsandbytes is not supported"), std::string::npos);
  EXPECT_EQ(parse_quantization("awq4").err().code, errc::invalid_request);
  testing::temp_dir awq, ct;
  ASSERT_TRUE(write_random_model(packed_spec("awq"), awq.path()).ok());
  ASSERT_TRUE(write_random_model(packed_spec("ct-w4a16"), ct.path()).ok());
  auto plain = model::load(awq.path());
  ASSERT_TRUE(plain.ok()) << plain.err().message;
  for (auto [dir, q] : {std::pair{&awq, quantization::awq}, {&ct, quantization::compressed_tensors}}) {
    load_options o;
    o.quant = q;
    auto m = model::load(dir->path(), o);
    ASSERT_TRUE(m.ok()) << m.err().message;
    EXPECT_EQ((*m)->quant(), q);
    EXPECT_EQ((*m)->quantized_weights(), "int4");
  }
  load_options o;
  o.quant = parse_quantization("awq_marlin").value();
  auto held_as_awq = model::load(awq.path(), o);
  ASSERT_TRUE(held_as_awq.ok());
  EXPECT_EQ(held((*held_as_awq)->weights().layers[0].q), held((*plain)->weights().layers[0].q));
  for (auto [dir, q, why] : {std::tuple{&awq, quantization::gptq, "--quantization gptq does not match the checkpoint: its quantization_config is AWQ"},
                             {&ct, quantization::awq, "--quantization awq does not match the checkpoint: its quantization_config is compressed-tensors"},
                             {&awq, quantization::gguf, "--quantization gguf does not match the checkpoint: its quantization_config is AWQ"}}) {
    o.quant = q;
    auto m = model::load(dir->path(), o);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.err().code, errc::invalid_request);
    EXPECT_NE(m.err().message.find(why), std::string::npos) << m.err().message;
  }
  testing::temp_dir bf;
  auto spec = packed_spec("");
  ASSERT_TRUE(write_random_model(spec, bf.path()).ok());
  o.quant = quantization::awq;
  auto none = model::load(bf.path(), o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.err().message.find("it has no quantization_config"), std::string::npos) << none.err().message;
}

}  // namespace
}  // namespace llmesh::model
