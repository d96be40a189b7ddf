// FP8 checkpoints (model/src/fp8_weights.hpp): each F8_E4M3 layer becomes an fp8 matrix
// holding exactly e4m3(q) · s for its scale per tensor, output, group or block; the configs'
// variants read or refused by name; broken tensors refused naming them. The values are checked
// against this file's own decoding of the codes (the OCP e4m3fn definition, in double); the
// forward pass against the PyTorch reference in tests/cli/golden_test.cpp (*_fp8*).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmesh/kernels/quantize.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/random_model.hpp"
#include "llmesh/model/safetensors.hpp"
#include "checkpoint_edit.hpp"
#include "engine_runs.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using kernels::dtype;
using json = nlohmann::json;

random_model_spec fp8_spec(const std::string& packed, size_t block = 32) {
  random_model_spec s;
  s.hidden = 64;
  s.intermediate = 160;
  s.n_layers = 1;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.vocab = 300;
  s.dtype = dtype::bf16;
  s.seed = 23;
  s.packed = packed;
  s.group_size = block;
  return s;
}

/// The OCP e4m3fn value of code c.
double e4m3(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (c & 0x80) ? -mag : mag;
}

/// Layer x's weights [out, in] decoded from the checkpoint: code times its scale (by the scale
/// tensor's shape: one, one per output, or one per block of `block` × `block`; `group`: one
/// per `block` inputs of an output).
std::vector<float> decoded(const tensor_store& st, const std::string& x, size_t block, bool group = false) {
  const auto w = st.get(x + ".weight").value();
  const std::string sname = st.contains(x + ".weight_scale_inv") ? x + ".weight_scale_inv" : x + ".weight_scale";
  const auto s = st.get(sname).value();
  const size_t out = w.shape[0], in = w.shape[1];
  std::vector<float> v(out * in);
  for (size_t o = 0; o < out; ++o) {
    for (size_t i = 0; i < in; ++i) {
      size_t at = 0;
      if (group) at = o * ((in + block - 1) / block) + i / block;
      else if (s.elements() == out) at = o;
      else if (s.elements() > 1) at = (o / block) * ((in + block - 1) / block) + i / block;
      const float scale = kernels::load_as_f32(s.data, s.type, at);
      const double exact = e4m3(static_cast<const uint8_t*>(w.data)[o * in + i]) * static_cast<double>(scale);
      v[o * in + i] = static_cast<float>(exact);
    }
  }
  return v;
}

std::vector<float> held(const weight_matrix& w) {
  std::vector<float> out(w.rows * w.cols);
  for (size_t r = 0; r < w.rows; ++r) {
    for (size_t c = 0; c < w.cols; ++c) out[r * w.cols + c] = kernels::load_as_f32(w.data, w.type, r * w.ld() + c);
  }
  return out;
}

