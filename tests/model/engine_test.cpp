// The engine's contracts: batch invariance, chunk invariance (identical bits; a dense model
// and a mixture of experts), tensor and expert
// parallelism (same greedy tokens, logits within 1e-4), refusing bad steps without changing
// state, and engine parts (create_part): one rank per engine gives one engine's bits, and a
// part refuses what it cannot run.
#include <gtest/gtest.h>

#include <array>

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/generate.hpp"
#include "llmesh/model/random_model.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

/// A random model written to a temporary directory and loaded.
class temp_model {
 public:
  explicit temp_model(const random_model_spec& spec) {
    EXPECT_TRUE(write_random_model(spec, dir_.path()).ok());
    auto m = model::load(dir_.path());
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
    if (m.ok()) model_ = m.value();
  }
  std::shared_ptr<const model> get() const { return model_; }

 private:
  testing::temp_dir dir_;
  std::shared_ptr<const model> model_;
};

random_model_spec small_spec() {
  random_model_spec s;
  s.hidden = 96;
  s.intermediate = 200;
  s.n_layers = 2;
  s.n_heads = 6;
  s.n_kv_heads = 2;
  s.vocab = 300;
  s.dtype = kernels::dtype::bf16;
  s.seed = 5;
  return s;
}

/// A mixture of experts (Qwen3-MoE): each token's experts differ, so a batch's rows run
/// different experts' matmuls in groups of different sizes.
random_model_spec moe_spec() {
  random_model_spec s = small_spec();
  s.arch = "qwen3_moe";
  s.intermediate = 64;
  s.n_experts = 6;
  s.experts_per_token = 2;
  return s;
}

/// Qwen2-MoE: routed experts without renormalisation, plus the shared expert every token runs.
random_model_spec shared_moe_spec() {
  random_model_spec s = moe_spec();
  s.arch = "qwen2_moe";
  s.shared_intermediate = 96;
  return s;
}

/// GPT-OSS as OpenAI ships it: MXFP4 experts with biases, clamped SwiGLU, a biased router
/// softmaxed over its chosen logits, attention sinks, sliding (window 5) and full layers.
random_model_spec gpt_oss_spec() {
  random_model_spec s = small_spec();
  s.arch = "gpt_oss";
  s.intermediate = 64;
  s.head_dim = 32;  // each of 2 ranks' attention width a multiple of 32 (the model holds blocks of 32)
  s.n_experts = 6;
  s.experts_per_token = 2;
  s.sliding_window = 5;
  s.packed = "mxfp4";
  return s;
}

/// Gemma 3 with everything Gemma adds: sliding and global layers (window 5, every second layer
/// global) with their own rotary, q/k norms, the sandwich norms, both soft-caps.
random_model_spec gemma_spec() {
  random_model_spec s = small_spec();
  s.arch = "gemma3";
  s.n_layers = 3;
  s.sliding_window = 5;
  s.sliding_pattern = 2;
  s.attn_softcap = 3.0f;
  s.final_softcap = 8.0f;
  return s;
}

