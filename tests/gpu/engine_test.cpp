// The CUDA engine end to end against the CPU engine (itself checked against the PyTorch golden
// files): on the golden shapes, greedy tokens identical and logits within 1e-4 relative
// (deterministic mode); and the GPU's own contracts, bit for bit: a sequence's logits do not
// change with its batch neighbours, with prefill chunking, or with CUDA graph replay.
// Skipped without a device (label gpu).
#include <cstring>
#include <random>

#include "../model/temp_dir.hpp"
#include "gpu_test_util.hpp"
#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/cuda_executor.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/random_model.hpp"

namespace llmesh::gpu_testing {
namespace {

using model::random_model_spec;

struct named_spec {
  const char* name;
  random_model_spec spec;
};

/// The shapes of tests/data/golden/cases.txt (dtype, GQA/MHA/MQA, biases, llama3 rope with
/// head_dim ≠ hidden/heads, sliding window, odd vocabulary, Qwen3's per-head q/k norms, Phi-3's
/// fused projections), plus one wide enough for 16-byte loads.
std::vector<named_spec> golden_shapes() {
  std::vector<named_spec> v;
  auto add = [&](const char* name, auto edit) {
    random_model_spec s;
    edit(s);
    v.push_back({name, s});
  };
  add("llama_gqa_f32", [](auto& s) { s.hidden = 64; s.intermediate = 160; s.n_heads = 4; s.n_kv_heads = 2; s.seed = 11; });
  add("llama_mha_tied_f16_h200", [](auto& s) {
    s.hidden = 200; s.intermediate = 344; s.n_heads = 5; s.n_kv_heads = 5; s.dtype = kernels::dtype::f16;
    s.tie_embeddings = true; s.seed = 12; });
  add("qwen2_bias_bf16", [](auto& s) {
    s.arch = "qwen2"; s.hidden = 96; s.intermediate = 256; s.n_layers = 3; s.n_heads = 6; s.n_kv_heads = 2;
    s.vocab = 600; s.dtype = kernels::dtype::bf16; s.tie_embeddings = true; s.rope_theta = 1e6; s.seed = 13; });
  add("llama3_rope_mqa_f32", [](auto& s) {
    s.hidden = 128; s.intermediate = 200; s.n_heads = 4; s.n_kv_heads = 1; s.head_dim = 48; s.vocab = 700;
    s.llama3_scaling = true; s.rope_theta = 500000; s.attention_bias = true; s.seed = 44; });
  add("mistral_window_bf16", [](auto& s) {
    s.arch = "mistral"; s.hidden = 64; s.intermediate = 128; s.n_heads = 8; s.n_kv_heads = 4;
    s.dtype = kernels::dtype::bf16; s.sliding_window = 8; s.seed = 15; });
  add("qwen3_qknorm_bf16", [](auto& s) {
    s.arch = "qwen3"; s.hidden = 64; s.intermediate = 192; s.n_heads = 4; s.n_kv_heads = 2; s.head_dim = 32;
    s.vocab = 600; s.dtype = kernels::dtype::bf16; s.tie_embeddings = true; s.rope_theta = 1e6; s.seed = 17; });
  add("phi3_fused_window_bf16", [](auto& s) {
    s.arch = "phi3"; s.hidden = 96; s.intermediate = 160; s.n_heads = 6; s.n_kv_heads = 2; s.vocab = 600;
    s.dtype = kernels::dtype::bf16; s.sliding_window = 6; s.seed = 19; });
  add("smollm3_nope_window_bf16", [](auto& s) {  // NoPE layers (rope_kv's rotate false), the window on them only
    s.arch = "smollm3"; s.hidden = 64; s.intermediate = 128; s.n_layers = 4; s.n_heads = 4; s.n_kv_heads = 2;
    s.vocab = 600; s.dtype = kernels::dtype::bf16; s.sliding_window = 5; s.rope_theta = 2e6; s.seed = 95; });
  add("ministral3_temp_yarn_bf16", [](auto& s) {  // yarn and the queries' temperature (rope_kv's q_scale)
    s.arch = "ministral3"; s.hidden = 64; s.intermediate = 128; s.n_heads = 4; s.n_kv_heads = 2;
    s.vocab = 600; s.dtype = kernels::dtype::bf16; s.rope_theta = 1e6; s.seed = 97; });
  add("llama_wide_bf16", [](auto& s) {
    s.hidden = 512; s.intermediate = 1376; s.n_layers = 3; s.n_heads = 8; s.n_kv_heads = 2; s.vocab = 4099;
    s.dtype = kernels::dtype::bf16; s.seed = 17; });
  return v;
}

class loaded_model {
 public:
  explicit loaded_model(const random_model_spec& spec) {
    EXPECT_TRUE(model::write_random_model(spec, dir_.path()).ok());
    auto m = model::model::load(dir_.path());
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
    if (m.ok()) m_ = *m;
  }
  std::shared_ptr<const model::model> get() const { return m_; }

