// LoRA adapters (lora.hpp): a sequence that names an adapter gets the logits of the model whose
// weights are W + scale·B·A (the merged model, written here by plain double arithmetic and run
// without adapters: an independent path to the same numbers); its bits do not depend on batch
// neighbours with other adapters or none, nor on chunking; tp 2 agrees; sequences without one
// keep the base model's bits; bad adapters are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "llmesh/kernels/dtype.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/lora.hpp"
#include "llmesh/model/random_model.hpp"
#include "llmesh/model/safetensors.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

random_model_spec llama_spec() {
  random_model_spec s;
  s.arch = "llama", s.hidden = 64, s.intermediate = 160, s.n_layers = 2, s.n_heads = 4, s.n_kv_heads = 2, s.vocab = 300;
  s.dtype = kernels::dtype::f32, s.seed = 21;
  return s;
}

/// Writes `base` with every adapter projection merged (W + scale·B·A, in double) into `out`.
void write_merged(const std::string& base, const std::string& adapter_dir, const std::string& out) {
  fs::create_directories(out);
  for (const auto& f : fs::directory_iterator(base)) {
    if (f.path().extension() != ".safetensors") fs::copy_file(f.path(), fs::path(out) / f.path().filename());
  }
  auto cfg = load_config(base);
  ASSERT_TRUE(cfg.ok());
  auto adapter = load_lora({"x", adapter_dir}, *cfg);
  ASSERT_TRUE(adapter.ok()) << adapter.err().message;
  auto store = tensor_store::open(base);
  ASSERT_TRUE(store.ok());
  std::vector<tensor_spec> tensors;
  for (const auto& name : store->names()) {
    const tensor_view v = *store->get(name);
    ASSERT_EQ(v.type, kernels::dtype::f32) << "the merged model is written in f32";
    const lora_pair* p = nullptr;
    for (size_t l = 0; l < cfg->n_layers; ++l) {
      for (size_t t = 0; t < lora_target_count; ++t) {
        const auto target = static_cast<lora_target>(t);
        const std::string module = (lora_target_in_mlp(target) ? "mlp." : "self_attn.") + std::string(lora_target_name(target));
        if (name == "model.layers." + std::to_string(l) + "." + module + ".weight") p = &adapter->layers[l].pairs[t];
      }
    }
    tensors.push_back({name, v.type, v.shape, [v, p](std::span<uint8_t> bytes) {
                         std::memcpy(bytes.data(), v.data, bytes.size());
                         if (p == nullptr || p->r == 0) return;
                         auto* w = reinterpret_cast<float*>(bytes.data());
                         for (size_t o = 0; o < p->out; ++o) {
                           for (size_t i = 0; i < p->in; ++i) {
                             double d = 0;
                             for (size_t k = 0; k < p->r; ++k) d += double(p->b.value(o * p->r + k)) * p->a.value(k * p->in + i);
                             w[o * p->in + i] = static_cast<float>(w[o * p->in + i] + double(p->scale) * d);
                           }
                         }
                       }});
  }
  ASSERT_TRUE(write_safetensors(out + "/model.safetensors", tensors).ok());
}

std::unique_ptr<engine> make_engine(std::shared_ptr<const model> m, int tp = 1) {
  engine_options o;
  o.tp = tp;
  o.threads = 2;
  o.kv_tokens = 1024;
  auto e = engine::create(std::move(m), o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
  return e.ok() ? std::move(*e) : nullptr;
}

struct seq_in {
  std::vector<int32_t> tokens;
  int32_t lora = -1;
  size_t pos0 = 0;
  int32_t first_block = 0;
  uint32_t draws = 1;
};

/// One step; returns the logits of every sequence's drawn rows, in batch order.
std::vector<float> step(engine& e, const std::vector<seq_in>& seqs) {
  std::vector<std::vector<int32_t>> tables;
  std::vector<step_sequence> batch;
  for (const auto& s : seqs) {
    auto& t = tables.emplace_back((s.pos0 + s.tokens.size() + e.kv_block_size() - 1) / e.kv_block_size());
    std::iota(t.begin(), t.end(), s.first_block);
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    step_sequence q;
    q.tokens = seqs[i].tokens;
    q.pos0 = seqs[i].pos0;
    q.block_table = tables[i];
    q.draws = seqs[i].draws;
    q.lora = seqs[i].lora;
    batch.push_back(q);
  }
  std::vector<float> logits;
  auto s = e.forward(batch, logits);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.err().message);
  return logits;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    max_diff = std::max(max_diff, std::abs(double(a[i]) - b[i]));
    max_abs = std::max(max_abs, std::abs(double(b[i])));
  }
  return max_diff / max_abs;
}