std::unique_ptr<engine> make_engine(std::shared_ptr<const model> m, int tp, int threads = 2, size_t kv_tokens = 4096) {
  engine_options o;
  o.tp = tp;
  o.threads = threads;
  o.kv_tokens = kv_tokens;
  o.block_size = 4;  // small blocks: sequences span many, non-contiguous blocks
  auto e = engine::create(std::move(m), o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
  return std::move(e.value());
}

std::vector<int32_t> prompt_of(size_t n, uint32_t salt) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((i * 37 + salt * 101 + 11) % 300);
  return p;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

/// Logits of the target sequence's last prompt token, then of 6 greedy decode steps.
std::vector<std::vector<float>> run_alone(engine& e, const std::vector<int32_t>& prompt, size_t chunk) {
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  int seq = e.open_sequence();
  for (size_t at = 0; at < prompt.size(); at += chunk) {
    size_t n = std::min(chunk, prompt.size() - at);
    step_item it{seq, std::span(prompt).subspan(at, n), at + n == prompt.size()};
    EXPECT_TRUE(e.step(std::span(&it, 1), logits).ok());
  }
  out.push_back(logits);
  for (int i = 0; i < 6; ++i) {
    int32_t next = kernels::argmax(logits);
    step_item it{seq, std::span(&next, 1), true};
    EXPECT_TRUE(e.step(std::span(&it, 1), logits).ok());
    out.push_back(logits);
  }
  e.close_sequence(seq);
  return out;
}

TEST(Engine, ChunkedPrefillAndTokenByTokenGiveIdenticalBits) {
  for (const auto& spec : {small_spec(), moe_spec(), shared_moe_spec(), gemma_spec(), gpt_oss_spec()}) {
  SCOPED_TRACE(spec.arch);
  temp_model tm(spec);
  auto e = make_engine(tm.get(), 1);
  auto prompt = prompt_of(23, 1);
  auto whole = run_alone(*e, prompt, prompt.size());
  auto chunks5 = run_alone(*e, prompt, 5);
  auto by_token = run_alone(*e, prompt, 1);
  const size_t v = e->config().vocab;
  for (size_t s = 0; s < whole.size(); ++s) {
    ASSERT_EQ(whole[s].size(), v);
    EXPECT_TRUE(same_bits(whole[s].data(), chunks5[s].data(), v)) << "chunks of 5 differ at step " << s;
    EXPECT_TRUE(same_bits(whole[s].data(), by_token[s].data(), v)) << "token by token differs at step " << s;
  }
  }
}

TEST(Engine, AnMoEPromptLongerThanOneRoutingChunkGivesTheSameBits) {
  // moe_block routes 512 tokens at a time: a 700-token prompt whole crosses that boundary.
  temp_model tm(moe_spec());
  auto e = make_engine(tm.get(), 1);
  auto prompt = prompt_of(700, 3);
  auto whole = run_alone(*e, prompt, prompt.size());
  auto chunks = run_alone(*e, prompt, 97);
  const size_t v = e->config().vocab;
  for (size_t s = 0; s < whole.size(); ++s) {
    EXPECT_TRUE(same_bits(whole[s].data(), chunks[s].data(), v)) << "step " << s;
  }
}

TEST(Engine, SequenceLogitsDoNotDependOnBatchNeighbours) {
  for (const auto& spec : {small_spec(), moe_spec(), shared_moe_spec(), gemma_spec(), gpt_oss_spec()}) {
  temp_model tm(spec);
  for (int tp : {1, 2}) {
    SCOPED_TRACE(spec.arch + " tp " + std::to_string(tp));
    auto e = make_engine(tm.get(), tp);
    auto prompt = prompt_of(17, 2);
    auto alone = run_alone(*e, prompt, prompt.size());
    const size_t v = e->config().vocab;

    // Seven neighbours: some already decoding (long contexts), some prefilling with the target.
    std::vector<int> others;
    std::vector<std::vector<int32_t>> other_prompts;
    std::vector<float> logits;
    for (uint32_t i = 0; i < 7; ++i) {
      others.push_back(e->open_sequence());
      other_prompts.push_back(prompt_of(3 + 5 * i, 10 + i));
      if (i % 2 == 0) {  // pre-filled neighbours: in decode during the target's steps
        step_item it{others.back(), other_prompts.back(), true};
        ASSERT_TRUE(e->step(std::span(&it, 1), logits).ok());
      }
    }
    int target = e->open_sequence();
    std::vector<int32_t> next_tok(7, 1);
    std::vector<int32_t> target_tok;
    for (int step = 0; step < 7; ++step) {
      std::vector<step_item> items;
      for (size_t i = 0; i < 7; ++i) {
        if (step == 0 && i % 2 == 1) {
          items.push_back({others[i], other_prompts[i], true});
        } else {
          next_tok[i] = static_cast<int32_t>((step * 13 + i * 7) % 300);
          items.push_back({others[i], std::span(&next_tok[i], 1), i % 3 != 0});
        }
        if (i == 3) {  // the target sits in the middle of the batch
          if (step == 0) {
            items.push_back({target, prompt, true});
          } else {
            items.push_back({target, std::span(&target_tok.back(), 1), true});
          }
        }
      }
      ASSERT_TRUE(e->step(items, logits).ok());
      // Row of the target among the rows that asked for logits.
      size_t row = 0;
      for (const auto& it : items) {
        if (it.seq == target) break;
        if (it.want_logits) ++row;
      }
      EXPECT_TRUE(same_bits(&logits[row * v], alone[step].data(), v)) << "step " << step;
      target_tok.push_back(kernels::argmax(std::span(&logits[row * v], v)));
    }
  }
  }
}

/// `req` on `e` gives `want`'s greedy tokens, and first logits within 1e-4 of its largest.
void expect_same_generation(engine& e, const generate_request& req, const generate_result& want) {
  auto r = generate(e, req);
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(r->tokens, want.tokens);
  ASSERT_EQ(r->first_logits.size(), want.first_logits.size());
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < want.first_logits.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(want.first_logits[i]));
    max_diff = std::max(max_diff, std::fabs(want.first_logits[i] - r->first_logits[i]));
  }
  EXPECT_LT(max_diff / max_abs, 1e-4f);
}

