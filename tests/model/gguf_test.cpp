// GGUF files (gguf.hpp; gguf_model.cpp, gguf_tensors.cpp): the parser's bounds (every
// truncation and thousands of mutations are errors, never faults), the config and tokenizer a
// file's metadata becomes, the tensors and their block formats. The engine's outputs on real
// converted files are checked against the PyTorch reference in tests/cli/golden_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <tuple>

#include "gguf_writer.hpp"
#include "llmesh/kernels/dtype.hpp"
#include "llmesh/model/chat_template.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/gguf.hpp"
#include "llmesh/model/tokenizer.hpp"
#include "llmesh/model/weights.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;
using testing::gguf_writer;
using testing::temp_dir;

const std::string data_dir = LLMESH_TEST_DATA;

result<std::shared_ptr<const gguf_file>> parse_bytes(const std::string& b) {
  auto keep = std::make_shared<std::string>(b);
  return gguf_file::parse("t.gguf", reinterpret_cast<const uint8_t*>(keep->data()), keep->size(), keep);
}

/// A small Llama: the metadata llama.cpp's converter writes and F32 tensors of the right shapes.
gguf_writer small_llama(size_t vocab = 8, size_t hidden = 4, size_t heads = 2, size_t kv_heads = 1, float theta = 10000.0f) {
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

TEST(GgufParse, ReadsMetadataAndTensors) {
  gguf_writer w = small_llama();
  w.strings("names", {"a", "b c", ""});
  w.i32s("ints", {-1, 2});
  w.boolean("flag", true);
  auto g = parse_bytes(w.bytes());
  ASSERT_TRUE(g.ok()) << g.err().message;
  EXPECT_EQ((*g)->version(), 3u);
  ASSERT_NE((*g)->find("names"), nullptr);
  ASSERT_EQ((*g)->find("names")->items.size(), 3u);
  EXPECT_EQ((*g)->find("names")->items[1].s, "b c");
  EXPECT_EQ((*g)->find("ints")->items[0].i, -1);
  uint64_t u = 0;
  EXPECT_FALSE((*g)->find("ints")->items[0].as_uint(u));  // negative
  EXPECT_TRUE((*g)->find("flag")->as_uint(u));
  EXPECT_EQ(u, 1u);
  const gguf_tensor* q = (*g)->tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dims, (std::vector<uint64_t>{4, 4}));
  EXPECT_EQ(q->bytes, 64u);
  float first;
  std::memcpy(&first, q->data, 4);
  EXPECT_EQ(first, -0.25f);
}

TEST(GgufParse, EveryTruncationIsAnError) {
  const std::string b = small_llama().bytes();
  for (size_t n = 0; n < b.size(); n += (n < 600 ? 1 : 61)) {
    auto g = parse_bytes(b.substr(0, n));
    EXPECT_FALSE(g.ok()) << "prefix of " << n << " bytes";
  }
}

TEST(GgufParse, MutatedFilesAreErrorsOrParsesNeverFaults) {
  const std::string base = small_llama().bytes();
  std::mt19937 rng(7);
  size_t refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string b = base;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t at = rng() % std::min<size_t>(b.size(), 700);  // the header, metadata and tensor infos
      b[at] = static_cast<char>(rng() % 3 == 0 ? 0xff : rng());
    }
    auto g = parse_bytes(b);
    if (!g.ok()) {
      ++refused;
      EXPECT_EQ(g.err().message.find('\n'), std::string::npos);
      continue;
    }
    unsigned sum = 0;
    for (const auto& t : (*g)->tensors()) {  // what parses stays inside the buffer: touch every byte
      for (size_t k = 0; k < t.bytes; ++k) sum += t.data[k];
    }
    EXPECT_GE(sum, 0u);
  }
  EXPECT_GT(refused, 300u);
}

