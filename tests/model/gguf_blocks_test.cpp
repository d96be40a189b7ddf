// GGUF block formats and mixtures of experts (gguf_tensors.cpp, gguf_model.cpp): Q8_0 and
// IQ4_NL taken exactly as int8, Q4_0 and Q4_1 as int4, the K-quants and IQ4_XS kept as the file's blocks, tensor-
// parallel slices that cut a super-block held as int8, llama.cpp's stacked expert tensors as
// one matrix per expert. The engine's outputs on converted files are checked against the
// PyTorch reference in tests/cli/golden_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "gguf_test_util.hpp"
#include "llmesh/kernels/dtype.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/gguf.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model {
namespace {

using namespace gguf_testing;

/// The raw bytes of float32 values (a ggml F32 tensor's).
std::string f32_bytes(const std::vector<float>& v) {
  std::string b(v.size() * 4, '\0');
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

/// A one-layer Llama of hidden 32 and vocabulary 8 (llama_shape(w, 32, 1, 32, 2, 1)) whose
/// tensors are 0.5 everywhere but ffn_gate and ffn_up, given as ggml blocks of `gate_type` and
/// `up_type`, and the embedding (the tied LM head), when `embd` is given, as `embd_type`.
void one_layer(gguf_writer& w, uint32_t gate_type, const std::string& gate, uint32_t up_type, const std::string& up,
               uint32_t embd_type = ggml::f32, const std::string& embd = {}) {
  llama_shape(w, 32, 1, 32, 2, 1);
  auto zeros = [](size_t n) { return std::vector<float>(n, 0.5f); };
  w.tensor("token_embd.weight", embd_type, {32, 8}, embd.empty() ? f32_bytes(zeros(256)) : embd);
  w.tensor_f32("output_norm.weight", {32}, zeros(32));
  w.tensor_f32("blk.0.attn_norm.weight", {32}, zeros(32));
  w.tensor_f32("blk.0.ffn_norm.weight", {32}, zeros(32));
  w.tensor_f32("blk.0.attn_q.weight", {32, 32}, zeros(1024));
  w.tensor_f32("blk.0.attn_k.weight", {32, 16}, zeros(512));
  w.tensor_f32("blk.0.attn_v.weight", {32, 16}, zeros(512));
  w.tensor_f32("blk.0.attn_output.weight", {32, 32}, zeros(1024));
  w.tensor("blk.0.ffn_gate.weight", gate_type, {32, 32}, gate);
  w.tensor("blk.0.ffn_up.weight", up_type, {32, 32}, up);
  w.tensor_f32("blk.0.ffn_down.weight", {32, 32}, zeros(1024));
}

TEST(GgufModel, Q8_0AndIq4NlBlocksAreTakenExactlyAndInt8KeepsThem) {
  // One Q8_0 matrix: its values are d * q with d the block's float16 scale, bit for bit; one
  // IQ4_NL matrix: d * iq4nl_values[index], likewise (both held as int8 blocks).
  temp_dir dir;
  gguf_writer w;  // hidden 32: whole Q8_0 rows
  const uint16_t d = kernels::f32_to_f16(0.0123f);
  std::string blocks;
  for (int r = 0; r < 32; ++r) {
    blocks.append(reinterpret_cast<const char*>(&d), 2);
    for (int j = 0; j < 32; ++j) blocks.push_back(static_cast<char>(static_cast<int8_t>((r * 7 + j * 13) % 255 - 127)));
  }
  std::string nl;  // IQ4_NL: d, then 16 bytes: element j's index the low nibble of byte j % 16, or the high (j ≥ 16)
  auto nl_index = [](size_t r, size_t j) { return j < 16 ? (r + j) % 16 : (r * 3 + j) % 16; };
  for (size_t r = 0; r < 32; ++r) {
    nl.append(reinterpret_cast<const char*>(&d), 2);
    for (size_t j = 0; j < 16; ++j) nl.push_back(static_cast<char>(nl_index(r, j) | nl_index(r, j + 16) << 4));
  }
  one_layer(w, ggml::q8_0, blocks, ggml::iq4_nl, nl);
  const std::string path = write(w, dir, "q8.gguf");
  for (auto q : {quantization::none, quantization::int8}) {
    load_options opt;
    opt.quant = q;
    auto loaded = model::load(path, opt);
    ASSERT_TRUE(loaded.ok()) << loaded.err().message;
    const weight_matrix& g = (*loaded)->weights().layers[0].gate;
    ASSERT_EQ(g.type, kernels::dtype::q8);
    for (size_t r = 0; r < 32; ++r) {
      for (size_t j = 0; j < 32; ++j) {
        const auto qv = static_cast<int8_t>((r * 7 + j * 13) % 255 - 127);
        ASSERT_EQ(kernels::load_as_f32(g.data, g.type, r * 32 + j), static_cast<float>(qv) * kernels::f16_to_f32(d));
      }
    }
    const weight_matrix& u = (*loaded)->weights().layers[0].up;
    ASSERT_EQ(u.type, kernels::dtype::q8);
    for (size_t r = 0; r < 32; ++r) {
      for (size_t j = 0; j < 32; ++j) {
        const float want = static_cast<float>(kernels::iq4nl_values[nl_index(r, j)]) * kernels::f16_to_f32(d);
        ASSERT_EQ(kernels::load_as_f32(u.data, u.type, r * 32 + j), want) << "row " << r << " col " << j;
      }
    }
  }
}

TEST(GgufModel, Q4_0AndQ4_1BlocksAreHeldAsInt4Exactly) {
  // Q4_0's values (q − 8)·d and Q4_1's q·d + min (one rounding, as ggml's), bit for bit, in
  // int4 blocks of the file's nibbles; --quantization int8 takes Q4_0's exactly (q − 8 with
  // scale d) and Q4_1's by the rule.
  temp_dir dir;
  gguf_writer w;
  const uint16_t d = kernels::f32_to_f16(0.0123f), mn = kernels::f32_to_f16(-0.0937f);
  auto nibble = [](size_t r, size_t j) { return static_cast<int>((r * 5 + j * 3) % 16); };
  std::string q40, q41;
  for (size_t r = 0; r < 32; ++r) {
    q40.append(reinterpret_cast<const char*>(&d), 2);
    q41.append(reinterpret_cast<const char*>(&d), 2);
    q41.append(reinterpret_cast<const char*>(&mn), 2);
    for (size_t j = 0; j < 16; ++j) {
      const char byte = static_cast<char>(nibble(r, j) | nibble(r, j + 16) << 4);
      q40.push_back(byte);
      q41.push_back(byte);
    }
  }
  one_layer(w, ggml::q4_0, q40, ggml::q4_1, q41);
  const std::string path = write(w, dir, "q4.gguf");
  const float df = kernels::f16_to_f32(d), mf = kernels::f16_to_f32(mn);
  for (auto q : {quantization::none, quantization::int8}) {
    load_options opt;
    opt.quant = q;
    auto loaded = model::load(path, opt);
    ASSERT_TRUE(loaded.ok()) << loaded.err().message;
    const auto want = q == quantization::none ? kernels::dtype::q4 : kernels::dtype::q8;
    EXPECT_EQ((*loaded)->quantized_weights(), q == quantization::none ? "int4" : "int8");
    const weight_matrix& g = (*loaded)->weights().layers[0].gate;
    const weight_matrix& u = (*loaded)->weights().layers[0].up;
    ASSERT_EQ(g.type, want);
    ASSERT_EQ(u.type, want);
    size_t differ = 0;
    for (size_t r = 0; r < 32; ++r) {
      for (size_t j = 0; j < 32; ++j) {
        ASSERT_EQ(kernels::load_as_f32(g.data, g.type, r * 32 + j), static_cast<float>(nibble(r, j) - 8) * df) << r << " " << j;
        const float q41_value = static_cast<float>(nibble(r, j)) * df + mf;  // exact product, one rounding
        if (q == quantization::none) {
          ASSERT_EQ(kernels::load_as_f32(u.data, u.type, r * 32 + j), q41_value) << r << " " << j;
        } else {
          differ += kernels::load_as_f32(u.data, u.type, r * 32 + j) != q41_value;
        }
      }
    }
    if (q == quantization::int8) {
      EXPECT_GT(differ, 0u) << "Q4_1's min is no multiple of its scale: int8 requantizes it";
    }
  }
}

TEST(GgufModel, Q4_0AndQ4_1ModelsGiveTheLogitsOfTheirDecodedValuesBitForBit) {
  // A model whose embedding (and tied LM head) is Q4_0 and whose gate and up are Q4_0 and
  // Q4_1, with positive, negative and zero scales: its logits equal, bit for bit, those of the
  // same model written as float32 tensors of the decoded values (both GGUF files, loaded with
  // vLLM's --quantization gguf, which a GGUF file satisfies).
  std::mt19937 rng(41);
  std::uniform_int_distribution<int> byte(0, 255);
  const float scales[] = {0.0123f, -0.0311f, 0.0f, 0.25f, -0.0078f};
  auto blocks = [&](bool q41, size_t rows, std::vector<float>& decoded) {
    std::string out;
    decoded.assign(rows * 32, 0.0f);
    for (size_t r = 0; r < rows; ++r) {
      const uint16_t d = kernels::f32_to_f16(scales[r % 5]), mn = kernels::f32_to_f16(scales[(r + 2) % 5] * 3);
      out.append(reinterpret_cast<const char*>(&d), 2);
      if (q41) out.append(reinterpret_cast<const char*>(&mn), 2);
      for (size_t j = 0; j < 16; ++j) {
        const int b = byte(rng);
        out.push_back(static_cast<char>(b));
        const float df = kernels::f16_to_f32(d), mf = kernels::f16_to_f32(mn);
        for (auto [e, q] : {std::pair{j, b & 0xF}, {j + 16, b >> 4}}) {
          decoded[r * 32 + e] = q41 ? static_cast<float>(q) * df + mf : static_cast<float>(q - 8) * df;
        }
      }
    }
    return out;
  };
  std::vector<float> embd, gate, up;
  const std::string embd_q = blocks(false, 8, embd), gate_q = blocks(false, 32, gate), up_q = blocks(true, 32, up);
  auto write_model = [&](const temp_dir& dir, bool quantized) {
    gguf_writer w;
    if (quantized) {
      one_layer(w, ggml::q4_0, gate_q, ggml::q4_1, up_q, ggml::q4_0, embd_q);
    } else {
      one_layer(w, ggml::f32, f32_bytes(gate), ggml::f32, f32_bytes(up), ggml::f32, f32_bytes(embd));
    }
    return write(w, dir);
  };
  temp_dir qdir, fdir;
  std::vector<std::vector<float>> logits;
  for (auto [path, type] : {std::pair{write_model(qdir, true), kernels::dtype::q4}, {write_model(fdir, false), kernels::dtype::f32}}) {
    load_options opt;
    opt.quant = quantization::gguf;
    auto m = model::load(path, opt);
    ASSERT_TRUE(m.ok()) << m.err().message;
    ASSERT_EQ((*m)->weights().embed.type, type);
    ASSERT_EQ((*m)->weights().layers[0].up.type, type);
    engine_options o;
    o.threads = 2;
    o.kv_tokens = 32;
    auto e = engine::create(*m, o);
    ASSERT_TRUE(e.ok()) << e.err().message;
    const std::vector<int32_t> prompt = {1, 2, 3, 7, 0, 5}, table = {0, 1};
    step_sequence s;
    s.tokens = prompt;
    s.block_table = table;
    logits.emplace_back();
    ASSERT_TRUE((*e)->forward(std::span(&s, 1), logits.back()).ok());
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  ASSERT_GE(logits[0].size(), 8u);
  for (float v : logits[0]) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)), 0);
}