TEST(Engine, TensorParallelMatchesSingleRank) {
  for (auto spec : {small_spec(), [] {
                      auto s = small_spec();  // fewer KV heads than ranks: replicated KV heads
                      s.n_heads = 4;
                      s.n_kv_heads = 1;
                      s.hidden = 64;
                      s.tie_embeddings = true;
                      s.arch = "qwen2";
                      return s;
                    }()}) {
    temp_model tm(spec);
    auto e1 = make_engine(tm.get(), 1);
    generate_request req;
    req.prompt = prompt_of(9, 3);
    req.max_tokens = 24;
    auto r1 = generate(*e1, req);
    ASSERT_TRUE(r1.ok());
    for (int tp : {2, 4}) {
      if (spec.n_heads % tp != 0 || spec.intermediate % tp != 0) continue;
      SCOPED_TRACE("tp " + std::to_string(tp));
      auto e = make_engine(tm.get(), tp, tp);
      expect_same_generation(*e, req, *r1);
    }
  }
}

TEST(Engine, ExpertParallelMatchesSingleRank) {
  // Whole experts per rank (--enable-expert-parallel): 7 experts over 2 ranks (4, 3) and 3
  // ranks (3, 2, 2), an intermediate (64) no 3 ranks could split; the shared expert still
  // splits. Each rank sums its experts' rows, the all-reduce the ranks': same greedy tokens,
  // logits within 1e-4.
  for (auto spec : {moe_spec(), shared_moe_spec(), gpt_oss_spec()}) {
    SCOPED_TRACE(spec.arch);
    spec.n_kv_heads = 6;
    spec.n_experts = 7;
    temp_model tm(spec);
    auto e1 = make_engine(tm.get(), 1);
    generate_request req;
    req.prompt = prompt_of(9, 3);
    req.max_tokens = 24;
    auto r1 = generate(*e1, req);
    ASSERT_TRUE(r1.ok());
    for (int tp : {2, 3}) {
      SCOPED_TRACE("tp " + std::to_string(tp));
      engine_options o;
      o.tp = tp;
      o.threads = tp;
      o.kv_tokens = 4096;
      o.block_size = 4;
      o.expert_parallel = true;
      auto e = engine::create(tm.get(), o);
      ASSERT_TRUE(e.ok()) << e.err().message;
      expect_same_generation(**e, req, *r1);
      o.expert_parallel = false;  // the intermediate split instead
      auto sliced = engine::create(tm.get(), o);
      if (tp == 3) {
        ASSERT_FALSE(sliced.ok());
        EXPECT_NE(sliced.err().message.find("intermediate_size"), std::string::npos) << sliced.err().message;
      }
    }
  }
}

TEST(Engine, ShapeThatCannotSplitIsAClearError) {
  auto spec = small_spec();
  spec.n_heads = 6;
  spec.n_kv_heads = 6;
  temp_model tm(spec);
  engine_options o;
  o.tp = 4;
  auto e = engine::create(tm.get(), o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.err().code, errc::invalid_request);
  EXPECT_NE(e.err().message.find("num_attention_heads"), std::string::npos) << e.err().message;
}