TEST(GgufParse, RefusesWhatItCannotRead) {
  auto msg = [](const std::string& b) {
    auto g = parse_bytes(b);
    return g.ok() ? std::string("parsed") : g.err().message;
  };
  const std::string v1("GGUF\x01\0\0\0", 8), ggml("GGML\x03\0\0\0", 8);
  EXPECT_NE(msg(v1).find("GGUF version 1 (supported: 2, 3)"), std::string::npos) << msg(v1);
  EXPECT_NE(msg(ggml).find("not a GGUF file"), std::string::npos);
  gguf_writer q;
  q.tensor("w", 21, {256, 2}, std::string(2 * 110, '\0'));  // IQ3_S
  EXPECT_NE(msg(q.bytes()).find("type IQ3_S"), std::string::npos) << msg(q.bytes());
  gguf_writer rows;
  rows.tensor("w", 8, {48, 1}, std::string(68, '\0'));  // Q8_0 rows of 48: not whole blocks
  EXPECT_NE(msg(rows.bytes()).find("not whole blocks"), std::string::npos) << msg(rows.bytes());
  gguf_writer twice;
  twice.u32("k", 1);
  twice.u32("k", 2);
  EXPECT_NE(msg(twice.bytes()).find("appears twice"), std::string::npos);
}

/// A llama GGUF's architecture and shape metadata.
void llama_shape(gguf_writer& w, uint32_t hidden, uint32_t layers, uint32_t ffn, uint32_t heads, uint32_t kv_heads) {
  w.str("general.architecture", "llama");
  w.u32("llama.embedding_length", hidden);
  w.u32("llama.block_count", layers);
  w.u32("llama.feed_forward_length", ffn);
  w.u32("llama.attention.head_count", heads);
  w.u32("llama.attention.head_count_kv", kv_heads);
}

/// Writes `w` to DIR/model.gguf and returns the path.
std::string write(const gguf_writer& w, const temp_dir& dir, const std::string& name = "model.gguf") {
  const std::string path = dir.path() + "/" + name;
  w.write(path);
  return path;
}

TEST(GgufModel, ConfigComesFromTheMetadata) {
  temp_dir dir;
  gguf_writer w = small_llama(8, 4, 2, 1);
  w.tensor_f32("rope_freqs.weight", {1}, {1.0f});  // head_dim 2: one frequency, unscaled
  const std::string path = write(w, dir);
  ASSERT_TRUE(is_gguf_file(path));
  EXPECT_FALSE(is_gguf_file(dir.path()));
  auto c = load_config(path);
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->arch, architecture::llama);
  EXPECT_EQ(c->hidden, 4u);
  EXPECT_EQ(c->n_heads, 2u);
  EXPECT_EQ(c->n_kv_heads, 1u);
  EXPECT_EQ(c->head_dim, 2u);
  EXPECT_EQ(c->vocab, 8u);
  EXPECT_EQ(c->max_positions, 128u);
  EXPECT_TRUE(c->tie_embeddings);  // no output.weight
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_FALSE(c->rope.llama3);
  auto m = model::load(path);
  ASSERT_TRUE(m.ok()) << m.err().message;
  EXPECT_EQ((*m)->weights().layers.size(), 1u);
}

