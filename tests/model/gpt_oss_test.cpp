// GPT-OSS (GptOssForCausalLM; model/src/gpt_oss_experts.hpp): the fused experts of an MXFP4
// checkpoint held exactly as the checkpoint's values (this file's own decoding of OCP MXFP4, in
// double), the plain form of the same weights giving the same logits bit for bit, the config's
// fields, and broken checkpoints refused naming the tensor. The forward pass against the
// PyTorch reference is tests/cli/golden_test.cpp's gpt_oss_* cases; batch and chunk invariance
// and tensor/expert parallelism are engine_test.cpp's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmesh/model/engine.hpp"
#include "llmesh/model/random_model.hpp"
#include "llmesh/model/safetensors.hpp"
#include "llmesh/model/weights.hpp"
#include "checkpoint_edit.hpp"
#include "engine_runs.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using kernels::dtype;
using json = nlohmann::json;
using testing::temp_dir;

random_model_spec gpt_oss_spec(const std::string& packed) {
  random_model_spec s;
  s.arch = "gpt_oss";
  s.hidden = 64;
  s.intermediate = 64;  // tp 2 slices whole blocks of 32
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 16;
  s.vocab = 300;
  s.n_experts = 4;
  s.experts_per_token = 2;
  s.sliding_window = 4;
  s.dtype = dtype::bf16;
  s.seed = 31;
  s.packed = packed;
  return s;
}

/// OCP MXFP4: an e2m1 code (sign, two exponent bits, one mantissa bit) times 2^(scale − 127).
double mxfp4(uint8_t code, uint8_t scale) {
  const int e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
  return std::ldexp((code & 8) ? -mag : mag, static_cast<int>(scale) - 127);
}

/// Element (o, i) of expert e of a checkpoint's [E, out, in / 32, 16] blocks and [E, out, in / 32] scales.
double checkpoint_value(const tensor_view& blocks, const tensor_view& scales, size_t e, size_t o, size_t i) {
  const size_t out = blocks.shape[1], groups = blocks.shape[2];
  const auto* b = static_cast<const uint8_t*>(blocks.data) + ((e * out + o) * groups + i / 32) * 16;
  const uint8_t byte = b[(i % 32) / 2];
  const uint8_t code = i % 2 == 0 ? byte & 0xF : byte >> 4;
  return mxfp4(code, static_cast<const uint8_t*>(scales.data)[(e * out + o) * groups + i / 32]);
}

void edit_config(const temp_dir& dir, const std::function<void(json&)>& change) {
  std::ifstream in(dir / "config.json");
  json j = json::parse(in);
  change(j);
  std::ofstream(dir / "config.json") << j.dump(2);
}

std::string load_error(const temp_dir& dir) {
  auto m = model::load(dir.path());
  return m.ok() ? "(loaded)" : m.err().message;
}

TEST(GptOss, Mxfp4ExpertsHoldTheCheckpointsValuesExactly) {
  temp_dir dir;
  const auto spec = gpt_oss_spec("mxfp4");
  ASSERT_TRUE(write_random_model(spec, dir.path()).ok());
  auto m = model::load(dir.path());
  ASSERT_TRUE(m.ok()) << m.err().message;
  const auto& c = (*m)->config();
  EXPECT_EQ(c.arch, architecture::gpt_oss);
  EXPECT_TRUE(c.attn_sinks);
  EXPECT_TRUE(c.moe.biases);
  EXPECT_EQ(c.moe.swiglu_limit, 7.0f);
  EXPECT_EQ((*m)->quantized_weights(), "mxfp4");
  EXPECT_TRUE((*m)->holds_blocks_of_32());
  auto st = tensor_store::open(dir.path());
  ASSERT_TRUE(st.ok());
  const size_t E = 4, I = 64, H = 64;
  for (size_t layer = 0; layer < 2; ++layer) {
    const auto& lw = (*m)->weights().layers[layer];
    ASSERT_EQ(lw.experts.size(), E);
    ASSERT_EQ(lw.sinks.size(), 4u);
    ASSERT_EQ(lw.router_bias.size(), E);
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    auto gu_b = st->get_u8(p + "gate_up_proj_blocks"), gu_s = st->get_u8(p + "gate_up_proj_scales");
    auto dn_b = st->get_u8(p + "down_proj_blocks"), dn_s = st->get_u8(p + "down_proj_scales");
    auto gu_bias = st->get(p + "gate_up_proj_bias"), dn_bias = st->get(p + "down_proj_bias");
    ASSERT_TRUE(gu_b.ok() && gu_s.ok() && dn_b.ok() && dn_s.ok() && gu_bias.ok() && dn_bias.ok());
    for (size_t e = 0; e < E; ++e) {
      const auto& x = lw.experts[e];
      ASSERT_EQ(x.gate.type, dtype::mxfp4);
      ASSERT_EQ(x.gate.rows, I);
      ASSERT_EQ(x.gate.cols, H);
      ASSERT_EQ(x.down.rows, H);
      ASSERT_EQ(x.down.cols, I);
      for (size_t r = 0; r < I; ++r) {
        for (size_t i = 0; i < H; ++i) {  // gate: gate_up's even outputs, up: its odd ones
          ASSERT_EQ(kernels::load_as_f32(x.gate.data, x.gate.type, r * x.gate.ld() + i), checkpoint_value(*gu_b, *gu_s, e, 2 * r, i))
              << "layer " << layer << " expert " << e << " gate " << r << "," << i;
          ASSERT_EQ(kernels::load_as_f32(x.up.data, x.up.type, r * x.up.ld() + i), checkpoint_value(*gu_b, *gu_s, e, 2 * r + 1, i))
              << "layer " << layer << " expert " << e << " up " << r << "," << i;
        }
        EXPECT_EQ(x.gate_bias[r], kernels::load_as_f32(gu_bias->data, gu_bias->type, e * 2 * I + 2 * r));
        EXPECT_EQ(x.up_bias[r], kernels::load_as_f32(gu_bias->data, gu_bias->type, e * 2 * I + 2 * r + 1));
      }
      for (size_t o = 0; o < H; ++o) {
        for (size_t i = 0; i < I; ++i) {
          ASSERT_EQ(kernels::load_as_f32(x.down.data, x.down.type, o * x.down.ld() + i), checkpoint_value(*dn_b, *dn_s, e, o, i))
              << "layer " << layer << " expert " << e << " down " << o << "," << i;
        }
        EXPECT_EQ(x.down_bias[o], kernels::load_as_f32(dn_bias->data, dn_bias->type, e * H + o));
      }
    }
  }
}