TEST(Engine, BadStepsAreRefusedWithoutChangingState) {
  temp_model tm(small_spec());
  auto e = make_engine(tm.get(), 1, 1, /*kv_tokens=*/32);  // 8 blocks of 4
  std::vector<float> logits;
  int seq = e->open_sequence();
  auto p = prompt_of(20, 4);
  step_item ok_item{seq, p, true};
  ASSERT_TRUE(e->step(std::span(&ok_item, 1), logits).ok());
  const size_t free_before = e->free_blocks();
  std::vector<float> before = logits;

  std::vector<int32_t> bad_id{5, 300};
  step_item bad{seq, bad_id, true};
  auto s = e->step(std::span(&bad, 1), logits);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::invalid_request);
  EXPECT_NE(s.err().message.find("300"), std::string::npos);

  auto big = prompt_of(16, 5);  // needs 4 more blocks, 3 are free
  step_item too_big{seq, big, true};
  s = e->step(std::span(&too_big, 1), logits);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::overloaded);

  step_item unknown{999, p, true};
  EXPECT_FALSE(e->step(std::span(&unknown, 1), logits).ok());
  EXPECT_EQ(e->free_blocks(), free_before);
  EXPECT_EQ(e->sequence_length(seq), 20u);

  // The sequence is intact: the same continuation as on a fresh engine.
  int32_t next = 7;
  step_item cont{seq, std::span(&next, 1), true};
  ASSERT_TRUE(e->step(std::span(&cont, 1), logits).ok());
  auto fresh = make_engine(tm.get(), 1, 1, 32);
  std::vector<int32_t> full = p;
  full.push_back(7);
  int s2 = fresh->open_sequence();
  step_item all{s2, full, true};
  std::vector<float> ref;
  ASSERT_TRUE(fresh->step(std::span(&all, 1), ref).ok());
  EXPECT_TRUE(same_bits(logits.data(), ref.data(), ref.size()));
  e->close_sequence(seq);
  EXPECT_EQ(e->free_blocks(), 8u);
}

TEST(Engine, StepSampleDrawsWhatSampleDrawsFromTheLogitsAtEveryTp) {
  temp_model tm(small_spec());
  const kernels::sampling_params greedy{}, warm{0.9f, 0, 0.95f, 5}, narrow{1.2f, 8, 1.0f, 6};
  for (int tp : {1, 2}) {
    auto a = make_engine(tm.get(), tp, tp), b = make_engine(tm.get(), tp, tp);
    // Three sequences in one batch, each with its own parameters; the middle one only prefills.
    std::vector<int> sa, sb;
    std::vector<std::vector<int32_t>> next;
    for (int i = 0; i < 3; ++i) {
      sa.push_back(a->open_sequence());
      sb.push_back(b->open_sequence());
      next.push_back(prompt_of(4 + 3 * static_cast<size_t>(i), 40 + static_cast<uint32_t>(i)));
    }
    const size_t vocab = a->config().vocab;
    for (int step = 0; step < 6; ++step) {
      std::vector<step_item> ia, ib;
      std::vector<kernels::sample_row> rows;
      for (int i = 0; i < 3; ++i) {
        const bool want = i != 1 || step > 0;
        ia.push_back({sa[static_cast<size_t>(i)], next[static_cast<size_t>(i)], want});
        ib.push_back({sb[static_cast<size_t>(i)], next[static_cast<size_t>(i)], want});
        if (want) rows.push_back({i == 0 ? greedy : i == 1 ? warm : narrow, a->sequence_length(sa[static_cast<size_t>(i)]) + next[static_cast<size_t>(i)].size()});
      }
      std::vector<float> logits;
      std::vector<int32_t> drawn;
      ASSERT_TRUE(a->step(ia, logits).ok());
      ASSERT_TRUE(b->step_sample(ib, rows, drawn).ok());
      ASSERT_EQ(drawn, kernels::sample_rows(logits, vocab, rows)) << "tp " << tp << " step " << step;
      size_t r = 0;
      for (int i = 0; i < 3; ++i) {
        if (ia[static_cast<size_t>(i)].want_logits) next[static_cast<size_t>(i)] = {drawn[r++]};
        else next[static_cast<size_t>(i)] = prompt_of(1, 99);
      }
    }
  }
}

