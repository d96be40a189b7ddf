// The final hidden rows a step gives back (step_sequence::hidden: what /v1/embeddings pools).
// Against the independent PyTorch reference (tests/data/golden): a golden model's LM head
// applied to the last prompt row gives the reference's logits within 1e-4 (max-abs-diff /
// max-abs, as the golden test checks the engine's own logits). Then the contracts: a row is
// the one the LM head takes (its logits equal the step's), its bits do not depend on chunking
// or on batch neighbours, and tp 2 agrees within 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "llmesh/kernels/dtype.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/random_model.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

const std::string golden_dir = std::string(LLMESH_TEST_DATA) + "/golden";

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

/// One step of `seqs` (each from position 0 unless pos0 is given, blocks from `first_block`
/// on), asking for their hidden rows; returns rank 0's rows.
struct seq_in {
  std::vector<int32_t> tokens;
  size_t pos0 = 0;
  int32_t first_block = 0;
  hidden_rows hidden = hidden_rows::all;
  bool want_logits = false;
};

result<step_logprobs> run_step(engine& e, const std::vector<seq_in>& seqs, std::vector<int32_t>* tokens = nullptr) {
  std::vector<std::vector<int32_t>> tables;
  std::vector<step_sequence> batch;
  size_t rows = 0;
  for (const auto& s : seqs) {
    const size_t blocks = (s.pos0 + s.tokens.size() + e.kv_block_size() - 1) / e.kv_block_size();
    auto& t = tables.emplace_back(blocks);
    std::iota(t.begin(), t.end(), s.first_block);
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    step_sequence q;
    q.tokens = seqs[i].tokens;
    q.pos0 = seqs[i].pos0;
    q.block_table = tables[i];
    q.want_logits = seqs[i].want_logits;
    q.hidden = seqs[i].hidden;
    rows += drawn_rows(q);
    batch.push_back(q);
  }
  std::vector<kernels::sample_row> sample(rows);  // greedy
  std::vector<int32_t> drawn;
  step_logprobs out;
  LLMESH_TRY(e.forward_sample(batch, sample, tokens ? *tokens : drawn, &out));
  return out;
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

struct golden {
  const char* name;
  std::vector<int32_t> prompt;
  random_model_spec spec;
};

std::vector<golden> golden_cases() {
  std::vector<golden> out;
  random_model_spec a;  // llama_gqa_f32: untied
  a.arch = "llama", a.hidden = 64, a.intermediate = 160, a.n_layers = 2, a.n_heads = 4, a.n_kv_heads = 2, a.vocab = 517;
  a.dtype = kernels::dtype::f32, a.seed = 11;
  out.push_back({"llama_gqa_f32", {1, 7, 42, 300, 5, 99, 128, 256, 17, 3}, a});
  random_model_spec q;  // qwen3_qknorm_bf16: tied, q/k norms
  q.arch = "qwen3", q.hidden = 64, q.intermediate = 192, q.n_layers = 2, q.n_heads = 4, q.n_kv_heads = 2, q.head_dim = 32;
  q.vocab = 600, q.dtype = kernels::dtype::bf16, q.tie_embeddings = true, q.rope_theta = 1000000, q.seed = 17;
  out.push_back({"qwen3_qknorm_bf16", {4, 44, 144, 244, 344, 444, 7, 77}, q});
  random_model_spec b;  // qwen2_bias_bf16: q/k/v biases, tied
  b.arch = "qwen2", b.hidden = 96, b.intermediate = 256, b.n_layers = 3, b.n_heads = 6, b.n_kv_heads = 2, b.vocab = 600;
  b.dtype = kernels::dtype::bf16, b.tie_embeddings = true, b.rope_theta = 1000000, b.seed = 13;
  out.push_back({"qwen2_bias_bf16", {3, 14, 15, 92, 65, 35, 89, 79}, b});
  return out;
}

TEST(HiddenRows, TheLastRowTimesTheLmHeadIsTheReferencesLogits) {
  for (const auto& g : golden_cases()) {
    SCOPED_TRACE(g.name);
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(g.spec, dir.path()).ok());
    const std::string check = "cd " + dir.path() + " && sha256sum -c --quiet " + golden_dir + "/" + g.name + "/model.sha256";
    ASSERT_EQ(std::system(check.c_str()), 0) << "the random model's bytes changed: regenerate the golden files";
    auto m = model::load(dir.path());
    ASSERT_TRUE(m.ok()) << m.err().message;
    auto e = make_engine(*m);
    ASSERT_TRUE(e);
    auto out = run_step(*e, {{g.prompt, 0, 0, hidden_rows::last}});
    ASSERT_TRUE(out.ok()) << out.err().message;
    const size_t H = (*m)->config().hidden, V = (*m)->config().vocab;
    ASSERT_EQ(out->hidden.size(), H);
    const auto& head = (*m)->weights().lm_head;
    const auto ref = read_floats(golden_dir + "/" + g.name + "/logits.f32");
    ASSERT_EQ(ref.size(), V);
    double max_diff = 0, max_abs = 0;
    for (size_t v = 0; v < V; ++v) {
      double dot = 0;
      for (size_t d = 0; d < H; ++d) dot += double(kernels::load_as_f32(head.data, head.type, v * head.ld() + d)) * out->hidden[d];
      max_diff = std::max(max_diff, std::abs(dot - ref[v]));
      max_abs = std::max(max_abs, std::abs(double(ref[v])));
    }
    EXPECT_LT(max_diff / max_abs, 1e-4);
  }
}