const std::vector<int32_t> prompt = {1, 7, 42, 250, 5, 99, 128, 256, 17, 3, 64, 200};

struct lora_case {
  const char* name;
  random_model_spec model;
  random_lora_spec lora;
};

std::vector<lora_case> cases() {
  std::vector<lora_case> out;
  out.push_back({"llama_all_targets", llama_spec(), {}});
  lora_case q{"qwen2_attention_rslora_bf16", llama_spec(), {}};
  q.model.arch = "qwen2", q.model.n_heads = 6, q.model.hidden = 96, q.model.n_kv_heads = 2, q.model.seed = 9;
  q.lora.rank = 4, q.lora.alpha = 8, q.lora.rslora = true, q.lora.dtype = kernels::dtype::bf16, q.lora.seed = 3;
  q.lora.targets = {"q_proj", "v_proj", "o_proj"};
  out.push_back(q);
  lora_case g{"qwen3_mlp_rank1", llama_spec(), {}};
  g.model.arch = "qwen3", g.model.head_dim = 32, g.model.seed = 4;
  g.lora.rank = 1, g.lora.targets = {"gate_proj", "down_proj"}, g.lora.seed = 8;
  out.push_back(g);
  return out;
}

/// The llama_spec model in DIR/base with one all-target adapter "a" (DIR/adapter), loaded.
std::shared_ptr<const model> model_with_adapter(const testing::temp_dir& dir) {
  const std::string base = dir.path() + "/base", ad = dir.path() + "/adapter";
  EXPECT_TRUE(write_random_model(llama_spec(), base).ok());
  EXPECT_TRUE(write_random_lora({}, base, ad).ok());
  load_options lo;
  lo.loras = {{"a", ad}};
  auto m = model::load(base, lo);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
  return m.ok() ? *m : nullptr;
}

TEST(Lora, AnAdaptersLogitsAreThoseOfTheMergedModel) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    testing::temp_dir dir;
    const std::string base = dir.path() + "/base", ad = dir.path() + "/adapter", merged = dir.path() + "/merged";
    ASSERT_TRUE(write_random_model(c.model, base).ok());
    ASSERT_TRUE(write_random_lora(c.lora, base, ad).ok());
    write_merged(base, ad, merged);
    load_options lo;
    lo.loras = {{"a", ad}};
    auto m = model::load(base, lo);
    ASSERT_TRUE(m.ok()) << m.err().message;
    auto mm = model::load(merged);
    ASSERT_TRUE(mm.ok()) << mm.err().message;
    auto e = make_engine(*m), em = make_engine(*mm);
    ASSERT_TRUE(e && em);
    const uint32_t n = static_cast<uint32_t>(prompt.size());
    const auto with = step(*e, {{prompt, 0, 0, 0, n}});  // every position's logits
    const auto want = step(*em, {{prompt, -1, 0, 0, n}});
    const auto without = step(*e, {{prompt, -1, 0, 8, n}});
    ASSERT_EQ(with.size(), n * (*m)->config().vocab);
    EXPECT_LT(rel_diff(with, want), 1e-5);
    EXPECT_GT(rel_diff(without, want), 0.05) << "the adapter must change the logits for this test to mean anything";
  }
}