TEST(Engine, StepSampleLogprobsAreThoseOfTheStepsLogitsAtEveryTp) {
  // Greedy rows that ask for logprobs included: at tp 2 they must not take the argmax-pair
  // shortcut (which never gathers the whole row).
  temp_model tm(small_spec());
  kernels::sampling_params greedy_lp{}, warm_lp{0.9f, 0, 0.95f, 5}, plain{0.7f, 0, 1.0f, 9};
  greedy_lp.logprobs = 3;
  warm_lp.logprobs = 0;
  for (int tp : {1, 2}) {
    auto a = make_engine(tm.get(), tp, tp), b = make_engine(tm.get(), tp, tp);
    std::vector<int> sa, sb;
    for (int i = 0; i < 3; ++i) sa.push_back(a->open_sequence()), sb.push_back(b->open_sequence());
    std::vector<std::vector<int32_t>> next{prompt_of(4, 11), prompt_of(7, 12), prompt_of(10, 13)};
    const size_t vocab = a->config().vocab;
    for (int step = 0; step < 4; ++step) {
      std::vector<step_item> ia, ib;
      std::vector<kernels::sample_row> rows;
      // Steps 2 and 3: every row greedy, so only asking for logprobs keeps the whole rows.
      const std::array<kernels::sampling_params, 3> params =
          step < 2 ? std::array{greedy_lp, warm_lp, plain} : std::array{greedy_lp, greedy_lp, greedy_lp};
      for (size_t i = 0; i < 3; ++i) {
        ia.push_back({sa[i], next[i], true});
        ib.push_back({sb[i], next[i], true});
        rows.push_back({params[i], a->sequence_length(sa[i]) + next[i].size()});
      }
      std::vector<float> logits;
      std::vector<int32_t> drawn;
      kernels::row_logprobs lps;
      ASSERT_TRUE(a->step(ia, logits).ok());
      ASSERT_TRUE(b->step_sample(ib, rows, drawn, &lps).ok());
      ASSERT_EQ(drawn, kernels::sample_rows(logits, vocab, rows)) << "tp " << tp << " step " << step;
      ASSERT_EQ(lps.size(), 3u);
      for (size_t i = 0; i < 3; ++i) {
        if (params[i].logprobs < 0) {
          EXPECT_FALSE(lps[i].has_value());
          continue;
        }
        ASSERT_TRUE(lps[i].has_value());
        EXPECT_EQ(*lps[i], kernels::compute_logprobs(std::span(logits).subspan(i * vocab, vocab), drawn[i], params[i].logprobs))
            << "tp " << tp << " step " << step << " row " << i;
        EXPECT_EQ(lps[i]->top.size(), static_cast<size_t>(params[i].logprobs));
        EXPECT_LT(lps[i]->logprob, 0.0f);
      }
      if (tp == 2 && step == 0) {  // the greedy row's top entry is its token
        EXPECT_EQ(lps[0]->top[0].id, drawn[0]);
        EXPECT_EQ(lps[0]->top[0].logprob, lps[0]->logprob);
      }
      for (size_t i = 0; i < 3; ++i) next[i] = {drawn[i]};
    }
    // No row asking: nothing computed.
    std::vector<step_item> one{{sb[2], next[2], true}};
    std::vector<int32_t> drawn;
    kernels::row_logprobs lps(1);
    ASSERT_TRUE(b->step_sample(one, std::vector<kernels::sample_row>{{plain, b->sequence_length(sb[2]) + 1}}, drawn, &lps).ok());
    EXPECT_TRUE(lps.empty());
  }
}

TEST(Engine, StepSampleRefusesRowsThatDoNotMatchTheItems) {
  temp_model tm(small_spec());
  auto e = make_engine(tm.get(), 1);
  int seq = e->open_sequence();
  auto prompt = prompt_of(5, 3);
  const step_item it{seq, prompt, true};
  std::vector<int32_t> drawn;
  const std::vector<kernels::sample_row> two(2), none;
  for (const auto* rows : {&two, &none}) {
    auto s = e->step_sample(std::span(&it, 1), *rows, drawn);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.err().code, errc::invalid_request) << s.err().message;
    EXPECT_EQ(e->sequence_length(seq), 0u) << "nothing ran";
  }
  const std::vector<int32_t> table{0, 1};
  const std::vector<step_sequence> batch{{prompt, 0, table, true}};
  auto s = e->forward_sample(batch, two, drawn);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::invalid_request) << s.err().message;
  // Prompt scoring that makes no sense: a successor after a chunk that is drawn from, one
  // outside the vocabulary, too many alternatives.
  {
    std::vector<step_sequence> scored{{prompt, 0, table, true, 0, 5}};
    auto bad = e->forward_sample(scored, std::vector<kernels::sample_row>(1), drawn);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.err().message.find("follows a chunk that is drawn from"), std::string::npos) << bad.err().message;
  }
  for (const auto& [n, next] : std::vector<std::pair<int, int32_t>>{{0, 1 << 20}, {kernels::max_logprobs + 1, -1}}) {
    std::vector<step_sequence> scored{{prompt, 0, table, false, n, next}};
    auto bad = e->forward_sample(scored, {}, drawn);
    ASSERT_FALSE(bad.ok()) << n << " " << next;
    EXPECT_EQ(bad.err().code, errc::invalid_request);
  }
  ASSERT_TRUE(e->step_sample(std::span(&it, 1), std::vector<kernels::sample_row>(1), drawn).ok()) << "the engine still runs";
  EXPECT_EQ(drawn.size(), 1u);
}