random_model_spec small_spec() {
  random_model_spec s;
  s.hidden = 96, s.intermediate = 200, s.n_layers = 2, s.n_heads = 6, s.n_kv_heads = 2, s.vocab = 300;
  s.dtype = kernels::dtype::bf16, s.seed = 5;
  return s;
}

std::shared_ptr<const model> small_model(testing::temp_dir& dir, random_model_spec s = small_spec()) {
  EXPECT_TRUE(write_random_model(s, dir.path()).ok());
  auto m = model::load(dir.path());
  EXPECT_TRUE(m.ok());
  return m.ok() ? *m : nullptr;
}

std::vector<int32_t> prompt_of(size_t n, int32_t salt) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((i * 37 + salt * 11 + 5) % 290 + 3);
  return p;
}

TEST(HiddenRows, LastIsTheRowTheLmHeadTakes) {
  testing::temp_dir dir;
  auto m = small_model(dir);
  auto e = make_engine(m);
  const auto p = prompt_of(13, 1);
  auto rows = run_step(*e, {{p, 0, 0, hidden_rows::all}});
  ASSERT_TRUE(rows.ok()) << rows.err().message;
  const size_t H = m->config().hidden;
  ASSERT_EQ(rows->hidden.size(), p.size() * H);
  // The same prompt again (its KV rewritten alike), drawing greedily and asking for the last row.
  std::vector<int32_t> drawn;
  auto last = run_step(*e, {{p, 0, 0, hidden_rows::last, true}}, &drawn);
  ASSERT_TRUE(last.ok());
  ASSERT_EQ(last->hidden.size(), H);
  EXPECT_EQ(0, std::memcmp(last->hidden.data(), rows->hidden.data() + (p.size() - 1) * H, H * sizeof(float)));
  // Its logits (the LM head over it) put the drawn token first.
  std::vector<float> logits;
  const std::vector<int32_t> table = {0};
  step_sequence q;
  q.tokens = p;
  q.block_table = table;
  ASSERT_TRUE(e->forward(std::span(&q, 1), logits).ok());
  const auto& head = m->weights().lm_head;
  int32_t best = 0;
  double best_v = -1e300;
  for (size_t v = 0; v < m->config().vocab; ++v) {
    double dot = 0;
    for (size_t d = 0; d < H; ++d) dot += double(kernels::load_as_f32(head.data, head.type, v * head.ld() + d)) * last->hidden[d];
    EXPECT_NEAR(dot, logits[v], 1e-3 * (1 + std::abs(logits[v])));
    if (dot > best_v) best_v = dot, best = static_cast<int32_t>(v);
  }
  ASSERT_EQ(drawn.size(), 1u);
  EXPECT_EQ(best, drawn[0]);
}

TEST(HiddenRows, BitsDoNotDependOnChunksOrNeighbours) {
  testing::temp_dir dir;
  auto m = small_model(dir);
  auto e = make_engine(m);
  const size_t H = m->config().hidden;
  const auto p = prompt_of(21, 2);
  auto whole = run_step(*e, {{p, 0, 0}});
  ASSERT_TRUE(whole.ok());
  // In chunks of 5 (each chunk's rows are its positions'), beside another sequence's prompt.
  std::vector<float> chunked;
  const auto other = prompt_of(9, 3);
  for (size_t at = 0; at < p.size(); at += 5) {
    std::vector<int32_t> chunk(p.begin() + at, p.begin() + std::min(p.size(), at + 5));
    auto out = run_step(*e, {{other, 0, 20, hidden_rows::last, true}, {chunk, at, 0}});
    ASSERT_TRUE(out.ok()) << out.err().message;
    ASSERT_EQ(out->hidden.size(), (1 + chunk.size()) * H);
    chunked.insert(chunked.end(), out->hidden.begin() + H, out->hidden.end());  // after the neighbour's row
  }
  ASSERT_EQ(chunked.size(), whole->hidden.size());
  EXPECT_EQ(0, std::memcmp(chunked.data(), whole->hidden.data(), chunked.size() * sizeof(float)));
}