TEST(Lora, WithoutAnAdapterASequenceKeepsTheBaseModelsBits) {
  testing::temp_dir dir;
  auto m = model_with_adapter(dir);
  auto plain = model::load(dir.path() + "/base");
  ASSERT_TRUE(m && plain.ok());
  auto e = make_engine(m), ep = make_engine(*plain);
  // Beside a sequence with the adapter, in the same step.
  const auto mixed = step(*e, {{prompt, -1, 0, 0}, {prompt, 0, 0, 8}});
  const auto ref = step(*ep, {{prompt, -1, 0, 0}});
  ASSERT_EQ(mixed.size(), 2 * ref.size());
  EXPECT_EQ(0, std::memcmp(mixed.data(), ref.data(), ref.size() * sizeof(float)));
  EXPECT_NE(0, std::memcmp(mixed.data() + ref.size(), ref.data(), ref.size() * sizeof(float)));
}

TEST(Lora, BitsDoNotDependOnNeighboursOrChunks) {
  testing::temp_dir dir;
  const std::string base = dir.path() + "/base";
  ASSERT_TRUE(write_random_model(llama_spec(), base).ok());
  random_lora_spec b;
  b.seed = 99, b.rank = 16, b.targets = {"k_proj", "up_proj"};
  ASSERT_TRUE(write_random_lora({}, base, dir.path() + "/a").ok());
  ASSERT_TRUE(write_random_lora(b, base, dir.path() + "/b").ok());
  load_options lo;
  lo.loras = {{"a", dir.path() + "/a"}, {"b", dir.path() + "/b"}};
  auto m = model::load(base, lo);
  ASSERT_TRUE(m.ok()) << m.err().message;
  auto e = make_engine(*m);
  const auto alone = step(*e, {{prompt, 0, 0, 0}});
  // In chunks of 5, the same sequence's blocks (0..) beside two others with adapter b and none.
  std::vector<float> last;
  for (size_t p0 = 0; p0 < prompt.size(); p0 += 5) {
    const size_t k = std::min<size_t>(5, prompt.size() - p0);
    std::vector<int32_t> chunk(prompt.begin() + p0, prompt.begin() + p0 + k);
    auto out = step(*e, {{{9, 8, 7}, 1, 0, 8}, {chunk, 0, p0, 0}, {{3, 4, 5, 6}, -1, 0, 16}});
    last.assign(out.begin() + (*m)->config().vocab, out.begin() + 2 * (*m)->config().vocab);
  }
  ASSERT_EQ(last.size(), alone.size());
  EXPECT_EQ(0, std::memcmp(last.data(), alone.data(), alone.size() * sizeof(float)));
}

TEST(Lora, TensorParallelAgrees) {
  testing::temp_dir dir;
  auto m = model_with_adapter(dir);
  ASSERT_TRUE(m);
  auto e1 = make_engine(m, 1), e2 = make_engine(m, 2);
  ASSERT_TRUE(e1 && e2);
  const uint32_t n = static_cast<uint32_t>(prompt.size());
  EXPECT_LT(rel_diff(step(*e2, {{prompt, 0, 0, 0, n}}), step(*e1, {{prompt, 0, 0, 0, n}})), 1e-5);
}

