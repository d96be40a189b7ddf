// GGUF files of the Gemma family (llama.cpp's "gemma", "gemma2", "gemma3"): the config their
// metadata becomes (llama.cpp's rules where the converter writes no key: the query scale, Gemma
// 3's global layers and local rotary), the norms llama.cpp's converter stores plus one, Gemma 2/3's
// norm names, <end_of_turn> as an end of generation. Their logits against the PyTorch reference:
// tests/cli/golden_test.cpp (gemma_geglu_q8_0, gemma2_softcap_window_q4_k_m, gemma3_local_rope_bf16).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gguf_test_util.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model {
namespace {

using namespace gguf_testing;

/// A Gemma file as llama.cpp's converter writes one: the metadata of `arch` and, for a
/// one-layer model, F32 tensors (each norm holding `norm` + i/8 at element i: HF's weight + 1).
gguf_writer small_gemma(const std::string& arch, uint32_t layers, uint32_t hidden, uint32_t heads, uint32_t head_dim,
                        float norm = 1.25f) {
  gguf_writer w;
  const std::string p = arch + ".";
  w.str("general.architecture", arch);
  w.u32(p + "context_length", 8192);
  w.u32(p + "embedding_length", hidden);
  w.u32(p + "block_count", layers);
  w.u32(p + "feed_forward_length", 8);
  w.u32(p + "attention.head_count", heads);
  w.u32(p + "attention.head_count_kv", 1);
  w.u32(p + "attention.key_length", head_dim);
  w.u32(p + "attention.value_length", head_dim);
  w.f32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  const uint64_t vocab = 8, q = static_cast<uint64_t>(heads) * head_dim;
  auto t = [&](const std::string& name, std::vector<uint64_t> dims) {
    size_t n = 1;
    for (auto d : dims) n *= d;
    std::vector<float> v(n);
    const bool is_norm = name.ends_with("norm.weight");
    for (size_t i = 0; i < n; ++i) v[i] = is_norm ? norm + static_cast<float>(i % 4) / 8 : static_cast<float>(i % 5) * 0.125f - 0.25f;
    w.tensor_f32(name, std::move(dims), v);
  };
  t("token_embd.weight", {hidden, vocab});
  if (layers != 1) return w;  // config tests: the metadata and the embedding (the vocabulary's size)
  t("output_norm.weight", {hidden});
  t("blk.0.attn_norm.weight", {hidden});
  t("blk.0.ffn_norm.weight", {hidden});
  if (arch != "gemma") {
    t("blk.0.post_attention_norm.weight", {hidden});
    t("blk.0.post_ffw_norm.weight", {hidden});
  }
  if (arch == "gemma3") {
    t("blk.0.attn_q_norm.weight", {head_dim});
    t("blk.0.attn_k_norm.weight", {head_dim});
  }
  t("blk.0.attn_q.weight", {hidden, q});
  t("blk.0.attn_k.weight", {hidden, head_dim});
  t("blk.0.attn_v.weight", {hidden, head_dim});
  t("blk.0.attn_output.weight", {q, hidden});
  t("blk.0.ffn_gate.weight", {hidden, 8});
  t("blk.0.ffn_up.weight", {hidden, 8});
  t("blk.0.ffn_down.weight", {8, hidden});
  return w;
}

model_config config_of(const gguf_writer& w, const temp_dir& dir, const std::string& name = "model.gguf") {
  auto c = load_config(write(w, dir, name));
  EXPECT_TRUE(c.ok()) << c.err().message;
  return c.ok() ? *c : model_config{};
}

TEST(GgufGemma, GemmaIsTiedWithTheTanhGeluAndTheHeadDimsScale) {
  temp_dir dir;
  const auto c = config_of(small_gemma("gemma", 18, 2048, 8, 256), dir);
  EXPECT_EQ(c.arch, architecture::gemma);
  EXPECT_TRUE(c.gemma.on);
  EXPECT_FALSE(c.gemma.sandwich_norms);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.head_dim, 256u);
  EXPECT_EQ(c.attn_scale, 0.0);  // 1/sqrt(head_dim), as llama.cpp's Gemma graph
  EXPECT_TRUE(c.sliding_layers.empty());
}

TEST(GgufGemma, Gemma2sCapsWindowAndQueryScaleFollowLlamaCpp) {
  temp_dir dir;
  gguf_writer w = small_gemma("gemma2", 26, 2304, 8, 256);
  w.f32("gemma2.attn_logit_softcapping", 40.0f);
  w.f32("gemma2.final_logit_softcapping", 20.0f);
  w.u32("gemma2.attention.sliding_window", 1024);
  auto c = config_of(w, dir);
  EXPECT_EQ(c.arch, architecture::gemma2);
  EXPECT_TRUE(c.gemma.sandwich_norms);
  EXPECT_FLOAT_EQ(c.gemma.attn_softcap, 40.0f);
  EXPECT_FLOAT_EQ(c.gemma.final_softcap, 20.0f);
  EXPECT_DOUBLE_EQ(c.attn_scale, 1.0 / 16.0);  // head_dim 256
  for (size_t i = 0; i < 26; ++i) EXPECT_EQ(layer_window(c, i), i % 2 == 0 ? 1024u : 0u) << i;
  // Keys left out: llama.cpp's (and HF's) 50, 30 and 4096. Gemma 2 27B (46 layers): hidden / heads.
  c = config_of(small_gemma("gemma2", 46, 4608, 32, 128), dir, "27b.gguf");
  EXPECT_FLOAT_EQ(c.gemma.attn_softcap, 50.0f);
  EXPECT_FLOAT_EQ(c.gemma.final_softcap, 30.0f);
  EXPECT_EQ(layer_window(c, 0), 4096u);
  EXPECT_DOUBLE_EQ(c.attn_scale, 1.0 / 12.0);  // query_pre_attn_scalar 144
}