TEST(HiddenRows, OnlyTheSequencesThatAskGetRowsAndFirstIsTheChunksFirst) {
  testing::temp_dir dir;
  auto m = small_model(dir);
  auto e = make_engine(m);
  auto out = run_step(*e, {{prompt_of(4, 1), 0, 0, hidden_rows::none, true}, {prompt_of(6, 2), 0, 10, hidden_rows::none}});
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->hidden.empty());
  const size_t H = m->config().hidden;
  const auto p = prompt_of(9, 3);
  auto all = run_step(*e, {{p, 0, 0, hidden_rows::all}});
  auto first = run_step(*e, {{prompt_of(3, 4), 0, 10, hidden_rows::last}, {p, 0, 0, hidden_rows::first}});
  ASSERT_TRUE(all.ok() && first.ok());
  ASSERT_EQ(first->hidden.size(), 2 * H);
  EXPECT_EQ(0, std::memcmp(first->hidden.data() + H, all->hidden.data(), H * sizeof(float)));
}

TEST(HiddenRows, TensorParallelAgreesWithOneRank) {
  testing::temp_dir dir;
  auto m = small_model(dir);
  auto one = make_engine(m, 1);
  auto two = make_engine(m, 2);
  const auto p = prompt_of(11, 4);
  auto a = run_step(*one, {{p, 0, 0}});
  auto b = run_step(*two, {{p, 0, 0}});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->hidden.size(), b->hidden.size());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < a->hidden.size(); ++i) {
    max_diff = std::max(max_diff, double(std::abs(a->hidden[i] - b->hidden[i])));
    max_abs = std::max(max_abs, double(std::abs(a->hidden[i])));
  }
  EXPECT_LT(max_diff / max_abs, 1e-5);
}

// How embedding models ship: a bare transformer ("LlamaModel", tensors without "model.", no
// lm_head), or a ...ForCausalLM config over such tensors (Qwen3-Embedding-8B). Both load, say
// they have no LM head, and give the full checkpoint's hidden rows bit for bit.
TEST(HiddenRows, ABareTransformersCheckpointGivesTheFullCheckpointsRows) {
  testing::temp_dir full_dir, bare_dir;
  auto full = small_model(full_dir);
  random_model_spec b = small_spec();
  b.base_model = true;
  auto bare = small_model(bare_dir, b);
  ASSERT_TRUE(full && bare);
  EXPECT_TRUE(full->config().has_lm_head);
  EXPECT_FALSE(bare->config().has_lm_head);
  EXPECT_EQ(bare->config().arch_name, "LlamaModel");
  const auto p = prompt_of(17, 5);
  auto a = run_step(*make_engine(full), {{p, 0, 0}});
  auto c = run_step(*make_engine(bare), {{p, 0, 0}});
  ASSERT_TRUE(a.ok() && c.ok());
  ASSERT_EQ(a->hidden.size(), c->hidden.size());
  EXPECT_EQ(0, std::memcmp(a->hidden.data(), c->hidden.data(), a->hidden.size() * sizeof(float)));
  {  // the same tensors under a ...ForCausalLM config
    std::ifstream in(bare_dir.path() + "/config.json");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string cfg = ss.str();
    const auto at = cfg.find("\"LlamaModel\"");
    ASSERT_NE(at, std::string::npos);
    cfg.replace(at, 12, "\"LlamaForCausalLM\"");
    std::ofstream(bare_dir.path() + "/config.json") << cfg;
  }
  auto causal = model::load(bare_dir.path());
  ASSERT_TRUE(causal.ok()) << causal.err().message;
  EXPECT_FALSE((*causal)->config().has_lm_head);
  auto d = run_step(*make_engine(*causal), {{p, 0, 0}});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(0, std::memcmp(a->hidden.data(), d->hidden.data(), a->hidden.size() * sizeof(float)));
}

}  // namespace
}  // namespace llmesh::model