// vLLM's --lora-dtype: every matrix rewritten in the type asked for (bfloat16 and float16 by
// rounding to nearest even, float32 exactly); auto follows the weights' --dtype, else the file's.
TEST(Lora, LoraDtypeRewritesEveryMatrix) {
  testing::temp_dir dir;
  const std::string base = dir.path() + "/base", ad = dir.path() + "/adapter";
  ASSERT_TRUE(write_random_model(llama_spec(), base).ok());
  ASSERT_TRUE(write_random_lora({}, base, ad).ok());
  auto cfg = load_config(base);
  ASSERT_TRUE(cfg.ok());
  auto stored = load_lora({"a", ad}, *cfg);
  ASSERT_TRUE(stored.ok()) << stored.err().message;
  ASSERT_EQ(stored->layers[0][lora_target::q].a.type, kernels::dtype::f32) << "random-lora writes float32";
  for (auto to : {kernels::dtype::bf16, kernels::dtype::f16}) {
    lora_adapter cast = *stored;
    ASSERT_TRUE(cast_lora(cast, to).ok());
    size_t checked = 0;
    for (size_t l = 0; l < cfg->n_layers; ++l) {
      for (size_t t = 0; t < lora_target_count; ++t) {
        const auto& was = stored->layers[l].pairs[t];
        const auto& now = cast.layers[l].pairs[t];
        if (was.r == 0) continue;
        ASSERT_EQ(now.a.type, to);
        ASSERT_EQ(now.b.type, to);
        ASSERT_EQ(now.a.bytes.size(), kernels::dtype_offset(to, was.r * was.in));
        for (size_t i = 0; i < was.r * was.in; ++i) {
          const float v = was.a.value(i);
          const float want = to == kernels::dtype::bf16 ? kernels::bf16_to_f32(kernels::f32_to_bf16(v))
                                                        : kernels::f16_to_f32(kernels::f32_to_f16(v));
          ASSERT_EQ(now.a.value(i), want) << l << " " << t << " " << i;
          ++checked;
        }
        EXPECT_EQ(now.scale, was.scale);
      }
    }
    EXPECT_GT(checked, 1000u);
    lora_adapter back = cast;  // widening is exact
    ASSERT_TRUE(cast_lora(back, kernels::dtype::f32).ok());
    EXPECT_EQ(back.layers[1][lora_target::down].b.value(3), cast.layers[1][lora_target::down].b.value(3));
  }
  lora_adapter q8 = *stored;
  EXPECT_FALSE(cast_lora(q8, kernels::dtype::q8).ok());
  // Through model::load: asked for, or following --dtype (vLLM's auto).
  load_options lo;
  lo.loras = {{"a", ad}};
  lo.lora_dtype = kernels::dtype::bf16;
  auto asked = model::load(base, lo);
  ASSERT_TRUE(asked.ok()) << asked.err().message;
  EXPECT_EQ((*asked)->loras().find("a").second->layers[0][lora_target::v].b.type, kernels::dtype::bf16);
  lo.lora_dtype.reset();
  lo.dtype = kernels::dtype::f16;
  auto follows = model::load(base, lo);
  ASSERT_TRUE(follows.ok()) << follows.err().message;
  EXPECT_EQ((*follows)->loras().find("a").second->layers[0][lora_target::v].b.type, kernels::dtype::f16);
  lo.dtype.reset();
  auto plain = model::load(base, lo);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->loras().find("a").second->layers[0][lora_target::v].b.type, kernels::dtype::f32) << "as stored";
}

TEST(Lora, AnUnknownAdapterIndexIsRefusedAndCudaIsRefused) {
  testing::temp_dir dir;
  auto m = model_with_adapter(dir);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->loras().find("a").first, 0);
  EXPECT_EQ(m->loras().find("b").first, -1);
  auto e = make_engine(m);
  std::vector<int32_t> table = {0};
  step_sequence s;
  s.tokens = prompt;
  s.block_table = table;
  s.lora = 1;
  std::vector<float> logits;
  auto st = e->forward(std::span(&s, 1), logits);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("LoRA adapter 1 is not loaded"), std::string::npos) << st.err().message;
  engine_options o;
  o.device = backend::cuda;
  auto c = engine::create(m, o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.err().message.find("LoRA adapters run on the CPU backend only"), std::string::npos) << c.err().message;
}

TEST(Lora, SourcesParseAndNamesAreChecked) {
  auto a = parse_lora_source("sql=/models/sql-lora");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->name, "sql");
  EXPECT_EQ(a->path, "/models/sql-lora");
  auto j = parse_lora_source(R"({"name": "org/chat:v2", "path": "/x", "base_model_name": "m"})");
  ASSERT_TRUE(j.ok()) << j.err().message;
  EXPECT_EQ(j->name, "org/chat:v2");
  for (const char* bad : {"nopath", "=/x", "a b=/x", "x=", "{\"name\": 3}", "{bad json"}) {
    auto r = parse_lora_source(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.err().message.find("--lora-modules"), std::string::npos) << r.err().message;
    }
  }
  EXPECT_TRUE(check_lora_names({{"a", "/x"}, {"b", "/x"}}, "m").ok());
  EXPECT_FALSE(check_lora_names({{"a", "/x"}, {"a", "/y"}}, "m").ok());
  EXPECT_FALSE(check_lora_names({{"m", "/x"}}, "m").ok());
}

