// Helpers of the GGUF tests (gguf_test.cpp, gguf_blocks_test.cpp): small files as llama.cpp's
// converter writes them, random K-quant blocks, a model's first-step logits at a --tp.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gguf_writer.hpp"
#include "llmesh/kernels/dtype.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/gguf.hpp"
#include "temp_dir.hpp"

namespace llmesh::model::gguf_testing {

using testing::gguf_writer;
using testing::temp_dir;

/// A small Llama: the metadata llama.cpp's converter writes and F32 tensors of the right shapes.
inline gguf_writer small_llama(size_t vocab = 8, size_t hidden = 4, size_t heads = 2, size_t kv_heads = 1, float theta = 10000.0f) {
  gguf_writer w;
  w.str("general.architecture", "llama");
  w.u32("llama.context_length", 128);
  w.u32("llama.embedding_length", static_cast<uint32_t>(hidden));
  w.u32("llama.block_count", 1);
  w.u32("llama.feed_forward_length", 8);
  w.u32("llama.attention.head_count", static_cast<uint32_t>(heads));
  w.u32("llama.attention.head_count_kv", static_cast<uint32_t>(kv_heads));
  w.f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.f32("llama.rope.freq_base", theta);
  const size_t hd = hidden / heads;
  auto t = [&](const std::string& name, std::vector<uint64_t> dims) {
    size_t n = 1;
    for (auto d : dims) n *= d;
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 7) * 0.125f - 0.25f;
    w.tensor_f32(name, std::move(dims), v);
  };
  t("token_embd.weight", {hidden, vocab});
  t("output_norm.weight", {hidden});
  t("blk.0.attn_norm.weight", {hidden});
  t("blk.0.ffn_norm.weight", {hidden});
  t("blk.0.attn_q.weight", {hidden, heads * hd});
  t("blk.0.attn_k.weight", {hidden, kv_heads * hd});
  t("blk.0.attn_v.weight", {hidden, kv_heads * hd});
  t("blk.0.attn_output.weight", {heads * hd, hidden});
  t("blk.0.ffn_gate.weight", {hidden, 8});
  t("blk.0.ffn_up.weight", {hidden, 8});
  t("blk.0.ffn_down.weight", {8, hidden});
  return w;
}

inline void llama_shape(gguf_writer& w, uint32_t hidden, uint32_t layers, uint32_t ffn, uint32_t heads, uint32_t kv_heads) {
  w.str("general.architecture", "llama");
  w.u32("llama.embedding_length", hidden);
  w.u32("llama.block_count", layers);
  w.u32("llama.feed_forward_length", ffn);
  w.u32("llama.attention.head_count", heads);
  w.u32("llama.attention.head_count_kv", kv_heads);
}

/// Writes `w` to DIR/model.gguf and returns the path.
inline std::string write(const gguf_writer& w, const temp_dir& dir, const std::string& name = "model.gguf") {
  const std::string path = dir.path() + "/" + name;
  w.write(path);
  return path;
}

/// Random K-quant blocks for a [rows, cols] matrix: every byte random but the float16 factors
/// (d, and dmin where the type has one), small enough that a forward pass stays finite.
inline std::string k_quant_blocks(uint32_t type, size_t rows, size_t cols, std::mt19937& rng) {
  const size_t bb = ggml::block(type).bytes;
  std::string out(rows * cols / 256 * bb, '\0');
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& c : out) c = static_cast<char>(byte(rng));
  struct halves {
    size_t d, dmin;  // dmin == 0: none
    float dv;
  };
  const halves h = type == ggml::q2_k   ? halves{80, 82, 0.002f}
                   : type == ggml::q3_k ? halves{108, 0, 0.0005f}
                   : type == ggml::q6_k ? halves{208, 0, 0.0001f}
                   : type == ggml::iq4_xs ? halves{0, 0, 0.0001f}
                                        : halves{0, 2, 0.002f};  // Q4_K
  const uint16_t d = kernels::f32_to_f16(h.dv), dmin = kernels::f32_to_f16(0.001f);
  for (size_t b = 0; b < rows * cols / 256; ++b) {
    char* block = out.data() + b * bb;
    std::memcpy(block + h.d, &d, 2);
    if (h.dmin != 0) std::memcpy(block + h.dmin, &dmin, 2);
  }
  return out;
}

/// Logits of the first step of a prompt at `tp` ranks (empty on failure, which is reported).
inline std::vector<float> first_logits(const std::shared_ptr<const model>& m, int tp, const std::vector<int32_t>& prompt,
                                       bool expert_parallel = false) {
  engine_options o;
  o.threads = 2;
  o.tp = tp;
  o.expert_parallel = expert_parallel;
  o.kv_tokens = 64;
  auto e = engine::create(m, o);
  std::vector<float> logits;
  EXPECT_TRUE(e.ok()) << e.err().message;
  if (!e.ok()) return logits;
  std::vector<int32_t> table(4);
  std::iota(table.begin(), table.end(), 0);
  step_sequence s;
  s.tokens = prompt;
  s.block_table = table;
  EXPECT_TRUE((*e)->forward(std::span(&s, 1), logits).ok());
  return logits;
}

/// --tp 1's and --tp 2's logits of a model whose ranks hold int8 copies of the slices that cut
/// K-quant super-blocks: finite, different (int8 rounds), within 2 % of the largest.
inline void expect_tp_logits_close(const std::vector<float>& tp1, const std::vector<float>& tp2) {
  ASSERT_EQ(tp1.size(), 64u);
  ASSERT_EQ(tp2.size(), tp1.size());
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < tp1.size(); ++i) {
    ASSERT_TRUE(std::isfinite(tp1[i]) && std::isfinite(tp2[i]));
    max_abs = std::max(max_abs, std::fabs(tp1[i]));
    max_diff = std::max(max_diff, std::fabs(tp1[i] - tp2[i]));
  }
  EXPECT_GT(max_diff, 0.0f);
  EXPECT_LT(max_diff, 0.02f * max_abs) << "max abs " << max_abs;
}

}  // namespace llmesh::model::gguf_testing