// The BF16 re-releases hold HF's parameters ([E, in, out]); the same weights in that form must
// give the same logits, bit for bit (the kernels multiply the same floats in the same order).
TEST(GptOss, PlainFormGivesTheMxfp4FormsLogitsBitForBit) {
  temp_dir mx, plain;
  ASSERT_TRUE(write_random_model(gpt_oss_spec("mxfp4"), mx.path()).ok());
  ASSERT_TRUE(write_random_model(gpt_oss_spec("mxfp4"), plain.path()).ok());
  auto st = tensor_store::open(mx.path());
  ASSERT_TRUE(st.ok());
  testing::rewrite(plain, [&](tensor_spec& t) {
    if (t.name.ends_with("_scales")) return false;
    if (!t.name.ends_with("_blocks")) return true;
    const std::string base = t.name.substr(0, t.name.size() - 7);  // ...gate_up_proj or ...down_proj
    auto blocks = st->get_u8(base + "_blocks").value();
    auto scales = st->get_u8(base + "_scales").value();
    const size_t E = blocks.shape[0], out = blocks.shape[1], in = blocks.shape[2] * 32;
    t.name = base;
    t.type = dtype::bf16;
    t.int_bytes = 0;
    t.shape = {E, in, out};
    t.fill = [blocks, scales, E, out, in](std::span<uint8_t> bytes) {
      for (size_t e = 0; e < E; ++e)
        for (size_t i = 0; i < in; ++i)
          for (size_t o = 0; o < out; ++o) {
            const uint16_t h = kernels::f32_to_bf16(static_cast<float>(checkpoint_value(blocks, scales, e, o, i)));
            std::memcpy(bytes.data() + ((e * in + i) * out + o) * 2, &h, 2);
          }
    };
    return true;
  });
  edit_config(plain, [](json& j) { j.erase("quantization_config"); });
  auto m_mx = model::load(mx.path());
  auto m_plain = model::load(plain.path());
  ASSERT_TRUE(m_mx.ok()) << m_mx.err().message;
  ASSERT_TRUE(m_plain.ok()) << m_plain.err().message;
  EXPECT_EQ((*m_plain)->weights().layers[0].experts[0].gate.type, dtype::bf16);
  for (int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    auto e_mx = testing::engine_with(*m_mx, dtype::f32, tp);
    auto e_plain = testing::engine_with(*m_plain, dtype::f32, tp);
    const auto prompt = testing::prompt_of(19, 4);
    const auto a = testing::run(*e_mx, prompt, 7), b = testing::run(*e_plain, prompt, 7);
    ASSERT_EQ(a.size(), b.size());
    for (size_t s = 0; s < a.size(); ++s) EXPECT_TRUE(testing::same_bits(a[s], b[s])) << "step " << s;
  }
}