TEST(GgufModel, Llama3RopeFreqsBecomeItsScaling) {
  // Llama 3.1's divisors for head_dim 128, theta 500000, factor 8, original context 8192, as
  // llama.cpp's converter computes them; a pattern that is not the llama3 rule is refused.
  const size_t hd = 128;
  std::vector<float> fac;
  for (size_t i = 0; i < hd; i += 2) {
    const double freq = 1.0 / std::pow(500000.0, static_cast<double>(i) / hd), wl = 2 * M_PI / freq;
    if (wl < 8192.0 / 4) {
      fac.push_back(1.0f);
    } else if (wl > 8192.0) {
      fac.push_back(8.0f);
    } else {
      const double s = (8192.0 / wl - 1) / 3;
      fac.push_back(static_cast<float>(1 / ((1 - s) / 8 + s)));
    }
  }
  temp_dir dir;
  gguf_writer w = small_llama(8, 256, 2, 2, 500000.0f);
  w.tensor_f32("rope_freqs.weight", {hd / 2}, fac);
  auto c = load_config(write(w, dir));
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_TRUE(c->rope.llama3);
  EXPECT_EQ(c->rope.factor, 8.0);
  EXPECT_EQ(c->rope.low_freq_factor, 1.0);
  EXPECT_EQ(c->rope.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope.original_max_position, 8192.0);
  fac[20] *= 1.5f;
  gguf_writer odd = small_llama(8, 256, 2, 2, 500000.0f);
  odd.tensor_f32("rope_freqs.weight", {hd / 2}, fac);
  auto bad = load_config(write(odd, dir, "odd.gguf"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("not Llama 3's rotary scaling"), std::string::npos) << bad.err().message;
}

TEST(GgufModel, UnsupportedFilesAreRefusedByName) {
  temp_dir dir;
  auto refused = [&](gguf_writer w, const std::string& want) {
    auto m = model::load(write(w, dir, "x.gguf"));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.err().message.find(want), std::string::npos) << m.err().message;
    EXPECT_EQ(m.err().message.find('\n'), std::string::npos);
  };
  gguf_writer arch;
  arch.str("general.architecture", "mamba");
  refused(arch, "general.architecture 'mamba' (supported: llama, qwen2, qwen3, qwen3moe, qwen2moe)");
  gguf_writer moe = small_llama();
  moe.u32("llama.expert_count", 8);
  refused(moe, "missing metadata 'llama.expert_used_count'");
  gguf_writer qwen_experts;
  qwen_experts.str("general.architecture", "qwen2");
  qwen_experts.u32("qwen2.expert_count", 8);
  refused(qwen_experts, "experts in a qwen2 model");
  gguf_writer extra = small_llama();  // experts' tensors in a model without experts
  extra.tensor_f32("blk.0.ffn_gate_exps.weight", {4, 8, 2}, std::vector<float>(64));
  refused(extra, "tensor 'blk.0.ffn_gate_exps.weight' is not one llmesh knows");
  gguf_writer used = small_llama();
  used.u32("llama.expert_count", 8);
  used.u32("llama.expert_used_count", 9);
  refused(used, "llama.expert_used_count must be 1 to expert_count");
  gguf_writer stack = small_llama();
  stack.u32("llama.expert_count", 3);
  stack.u32("llama.expert_used_count", 2);
  stack.tensor_f32("blk.0.ffn_gate_exps.weight", {4, 8, 2}, std::vector<float>(64));
  refused(stack, "tensor 'blk.0.ffn_gate_exps.weight' stacks 2 experts, not expert_count's 3");
  gguf_writer count;
  count.str("general.architecture", "qwen3moe");
  refused(count, "missing metadata 'qwen3moe.expert_count'");
  gguf_writer missing;
  missing.str("general.architecture", "qwen2");
  refused(missing, "missing metadata 'qwen2.embedding_length'");
}