 private:
  model::testing::temp_dir dir_;
  std::shared_ptr<const model::model> m_;
};

std::unique_ptr<model::engine> make_engine(std::shared_ptr<const model::model> m, model::backend b, bool det = true,
                                           bool graphs = true) {
  model::engine_options o;
  o.device = b;
  o.deterministic = det;
  o.cuda_graphs = graphs;
  o.threads = 2;
  o.kv_tokens = 2048;
  auto e = model::engine::create(std::move(m), o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
  return e.ok() ? std::move(*e) : nullptr;
}

std::vector<int32_t> prompt_of(size_t n, size_t vocab, uint32_t salt) {
  std::mt19937 rng(test_seed(salt));
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
  return p;
}

/// Greedy generation: the logits of every step (prefill's last row, then each decode step).
std::vector<std::vector<float>> greedy_logits(model::engine& e, const std::vector<int32_t>& prompt, size_t steps,
                                              std::vector<int32_t>& ids) {
  std::vector<std::vector<float>> out;
  int seq = e.open_sequence();
  std::vector<int32_t> next = prompt;
  for (size_t i = 0; i < steps; ++i) {
    std::vector<float> logits;
    const model::step_item item{seq, next, true};
    auto st = e.step(std::span(&item, 1), logits);
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.err().message);
    if (!st.ok()) break;
    int32_t tok = kernels::argmax(logits);
    ids.push_back(tok);
    out.push_back(std::move(logits));
    next = {tok};
  }
  e.close_sequence(seq);
  return out;
}

TEST(CudaEngine, GreedyTokensEqualCpuOnGoldenShapes) {
  LLMESH_REQUIRE_GPU();
  uint32_t salt = 1;
  for (const auto& [name, spec] : golden_shapes()) {
    loaded_model m(spec);
    ASSERT_TRUE(m.get());
    auto cpu = make_engine(m.get(), model::backend::cpu);
    auto gpu = make_engine(m.get(), model::backend::cuda);
    ASSERT_TRUE(cpu && gpu);
    EXPECT_STREQ(gpu->backend_name(), "cuda");
    auto prompt = prompt_of(23, spec.vocab, salt++);
    std::vector<int32_t> cpu_ids, gpu_ids;
    auto want = greedy_logits(*cpu, prompt, 12, cpu_ids);
    auto got = greedy_logits(*gpu, prompt, 12, gpu_ids);
    EXPECT_EQ(gpu_ids, cpu_ids) << name;
    for (size_t i = 0; i < std::min(want.size(), got.size()); ++i) {
      EXPECT_LT(rel_error(got[i], want[i]), 1e-4) << name << " step " << i;
    }
  }
}

TEST(CudaEngine, FastModeStaysCloseToCpu) {
  LLMESH_REQUIRE_GPU();
  auto shapes = golden_shapes();
  loaded_model m(shapes.back().spec);  // bf16, wide enough for cuBLAS's tensor-core kernels
  auto cpu = make_engine(m.get(), model::backend::cpu);
  auto gpu = make_engine(m.get(), model::backend::cuda, /*det=*/false);
  ASSERT_TRUE(cpu && gpu);
  auto prompt = prompt_of(64, shapes.back().spec.vocab, 50);
  std::vector<int32_t> a, b;
  auto want = greedy_logits(*cpu, prompt, 4, a);
  auto got = greedy_logits(*gpu, prompt, 4, b);
  ASSERT_EQ(want.size(), got.size());
  EXPECT_LT(rel_error(got[0], want[0]), 2e-2);  // prefill through cuBLASLt with bf16 activations
}

TEST(CudaEngine, StepGreedyEqualsArgmaxOfLogits) {
  LLMESH_REQUIRE_GPU();
  loaded_model m(golden_shapes()[2].spec);
  auto a = make_engine(m.get(), model::backend::cuda);
  auto b = make_engine(m.get(), model::backend::cuda);
  auto prompt = prompt_of(9, 600, 60);
  int sa = a->open_sequence(), sb = b->open_sequence();
  std::vector<int32_t> next = prompt;
  for (int i = 0; i < 6; ++i) {
    std::vector<float> logits;
    std::vector<int32_t> ids;
    const model::step_item ia{sa, next, true}, ib{sb, next, true};
    ASSERT_TRUE(a->step(std::span(&ia, 1), logits).ok());
    ASSERT_TRUE(b->step_greedy(std::span(&ib, 1), ids).ok());
    ASSERT_EQ(ids.size(), 1u);
    EXPECT_EQ(ids[0], kernels::argmax(logits)) << "step " << i;
    next = {ids[0]};
  }
}

/// Sampled decoding on the GPU: step_sample's device draw equals kernels::sample (the CPU) on
/// the logits the same engine returns, step after step.
TEST(CudaEngine, StepSampleDrawsTheCpuSamplersTokenFromItsLogits) {
  LLMESH_REQUIRE_GPU();
  loaded_model m(golden_shapes()[2].spec);
  const kernels::sampling_params settings[] = {{0.8f, 0, 1.0f, 11}, {1.0f, 40, 0.9f, 12}, {1.3f, 0, 0.5f, 13}};
  for (bool det : {true, false}) {
    auto a = make_engine(m.get(), model::backend::cuda, det);
    auto b = make_engine(m.get(), model::backend::cuda, det);
    ASSERT_TRUE(a && b);
    for (const auto& prm : settings) {
      auto prompt = prompt_of(12, 600, 61);
      int sa = a->open_sequence(), sb = b->open_sequence();
      std::vector<int32_t> next = prompt;
      for (int i = 0; i < 12; ++i) {
        const std::vector<kernels::sample_row> rows = {{prm, prompt.size() + static_cast<size_t>(i)}};
        std::vector<float> logits;
        std::vector<int32_t> ids;
        const model::step_item ia{sa, next, true}, ib{sb, next, true};
        ASSERT_TRUE(a->step(std::span(&ia, 1), logits).ok());
        ASSERT_TRUE(b->step_sample(std::span(&ib, 1), rows, ids).ok());
        ASSERT_EQ(ids.size(), 1u);
        ASSERT_EQ(ids[0], kernels::sample(logits, prm, rows[0].position)) << "det " << det << " T " << prm.temperature << " step " << i;
        next = {ids[0]};
      }
      a->close_sequence(sa);
      b->close_sequence(sb);
    }
  }
}

/// Logprobs on the GPU: rows that ask bring their logits back, and the numbers are
/// kernels::compute_logprobs of the logits the same engine returns, greedy rows included.
TEST(CudaEngine, StepSampleLogprobsAreThoseOfItsLogits) {
  LLMESH_REQUIRE_GPU();
  loaded_model m(golden_shapes()[2].spec);
  kernels::sampling_params greedy{}, warm{0.8f, 0, 1.0f, 11}, silent{0.8f, 0, 1.0f, 12};
  greedy.logprobs = 5;
  warm.logprobs = 0;
  auto a = make_engine(m.get(), model::backend::cuda, true);
  auto b = make_engine(m.get(), model::backend::cuda, true);
  ASSERT_TRUE(a && b);
  const kernels::sampling_params params[3] = {greedy, warm, silent};
  std::vector<int> sa, sb;
  std::vector<std::vector<int32_t>> next;
  for (int i = 0; i < 3; ++i) {
    sa.push_back(a->open_sequence());
    sb.push_back(b->open_sequence());
    next.push_back(prompt_of(10 + static_cast<size_t>(i), 600, 80 + static_cast<uint32_t>(i)));
  }
  const size_t vocab = a->config().vocab;
  for (int step = 0; step < 6; ++step) {
    std::vector<model::step_item> ia, ib;
    std::vector<kernels::sample_row> rows;
    for (size_t i = 0; i < 3; ++i) {
      ia.push_back({sa[i], next[i], true});
      ib.push_back({sb[i], next[i], true});
      rows.push_back({params[i], a->sequence_length(sa[i]) + next[i].size()});
    }
    std::vector<float> logits;
    std::vector<int32_t> ids;
    kernels::row_logprobs lps;
    ASSERT_TRUE(a->step(ia, logits).ok());
    ASSERT_TRUE(b->step_sample(ib, rows, ids, &lps).ok());
    ASSERT_EQ(ids, kernels::sample_rows(logits, vocab, rows)) << "step " << step;
    ASSERT_EQ(lps.size(), 3u);
    EXPECT_EQ(lps[0], kernels::compute_logprobs(std::span(logits).first(vocab), ids[0], 5)) << "step " << step;
    EXPECT_EQ(lps[1], kernels::compute_logprobs(std::span(logits).subspan(vocab, vocab), ids[1], 0)) << "step " << step;
    EXPECT_FALSE(lps[2].has_value());
    for (size_t i = 0; i < 3; ++i) next[i] = {ids[i]};
  }
}

/// Structured outputs on the GPU: a row's grammar mask (logits_adjust::allowed) becomes bans
/// of the ids outside it; the draw equals the CPU sampler's on the same logits and mask, and
/// only allowed ids come out.
TEST(CudaEngine, StepSampleFollowsAGrammarMaskAsTheCpuDoes) {
  LLMESH_REQUIRE_GPU();
  loaded_model m(golden_shapes()[2].spec);
  kernels::sampling_params greedy{}, warm{1.0f, 0, 1.0f, 21};
  greedy.constrained = warm.constrained = true;
  auto a = make_engine(m.get(), model::backend::cuda, true);
  auto b = make_engine(m.get(), model::backend::cuda, true);
  ASSERT_TRUE(a && b);
  const size_t vocab = a->config().vocab;
  std::mt19937 rng(4);
  std::vector<int> sa{a->open_sequence(), a->open_sequence()}, sb{b->open_sequence(), b->open_sequence()};
  std::vector<std::vector<int32_t>> next{prompt_of(8, 600, 90), prompt_of(11, 600, 91)};
  for (int step = 0; step < 8; ++step) {
    std::vector<std::vector<uint32_t>> masks(2, std::vector<uint32_t>((vocab + 31) / 32, 0u));
    std::vector<kernels::logits_adjust> adjusts(2);
    for (size_t i = 0; i < 2; ++i) {
      for (int k = 0; k < 1 + step * 3; ++k) {
        const size_t id = rng() % vocab;
        masks[i][id >> 5] |= 1u << (id & 31);
      }
      adjusts[i].allowed = masks[i];
    }
    std::vector<model::step_item> ia, ib;
    std::vector<kernels::sample_row> rows;
    for (size_t i = 0; i < 2; ++i) {
      ia.push_back({sa[i], next[i], true});
      ib.push_back({sb[i], next[i], true});
      rows.push_back({i == 0 ? greedy : warm, a->sequence_length(sa[i]) + next[i].size(), &adjusts[i]});
    }
    std::vector<float> logits;
    std::vector<int32_t> ids;
    ASSERT_TRUE(a->step(ia, logits).ok());
    ASSERT_TRUE(b->step_sample(ib, rows, ids).ok());
    ASSERT_EQ(ids, kernels::sample_rows(logits, vocab, rows)) << "step " << step;
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE((masks[i][static_cast<size_t>(ids[i]) >> 5] >> (ids[i] & 31)) & 1u) << "step " << step << " row " << i;
      next[i] = {ids[i]};
    }
  }
}

/// Decodes `target` alone, then again beside two other sequences (graphs on or off):
/// its logits must keep their bits.
TEST(CudaEngine, DecodeIsBatchInvariantAndGraphsChangeNothing) {
  LLMESH_REQUIRE_GPU();
  loaded_model m(golden_shapes().back().spec);
  const size_t vocab = golden_shapes().back().spec.vocab;
  auto prompt = prompt_of(30, vocab, 70), other1 = prompt_of(45, vocab, 71), other2 = prompt_of(3, vocab, 72);
  std::vector<std::vector<float>> reference;
  for (int variant = 0; variant < 3; ++variant) {
    auto e = make_engine(m.get(), model::backend::cuda, true, /*graphs=*/variant != 1);
    ASSERT_TRUE(e);
    const bool crowded = variant > 0;
    int s = e->open_sequence(), o1 = e->open_sequence(), o2 = e->open_sequence();
    std::vector<float> logits;
    // Prefill (others prefilled in the same step when crowded).
    std::vector<model::step_item> items = {{s, prompt, true}};
    if (crowded) {
      items.push_back({o1, other1, true});
      items.push_back({o2, other2, true});
    }
    ASSERT_TRUE(e->step(items, logits).ok());
    std::vector<std::vector<float>> rows = {std::vector<float>(logits.begin(), logits.begin() + vocab)};
    std::vector<int32_t> tok = {kernels::argmax(rows.back())}, t1 = {5}, t2 = {7};
    for (int i = 0; i < 6; ++i) {
      items = {{s, tok, true}};
      if (crowded) {
        items.insert(items.begin(), model::step_item{o1, t1, true});  // target not first in the batch
        items.push_back({o2, t2, true});
      }
      ASSERT_TRUE(e->step(items, logits).ok());
      const size_t at = crowded ? vocab : 0;
      rows.emplace_back(logits.begin() + at, logits.begin() + at + vocab);
      tok = {kernels::argmax(rows.back())};
    }
    if (variant == 0) {
      reference = rows;
    } else {
      for (size_t i = 0; i < rows.size(); ++i) EXPECT_TRUE(same_bits(rows[i], reference[i])) << "variant " << variant << " step " << i;
    }
  }
}

TEST(CudaEngine, ChunkedPrefillGivesIdenticalBits) {
  LLMESH_REQUIRE_GPU();
  loaded_model m(golden_shapes()[4].spec);  // the sliding-window model
  auto prompt = prompt_of(41, 517, 80);
  std::vector<float> whole, chunked;
  {
    auto e = make_engine(m.get(), model::backend::cuda);
    int s = e->open_sequence();
    const model::step_item item{s, prompt, true};
    ASSERT_TRUE(e->step(std::span(&item, 1), whole).ok());
  }
  {
    auto e = make_engine(m.get(), model::backend::cuda);
    int s = e->open_sequence();
    for (size_t at = 0; at < prompt.size(); at += 5) {
      const size_t n = std::min<size_t>(5, prompt.size() - at);
      const model::step_item item{s, std::span<const int32_t>(prompt.data() + at, n), at + n == prompt.size()};
      ASSERT_TRUE(e->step(std::span(&item, 1), chunked).ok());
    }
  }
  EXPECT_TRUE(same_bits(whole, chunked));
}

/// Speculative decoding's verification step on the device: a sequence that draws from its last
/// 4 positions (step_sequence::draws) gets, bit for bit, the rows of the steps ending at each
/// of them (deterministic mode: batch- and chunk-invariant), and draws their argmax.
TEST(CudaEngine, DrawsFromSeveralPositionsAreTheRowsOfStepsEndingThere) {
  LLMESH_REQUIRE_GPU();
  loaded_model m(golden_shapes()[5].spec);  // Qwen3's per-head q/k norms
  const size_t v = m.get()->config().vocab;
  auto prompt = prompt_of(21, v, 81);
  const std::vector<int32_t> table{4, 9};  // block size 16: positions 0..31
  std::vector<float> want, logits;
  {
    auto e = make_engine(m.get(), model::backend::cuda);
    ASSERT_TRUE(e->forward(std::vector<model::step_sequence>{{std::span(prompt).first(18), 0, table, true}}, logits).ok());
    want = logits;
    for (size_t p = 18; p < prompt.size(); ++p) {
      ASSERT_TRUE(e->forward(std::vector<model::step_sequence>{{std::span(prompt).subspan(p, 1), p, table, true}}, logits).ok());
      want.insert(want.end(), logits.begin(), logits.end());
    }
  }
  ASSERT_EQ(want.size(), 4 * v);
  auto e = make_engine(m.get(), model::backend::cuda);
  ASSERT_TRUE(e->forward(std::vector<model::step_sequence>{{std::span(prompt).first(17), 0, table, false}}, logits).ok());
  model::step_sequence spec{std::span(prompt).subspan(17), 17, table, true};
  spec.draws = 4;
  ASSERT_TRUE(e->forward(std::vector<model::step_sequence>{spec}, logits).ok());
  EXPECT_TRUE(same_bits(logits, want));
  std::vector<kernels::sample_row> rows(4);
  std::vector<int32_t> drawn;
  auto e2 = make_engine(m.get(), model::backend::cuda);
  ASSERT_TRUE(e2->forward(std::vector<model::step_sequence>{{std::span(prompt).first(17), 0, table, false}}, logits).ok());
  ASSERT_TRUE(e2->forward_sample(std::vector<model::step_sequence>{spec}, rows, drawn).ok());
  ASSERT_EQ(drawn.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(drawn[i], kernels::argmax(std::span<const float>(want).subspan(i * v, v)));
}

/// Prompt scoring (step_sequence::prompt_logprobs) on the device: a 40-token prompt in two
/// chunks (the first scoring its successor in the second) gives, for every prompt token after
/// the first, what compute_logprobs gives on the logits of a step ending just before it, and
/// the same entries as the CPU engine within 1e-4.
TEST(CudaEngine, PromptScoringIsThatOfTheLogitsBeforeEachToken) {
  LLMESH_REQUIRE_GPU();
  loaded_model m(golden_shapes()[2].spec);
  const auto prompt = prompt_of(40, 600, 90);
  auto scored_by = [&](model::backend b) {
    auto e = make_engine(m.get(), b, true);
    EXPECT_TRUE(e);
    std::vector<int32_t> table(e->kv_blocks());
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    std::vector<kernels::token_logprobs> out;
    const size_t cut = 25;
    for (int part = 0; part < 2; ++part) {
      model::step_sequence s;
      s.tokens = part == 0 ? std::span(prompt).first(cut) : std::span(prompt).subspan(cut);
      s.pos0 = part == 0 ? 0 : cut;
      s.block_table = table;
      s.want_logits = part == 1;
      s.prompt_logprobs = 3;
      s.next = part == 0 ? prompt[cut] : -1;
      std::vector<kernels::sample_row> rows(part == 1 ? 1 : 0);
      std::vector<int32_t> drawn;
      model::step_logprobs lps;
      auto st = e->forward_sample(std::span(&s, 1), rows, drawn, &lps);
      EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.err().message);
      EXPECT_EQ(lps.prompt.size(), part == 0 ? cut : prompt.size() - cut - 1);
      out.insert(out.end(), lps.prompt.begin(), lps.prompt.end());
    }
    return out;
  };
  const auto gpu = scored_by(model::backend::cuda), cpu = scored_by(model::backend::cpu);
  ASSERT_EQ(gpu.size(), prompt.size() - 1);
  ASSERT_EQ(cpu.size(), gpu.size());
  auto ref = make_engine(m.get(), model::backend::cuda, true);
  ASSERT_TRUE(ref);
  const int seq = ref->open_sequence();
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    const model::step_item it{seq, std::span(&prompt[i], 1), true};
    std::vector<float> logits;
    ASSERT_TRUE(ref->step(std::span(&it, 1), logits).ok());
    const auto want = kernels::compute_logprobs(logits, prompt[i + 1], 3);
    EXPECT_NEAR(gpu[i].logprob, want.logprob, 1e-5) << "position " << i;
    ASSERT_EQ(gpu[i].top.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(gpu[i].top[k].id, want.top[k].id) << "position " << i;
      EXPECT_NEAR(gpu[i].top[k].logprob, want.top[k].logprob, 1e-5) << "position " << i;
    }
    EXPECT_NEAR(gpu[i].logprob, cpu[i].logprob, 1e-4) << "position " << i;
  }
}