TEST(GgufModel, KQuantMatricesAreReadInPlaceAndTpSlicesThatCutABlockBecomeInt8) {
  // Q2_K / Q3_K / Q4_K / Q6_K / IQ4_XS matrices are held as the file's blocks (the kernels read them in
  // place); at --tp 2 a rank's o_proj (128 of 256 columns) and down_proj (384 of 768) slices
  // cut super-blocks, so each rank holds them as int8: the logits move by int8's rounding only.
  temp_dir dir;
  gguf_writer w;
  llama_shape(w, 256, 2, 768, 4, 2);
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  std::vector<float> embed(64 * 256);
  for (auto& x : embed) x = u(rng);
  const std::vector<float> ones(256, 1.0f);
  w.tensor_f32("token_embd.weight", {256, 64}, embed);
  w.tensor_f32("output_norm.weight", {256}, ones);
  std::map<std::string, std::string> bytes;  // what the file holds, by tensor
  for (int l = 0; l < 2; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    w.tensor_f32(b + "attn_norm.weight", {256}, ones);
    w.tensor_f32(b + "ffn_norm.weight", {256}, ones);
    for (auto [name, type, cols, rows] : {std::tuple{"attn_q.weight", ggml::iq4_xs, 256, 256}, {"attn_k.weight", ggml::q3_k, 256, 128},
                                          {"attn_v.weight", ggml::q6_k, 256, 128}, {"attn_output.weight", ggml::q4_k, 256, 256},
                                          {"ffn_gate.weight", ggml::q4_k, 256, 768}, {"ffn_up.weight", ggml::q2_k, 256, 768},
                                          {"ffn_down.weight", ggml::q6_k, 768, 256}}) {
      bytes[b + name] = k_quant_blocks(type, rows, cols, rng);
      w.tensor(b + name, type, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)}, bytes[b + name]);
    }
  }
  std::vector<float> head(64 * 256);
  for (auto& x : head) x = u(rng);
  w.tensor_f32("output.weight", {256, 64}, head);
  const std::string path = write(w, dir, "kq.gguf");
  auto m = model::load(path);
  ASSERT_TRUE(m.ok()) << m.err().message;
  EXPECT_EQ((*m)->quantized_weights(), "Q2_K+Q3_K+Q4_K+Q6_K+IQ4_XS");
  const auto& l1 = (*m)->weights().layers[1];
  EXPECT_EQ(l1.k.type, kernels::dtype::q3_k);
  EXPECT_EQ(l1.up.type, kernels::dtype::q2_k);
  EXPECT_EQ(l1.v.type, kernels::dtype::q6_k);
  EXPECT_EQ(l1.o.type, kernels::dtype::q4_k);
  EXPECT_EQ(l1.down.type, kernels::dtype::q6_k);
  // Not a permuted matrix (v, o, gate, up, down): the file's bytes, not a copy of them.
  EXPECT_EQ(std::memcmp(l1.down.data, bytes["blk.1.ffn_down.weight"].data(), bytes["blk.1.ffn_down.weight"].size()), 0);
  EXPECT_EQ(std::memcmp(l1.gate.data, bytes["blk.1.ffn_gate.weight"].data(), bytes["blk.1.ffn_gate.weight"].size()), 0);
  EXPECT_EQ(std::memcmp(l1.up.data, bytes["blk.1.ffn_up.weight"].data(), bytes["blk.1.ffn_up.weight"].size()), 0);
  // q and k rows are un-permuted whole rows: row r of HF's q is the file's row 2j + s of its head.
  const auto& q1 = l1.q;
  ASSERT_EQ(q1.type, kernels::dtype::iq4_xs);
  const std::string& file_q = bytes["blk.1.attn_q.weight"];
  for (size_t r : {0, 1, 31, 32, 63, 64, 255}) {
    const size_t hd = 64, h = r / hd, i = r % hd, src = h * hd + 2 * (i % 32) + i / 32;
    EXPECT_EQ(std::memcmp(static_cast<const char*>(q1.data) + r * 136, file_q.data() + src * 136, 136), 0) << "row " << r;
  }

  // At --tp 2 this runs only with the ranks' int8 slices: the kernels refuse a K-quant job whose
  // columns cut a super-block.
  const std::vector<int32_t> prompt = {3, 14, 15, 9, 2, 6};
  expect_tp_logits_close(first_logits(*m, 1, prompt), first_logits(*m, 2, prompt));

  // --quantization int8 re-quantizes the K-quant matrices (decoded first), and the rest of a
  // --dtype cast leaves them as they are.
  load_options int8;
  int8.quant = quantization::int8;
  auto q = model::load(path, int8);
  ASSERT_TRUE(q.ok()) << q.err().message;
  EXPECT_EQ((*q)->quantized_weights(), "int8");
  const auto& ql1 = (*q)->weights().layers[1];
  ASSERT_EQ(ql1.down.type, kernels::dtype::q8);
  for (size_t r : {0, 100, 255}) {
    for (size_t c : {0, 1, 383, 767}) {
      const float want = kernels::load_as_f32(l1.down.data, l1.down.type, r * 768 + c);
      const float got = kernels::load_as_f32(ql1.down.data, ql1.down.type, r * ql1.down.ld() + c);
      float amax = 0;  // int8 rounds to half a step of its block's max / 127
      for (size_t j = c / 32 * 32; j < c / 32 * 32 + 32; ++j) {
        amax = std::max(amax, std::fabs(kernels::load_as_f32(l1.down.data, l1.down.type, r * 768 + j)));
      }
      EXPECT_NEAR(got, want, amax / 254.0f * 1.001f) << "row " << r << " col " << c;
    }
  }
  load_options cast;
  cast.dtype = kernels::dtype::f32;
  auto f = model::load(path, cast);
  ASSERT_TRUE(f.ok()) << f.err().message;
  EXPECT_EQ((*f)->weights().layers[1].down.type, kernels::dtype::q6_k);
}