TEST(Fp8Weights, EveryLayoutIsHeldExactlyAsCodeTimesScale) {
  using method = model_config::packed_config::method;
  using scales = model_config::packed_config::fp8_scales;
  // fp8-block with blocks of 96: rows and columns that end in a partial block (160 and 64).
  for (auto [packed, block, kind, how] : {std::tuple{"fp8", size_t{32}, method::fp8, scales::tensor},
                                          {"fp8-block", size_t{96}, method::fp8, scales::block},
                                          {"ct-fp8", size_t{32}, method::compressed, scales::channel},
                                          {"ct-fp8-block", size_t{64}, method::compressed, scales::block},
                                          {"ct-fp8-group", size_t{64}, method::compressed, scales::group}}) {
    SCOPED_TRACE(packed);
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(fp8_spec(packed, block), dir.path()).ok());
    auto m = model::load(dir.path());
    ASSERT_TRUE(m.ok()) << m.err().message;
    EXPECT_EQ((*m)->config().packed.kind, kind);
    EXPECT_TRUE((*m)->config().packed.float8);
    EXPECT_EQ((*m)->config().packed.scales, how);
    EXPECT_EQ((*m)->quantized_weights(), "fp8");
    auto st = tensor_store::open(dir.path());
    ASSERT_TRUE(st.ok());
    const auto& l = (*m)->weights().layers[0];
    for (auto [x, w] : {std::pair{"model.layers.0.self_attn.q_proj", &l.q}, {"model.layers.0.self_attn.k_proj", &l.k},
                        {"model.layers.0.self_attn.o_proj", &l.o}, {"model.layers.0.mlp.down_proj", &l.down},
                        {"model.layers.0.mlp.up_proj", &l.up}}) {
      SCOPED_TRACE(x);
      ASSERT_EQ(w->type, dtype::fp8);
      const auto want = decoded(*st, x, block, how == scales::group);
      const auto got = held(*w);
      ASSERT_EQ(got.size(), want.size());
      size_t differ = 0, nonzero = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        differ += got[i] != want[i];
        nonzero += got[i] != 0.0f;
      }
      EXPECT_EQ(differ, 0u) << "of " << got.size();
      EXPECT_GT(nonzero, got.size() / 2);
      EXPECT_EQ(w->bytes(), w->rows * (w->cols / 32) * 36);  // 1.125 bytes per weight
    }
    EXPECT_EQ((*m)->weights().embed.type, dtype::bf16);  // the embedding and head are not FP8
    EXPECT_EQ((*m)->weights().lm_head.type, dtype::bf16);
  }
}

/// A random FP8 model whose config.json's quantization_config is replaced (null: removed).
std::string with_quantization_config(const testing::temp_dir& dir, const json& q, const std::string& packed = "fp8-block") {
  EXPECT_TRUE(write_random_model(fp8_spec(packed), dir.path()).ok());
  json cfg = json::parse(testing::read_text(dir / "config.json"));
  if (q.is_null()) cfg.erase("quantization_config");
  else cfg["quantization_config"] = q;
  testing::write_text(dir / "config.json", cfg.dump());
  return dir.path();
}

json ct_fp8(const std::function<void(json&)>& change) {
  json q = {{"quant_method", "compressed-tensors"},
            {"format", "float-quantized"},
            {"config_groups",
             {{"group_0",
               {{"targets", {"Linear"}},
                {"weights", {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"strategy", "channel"}}},
                {"input_activations", {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}}}}}}}};
  change(q);
  return q;
}