/// Rewrites the adapter's config (a JSON patch merged in) or its tensors, then expects a load error naming `what`.
void expect_refused(const std::function<void(const std::string& ad)>& spoil, const std::string& what) {
  testing::temp_dir dir;
  const std::string base = dir.path() + "/base", ad = dir.path() + "/adapter";
  ASSERT_TRUE(write_random_model(llama_spec(), base).ok());
  random_lora_spec s;
  s.targets = {"q_proj"};
  ASSERT_TRUE(write_random_lora(s, base, ad).ok());
  spoil(ad);
  load_options lo;
  lo.loras = {{"bad", ad}};
  auto m = model::load(base, lo);
  ASSERT_FALSE(m.ok()) << what;
  EXPECT_NE(m.err().message.find("LoRA adapter 'bad'"), std::string::npos) << m.err().message;
  EXPECT_NE(m.err().message.find(what), std::string::npos) << m.err().message;
}

void patch_config(const std::string& ad, const json& patch) {
  std::ifstream in(ad + "/adapter_config.json");
  json j = json::parse(in);
  j.merge_patch(patch);
  std::ofstream(ad + "/adapter_config.json") << j.dump();
}

void write_tensors(const std::string& ad, std::vector<std::pair<std::string, std::vector<size_t>>> shapes) {
  std::vector<tensor_spec> t;
  for (auto& [name, shape] : shapes) {
    t.push_back({name, kernels::dtype::f32, shape, [](std::span<uint8_t> b) { std::fill(b.begin(), b.end(), 0); }});
  }
  ASSERT_TRUE(write_safetensors(ad + "/adapter_model.safetensors", t).ok());
}

TEST(Lora, BadAdaptersAreRefusedByName) {
  const std::string p = "base_model.model.model.layers.0.self_attn.q_proj.";
  expect_refused([](const std::string& ad) { patch_config(ad, {{"use_dora", true}}); }, "DoRA");
  expect_refused([](const std::string& ad) { patch_config(ad, {{"bias", "all"}}); }, "bias");
  expect_refused([](const std::string& ad) { patch_config(ad, {{"modules_to_save", {"lm_head"}}}); }, "modules_to_save");
  expect_refused([](const std::string& ad) { patch_config(ad, {{"peft_type", "IA3"}}); }, "not LORA");
  expect_refused([](const std::string& ad) { patch_config(ad, {{"alpha_pattern", {{"q_proj", 4}}}}); }, "alpha_pattern");
  expect_refused([](const std::string& ad) { std::ofstream(ad + "/adapter_config.json") << "[1"; }, "not a JSON object");
  expect_refused([](const std::string& ad) { fs::remove(ad + "/adapter_config.json"); }, "adapter_config.json");
  expect_refused([](const std::string& ad) { fs::remove(ad + "/adapter_model.safetensors"); }, "no adapter_model.safetensors");
  expect_refused(
      [](const std::string& ad) {
        fs::remove(ad + "/adapter_model.safetensors");
        std::ofstream(ad + "/adapter_model.bin") << "x";
      },
      "adapter_model.bin");
  expect_refused([&](const std::string& ad) { write_tensors(ad, {{p + "lora_A.weight", {8, 64}}}); }, "lora_A and lora_B must both");
  expect_refused([&](const std::string& ad) { write_tensors(ad, {{p + "lora_A.weight", {8, 64}}, {p + "lora_B.weight", {63, 8}}}); },
                 "do not fit");
  expect_refused([&](const std::string& ad) { write_tensors(ad, {{p + "lora_A.weight", {600, 64}}, {p + "lora_B.weight", {64, 600}}}); },
                 "rank 600");
  expect_refused([](const std::string& ad) { write_tensors(ad, {{"base_model.model.model.embed_tokens.lora_embedding_A", {8, 300}}}); },
                 "embed_tokens");
  expect_refused(
      [](const std::string& ad) {
        write_tensors(ad, {{"base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight", {8, 64}},
                           {"base_model.model.model.layers.2.self_attn.q_proj.lora_B.weight", {64, 8}}});
      },
      "layer 2");
  expect_refused([](const std::string& ad) { write_tensors(ad, {}); }, "no LoRA tensors");
  expect_refused([&](const std::string& ad) {
    write_tensors(ad, {{p + "lora_A.weight", {8, 64}}, {p + "lora_A.default.weight", {8, 64}}, {p + "lora_B.weight", {64, 8}}});
  }, "given twice");
  expect_refused([](const std::string& ad) {
    write_tensors(ad, {{"base_model.model.model.layers.99999999999999999999.self_attn.q_proj.lora_A.weight", {8, 64}}});
  }, "is not a LoRA pair");
}