TEST(GgufGemma, Gemma3sGlobalLayersLocalRotaryAndQueryScale) {
  temp_dir dir;
  gguf_writer w = small_gemma("gemma3", 34, 2560, 8, 256);
  w.u32("gemma3.attention.sliding_window", 1024);
  w.f32("gemma3.rope.freq_base", 1e6f);
  w.str("gemma3.rope.scaling.type", "linear");
  w.f32("gemma3.rope.scaling.factor", 8.0f);
  auto c = config_of(w, dir);
  EXPECT_EQ(c.arch, architecture::gemma3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.gemma.final_softcap, 0.0f);
  EXPECT_DOUBLE_EQ(c.attn_scale, 1.0 / 16.0);
  ASSERT_TRUE(c.rope_local.has_value());
  for (size_t i = 0; i < 34; ++i) {  // llama.cpp's swa pattern 6: every sixth layer global
    const bool sliding = (i + 1) % 6 != 0;
    EXPECT_EQ(layer_window(c, i), sliding ? 1024u : 0u) << i;
    EXPECT_DOUBLE_EQ(layer_rope(c, i).theta, sliding ? 1e4 : 1e6) << i;
    EXPECT_DOUBLE_EQ(layer_rope(c, i).linear_factor, sliding ? 1.0 : 8.0) << i;
  }
  gguf_writer big = small_gemma("gemma3", 62, 5376, 32, 128);  // Gemma 3 27B: query_pre_attn_scalar 168
  big.u32("gemma3.attention.sliding_window", 1024);
  EXPECT_DOUBLE_EQ(config_of(big, dir, "27b.gguf").attn_scale, 1.0 / std::sqrt(168.0));
  // No window (the converter writes none for sliding_window_pattern 1): every layer global, with
  // the global rotary, as llama.cpp runs it; a final cap the converter wrote is read.
  gguf_writer global = small_gemma("gemma3", 26, 1152, 4, 256);
  global.f32("gemma3.rope.freq_base", 1e6f);
  global.f32("gemma3.final_logit_softcapping", 30.0f);
  c = config_of(global, dir, "nowindow.gguf");
  EXPECT_FLOAT_EQ(c.gemma.final_softcap, 30.0f);
  for (size_t i = 0; i < 26; ++i) {
    EXPECT_EQ(layer_window(c, i), 0u) << i;
    EXPECT_DOUBLE_EQ(layer_rope(c, i).theta, 1e6) << i;
  }
}

TEST(GgufGemma, NormsHoldWhatTheFileHoldsUnderHfsNames) {
  // The converter stored HF's weight + 1; the loader takes the 1 off and the bind adds it back:
  // the engine's norms are the file's values, bit for bit, and the model runs.
  temp_dir dir;
  for (const std::string arch : {"gemma", "gemma2", "gemma3"}) {
    SCOPED_TRACE(arch);
    gguf_writer w = small_gemma(arch, 1, 8, 2, 4, 1.25f);
    if (arch == "gemma3") w.u32("gemma3.attention.sliding_window", 4);
    auto m = model::load(write(w, dir, arch + ".gguf"));
    ASSERT_TRUE(m.ok()) << m.err().message;
    const auto& wt = (*m)->weights();
    auto expect_file = [](const std::vector<float>& v, size_t n, const char* what) {
      ASSERT_EQ(v.size(), n) << what;
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(v[i], 1.25f + static_cast<float>(i % 4) / 8) << what << " " << i;
    };
    expect_file(wt.final_norm, 8, "final");
    expect_file(wt.layers[0].attn_norm, 8, "attn");
    expect_file(wt.layers[0].mlp_norm, 8, "mlp (Gemma 2/3: pre_feedforward)");
    if (arch != "gemma") {
      expect_file(wt.layers[0].post_attn_norm, 8, "post attention");
      expect_file(wt.layers[0].post_mlp_norm, 8, "post mlp");
    }
    if (arch == "gemma3") {
      expect_file(wt.layers[0].q_norm, 4, "q");
      expect_file(wt.layers[0].k_norm, 4, "k");
    }
    const auto logits = first_logits(*m, 1, {2, 5, 3});
    ASSERT_EQ(logits.size(), 8u);
    for (float x : logits) EXPECT_TRUE(std::isfinite(x));
  }
}

TEST(GgufGemma, EndOfTurnEndsAGeneration) {
  // Gemma 2/3 files name <eos> only; llama.cpp ends a turn at <end_of_turn> by its text.
  temp_dir dir;
  gguf_writer w = small_gemma("gemma2", 26, 2304, 8, 256);
  w.str("tokenizer.ggml.model", "llama");
  w.strings("tokenizer.ggml.tokens", {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\u2581a", "b"});
  w.i32s("tokenizer.ggml.token_type", {3, 3, 3, 2, 3, 3, 1, 1});
  w.f32s("tokenizer.ggml.scores", {0, 0, 0, 0, 0, 0, -1, -2});
  w.u32("tokenizer.ggml.bos_token_id", 2);
  w.u32("tokenizer.ggml.eos_token_id", 1);
  w.boolean("tokenizer.ggml.add_space_prefix", false);
  const auto c = config_of(w, dir);
  EXPECT_EQ(c.eos_ids, (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(c.bos_ids, (std::vector<int32_t>{2}));
}

}  // namespace
}  // namespace llmesh::model