TEST(Fp8Weights, ConfigsReadOrRefusedByName) {
  const std::pair<json, std::string> refused[] = {
      {{{"quant_method", "fp8"}, {"fmt", "e5m2"}}, "fp8 fmt 'e5m2' is not supported"},
      {{{"quant_method", "fp8"}, {"weight_block_size", {128, 48}}}, "'weight_block_size' columns of 48 (not a multiple of 32)"},
      {ct_fp8([](json& q) { q["config_groups"]["group_0"]["weights"]["num_bits"] = 4; }), "float weights of other than 8 bits"},
      {ct_fp8([](json& q) { q["config_groups"]["group_0"]["weights"]["symmetric"] = false; }), "asymmetric float weights"},
      {ct_fp8([](json& q) { q["config_groups"]["group_0"]["weights"]["strategy"] = "tensor_group"; }), "strategy 'tensor_group'"},
      {ct_fp8([](json& q) {
         q["config_groups"]["group_0"]["weights"]["strategy"] = "group";
         q["config_groups"]["group_0"]["weights"]["group_size"] = 16;
       }),
       "FP8 group_size 16 (not a multiple of 32)"},
      {ct_fp8([](json& q) { q["config_groups"]["group_0"]["input_activations"]["type"] = "int"; }), "'int' input_activations"},
      {ct_fp8([](json& q) { q["config_groups"]["group_0"]["output_activations"] = {{"num_bits", 8}}; }), "output_activations"},
      {ct_fp8([](json& q) { q["kv_cache_scheme"] = {{"num_bits", 8}, {"type", "int"}}; }), "kv_cache_scheme: type 'int'"},
      {ct_fp8([](json& q) { q["format"] = "naive-quantized"; q["config_groups"]["group_0"]["weights"]["type"] = "int"; }),
       "format 'naive-quantized' with int weights"},
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
      {{{"quant_method", "fp8"}, {"activation_scheme", "sometimes"}}, "'activation_scheme' must be dynamic or static"},
      {{{"quant_method", "fp8"}, {"weight_block_size", {128}}}, "'weight_block_size' must be two positive integers"},
      {{{"quant_method", "fp8"}, {"weight_block_size", {0, 128}}}, "'weight_block_size' must be two positive integers"},
      {ct_fp8([](json& q) { q["config_groups"]["group_0"]["weights"]["strategy"] = "block"; }), "strategy 'block' needs 'block_structure'"},
  };
  for (const auto& [q, why] : bad) {
    SCOPED_TRACE(q.dump());
    testing::temp_dir dir;
    auto m = model::load(with_quantization_config(dir, q));
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.err().code, errc::invalid_request);
    EXPECT_NE(m.err().message.find(why), std::string::npos) << m.err().message;
  }
  // F8_E4M3 tensors without an FP8 quantization_config say so; so do AWQ tensors with one.
  testing::temp_dir none;
  auto unset = model::load(with_quantization_config(none, nullptr));
  ASSERT_FALSE(unset.ok());
  EXPECT_NE(unset.err().message.find("is F8_E4M3, but config.json has no FP8 quantization_config"), std::string::npos)
      << unset.err().message;
  testing::temp_dir awq;
  auto packed = model::load(with_quantization_config(awq, {{"quant_method", "fp8"}}, "awq"));
  ASSERT_FALSE(packed.ok());
  EXPECT_NE(packed.err().message.find("is packed, but config.json's quantization_config is FP8"), std::string::npos)
      << packed.err().message;
  // Meta's fbgemm_fp8 (Llama 3.1 FP8): F8_E4M3 weights with a scale per output.
  testing::temp_dir fbgemm;
  auto meta = model::load(with_quantization_config(
      fbgemm, {{"quant_method", "fbgemm_fp8"}, {"activation_scale_ub", 1200.0}, {"modules_to_not_convert", {"lm_head"}}}, "ct-fp8"));
  ASSERT_TRUE(meta.ok()) << meta.err().message;
  EXPECT_EQ((*meta)->config().packed.kind, model_config::packed_config::method::fp8);
  EXPECT_EQ((*meta)->weights().layers[0].down.type, dtype::fp8);
  // A per-tensor config whose scales are per output reads them per output (the shape decides).
  testing::temp_dir channel;
  auto m = model::load(with_quantization_config(channel, {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}}, "ct-fp8"));
  ASSERT_TRUE(m.ok()) << m.err().message;
  EXPECT_EQ((*m)->weights().layers[0].q.type, dtype::fp8);
}