TEST(GgufModel, LlamaQAndKRowsAreUnpermutedOthersKeptAsViews) {
  // llama.cpp stores row h*hd + 2j + s of HF's h*hd + s*hd/2 + j: the loader undoes it.
  temp_dir dir;
  gguf_writer w = small_llama(8, 8, 2, 1);  // head_dim 4
  std::vector<float> q(8 * 8);
  for (size_t r = 0; r < 8; ++r) {
    for (size_t c = 0; c < 8; ++c) q[r * 8 + c] = static_cast<float>(r);  // each row holds its GGUF row index
  }
  w.tensor_f32("blk.0.attn_q.weight", {8, 8}, q);  // a second attn_q: refused
  auto twice = parse_bytes(w.bytes());
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.err().message.find("'blk.0.attn_q.weight' appears twice"), std::string::npos);
  gguf_writer m;
  m.str("general.architecture", "llama");
  m.u32("llama.embedding_length", 8);
  m.u32("llama.block_count", 1);
  m.u32("llama.feed_forward_length", 8);
  m.u32("llama.attention.head_count", 2);
  m.u32("llama.attention.head_count_kv", 1);
  auto zeros = [](size_t n) { return std::vector<float>(n, 0.0f); };
  m.tensor_f32("token_embd.weight", {8, 8}, zeros(64));
  m.tensor_f32("output_norm.weight", {8}, zeros(8));
  m.tensor_f32("blk.0.attn_norm.weight", {8}, zeros(8));
  m.tensor_f32("blk.0.ffn_norm.weight", {8}, zeros(8));
  m.tensor_f32("blk.0.attn_q.weight", {8, 8}, q);
  m.tensor_f32("blk.0.attn_k.weight", {8, 4}, std::vector<float>(q.begin(), q.begin() + 32));
  m.tensor_f32("blk.0.attn_v.weight", {8, 4}, std::vector<float>(q.begin(), q.begin() + 32));
  m.tensor_f32("blk.0.attn_output.weight", {8, 8}, q);
  m.tensor_f32("blk.0.ffn_gate.weight", {8, 8}, zeros(64));
  m.tensor_f32("blk.0.ffn_up.weight", {8, 8}, zeros(64));
  m.tensor_f32("blk.0.ffn_down.weight", {8, 8}, zeros(64));
  auto loaded = model::load(write(m, dir, "perm.gguf"));
  ASSERT_TRUE(loaded.ok()) << loaded.err().message;
  const auto& l = (*loaded)->weights().layers[0];
  auto row_of = [](const weight_matrix& w, size_t r) { return kernels::load_as_f32(w.data, w.type, r * w.cols); };
  // head 0: HF rows 0,1 (first half) are GGUF rows 0,2; HF rows 2,3 are GGUF rows 1,3.
  const float want_q[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (size_t r = 0; r < 8; ++r) EXPECT_EQ(row_of(l.q, r), want_q[r]) << "q row " << r;
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(row_of(l.k, r), want_q[r]) << "k row " << r;
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(row_of(l.v, r), static_cast<float>(r)) << "v row " << r;  // not permuted
  for (size_t r = 0; r < 8; ++r) EXPECT_EQ(row_of(l.o, r), static_cast<float>(r));
}