// A mutation fuzz of the adapter's two files: adapter_config.json edited at random, and
// safetensors files of random tensor names (valid and mangled, some very long) and shapes. A
// load either succeeds or fails with one line naming the adapter; it never throws or crashes.
TEST(Lora, MutatedAdaptersLoadOrFailWithOneLine) {
  testing::temp_dir dir;
  const std::string base = dir.path() + "/base", ad = dir.path() + "/adapter";
  ASSERT_TRUE(write_random_model(llama_spec(), base).ok());
  random_lora_spec spec;
  spec.targets = {"q_proj", "down_proj"};
  ASSERT_TRUE(write_random_lora(spec, base, ad).ok());
  auto cfg = load_config(base);
  ASSERT_TRUE(cfg.ok());
  std::string config_text;
  {
    std::ifstream in(ad + "/adapter_config.json");
    config_text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string good_file = ad + "/good.safetensors";
  fs::copy_file(ad + "/adapter_model.safetensors", good_file);
  std::mt19937 rng(77);
  static const std::string pieces[] = {"{", "}", "[", "]", "\"", ",", ":", "null", "true", "-1", "1e400", "\"r\"",
                                       "\"use_dora\"", "\"bias\"", "\"lora_alpha\"", "\"modules_to_save\"", "\xC3"};
  static const char* const projs[] = {"q_proj", "k_proj", "o_proj", "down_proj", "gate_proj", "qkv_proj", "lm_head", ""};
  size_t loaded = 0, refused = 0;
  for (int it = 0; it < 300; ++it) {
    std::string text = config_text;
    for (int e = 1 + static_cast<int>(rng() % 3); e > 0; --e) {
      const size_t at = rng() % (text.size() + 1);
      switch (rng() % 3) {
        case 0: text.insert(at, pieces[rng() % std::size(pieces)]); break;
        case 1: if (at < text.size()) text.erase(at, 1 + rng() % 4); break;
        default: if (at < text.size()) text[at] = static_cast<char>(rng() % 256); break;
      }
    }
    if (rng() % 3 == 0) text = config_text;  // the tensors alone
    std::ofstream(ad + "/adapter_config.json", std::ios::trunc) << text;
    if (rng() % 2 == 0) {
      fs::copy_file(good_file, ad + "/adapter_model.safetensors", fs::copy_options::overwrite_existing);
    } else {
      std::vector<std::pair<std::string, std::vector<size_t>>> tensors;
      for (int t = static_cast<int>(rng() % 4); t >= 0; --t) {
        std::string name = "base_model.model.model.layers." + std::to_string(rng() % 4) + "." +
                           (rng() % 2 ? "self_attn." : "mlp.") + projs[rng() % std::size(projs)] + ".lora_" +
                           (rng() % 2 ? "A" : "B") + ".weight";
        if (rng() % 8 == 0) name.insert(rng() % name.size(), std::string(rng() % 3 == 0 ? 100000 : 7, 'x'));
        std::vector<size_t> shape = {rng() % 3 == 0 ? 0 : 1 + rng() % 70, 1 + rng() % 200};
        if (rng() % 5 == 0) shape.push_back(2);
        tensors.emplace_back(std::move(name), std::move(shape));
      }
      write_tensors(ad, tensors);
    }
    auto a = load_lora({"f", ad}, *cfg);
    if (a.ok()) {
      ++loaded;
      continue;
    }
    ++refused;
    EXPECT_EQ(a.err().message.rfind("LoRA adapter 'f'", 0), 0u) << a.err().message;
    EXPECT_EQ(a.err().message.find('\n'), std::string::npos) << a.err().message;
  }
  EXPECT_GT(loaded, 20u);  // both outcomes are met
  EXPECT_GT(refused, 100u);
}

}  // namespace
}  // namespace llmesh::model