TEST(Fp8Weights, BrokenTensorsAreRefusedNamingThem) {
  const std::string q = "model.layers.0.self_attn.q_proj";
  auto fill_with = [](tensor_spec& s, std::function<void(std::span<uint8_t>)> after) {
    auto before = s.fill;
    s.fill = [before, after](std::span<uint8_t> out) {
      before(out);
      after(out);
    };
  };
  struct broken {
    std::string packed;
    std::function<bool(tensor_spec&)> change;
    std::string why;
  };
  const std::vector<broken> cases = {
      {"fp8-block", [&](tensor_spec& s) { return s.name != q + ".weight_scale_inv"; }, "missing tensor '" + q + ".weight_scale'"},
      {"fp8-block", [&](tensor_spec& s) {
         if (s.name == q + ".weight_scale_inv") s.shape = {2, 1};
         return true;
       }, "tensor '" + q + ".weight_scale_inv' has shape [2, 1], " + q + ".weight [64, 64] needs [2, 2]"},
      {"ct-fp8", [&](tensor_spec& s) {
         if (s.name == q + ".weight_scale") s.shape = {32, 2};
         return true;
       }, "tensor '" + q + ".weight_scale' has shape [32, 2]"},
      {"fp8", [&](tensor_spec& s) {
         if (s.name == q + ".weight") fill_with(s, [](std::span<uint8_t> b) { b[70] = 0xff; });
         return true;
       }, "tensor '" + q + ".weight' holds a NaN (row 1)"},
      {"fp8", [&](tensor_spec& s) {
         if (s.name == q + ".weight_scale") fill_with(s, [](std::span<uint8_t> b) {
           const float inf = INFINITY;
           std::memcpy(b.data(), &inf, 4);
         });
         return true;
       }, "tensor '" + q + ".weight_scale' holds inf"},
      {"fp8", [&](tensor_spec& s) {
         if (s.name == q + ".weight") s.type = dtype::f8_e5m2;
         return true;
       }, "tensor '" + q + ".weight' is F8_E5M2"},
      {"fp8", [&](tensor_spec& s) {
         if (s.name == q + ".weight_scale") s.type = dtype::f8_e4m3;
         return true;
       }, "tensor '" + q + ".weight_scale' is an 8-bit float; FP8 scales must be F32, BF16 or F16"},
      {"fp8", [&](tensor_spec& s) {
         if (s.name == q + ".weight") s.shape = {64 * 64};
         return true;
       }, "tensor '" + q + ".weight' (F8_E4M3) has shape [4096], not a matrix"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.why);
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(fp8_spec(c.packed), dir.path()).ok());
    rewrite(dir, c.change);
    auto m = model::load(dir.path());
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.err().message.find(c.why), std::string::npos) << m.err().message;
  }
}

TEST(Fp8Weights, Tp2GivesTp1sLogitsAndInt8KeepsTheRuleOverTheDecodedValues) {
  // Blocks of 96 (rank 1's rows and columns start inside one); intermediate 192: each rank's
  // share of it and of the attention width falls on blocks of 32. Llama, and Phi-3's fused
  // q/k/v and gate/up.
  for (const std::string arch : {"phi3", "llama"}) {
    SCOPED_TRACE(arch);
    testing::temp_dir dir;
    auto spec = fp8_spec("fp8-block", 96);
    spec.arch = arch;
    spec.n_layers = 2;
    spec.intermediate = 192;
    ASSERT_TRUE(write_random_model(spec, dir.path()).ok());
    auto m = model::load(dir.path());
    ASSERT_TRUE(m.ok()) << m.err().message;
    EXPECT_EQ((*m)->weights().layers[0].q.type, dtype::fp8);
    // Every row of a run (the prompt's logits, then 5 greedy steps) at tp 2 within 1e-4 of
    // tp 1's; and a sequence's bits the same whole, in chunks of 3 beside 2 neighbours.
    std::vector<std::vector<std::vector<float>>> runs;
    for (int tp : {1, 2}) {
      engine_options o;
      o.tp = tp;
      o.threads = 2;
      o.kv_tokens = 256;
      auto e = engine::create(*m, o);
      ASSERT_TRUE(e.ok()) << e.err().message;
      const auto prompt = testing::prompt_of(11, 1);
      runs.push_back(testing::run(**e, prompt, prompt.size()));
      EXPECT_TRUE(testing::same_rows(runs.back(), testing::run(**e, prompt, 3, 2))) << "tp " << tp;
    }
    for (size_t row = 0; row < runs[0].size(); ++row) {
      float max_abs = 0, max_diff = 0;
      for (size_t i = 0; i < runs[0][row].size(); ++i) {
        ASSERT_TRUE(std::isfinite(runs[0][row][i]) && std::isfinite(runs[1][row][i])) << row << " " << i;
        max_abs = std::max(max_abs, std::fabs(runs[0][row][i]));
        max_diff = std::max(max_diff, std::fabs(runs[0][row][i] - runs[1][row][i]));
      }
      EXPECT_GT(max_abs, 0.0f);
      EXPECT_LT(max_diff, 1e-4f * max_abs) << "row " << row;
    }
  }
  // A split whose share is not whole blocks of 32 (intermediate 160: rank 1 from 80) is refused.
  testing::temp_dir odd;
  ASSERT_TRUE(write_random_model(fp8_spec("fp8-block"), odd.path()).ok());
  auto m160 = model::load(odd.path());
  ASSERT_TRUE(m160.ok());
  engine_options o2;
  o2.tp = 2;
  o2.threads = 2;
  o2.kv_tokens = 64;
  auto refused = engine::create(*m160, o2);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.err().message.find("fp8 weights (--quantization int8 or fp8"), std::string::npos) << refused.err().message;
  EXPECT_NE(refused.err().message.find("multiple of 32"), std::string::npos) << refused.err().message;

  testing::temp_dir dir;
  auto spec = fp8_spec("fp8-block");
  spec.n_layers = 2;
  ASSERT_TRUE(write_random_model(spec, dir.path()).ok());
  auto m = model::load(dir.path());
  ASSERT_TRUE(m.ok()) << m.err().message;
  // --quantization int8: each fp8 matrix becomes the int8 blocks of its decoded values.
  load_options o;
  o.quant = quantization::int8;
  auto eight = model::load(dir.path(), o);
  ASSERT_TRUE(eight.ok()) << eight.err().message;
  EXPECT_EQ((*eight)->quantized_weights(), "int8");
  const auto& f = (*m)->weights().layers[1];
  const auto& q = (*eight)->weights().layers[1];
  for (auto [x, y] : {std::pair{&f.q, &q.q}, {&f.down, &q.down}}) {
    ASSERT_EQ(x->type, dtype::fp8);
    ASSERT_EQ(y->type, dtype::q8);
    const auto values = held(*x);
    std::vector<uint8_t> want(kernels::dtype_bytes(dtype::q8, x->rows * x->ld()));
    ASSERT_TRUE(kernels::quantize_q8(values.data(), dtype::f32, x->rows, x->cols, want.data()).ok());
    EXPECT_EQ(0, std::memcmp(want.data(), y->data, want.size()));
  }
}