TEST(GgufModel, StackedExpertsAreViewsPerExpertAndTpSlicesThatCutABlockBecomeInt8) {
  // Qwen3-MoE and Qwen2-MoE files as llama.cpp writes them: the router F32, each projection of
  // the 4 experts stacked into one [experts, rows, cols] tensor (Q4_K gate/up, Q6_K down);
  // Qwen2-MoE's shared expert beside them (its gate a 1-D F32 tensor). Each expert's matrix is
  // a view of its rows of the stack; at --tp 2 every expert's and the shared expert's down_proj
  // slice (384 of 768 columns) cuts a super-block, so each rank holds those as int8, unless
  // expert-parallel (whole experts: only the shared expert's slice).
  for (const std::string arch : {"qwen3moe", "qwen2moe"}) {
    SCOPED_TRACE(arch);
    const bool qwen2 = arch == "qwen2moe";
    temp_dir dir;
    gguf_writer w;
    const uint32_t hidden = 256, heads = 4, kv_heads = 2, hd = 64, experts = 4, ffn = 768;
    const std::string p = arch + ".";
    w.str("general.architecture", arch);
    w.u32(p + "embedding_length", hidden);
    w.u32(p + "block_count", 1);
    w.u32(p + "feed_forward_length", 3072);  // a dense MLP's size, which no layer has
    w.u32(p + "attention.head_count", heads);
    w.u32(p + "attention.head_count_kv", kv_heads);
    w.u32(p + "expert_count", experts);
    w.u32(p + "expert_used_count", 2);
    if (!qwen2) w.u32(p + "expert_feed_forward_length", ffn);  // Qwen2-MoE: from ffn_gate_exps' rows
    if (qwen2) w.u32(p + "expert_shared_feed_forward_length", ffn);
    std::mt19937 rng(78);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    auto random = [&](size_t n) {
      std::vector<float> v(n);
      for (auto& x : v) x = u(rng);
      return v;
    };
    const std::vector<float> ones(hidden, 1.0f);
    w.tensor_f32("token_embd.weight", {hidden, 64}, random(64 * hidden));
    w.tensor_f32("output.weight", {hidden, 64}, random(64 * hidden));
    w.tensor_f32("output_norm.weight", {hidden}, ones);
    w.tensor_f32("blk.0.attn_norm.weight", {hidden}, ones);
    w.tensor_f32("blk.0.ffn_norm.weight", {hidden}, ones);
    if (qwen2) {
      w.tensor_f32("blk.0.attn_q.bias", {heads * hd}, random(heads * hd));
      w.tensor_f32("blk.0.attn_k.bias", {kv_heads * hd}, random(kv_heads * hd));
      w.tensor_f32("blk.0.attn_v.bias", {kv_heads * hd}, random(kv_heads * hd));
    } else {
      w.tensor_f32("blk.0.attn_q_norm.weight", {hd}, std::vector<float>(hd, 1.0f));
      w.tensor_f32("blk.0.attn_k_norm.weight", {hd}, std::vector<float>(hd, 1.0f));
    }
    w.tensor_f32("blk.0.attn_q.weight", {hidden, heads * hd}, random(hidden * heads * hd));
    w.tensor_f32("blk.0.attn_k.weight", {hidden, kv_heads * hd}, random(hidden * kv_heads * hd));
    w.tensor_f32("blk.0.attn_v.weight", {hidden, kv_heads * hd}, random(hidden * kv_heads * hd));
    w.tensor_f32("blk.0.attn_output.weight", {heads * hd, hidden}, random(hidden * heads * hd));
    const std::vector<float> router = random(experts * hidden);
    w.tensor_f32("blk.0.ffn_gate_inp.weight", {hidden, experts}, router);
    std::map<std::string, std::string> bytes;
    for (auto [name, type, cols, rows] : {std::tuple{"ffn_gate_exps", ggml::q4_k, hidden, ffn}, {"ffn_up_exps", ggml::q4_k, hidden, ffn},
                                          {"ffn_down_exps", ggml::q6_k, ffn, hidden}}) {
      bytes[name] = k_quant_blocks(type, experts * rows, cols, rng);
      w.tensor(std::string("blk.0.") + name + ".weight", type, {cols, rows, experts}, bytes[name]);
    }
    if (qwen2) {
      w.tensor_f32("blk.0.ffn_gate_inp_shexp.weight", {hidden}, random(hidden));
      w.tensor("blk.0.ffn_gate_shexp.weight", ggml::q4_k, {hidden, ffn}, k_quant_blocks(ggml::q4_k, ffn, hidden, rng));
      w.tensor("blk.0.ffn_up_shexp.weight", ggml::q4_k, {hidden, ffn}, k_quant_blocks(ggml::q4_k, ffn, hidden, rng));
      w.tensor("blk.0.ffn_down_shexp.weight", ggml::q6_k, {ffn, hidden}, k_quant_blocks(ggml::q6_k, hidden, ffn, rng));
    }
    const std::string path = write(w, dir, "moe.gguf");
    auto m = model::load(path);
    ASSERT_TRUE(m.ok()) << m.err().message;
    const auto& c = (*m)->config();
    EXPECT_EQ(c.arch, qwen2 ? architecture::qwen2_moe : architecture::qwen3_moe);
    EXPECT_EQ(c.moe.n_experts, experts);
    EXPECT_EQ(c.moe.experts_per_token, 2u);
    EXPECT_EQ(c.moe.norm_topk_prob, !qwen2);  // llama.cpp renormalizes Qwen3-MoE's top-k, not Qwen2-MoE's
    EXPECT_EQ(c.moe.shared_intermediate, qwen2 ? ffn : 0u);
    EXPECT_EQ(c.intermediate, ffn);
    const auto& l = (*m)->weights().layers[0];
    ASSERT_EQ(l.experts.size(), experts);
    EXPECT_EQ(l.router.type, kernels::dtype::f32);
    EXPECT_EQ(kernels::load_as_f32(l.router.data, l.router.type, 2 * hidden + 5), router[2 * hidden + 5]);
    for (size_t e = 0; e < experts; ++e) {
      for (auto [name, x, type] : {std::tuple{"ffn_gate_exps", &l.experts[e].gate, kernels::dtype::q4_k},
                                   {"ffn_up_exps", &l.experts[e].up, kernels::dtype::q4_k},
                                   {"ffn_down_exps", &l.experts[e].down, kernels::dtype::q6_k}}) {
        ASSERT_EQ(x->type, type) << name << " expert " << e;
        const size_t each = bytes[name].size() / experts;  // expert e's rows of the stack, in place
        EXPECT_EQ(std::memcmp(x->data, bytes[name].data() + e * each, each), 0) << name << " expert " << e;
      }
    }
    if (qwen2) {
      EXPECT_EQ(l.shared.down.type, kernels::dtype::q6_k);
      EXPECT_EQ(l.shared_gate.rows, 1u);
    }
    const std::vector<int32_t> prompt = {3, 14, 15, 9, 2, 6};
    const auto tp1 = first_logits(*m, 1, prompt);
    expect_tp_logits_close(tp1, first_logits(*m, 2, prompt));
    // Expert-parallel, each rank reads its two experts whole, in place: Qwen3-MoE's logits are
    // --tp 1's but for the all-reduce's rounding (Qwen2-MoE's shared expert still splits, int8).
    const auto ep = first_logits(*m, 2, prompt, true);
    if (qwen2) {
      expect_tp_logits_close(tp1, ep);
    } else {
      ASSERT_EQ(ep.size(), tp1.size());
      float max_abs = 0, max_diff = 0;
      for (size_t i = 0; i < tp1.size(); ++i) {
        max_abs = std::max(max_abs, std::fabs(tp1[i]));
        max_diff = std::max(max_diff, std::fabs(tp1[i] - ep[i]));
      }
      EXPECT_LT(max_diff, 1e-4f * max_abs) << "max abs " << max_abs;
    }
  }
}