TEST(Engine, DrawsFromSeveralPositionsGiveTheLogitsOfStepsEndingThere) {
  // A decode step that verifies speculated tokens draws from its last `draws` positions: each
  // row's logits are, bit for bit, those of a step ending at that position, at every tp and
  // beside a neighbour.
  temp_model tm(small_spec());
  const size_t v = tm.get()->config().vocab;
  auto prompt = prompt_of(10, 4), other = prompt_of(6, 8);
  const std::vector<int32_t> table{7, 3, 11}, other_table{20, 21};
  for (int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    auto ref = make_engine(tm.get(), tp);
    std::vector<float> want, logits;  // prompt[0..6], then one token a step: rows at 6, 7, 8, 9
    ASSERT_TRUE(ref->forward(std::vector<step_sequence>{{std::span(prompt).first(7), 0, table, true}}, logits).ok());
    want = logits;
    for (size_t p = 7; p < prompt.size(); ++p) {
      ASSERT_TRUE(ref->forward(std::vector<step_sequence>{{std::span(prompt).subspan(p, 1), p, table, true}}, logits).ok());
      want.insert(want.end(), logits.begin(), logits.end());
    }
    auto e = make_engine(tm.get(), tp);
    ASSERT_TRUE(e->forward(std::vector<step_sequence>{{std::span(prompt).first(6), 0, table, false}}, logits).ok());
    step_sequence spec{std::span(prompt).subspan(6), 6, table, true};
    spec.draws = 4;
    ASSERT_TRUE(e->forward(std::vector<step_sequence>{{other, 0, other_table, true}, spec}, logits).ok());
    ASSERT_EQ(logits.size(), 5 * v);  // the neighbour's row, then the four drawn rows
    EXPECT_TRUE(same_bits(logits.data() + v, want.data(), 4 * v));

    // forward_sample draws a row per drawn position, with rows of their own.
    std::vector<kernels::sample_row> rows(4);
    for (size_t i = 0; i < 4; ++i) rows[i].position = 7 + i;
    std::vector<int32_t> drawn;
    auto s2 = make_engine(tm.get(), tp);
    ASSERT_TRUE(s2->forward(std::vector<step_sequence>{{std::span(prompt).first(6), 0, table, false}}, logits).ok());
    ASSERT_TRUE(s2->forward_sample(std::vector<step_sequence>{spec}, rows, drawn).ok());
    ASSERT_EQ(drawn.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(drawn[i], kernels::argmax(std::span<const float>(want).subspan(i * v, v))) << "row " << i;
    }
  }
}

TEST(Engine, DrawsOutsideTheirSequenceAreRefused) {
  temp_model tm(small_spec());
  auto e = make_engine(tm.get(), 1);
  auto prompt = prompt_of(5, 3);
  const std::vector<int32_t> table{0, 1};
  std::vector<float> logits;
  for (uint32_t draws : {0u, 6u, max_draws + 1}) {
    step_sequence s{prompt, 0, table, true};
    s.draws = draws;
    auto st = e->forward(std::vector<step_sequence>{s}, logits);
    ASSERT_FALSE(st.ok()) << draws;
    EXPECT_EQ(st.err().code, errc::invalid_request);
  }
  step_sequence scored{prompt, 0, table, true, 2};  // scoring its prompt while drawing several
  scored.draws = 2;
  EXPECT_FALSE(e->forward(std::vector<step_sequence>{scored}, logits).ok());
  std::vector<int32_t> drawn;
  step_sequence two{prompt, 0, table, true};
  two.draws = 2;
  auto st = e->forward_sample(std::vector<step_sequence>{two}, std::vector<kernels::sample_row>(1), drawn);
  ASSERT_FALSE(st.ok());  // two drawn rows, one sampling row
  EXPECT_EQ(st.err().code, errc::invalid_request);
  ASSERT_TRUE(e->forward_sample(std::vector<step_sequence>{two}, std::vector<kernels::sample_row>(2), drawn).ok());
  EXPECT_EQ(drawn.size(), 2u);
}

TEST(Engine, ContextLongerThanTheModelIsRefused) {
  auto spec = small_spec();
  spec.max_positions = 16;
  temp_model tm(spec);
  auto e = make_engine(tm.get(), 1, 1, 64);
  std::vector<float> logits;
  int seq = e->open_sequence();
  auto p = prompt_of(17, 6);
  step_item it{seq, p, true};
  auto s = e->step(std::span(&it, 1), logits);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("context"), std::string::npos);
}