TEST(Fp8Weights, VllmQuantizationFp8NamesAnFp8Checkpoint) {
  EXPECT_EQ(parse_quantization("fp8").value(), quantization::fp8);
  EXPECT_EQ(quantization_name(quantization::fp8), "fp8");
  EXPECT_EQ(parse_quantization("fbgemm_fp8").err().code, errc::unsupported);
  testing::temp_dir fp8, ct, plain;
  ASSERT_TRUE(write_random_model(fp8_spec("fp8"), fp8.path()).ok());
  ASSERT_TRUE(write_random_model(fp8_spec("ct-fp8"), ct.path()).ok());
  ASSERT_TRUE(write_random_model(fp8_spec(""), plain.path()).ok());
  load_options o;
  o.quant = quantization::fp8;
  auto m = model::load(fp8.path(), o);
  ASSERT_TRUE(m.ok()) << m.err().message;
  EXPECT_EQ((*m)->quant(), quantization::fp8);
  EXPECT_EQ((*m)->quantized_weights(), "fp8");
  auto other = model::load(ct.path(), o);  // compressed-tensors FP8 is named compressed-tensors, as in vLLM
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.err().message.find("--quantization fp8 does not match the checkpoint: its quantization_config is compressed-tensors"),
            std::string::npos)
      << other.err().message;
  o.quant = quantization::compressed_tensors;
  EXPECT_TRUE(model::load(ct.path(), o).ok());
  o.quant = quantization::fp8;
  auto online = model::load(plain.path(), o);  // vLLM's online FP8 (below)
  ASSERT_TRUE(online.ok()) << online.err().message;
  EXPECT_EQ((*online)->quantized_weights(), "fp8");
}