TEST(GptOss, ConfigFieldsAndDefaults) {
  temp_dir dir;
  ASSERT_TRUE(write_random_model(gpt_oss_spec(""), dir.path()).ok());
  auto c = load_config(dir.path());
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->moe.n_experts, 4u);
  EXPECT_EQ(c->moe.experts_per_token, 2u);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->o_bias);
  EXPECT_EQ(c->sliding_window, 4u);
  ASSERT_EQ(c->sliding_layers.size(), 2u);
  EXPECT_TRUE(c->sliding_layers[0]);  // layer_types: sliding, full
  EXPECT_FALSE(c->sliding_layers[1]);
  EXPECT_EQ(c->packed.kind, model_config::packed_config::method::none);
  // OpenAI's original config.json names the experts per token experts_per_token; GptOssConfig's
  // defaults: attention biases on, even layers sliding with a window of 128, head_dim 64.
  edit_config(dir, [](json& j) {
    j.erase("num_experts_per_tok");
    j["experts_per_token"] = 3;
    j.erase("attention_bias");
    j.erase("layer_types");
    j.erase("sliding_window");
    j.erase("head_dim");
    j.erase("swiglu_limit");
  });
  c = load_config(dir.path());
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->moe.experts_per_token, 3u);
  EXPECT_TRUE(c->o_bias);
  EXPECT_EQ(c->sliding_window, 128u);
  EXPECT_TRUE(c->sliding_layers[0]);
  EXPECT_FALSE(c->sliding_layers[1]);
  EXPECT_EQ(c->head_dim, 64u);
  EXPECT_EQ(c->moe.swiglu_limit, 7.0f);
  // Without rope_theta, rms_norm_eps and rope_scaling: GptOssConfig's 150000, 1e-5 and yarn
  // (factor 32 over 4096, betas 32 and 1, not truncated).
  edit_config(dir, [](json& j) {
    j.erase("rope_theta");
    j.erase("rms_norm_eps");
    j.erase("rope_scaling");
  });
  c = load_config(dir.path());
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->rope.theta, 150000.0);
  EXPECT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_TRUE(c->rope.yarn);
  EXPECT_EQ(c->rope.factor, 32.0);
  EXPECT_EQ(c->rope.original_max_position, 4096.0);
  EXPECT_FALSE(c->rope.yarn_truncate);
  edit_config(dir, [](json& j) { j["swiglu_alpha"] = 1.5; });
  c = load_config(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.err().message.find("swiglu_alpha"), std::string::npos) << c.err().message;
  // quant_method mxfp4 is GPT-OSS's only.
  temp_dir llama;
  random_model_spec s;
  ASSERT_TRUE(write_random_model(s, llama.path()).ok());
  edit_config(llama, [](json& j) { j["quantization_config"] = {{"quant_method", "mxfp4"}}; });
  c = load_config(llama.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.err().code, errc::unsupported);
  EXPECT_NE(c.err().message.find("mxfp4"), std::string::npos) << c.err().message;
}

TEST(GptOss, BrokenCheckpointsAreRefusedNamingTheTensor) {
  const std::string scales = "model.layers.1.mlp.experts.down_proj_scales";
  for (uint8_t bad : {uint8_t{255}, uint8_t{253}}) {
    temp_dir dir;
    ASSERT_TRUE(write_random_model(gpt_oss_spec("mxfp4"), dir.path()).ok());
    testing::rewrite(dir, [&](tensor_spec& t) {
      if (t.name == scales) {
        auto fill = t.fill;
        t.fill = [fill, bad](std::span<uint8_t> out) {
          fill(out);
          out[out.size() / 2] = bad;
        };
      }
      return true;
    });
    const std::string msg = load_error(dir);
    EXPECT_NE(msg.find(scales), std::string::npos) << msg;
    EXPECT_NE(msg.find(bad == 255 ? "NaN" : "float32"), std::string::npos) << msg;
  }
  {  // MXFP4 tensors without the config that says so
    temp_dir dir;
    ASSERT_TRUE(write_random_model(gpt_oss_spec("mxfp4"), dir.path()).ok());
    edit_config(dir, [](json& j) { j.erase("quantization_config"); });
    const std::string msg = load_error(dir);
    EXPECT_NE(msg.find("gate_up_proj_blocks"), std::string::npos) << msg;
    EXPECT_NE(msg.find("quant_method mxfp4"), std::string::npos) << msg;
  }
  for (const std::string name : {"model.layers.0.mlp.experts.gate_up_proj_blocks", "model.layers.0.self_attn.sinks",
                                 "model.layers.1.mlp.router.bias", "model.layers.1.mlp.experts.down_proj_bias"}) {
    SCOPED_TRACE(name);
    temp_dir dir;
    ASSERT_TRUE(write_random_model(gpt_oss_spec("mxfp4"), dir.path()).ok());
    testing::rewrite(dir, [&](tensor_spec& t) { return t.name != name; });
    const std::string msg = load_error(dir);
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
  }
  {  // blocks of the wrong shape
    temp_dir dir;
    ASSERT_TRUE(write_random_model(gpt_oss_spec("mxfp4"), dir.path()).ok());
    testing::rewrite(dir, [&](tensor_spec& t) {
      if (t.name == "model.layers.0.mlp.experts.down_proj_blocks") t.shape = {4, 32, 6, 16};  // 64 outputs' bytes as 32
      return true;
    });
    const std::string msg = load_error(dir);
    EXPECT_NE(msg.find("down_proj_blocks"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace llmesh::model