engine_options part_options(int tp, int threads) {
  engine_options o;
  o.tp = tp;
  o.threads = threads;
  o.kv_tokens = 256;
  o.block_size = 4;
  return o;
}

/// Communicators of ranks `ranks` of a fresh in-process group of `size`.
std::vector<std::unique_ptr<kernels::communicator>> comms_of(std::vector<std::unique_ptr<kernels::communicator>>& group,
                                                             std::initializer_list<int> ranks) {
  std::vector<std::unique_ptr<kernels::communicator>> out;
  for (int r : ranks) out.push_back(std::move(group[static_cast<size_t>(r)]));
  return out;
}

TEST(Engine, PartsInTwoEnginesMatchOneEngine) {
  // Two engines of one rank each (as on two nodes; here they meet through the in-process
  // communicator), driven rank by rank, give the logits of one tp=2 engine, bit for bit; a
  // mixture of experts' parts expert-parallel too.
  for (const bool moe : {false, true}) {
  SCOPED_TRACE(moe ? "expert-parallel" : "dense");
  temp_model tm(moe ? moe_spec() : small_spec());
  auto opt = [&](int threads) {
    auto o = part_options(2, threads);
    o.expert_parallel = moe;
    return o;
  };
  auto whole = engine::create(tm.get(), opt(2));
  ASSERT_TRUE(whole.ok()) << whole.err().message;
  auto group = kernels::make_local_communicators(2);
  std::vector<std::unique_ptr<engine>> parts;
  for (int r = 0; r < 2; ++r) {
    auto e = engine::create_part(tm.get(), opt(1), comms_of(group, {r}));
    ASSERT_TRUE(e.ok()) << e.err().message;
    EXPECT_EQ((*e)->local_ranks(), std::vector<int>{r});
    EXPECT_EQ((*e)->tp(), 2);
    EXPECT_EQ((*e)->kv_blocks(), (*whole)->kv_blocks());
    parts.push_back(std::move(*e));
  }
  auto prompt = prompt_of(7, 9);
  const std::vector<int32_t> table{5, 2, 9};  // caller-managed, non-contiguous blocks
  std::vector<int32_t> tokens = prompt;
  size_t pos = 0;
  const size_t v = tm.get()->config().vocab;
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<step_sequence> batch{{tokens, pos, table, true}};
    std::vector<float> want;
    ASSERT_TRUE((*whole)->forward(batch, want).ok());
    ASSERT_EQ(want.size(), v);
    std::vector<std::vector<float>> got(2);
    std::vector<status> st(2);
    std::thread rank1([&] { st[1] = parts[1]->forward_rank(1, batch, got[1]); });
    st[0] = parts[0]->forward_rank(0, batch, got[0]);
    rank1.join();
    ASSERT_TRUE(st[0].ok()) << st[0].err().message;
    ASSERT_TRUE(st[1].ok()) << st[1].err().message;
    ASSERT_EQ(got[0].size(), v);
    EXPECT_TRUE(same_bits(got[0].data(), want.data(), v));
    pos += tokens.size();
    tokens = {kernels::argmax(want)};
  }
  }
}

TEST(Engine, CreatePartRefusesWhatItCannotRun) {
  temp_model tm(small_spec());
  {
    auto group = kernels::make_local_communicators(2);
    auto o = part_options(2, 1);
    o.device = backend::cuda;
    auto e = engine::create_part(tm.get(), o, comms_of(group, {0}));
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.err().code, errc::unsupported) << e.err().message;
  }
  {
    auto group = kernels::make_local_communicators(3);  // a group of 3 for tp 2
    auto e = engine::create_part(tm.get(), part_options(2, 1), comms_of(group, {0}));
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.err().code, errc::invalid_request) << e.err().message;
  }
  {
    auto a = kernels::make_local_communicators(2), b = kernels::make_local_communicators(2);
    auto comms = comms_of(a, {1});
    comms.push_back(std::move(b[1]));  // rank 1 twice
    auto e = engine::create_part(tm.get(), part_options(2, 1), std::move(comms));
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.err().code, errc::invalid_request) << e.err().message;
  }
  {
    auto e = engine::create_part(tm.get(), part_options(2, 1), {});
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.err().code, errc::invalid_request) << e.err().message;
  }
  {
    auto group = kernels::make_local_communicators(4);  // 6 heads do not split over 4 ranks
    auto e = engine::create_part(tm.get(), part_options(4, 1), comms_of(group, {2}));
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.err().code, errc::invalid_request) << e.err().message;
  }
}