/// /v1/embeddings' source on the GPU: the final hidden rows (step_sequence::hidden) of a
/// prompt in two chunks beside a decoding neighbour equal the CPU's within 1e-4 relative, and
/// the GPU's own bits do not depend on the chunking (the rows of one whole step).
TEST(CudaEngine, HiddenRowsEqualTheCpusAndDoNotDependOnChunks) {
  LLMESH_REQUIRE_GPU();
  loaded_model m(golden_shapes()[2].spec);
  const auto prompt = prompt_of(40, 600, 91);
  const size_t H = m.get()->config().hidden;
  auto rows_by = [&](model::backend b, size_t cut) {
    auto e = make_engine(m.get(), b, true);
    EXPECT_TRUE(e);
    std::vector<int32_t> table(64), other_table(4);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    for (size_t i = 0; i < other_table.size(); ++i) other_table[i] = static_cast<int32_t>(100 + i);
    const std::vector<int32_t> other = {5, 6, 7};
    std::vector<float> out;
    for (size_t at = 0; at < prompt.size(); at += cut) {
      model::step_sequence n;  // a neighbour drawing a token
      n.tokens = other;
      n.block_table = other_table;
      model::step_sequence s;
      s.tokens = std::span(prompt).subspan(at, std::min(cut, prompt.size() - at));
      s.pos0 = at;
      s.block_table = table;
      s.want_logits = false;
      s.hidden = model::hidden_rows::all;
      const model::step_sequence batch[2] = {n, s};
      std::vector<kernels::sample_row> rows(1);
      std::vector<int32_t> drawn;
      model::step_logprobs lps;
      auto st = e->forward_sample(batch, rows, drawn, &lps);
      EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.err().message);
      EXPECT_EQ(lps.hidden.size(), s.tokens.size() * H);
      out.insert(out.end(), lps.hidden.begin(), lps.hidden.end());
    }
    return out;
  };
  const auto gpu = rows_by(model::backend::cuda, 25), cpu = rows_by(model::backend::cpu, 25);
  const auto whole = rows_by(model::backend::cuda, prompt.size());
  ASSERT_EQ(gpu.size(), prompt.size() * H);
  ASSERT_EQ(cpu.size(), gpu.size());
  EXPECT_EQ(0, std::memcmp(gpu.data(), whole.data(), gpu.size() * sizeof(float)));
  double diff = 0, scale = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    diff = std::max(diff, double(std::abs(gpu[i] - cpu[i])));
    scale = std::max(scale, double(std::abs(cpu[i])));
  }
  EXPECT_LT(diff / scale, 1e-4);
}