TEST(GgufModel, Q8_0AndIq4NlBlocksAreTakenExactlyAndInt8KeepsThem) {
  // One Q8_0 matrix: its values are d * q with d the block's float16 scale, bit for bit; one
  // IQ4_NL matrix: d * iq4nl_values[index], likewise (both held as int8 blocks).
  temp_dir dir;
  gguf_writer w;  // hidden 32: whole Q8_0 rows
  llama_shape(w, 32, 1, 32, 2, 1);
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
  auto zeros = [](size_t n) { return std::vector<float>(n, 0.5f); };
  w.tensor_f32("token_embd.weight", {32, 8}, zeros(256));
  w.tensor_f32("output_norm.weight", {32}, zeros(32));
  w.tensor_f32("blk.0.attn_norm.weight", {32}, zeros(32));
  w.tensor_f32("blk.0.ffn_norm.weight", {32}, zeros(32));
  w.tensor_f32("blk.0.attn_q.weight", {32, 32}, zeros(1024));
  w.tensor_f32("blk.0.attn_k.weight", {32, 16}, zeros(512));
  w.tensor_f32("blk.0.attn_v.weight", {32, 16}, zeros(512));
  w.tensor_f32("blk.0.attn_output.weight", {32, 32}, zeros(1024));
  w.tensor("blk.0.ffn_gate.weight", ggml::q8_0, {32, 32}, blocks);
  w.tensor("blk.0.ffn_up.weight", ggml::iq4_nl, {32, 32}, nl);
  w.tensor_f32("blk.0.ffn_down.weight", {32, 32}, zeros(1024));
  const std::string path = write(w, dir, "q8.gguf");
  for (auto q : {quantization::none, quantization::int8}) {
    auto loaded = model::load(path, {.dtype = {}, .quant = q, .loras = {}});
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

/// Random K-quant blocks for a [rows, cols] matrix: every byte random but the float16 factors
/// (d, and dmin where the type has one), small enough that a forward pass stays finite.
std::string k_quant_blocks(uint32_t type, size_t rows, size_t cols, std::mt19937& rng) {
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
std::vector<float> first_logits(const std::shared_ptr<const model>& m, int tp, const std::vector<int32_t>& prompt) {
  engine_options o;
  o.threads = 2;
  o.tp = tp;
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
void expect_tp_logits_close(const std::vector<float>& tp1, const std::vector<float>& tp2) {
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
  // slice (384 of 768 columns) cuts a super-block, so each rank holds those as int8.
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
    expect_tp_logits_close(first_logits(*m, 1, prompt), first_logits(*m, 2, prompt));
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

/// The GGUF tokenizer metadata llama.cpp's converter writes for an HF tokenizer.json: tokens in
/// id order (added ones too), special added tokens CONTROL (3), other added ones USER_DEFINED
/// (4), merges as "a b".
void add_tokenizer(gguf_writer& w, const std::string& fixture, const std::string& pre, bool add_bos) {
  std::ifstream in(data_dir + "/tokenizers/" + fixture + "/tokenizer.json");
  json j = json::parse(in);
  std::map<int64_t, std::pair<std::string, int32_t>> by_id;
  for (const auto& [t, id] : j["model"]["vocab"].items()) by_id[id.get<int64_t>()] = {t, 1};
  for (const auto& a : j["added_tokens"]) by_id[a["id"].get<int64_t>()] = {a["content"], a.value("special", false) ? 3 : 4};
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int64_t i = 0; i <= by_id.rbegin()->first; ++i) {
    auto it = by_id.find(i);
    tokens.push_back(it == by_id.end() ? "[PAD" + std::to_string(i) + "]" : it->second.first);
    types.push_back(it == by_id.end() ? 5 : it->second.second);
  }
  std::vector<std::string> merges;
  for (const auto& m : j["model"]["merges"]) {
    merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  w.str("tokenizer.ggml.model", "gpt2");
  w.str("tokenizer.ggml.pre", pre);
  w.strings("tokenizer.ggml.tokens", tokens);
  w.i32s("tokenizer.ggml.token_type", types);
  w.strings("tokenizer.ggml.merges", merges);
  w.boolean("tokenizer.ggml.add_bos_token", add_bos);
  w.u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(add_bos ? 128000 : 151643));
  w.u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(add_bos ? 128009 : 151645));
}

/// The same for a SentencePiece vocabulary (tokenizer.ggml.model "llama"): scores instead of
/// merges (Llama 2's pieces score by id, -id, but for the runs of spaces ▁▁ and ▁▁▁▁, which come
/// last: tokenizer.json lists their merges at the end), <unk> UNKNOWN (2), <0xNN> BYTE (6).
void add_spm_tokenizer(gguf_writer& w, const std::string& fixture) {
  std::ifstream in(data_dir + "/tokenizers/" + fixture + "/tokenizer.json");
  json j = json::parse(in);
  std::map<int64_t, std::string> by_id;
  for (const auto& [t, id] : j["model"]["vocab"].items()) by_id[id.get<int64_t>()] = t;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<float> scores;
  for (const auto& [id, t] : by_id) {
    tokens.push_back(t);
    const bool byte = t.size() == 6 && t.rfind("<0x", 0) == 0;
    types.push_back(t == "<unk>" ? 2 : (t == "<s>" || t == "</s>") ? 3 : byte ? 6 : 1);
    const bool space_run = t == "\u2581\u2581" || t == "\u2581\u2581\u2581\u2581";  // scored last, as HF's merges show
    scores.push_back(types.back() != 1 ? 0.0f : space_run ? -1e9f : -static_cast<float>(id));
  }
  w.str("tokenizer.ggml.model", "llama");
  w.strings("tokenizer.ggml.tokens", tokens);
  w.i32s("tokenizer.ggml.token_type", types);
  w.f32s("tokenizer.ggml.scores", scores);
  w.u32("tokenizer.ggml.bos_token_id", 1);
  w.u32("tokenizer.ggml.eos_token_id", 2);
  w.u32("tokenizer.ggml.unknown_token_id", 0);
}

struct tokenizer_case {
  std::string fixture, pre;
  bool add_bos;
};

class GgufTokenizer : public ::testing::TestWithParam<tokenizer_case> {};

TEST_P(GgufTokenizer, EncodesAndDecodesAsTheReference) {
  const auto& c = GetParam();
  temp_dir dir;
  gguf_writer w;
  w.str("general.architecture", "llama");  // no tensors: the tokenizer alone is read
  if (c.pre.empty()) {
    add_spm_tokenizer(w, c.fixture);
  } else {
    add_tokenizer(w, c.fixture, c.pre, c.add_bos);
  }
  w.str("tokenizer.chat_template", "{% for m in messages %}[{{ m['content'] }}]{% endfor %}");
  const std::string path = write(w, dir);
  auto tok = tokenizer::load(path);
  ASSERT_TRUE(tok.ok()) << tok.err().message;
  std::ifstream in(data_dir + "/tokenizers/" + c.fixture + "/cases.jsonl");
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    auto k = json::parse(line);
    const std::string text = k["text"].get<std::string>();
    SCOPED_TRACE("text: " + text.substr(0, 80));
    auto ids = k["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ((*tok)->encode(text, false), ids);
    auto with_special = (*tok)->encode(text, true);
    if (c.add_bos) {
      ASSERT_FALSE(with_special.empty());
      EXPECT_EQ(with_special[0], c.pre.empty() ? 1 : 128000);
      with_special.erase(with_special.begin());
    }
    EXPECT_EQ(with_special, ids);
    EXPECT_EQ((*tok)->decoder().decode(ids, false), k["decoded"].get<std::string>());
    ++cases;
  }
  EXPECT_GE(cases, 25);
  auto chat = chat_template::load(path);
  ASSERT_TRUE(chat.ok()) << chat.err().message;
  auto text = chat->render(json::array({{{"role", "user"}, {"content", "hi"}}}), false, json::object());
  ASSERT_TRUE(text.ok()) << text.err().message;
  EXPECT_EQ(*text, "[hi]");
  // The config says what the architecture lacks; the tokenizer still loads.
  auto cfg = load_config(path);
  ASSERT_FALSE(cfg.ok());
  EXPECT_NE(cfg.err().message.find("missing metadata 'llama.embedding_length'"), std::string::npos) << cfg.err().message;
}

// llama3 (llama-bpe: ignore_merges, BOS added), qwen3 (qwen2: NFC, single digits, no BOS),
// llama2 (SentencePiece: merges from scores, byte fallback, BOS added).
INSTANTIATE_TEST_SUITE_P(Fixtures, GgufTokenizer,
                         ::testing::Values(tokenizer_case{"llama3", "llama-bpe", true}, tokenizer_case{"qwen3", "qwen2", false},
                                           tokenizer_case{"llama2", "", true}),
                         [](const auto& info) { return info.param.fixture; });

TEST(GgufTokenizer, AnUnknownPreTokenizerIsRefusedByName) {
  temp_dir dir;
  gguf_writer w;
  w.str("general.architecture", "llama");
  w.str("tokenizer.ggml.model", "gpt2");
  w.str("tokenizer.ggml.pre", "tekken");
  w.strings("tokenizer.ggml.tokens", {"a", "b"});
  w.strings("tokenizer.ggml.merges", {});
  auto tok = tokenizer::load(write(w, dir));
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.err().message.find("tokenizer.ggml.pre 'tekken'"), std::string::npos) << tok.err().message;
}

}  // namespace
}  // namespace llmesh::model