TEST(Fp8Weights, OnlineFp8QuantizesEachProjectionWithOneScaleAsVllm) {
  // --quantization fp8 on a BF16 checkpoint: every projection (not the LM head, the embedding
  // or a router) becomes fp8 with scale max|w| / 448 over vLLM's fused layer (q, k and v; gate
  // and up; o and down alone) and codes e4m3(w · (1 / scale)); --dtype float32 then casts what
  // is left.
  testing::temp_dir dir;
  auto spec = fp8_spec("");
  spec.n_layers = 2;
  spec.intermediate = 192;  // tp 2: each rank's share of down_proj's columns is whole blocks
  ASSERT_TRUE(write_random_model(spec, dir.path()).ok());
  // Random matrices of one input width share their largest magnitude: halve k, o and up so
  // that a shared scale is not each one's own (and o's and up's own are not q's and gate's),
  // and give gate a large weight in row 0 and down one in column 0 (rank 0's part of each).
  rewrite(dir, [](tensor_spec& s) {
    const bool halve = s.name.ends_with("k_proj.weight") || s.name.ends_with("o_proj.weight") || s.name.ends_with("up_proj.weight");
    const bool outlier = s.name.ends_with("layers.0.mlp.gate_proj.weight") || s.name.ends_with("layers.0.mlp.down_proj.weight");
    if (halve || outlier) {
      s.fill = [before = s.fill, halve](std::span<uint8_t> out) {
        before(out);
        for (size_t i = 0; halve && i + 1 < out.size(); i += 2) {
          uint16_t h;
          std::memcpy(&h, out.data() + i, 2);
          h = kernels::f32_to_bf16(kernels::bf16_to_f32(h) * 0.5f);
          std::memcpy(out.data() + i, &h, 2);
        }
        if (!halve) {
          const uint16_t big = kernels::f32_to_bf16(1.5f);
          std::memcpy(out.data(), &big, 2);  // row 0, column 0
        }
      };
    }
    return true;
  });
  auto plain = model::load(dir.path());
  ASSERT_TRUE(plain.ok());
  load_options o;
  o.quant = quantization::fp8;
  o.dtype = dtype::f32;
  auto m = model::load(dir.path(), o);
  ASSERT_TRUE(m.ok()) << m.err().message;
  EXPECT_EQ((*m)->quant(), quantization::fp8);
  EXPECT_EQ((*m)->weights().lm_head.type, dtype::f32);
  EXPECT_EQ((*m)->weights().embed.type, dtype::f32);
  for (size_t layer = 0; layer < 2; ++layer) {
    const auto& p = (*plain)->weights().layers[layer];
    const auto& q = (*m)->weights().layers[layer];
    auto amax_of = [](std::initializer_list<const weight_matrix*> ws) {
      float m = 0.0f;
      for (const weight_matrix* w : ws) {
        for (float v : held(*w)) m = std::max(m, std::fabs(v));
      }
      return m;
    };
    const float qkv = amax_of({&p.q, &p.k, &p.v}), gate_up = amax_of({&p.gate, &p.up});
    EXPECT_EQ(qkv, 2.0f * amax_of({&p.k}));
    EXPECT_GT(gate_up, amax_of({&p.up}));  // up's shared scale is not its own
    if (layer == 0) EXPECT_EQ(gate_up, 1.5f);
    for (auto [from, to, amax] : {std::tuple{&p.q, &q.q, qkv}, {&p.k, &q.k, qkv}, {&p.v, &q.v, qkv}, {&p.o, &q.o, amax_of({&p.o})},
                                  {&p.gate, &q.gate, gate_up}, {&p.up, &q.up, gate_up}, {&p.down, &q.down, amax_of({&p.down})}}) {
      ASSERT_EQ(from->type, dtype::bf16);
      ASSERT_EQ(to->type, dtype::fp8);
      const auto w = held(*from);
      const float scale = amax / 448.0f, inverse = 1.0f / scale;
      const auto* blocks = static_cast<const uint8_t*>(to->data);
      size_t differ = 0;
      for (size_t r = 0; r < to->rows; ++r) {
        for (size_t c = 0; c < to->cols; ++c) {
          const uint8_t* block = blocks + kernels::dtype_offset(dtype::fp8, r * to->ld() + c / 32 * 32);
          float s;
          std::memcpy(&s, block, 4);
          const uint8_t code = block[4 + c % 32];
          differ += s != scale || code != kernels::f32_to_f8_e4m3(w[r * to->cols + c] * inverse);
        }
      }
      EXPECT_EQ(differ, 0u);
    }
  }
  // Held for rank 1 of two, gate's rows and down's columns keep the whole matrix's scale,
  // though the large weight is in rank 0's part.
  load_options r = o;
  r.ranks = rank_set{2, false, {1}};
  auto part = model::load(dir.path(), r);
  ASSERT_TRUE(part.ok()) << part.err().message;
  auto scale_at = [](const weight_matrix& w, size_t row, size_t col) {
    float s;
    std::memcpy(&s, static_cast<const uint8_t*>(w.data) + kernels::dtype_offset(dtype::fp8, row * w.ld() + col), 4);
    return s;
  };
  const auto& whole = (*m)->weights().layers[0];
  const auto& held1 = (*part)->weights().layers[0];
  EXPECT_EQ(scale_at(whole.gate, 0, 0), 1.5f / 448.0f);
  EXPECT_EQ(scale_at(held1.gate, spec.intermediate - 1, 0), 1.5f / 448.0f);
  EXPECT_EQ(scale_at(whole.down, 0, 0), 1.5f / 448.0f);
  const weight_matrix* cols = (*part)->column_slice(held1.down, spec.intermediate / 2);
  ASSERT_NE(cols, nullptr);
  EXPECT_EQ(scale_at(*cols, 0, 0), 1.5f / 448.0f);
  EXPECT_EQ(scale_at(*cols, spec.hidden - 1, 0), 1.5f / 448.0f);
}