TEST(Engine, APartRunsOnlyItsOwnRanks) {
  temp_model tm(small_spec());
  auto group = kernels::make_local_communicators(2);
  auto e = engine::create_part(tm.get(), part_options(2, 1), comms_of(group, {1}));
  ASSERT_TRUE(e.ok()) << e.err().message;
  auto prompt = prompt_of(5, 1);
  const std::vector<int32_t> table{0, 1};
  std::vector<step_sequence> batch{{prompt, 0, table, true}};
  ASSERT_TRUE((*e)->check_batch(batch).ok());
  std::vector<float> logits;
  auto s = (*e)->forward(batch, logits);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::invalid_request) << s.err().message;
  int seq = (*e)->open_sequence();
  step_item it{seq, prompt, true};
  s = (*e)->step(std::span(&it, 1), logits);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::invalid_request) << s.err().message;
  std::vector<int32_t> greedy;
  s = (*e)->step_greedy(std::span(&it, 1), greedy);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::invalid_request) << s.err().message;
  EXPECT_EQ((*e)->sequence_length(seq), 0u);
  s = (*e)->forward_rank(0, batch, logits);  // rank 0 runs elsewhere
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::invalid_request) << s.err().message;
  EXPECT_TRUE((*e)->check_batch(batch).ok());  // refusing a rank it does not hold is no failure
}

TEST(Engine, APartHoldingEveryRankIsAWholeEngine) {
  temp_model tm(small_spec());
  auto whole = engine::create(tm.get(), part_options(2, 2));
  ASSERT_TRUE(whole.ok()) << whole.err().message;
  auto group = kernels::make_local_communicators(2);
  auto e = engine::create_part(tm.get(), part_options(2, 2), comms_of(group, {1, 0}));
  ASSERT_TRUE(e.ok()) << e.err().message;
  EXPECT_EQ((*e)->local_ranks(), (std::vector<int>{0, 1}));
  auto prompt = prompt_of(6, 2);
  const std::vector<int32_t> table{3, 1};
  std::vector<step_sequence> batch{{prompt, 0, table, true}};
  std::vector<float> want, got;
  ASSERT_TRUE((*whole)->forward(batch, want).ok());
  auto s = (*e)->forward(batch, got);
  ASSERT_TRUE(s.ok()) << s.err().message;
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(same_bits(got.data(), want.data(), want.size()));
}

TEST(Generate, SamplingIsDeterministicPerSeedAndPosition) {
  temp_model tm(small_spec());
  auto e = make_engine(tm.get(), 1);
  generate_request req;
  req.prompt = prompt_of(5, 7);
  req.max_tokens = 20;
  req.sampling.temperature = 1.0f;
  req.sampling.top_p = 0.9f;
  req.sampling.seed = 42;
  auto a = generate(*e, req);
  auto b = generate(*e, req);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  req.sampling.seed = 43;
  auto c = generate(*e, req);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->tokens, c->tokens);

  // Continuing from a prefix (a migrated request) yields the same remaining tokens.
  generate_request cont = req;
  cont.sampling.seed = 42;
  cont.prompt.insert(cont.prompt.end(), a->tokens.begin(), a->tokens.begin() + 8);
  cont.max_tokens = 12;
  auto d = generate(*e, cont);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->tokens, std::vector<int32_t>(a->tokens.begin() + 8, a->tokens.end()));
}

TEST(Generate, StopsOnStopIdAndRejectsEmptyPrompt) {
  temp_model tm(small_spec());
  auto e = make_engine(tm.get(), 1);
  generate_request req;
  req.prompt = prompt_of(5, 8);
  req.max_tokens = 10;
  auto full = generate(*e, req);
  ASSERT_TRUE(full.ok());
  req.stop_ids = {full->tokens[3]};
  auto stopped = generate(*e, req);
  ASSERT_TRUE(stopped.ok());
  size_t first = std::find(full->tokens.begin(), full->tokens.end(), full->tokens[3]) - full->tokens.begin();
  EXPECT_EQ(stopped->tokens.size(), first + 1);
  EXPECT_EQ(stopped->finish_reason, "stop");
  req.prompt.clear();
  EXPECT_FALSE(generate(*e, req).ok());
}

}  // namespace
}  // namespace llmesh::model