/// KV transfer (disaggregated prefill) on the device: a prompt's whole blocks copied out of a
/// CUDA engine hold the CPU engine's values in the same layout (within 1e-4); copied into
/// another CUDA engine's blocks they come back out bit for bit, and the rest of the prompt
/// computed there on them gives the bits of the prompt computed whole (chunk invariance) — and,
/// on the CPU's blocks, logits within 1e-4 of them.
TEST(CudaEngine, KvBlocksMoveBetweenEnginesInOneLayout) {
  LLMESH_REQUIRE_GPU();
  for (size_t shape : {size_t{0}, size_t{3}}) {  // GQA; MQA with head_dim 48
    loaded_model m(golden_shapes()[shape].spec);
    const auto& cfg = m.get()->config();
    const auto prompt = prompt_of(40, cfg.vocab, 95);
    auto cpu = make_engine(m.get(), model::backend::cpu), gpu = make_engine(m.get(), model::backend::cuda);
    ASSERT_TRUE(cpu && gpu);
    const size_t bs = gpu->kv_block_size();
    ASSERT_EQ(cpu->kv_block_size(), bs);
    auto run = [](model::engine& e, std::span<const int32_t> tokens, size_t pos0, std::span<const int32_t> table) {
      model::step_sequence s;
      s.tokens = tokens;
      s.pos0 = pos0;
      s.block_table = table;
      std::vector<float> logits;
      auto st = e.forward(std::span(&s, 1), logits);
      EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.err().message);
      return logits;
    };
    std::vector<int32_t> table(8), moved(8);
    for (size_t i = 0; i < table.size(); ++i) {
      table[i] = static_cast<int32_t>(i);
      moved[i] = static_cast<int32_t>(20 + i);
    }
    const auto whole = run(*gpu, prompt, 0, table);
    (void)run(*cpu, prompt, 0, table);
    const size_t n = (prompt.size() - 1) / bs;  // the whole blocks a prefill replica moves
    auto from_gpu = gpu->export_kv(std::span(table).first(n));
    auto from_cpu = cpu->export_kv(std::span(table).first(n));
    ASSERT_TRUE(from_gpu.ok()) << from_gpu.err().message;
    ASSERT_TRUE(from_cpu.ok()) << from_cpu.err().message;
    ASSERT_EQ(from_gpu->size(), n * gpu->kv_block_bytes());
    ASSERT_EQ(from_cpu->size(), from_gpu->size());
    std::vector<float> g(from_gpu->size() / sizeof(float)), c(g.size());
    std::memcpy(g.data(), from_gpu->data(), from_gpu->size());
    std::memcpy(c.data(), from_cpu->data(), from_cpu->size());
    double diff = 0, scale = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      diff = std::max(diff, double(std::abs(g[i] - c[i])));
      scale = std::max(scale, double(std::abs(c[i])));
    }
    EXPECT_GT(scale, 0.0);
    EXPECT_LT(diff / scale, 1e-4) << "shape " << shape;
    auto other = make_engine(m.get(), model::backend::cuda);
    ASSERT_TRUE(other);
    ASSERT_TRUE(other->import_kv(std::span(moved).first(n), *from_gpu).ok());
    auto back = other->export_kv(std::span(moved).first(n));
    ASSERT_TRUE(back.ok()) << back.err().message;
    EXPECT_TRUE(*back == *from_gpu);
    const auto rest = run(*other, std::span(prompt).subspan(n * bs), n * bs, moved);
    EXPECT_TRUE(same_bits(rest, whole)) << "shape " << shape;
    auto on_cpu_blocks = make_engine(m.get(), model::backend::cuda);
    ASSERT_TRUE(on_cpu_blocks->import_kv(std::span(moved).first(n), *from_cpu).ok());
    const auto near = run(*on_cpu_blocks, std::span(prompt).subspan(n * bs), n * bs, moved);
    ASSERT_EQ(near.size(), whole.size());
    double d = 0, sc = 0;
    for (size_t i = 0; i < near.size(); ++i) {
      d = std::max(d, double(std::abs(near[i] - whole[i])));
      sc = std::max(sc, double(std::abs(whole[i])));
    }
    EXPECT_LT(d / sc, 1e-4) << "shape " << shape;
    EXPECT_EQ(kernels::argmax(near), kernels::argmax(whole));
  }
}

/// Needs two GPUs (NCCL refuses two ranks on one device): --tp 2 over NCCL gives the greedy
/// tokens of --tp 1 and logits within 1e-4.
TEST(CudaEngine, TensorParallelOverNcclMatchesOneGpu) {
  if (kernels::cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  loaded_model m(golden_shapes().back().spec);
  auto one = make_engine(m.get(), model::backend::cuda);
  model::engine_options o;
  o.device = model::backend::cuda;
  o.deterministic = true;
  o.tp = 2;
  o.kv_tokens = 2048;
  auto two = model::engine::create(m.get(), o);
  ASSERT_TRUE(two.ok()) << two.err().message;
  auto prompt = prompt_of(20, golden_shapes().back().spec.vocab, 90);
  std::vector<int32_t> a, b;
  auto want = greedy_logits(*one, prompt, 8, a);
  auto got = greedy_logits(**two, prompt, 8, b);
  EXPECT_EQ(a, b);
  for (size_t i = 0; i < std::min(want.size(), got.size()); ++i) EXPECT_LT(rel_error(got[i], want[i]), 1e-4) << i;
}

}  // namespace
}  // namespace llmesh::gpu_testing