TEST(Fp8Weights, OnlineFp8RoundsThroughANarrowerDtypeFirst) {
  // --dtype float16 --quantization fp8 on a float32 checkpoint: vLLM quantizes the float16
  // copy, so each weight (and the scale's maximum) is rounded to float16 first.
  testing::temp_dir dir;
  auto spec = fp8_spec("");
  spec.dtype = dtype::f32;
  ASSERT_TRUE(write_random_model(spec, dir.path()).ok());
  auto plain = model::load(dir.path());
  ASSERT_TRUE(plain.ok());
  load_options o;
  o.quant = quantization::fp8;
  o.dtype = dtype::f16;
  auto m = model::load(dir.path(), o);
  ASSERT_TRUE(m.ok()) << m.err().message;
  EXPECT_EQ((*m)->weights().lm_head.type, dtype::f16);  // cast after
  const auto& from = (*plain)->weights().layers[0].o;
  const auto& to = (*m)->weights().layers[0].o;
  ASSERT_EQ(to.type, dtype::fp8);
  auto through = [](float w) { return kernels::f16_to_f32(kernels::f32_to_f16(w)); };
  const auto w = held(from);
  float amax = 0.0f, raw = 0.0f;
  for (float v : w) {
    amax = std::max(amax, std::fabs(through(v)));
    raw = std::max(raw, std::fabs(v));
  }
  EXPECT_NE(amax, raw);  // the float32 maximum is no float16: the scale tells the two apart
  const float scale = amax / 448.0f, inverse = 1.0f / scale;
  size_t differ = 0;
  for (size_t r = 0; r < to.rows; ++r) {
    for (size_t c = 0; c < to.cols; ++c) {
      const uint8_t* block = static_cast<const uint8_t*>(to.data) + kernels::dtype_offset(dtype::fp8, r * to.ld() + c / 32 * 32);
      float s;
      std::memcpy(&s, block, 4);
      differ += s != scale || block[4 + c % 32] != kernels::f32_to_f8_e4m3(through(w[r * to.cols + c]) * inverse);
    }
  }
  EXPECT_EQ(differ, 0u);
}

}  // namespace
}  // namespace llmesh::model