TEST(GgufModel, LlamaWithExpertsIsMixtralWhoseExpertsMayBeTensorsOfTheirOwn) {
  // llama.cpp's first MoE converter wrote Mixtral's experts one tensor each (ffn_up.E): they
  // map to block_sparse_moe.experts.E.w1/w3/w2 as the stacked ones do. A stacked Q8_0 tensor
  // is converted per expert (to int8 blocks), each from its own rows of the stack.
  temp_dir dir;
  gguf_writer w;
  llama_shape(w, 32, 1, 32, 2, 1);
  w.u32("llama.expert_count", 3);
  w.u32("llama.expert_used_count", 2);
  auto t = [&](const std::string& name, std::vector<uint64_t> dims, float scale) {
    size_t n = 1;
    for (auto d : dims) n *= d;
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + n) % 11) * scale - 0.2f;
    w.tensor_f32(name, std::move(dims), v);
  };
  t("token_embd.weight", {32, 16}, 0.05f);
  t("output_norm.weight", {32}, 0.1f);
  t("blk.0.attn_norm.weight", {32}, 0.1f);
  t("blk.0.ffn_norm.weight", {32}, 0.1f);
  t("blk.0.attn_q.weight", {32, 32}, 0.03f);
  t("blk.0.attn_k.weight", {32, 16}, 0.03f);
  t("blk.0.attn_v.weight", {32, 16}, 0.03f);
  t("blk.0.attn_output.weight", {32, 32}, 0.03f);
  t("blk.0.ffn_gate_inp.weight", {32, 3}, 0.04f);
  t("blk.0.ffn_gate_exps.weight", {32, 32, 3}, 0.02f);
  for (int e = 0; e < 3; ++e) t("blk.0.ffn_up." + std::to_string(e) + ".weight", {32, 32}, 0.02f + 0.01f * e);
  const uint16_t d = kernels::f32_to_f16(0.01f);
  auto q = [](size_t row, size_t j) { return static_cast<int8_t>((row * 5 + j * 3) % 41 - 20); };
  std::string down;  // [3 experts][32 rows][one Q8_0 block]
  for (size_t row = 0; row < 3 * 32; ++row) {
    down.append(reinterpret_cast<const char*>(&d), 2);
    for (size_t j = 0; j < 32; ++j) down.push_back(static_cast<char>(q(row, j)));
  }
  w.tensor("blk.0.ffn_down_exps.weight", ggml::q8_0, {32, 32, 3}, down);
  const std::string path = write(w, dir);
  auto m = model::load(path);
  ASSERT_TRUE(m.ok()) << m.err().message;
  EXPECT_EQ((*m)->config().arch, architecture::mixtral);
  EXPECT_EQ((*m)->config().moe.n_experts, 3u);
  const auto& l = (*m)->weights().layers[0];
  ASSERT_EQ(l.experts.size(), 3u);
  // Expert 1's up_proj is its own tensor (scale 0.03); its gate the stack's second 32 rows.
  EXPECT_FLOAT_EQ(kernels::load_as_f32(l.experts[1].up.data, kernels::dtype::f32, 0), static_cast<float>(1024 % 11) * 0.03f - 0.2f);
  EXPECT_FLOAT_EQ(kernels::load_as_f32(l.experts[1].gate.data, kernels::dtype::f32, 0),
                  static_cast<float>((1024 * 7 + 3072) % 11) * 0.02f - 0.2f);
  for (size_t e = 0; e < 3; ++e) {
    const weight_matrix& x = l.experts[e].down;
    ASSERT_EQ(x.type, kernels::dtype::q8);
    for (size_t r : {0, 17, 31}) {
      for (size_t j : {0, 9, 31}) {
        const float want = static_cast<float>(q(e * 32 + r, j)) * kernels::f16_to_f32(d);
        ASSERT_EQ(kernels::load_as_f32(x.data, x.type, r * x.ld() + j), want) << "expert " << e << " row " << r << " col " << j;
      }
    }
  }
  // A stacked tensor must have 3 dimensions.
  gguf_writer flat = w;
  flat.tensor_f32("blk.0.ffn_up_exps.weight", {32, 32}, std::vector<float>(1024, 0.0f));
  auto bad = model::load(write(flat, dir, "flat.gguf"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("has 2 dimensions (3: [experts, rows, columns])"), std::string::npos) << bad.err().message;
}

}  // namespace
}  // namespace llmesh::model
