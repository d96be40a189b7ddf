// GGUF files (gguf.hpp; gguf_model.cpp, gguf_tensors.cpp): the parser's bounds (every
// truncation and thousands of mutations are errors, never faults), the config and tokenizer a
// file's metadata becomes, refusals, Llama's q/k rows (block formats and experts:
// gguf_blocks_test.cpp). The engine's outputs on real converted files are checked against the
// PyTorch reference in tests/cli/golden_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <tuple>

#include "gguf_test_util.hpp"
#include "llmesh/kernels/dtype.hpp"
#include "llmesh/model/chat_template.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/gguf.hpp"
#include "llmesh/model/tokenizer.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;
using namespace gguf_testing;

const std::string data_dir = LLMESH_TEST_DATA;

result<std::shared_ptr<const gguf_file>> parse_bytes(const std::string& b) {
  auto keep = std::make_shared<std::string>(b);
  return gguf_file::parse("t.gguf", reinterpret_cast<const uint8_t*>(keep->data()), keep->size(), keep);
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

TEST(GgufModel, YarnScalingBecomesItsRopeScaling) {
  // llama.cpp's keys for a config's yarn rope_scaling (a Qwen GGUF converted for a long context).
  temp_dir dir;
  gguf_writer w = small_llama();
  w.str("llama.rope.scaling.type", "yarn");
  w.f32("llama.rope.scaling.factor", 4.0f);
  w.u32("llama.rope.scaling.original_context_length", 64);
  w.f32("llama.rope.scaling.yarn_beta_fast", 16.0f);
  auto c = load_config(write(w, dir));
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_TRUE(c->rope.yarn);
  EXPECT_EQ(c->rope.factor, 4.0);
  EXPECT_EQ(c->rope.original_max_position, 64.0);
  EXPECT_EQ(c->rope.beta_fast, 16.0);
  EXPECT_EQ(c->rope.beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(c->rope.attention_factor, 0.1 * std::log(4.0) + 1.0);
  EXPECT_EQ(c->max_positions, 256u);  // vLLM's context: the original one times the factor
  w.f32("llama.rope.scaling.yarn_attn_factor", 1.25f);  // a config's attention_factor: the whole scale
  w.f32("llama.rope.scaling.attn_factor", 2.0f);         // llama.cpp's multiplier of it
  c = load_config(write(w, dir, "attn.gguf"));
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_DOUBLE_EQ(c->rope.attention_factor, 2.5);
  gguf_writer ext = small_llama();
  ext.str("llama.rope.scaling.type", "yarn");
  ext.f32("llama.rope.scaling.factor", 4.0f);
  ext.f32("llama.rope.scaling.yarn_ext_factor", 0.5f);
  auto refused = load_config(write(ext, dir, "ext.gguf"));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.err().message.find("yarn_ext_factor"), std::string::npos) << refused.err().message;
  w.f32("llama.rope.scaling.yarn_log_multiplier", 0.1f);  // DeepSeek's
  auto bad = load_config(write(w, dir, "deepseek.gguf"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("yarn_log_multiplier"), std::string::npos) << bad.err().message;
  gguf_writer dyn = small_llama();
  dyn.str("llama.rope.scaling.type", "dynamic");
  bad = load_config(write(dyn, dir, "dyn.gguf"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("(supported: none, linear, yarn)"), std::string::npos) << bad.err().message;
}

/// A small Phi-3 as llama.cpp's converter writes Phi-4-mini: fused attn_qkv and ffn_up, a rotary
/// over 6 of each head's 8 dims, LongRoPE's factors as F32 tensors.
gguf_writer small_phi3(bool longrope) {
  gguf_writer w;
  w.str("general.architecture", "phi3");
  w.u32("phi3.context_length", 4096);
  w.u32("phi3.embedding_length", 16);
  w.u32("phi3.block_count", 1);
  w.u32("phi3.feed_forward_length", 8);
  w.u32("phi3.attention.head_count", 2);
  w.u32("phi3.attention.head_count_kv", 1);
  w.f32("phi3.attention.layer_norm_rms_epsilon", 1e-5f);
  w.f32("phi3.rope.freq_base", 10000.0f);
  w.u32("phi3.rope.dimension_count", 6);
  w.u32("phi3.rope.scaling.original_context_length", 1024);
  w.u32("phi3.attention.sliding_window", 512);
  auto t = [&](const std::string& name, std::vector<uint64_t> dims) {
    size_t n = 1;
    for (auto d : dims) n *= d;
    w.tensor_f32(name, std::move(dims), std::vector<float>(n, 0.125f));
  };
  t("token_embd.weight", {16, 8});
  t("output_norm.weight", {16});
  t("blk.0.attn_norm.weight", {16});
  t("blk.0.ffn_norm.weight", {16});
  t("blk.0.attn_qkv.weight", {16, 16 + 2 * 8});
  t("blk.0.attn_output.weight", {16, 16});
  t("blk.0.ffn_up.weight", {16, 16});
  t("blk.0.ffn_down.weight", {8, 16});
  if (longrope) {
    w.f32("phi3.rope.scaling.attn_factor", 1.1f);
    w.tensor_f32("rope_factors_long.weight", {3}, {1.0f, 2.0f, 4.0f});
    w.tensor_f32("rope_factors_short.weight", {3}, {1.0f, 1.5f, 2.0f});
  }
  return w;
}

TEST(GgufModel, Phi3sFusedTensorsPartialRotaryAndLongropeFactorsLoad) {
  temp_dir dir;
  auto m = model::load(write(small_phi3(true), dir));
  ASSERT_TRUE(m.ok()) << m.err().message;
  const model_config& c = (*m)->config();
  EXPECT_EQ(c.arch, architecture::phi3);
  EXPECT_TRUE(c.fused_projections);
  EXPECT_EQ(c.head_dim, 8u);
  EXPECT_EQ(c.rope.head_dim, 6u);
  EXPECT_EQ(c.sliding_window, 512u);
  EXPECT_TRUE(c.rope.longrope);
  EXPECT_TRUE(c.rope.use_long);  // served at 4096 > 1024
  EXPECT_EQ(c.rope.long_factor, (std::vector<double>{1.0, 2.0, 4.0}));
  EXPECT_EQ(c.rope.short_factor, (std::vector<double>{1.0, 1.5, 2.0}));
  EXPECT_DOUBLE_EQ(c.rope.long_mscale, static_cast<double>(1.1f));
  EXPECT_EQ((*m)->weights().layers[0].q.rows, 16u);  // q, k, v and gate, up: views of the fused tensors
  EXPECT_EQ((*m)->weights().layers[0].v.rows, 8u);
  EXPECT_EQ((*m)->weights().layers[0].up.rows, 8u);
  auto plain = load_config(write(small_phi3(false), dir, "plain.gguf"));
  ASSERT_TRUE(plain.ok()) << plain.err().message;
  EXPECT_FALSE(plain->rope.longrope);
  EXPECT_EQ(plain->rope.head_dim, 6u);

  gguf_writer odd = small_phi3(false);  // one factor list missing
  odd.tensor_f32("rope_factors_long.weight", {3}, {1.0f, 2.0f, 4.0f});
  auto bad = load_config(write(odd, dir, "odd.gguf"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("rope_factors_short.weight"), std::string::npos) << bad.err().message;
  gguf_writer partial = small_llama(8, 16, 2, 1);  // Llama's permuted q/k with a partial rotary: refused
  partial.u32("llama.rope.dimension_count", 6);
  bad = load_config(write(partial, dir, "partial.gguf"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("rope.dimension_count < head dim) in a llama model"), std::string::npos) << bad.err().message;
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
  refused(arch, "general.architecture 'mamba' (supported: llama, qwen2, qwen3, qwen3moe, qwen2moe, phi3, gpt-oss, gemma, gemma2, gemma3, smollm3)");
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

// GPT-4o's pre-tokenizer (Phi-4-mini's GGUFs say "gpt-4o"): a lower-case run ends a word before
// an upper-case letter, and a contraction stays with its word — where Llama 3's pattern keeps
// "helloWorld" whole and splits "it's". Merges across those boundaries show the pieces.
TEST(GgufTokenizer, Gpt4oSplitsAtCaseChangesAndKeepsContractions) {
  temp_dir dir;
  auto tokenizer_of = [&](const std::string& pre) {
    gguf_writer w;
    w.str("general.architecture", "llama");
    w.str("tokenizer.ggml.model", "gpt2");
    w.str("tokenizer.ggml.pre", pre);
    w.strings("tokenizer.ggml.tokens", {"h", "e", "l", "o", "W", "r", "d", "i", "t", "'", "s", "oW", "t'", "1", "2", "3", "4", "34"});
    w.strings("tokenizer.ggml.merges", {"o W", "t '", "3 4"});
    auto tok = tokenizer::load(write(w, dir, pre + ".gguf"));
    EXPECT_TRUE(tok.ok()) << (tok.ok() ? "" : tok.err().message);
    return tok.ok() ? *tok : nullptr;
  };
  auto o200k = tokenizer_of("gpt-4o"), llama3 = tokenizer_of("llama-bpe");
  ASSERT_TRUE(o200k && llama3);
  EXPECT_EQ(o200k->encode("helloWorld", false), (std::vector<int32_t>{0, 1, 2, 2, 3, 4, 3, 5, 2, 6}));  // hello | World
  EXPECT_EQ(llama3->encode("helloWorld", false), (std::vector<int32_t>{0, 1, 2, 2, 11, 3, 5, 2, 6}));  // one word: "oW"
  EXPECT_EQ(o200k->encode("it's", false), (std::vector<int32_t>{7, 12, 10}));  // one piece: "t'"
  EXPECT_EQ(llama3->encode("it's", false), (std::vector<int32_t>{7, 8, 9, 10}));  // it | 's
  EXPECT_EQ(o200k->encode("1234", false), (std::vector<int32_t>{13, 14, 15, 16}));  // 123 | 4
}

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
