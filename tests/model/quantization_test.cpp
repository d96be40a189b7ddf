// --quantization int8 (weight-only, blocks of 32): what the loader quantizes and keeps, the
// engine's invariants on int8 weights (chunk and batch invariance to the bit, tensor
// parallelism), closeness to the checkpoint's logits, and the refusals (splits off a block
// boundary, CUDA, non-finite weights, bad names). The independent PyTorch reference of the
// int8 forward pass is checked in tests/cli/golden_test.cpp (cases ending in _int8).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/generate.hpp"
#include "llmesh/model/random_model.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using kernels::dtype;

random_model_spec spec_with(size_t hidden, size_t inter, size_t heads, size_t kv_heads, bool tied) {
  random_model_spec s;
  s.hidden = hidden;
  s.intermediate = inter;
  s.n_layers = 2;
  s.n_heads = heads;
  s.n_kv_heads = kv_heads;
  s.vocab = 300;
  s.dtype = dtype::bf16;
  s.tie_embeddings = tied;
  s.seed = 9;
  return s;
}

/// One random model on disk, loaded as stored and as int8.
struct both_models {
  explicit both_models(const random_model_spec& spec) {
    EXPECT_TRUE(write_random_model(spec, dir.path()).ok());
    auto a = model::load(dir.path());
    auto b = model::load(dir.path(), {.dtype = {}, .quant = quantization::int8, .loras = {}});
    EXPECT_TRUE(a.ok() && b.ok()) << (b.ok() ? "" : b.err().message);
    if (a.ok()) plain = *a;
    if (b.ok()) int8 = *b;
  }
  testing::temp_dir dir;
  std::shared_ptr<const model> plain, int8;
};

std::unique_ptr<engine> make_engine(std::shared_ptr<const model> m, int tp) {
  engine_options o;
  o.tp = tp;
  o.threads = 2;
  o.kv_tokens = 2048;
  o.block_size = 4;
  auto e = engine::create(std::move(m), o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
  return e.ok() ? std::move(*e) : nullptr;
}

std::vector<int32_t> prompt_of(size_t n, uint32_t salt) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((i * 37 + salt * 101 + 11) % 300);
  return p;
}

bool same_bits(const std::vector<float>& a, const float* b) { return std::memcmp(a.data(), b, a.size() * 4) == 0; }

TEST(Quantization, NamesParse) {
  EXPECT_EQ(*parse_quantization("none"), quantization::none);
  EXPECT_EQ(*parse_quantization("int8"), quantization::int8);
  auto bad = parse_quantization("fp4");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("must be none, int8, awq (awq_marlin), gptq (gptq_marlin), compressed-tensors, gguf, fp8 or mxfp4"),
            std::string::npos)
      << bad.err().message;
  EXPECT_EQ(quantization_name(quantization::int8), "int8");
  EXPECT_EQ(*parse_quantization("mxfp4"), quantization::mxfp4);  // GPT-OSS's checkpoints (gpt_oss_test)
  EXPECT_EQ(quantization_name(quantization::mxfp4), "mxfp4");
}

TEST(Quantization, ProjectionsAndTheLmHeadBecomeInt8AndTheEmbeddingStays) {
  // hidden 96 = 3 blocks; intermediate 200: down_proj rows are padded to 224.
  both_models m(spec_with(96, 200, 6, 2, true));
  ASSERT_TRUE(m.int8 && m.plain);
  EXPECT_EQ(m.int8->quant(), quantization::int8);
  const auto& q = m.int8->weights();
  const auto& p = m.plain->weights();
  EXPECT_EQ(q.embed.type, dtype::bf16);
  EXPECT_EQ(q.embed.rows, p.embed.rows);
  EXPECT_EQ(q.lm_head.type, dtype::q8) << "tied: the LM head gets its own int8 copy";
  EXPECT_NE(q.lm_head.data, q.embed.data);
  size_t want_bytes = q.lm_head.rows * 96 / 32 * 36;
  for (size_t l = 0; l < q.layers.size(); ++l) {
    const auto& ql = q.layers[l];
    const auto& pl = p.layers[l];
    for (auto [a, b] : {std::pair{&ql.q, &pl.q}, {&ql.k, &pl.k}, {&ql.v, &pl.v}, {&ql.o, &pl.o}, {&ql.gate, &pl.gate},
                        {&ql.up, &pl.up}, {&ql.down, &pl.down}}) {
      ASSERT_EQ(a->type, dtype::q8);
      ASSERT_EQ(a->rows, b->rows);
      ASSERT_EQ(a->cols, b->cols);
      EXPECT_EQ(a->ld(), (b->cols + 31) / 32 * 32);
      want_bytes += a->rows * a->ld() / 32 * 36;
      // Every weight within half a step of its block's scale from the checkpoint's value.
      for (size_t r = 0; r < a->rows; r += 7) {
        for (size_t c = 0; c < a->cols; ++c) {
          const float orig = kernels::load_as_f32(b->data, b->type, r * b->cols + c);
          const float got = kernels::load_as_f32(a->data, dtype::q8, r * a->ld() + c);
          float scale;
          std::memcpy(&scale, static_cast<const uint8_t*>(a->data) + kernels::dtype_offset(dtype::q8, r * a->ld() + c / 32 * 32), 4);
          ASSERT_LE(std::fabs(got - orig), scale * 0.5001f + 1e-30f) << "layer " << l << " row " << r << " col " << c;
        }
      }
    }
  }
  EXPECT_EQ(m.int8->decode_weight_bytes(), want_bytes);
  EXPECT_EQ(m.int8->decode_params(), m.plain->decode_params());
  EXPECT_LT(static_cast<double>(m.int8->decode_weight_bytes()), 0.62 * static_cast<double>(m.plain->decode_weight_bytes()));
}

/// Logits after the prompt (in chunks of `chunk`) and after 5 greedy steps.
std::vector<std::vector<float>> run_alone(engine& e, const std::vector<int32_t>& prompt, size_t chunk) {
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  int seq = e.open_sequence();
  for (size_t at = 0; at < prompt.size(); at += chunk) {
    const size_t n = std::min(chunk, prompt.size() - at);
    step_item it{seq, std::span(prompt).subspan(at, n), at + n == prompt.size()};
    EXPECT_TRUE(e.step(std::span(&it, 1), logits).ok());
  }
  out.push_back(logits);
  for (int i = 0; i < 5; ++i) {
    int32_t next = kernels::argmax(logits);
    step_item it{seq, std::span(&next, 1), true};
    EXPECT_TRUE(e.step(std::span(&it, 1), logits).ok());
    out.push_back(logits);
  }
  e.close_sequence(seq);
  return out;
}

TEST(Quantization, Int8LogitsAreChunkAndBatchInvariantToTheBit) {
  both_models m(spec_with(128, 256, 4, 2, false));
  auto e = make_engine(m.int8, 1);
  ASSERT_TRUE(e);
  const auto prompt = prompt_of(21, 4);
  const auto whole = run_alone(*e, prompt, prompt.size());
  const auto chunks = run_alone(*e, prompt, 4);
  for (size_t s = 0; s < whole.size(); ++s) EXPECT_TRUE(same_bits(whole[s], chunks[s].data())) << "step " << s;

  // The same prompt beside five neighbours of other lengths, prefilled in the same step.
  std::vector<float> logits;
  std::vector<int> seqs;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<step_item> items;
  for (uint32_t i = 0; i < 5; ++i) {
    seqs.push_back(e->open_sequence());
    prompts.push_back(prompt_of(3 + 4 * i, 20 + i));
  }
  const int target = e->open_sequence();
  for (size_t i = 0; i < 5; ++i) {
    items.push_back({seqs[i], prompts[i], true});
    if (i == 2) items.push_back({target, prompt, true});
  }
  ASSERT_TRUE(e->step(items, logits).ok());
  const size_t v = e->config().vocab;
  EXPECT_TRUE(same_bits(whole[0], logits.data() + 3 * v)) << "the target's row differs beside neighbours";
}

TEST(Quantization, TensorParallelRanksGiveTheTokensOfOneRank) {
  // Each of 2 ranks starts its o_proj and down_proj columns on a block boundary: 4 heads of 32
  // and intermediate 256; then hidden 200 (q/k/v/gate/up rows padded to 224) with 4 heads of 64
  // and intermediate 320 (rank 1 from column 160).
  auto padded = spec_with(200, 320, 4, 2, false);
  padded.head_dim = 64;
  for (const auto& spec : {spec_with(128, 256, 4, 2, false), padded}) {
    SCOPED_TRACE("hidden " + std::to_string(spec.hidden));
    both_models m(spec);
    generate_request req;
    req.prompt = prompt_of(9, 3);
    req.max_tokens = 20;
    auto e1 = make_engine(m.int8, 1);
    auto e2 = make_engine(m.int8, 2);
    ASSERT_TRUE(e1 && e2);
    auto r1 = generate(*e1, req);
    auto r2 = generate(*e2, req);
    ASSERT_TRUE(r1.ok() && r2.ok());
    EXPECT_EQ(r1->tokens, r2->tokens);
    float max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < r1->first_logits.size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(r1->first_logits[i]));
      max_diff = std::max(max_diff, std::fabs(r1->first_logits[i] - r2->first_logits[i]));
    }
    EXPECT_LT(max_diff / max_abs, 1e-4f);
  }
}

TEST(Quantization, Int8LogitsStayCloseToTheCheckpoints) {
  both_models m(spec_with(128, 256, 4, 2, false));
  auto ep = make_engine(m.plain, 1);
  auto eq = make_engine(m.int8, 1);
  ASSERT_TRUE(ep && eq);
  generate_request req;
  req.prompt = prompt_of(12, 7);
  req.max_tokens = 1;
  auto rp = generate(*ep, req);
  auto rq = generate(*eq, req);
  ASSERT_TRUE(rp.ok() && rq.ok());
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < rp->first_logits.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(rp->first_logits[i]));
    max_diff = std::max(max_diff, std::fabs(rp->first_logits[i] - rq->first_logits[i]));
  }
  EXPECT_GT(max_diff, 0.0f) << "int8 weights must change something";
  EXPECT_LT(max_diff / max_abs, 0.03f) << "max abs diff " << max_diff << " of " << max_abs;
}

TEST(Quantization, SplitsOffABlockBoundaryAndCudaAreRefused) {
  // 6 heads of 16: rank 1 of 2 starts its o_proj columns at 48, inside a block.
  both_models m(spec_with(96, 256, 6, 2, false));
  engine_options o;
  o.tp = 2;
  o.threads = 2;
  o.kv_tokens = 256;
  auto e = engine::create(m.int8, o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.err().code, errc::invalid_request);
  EXPECT_NE(e.err().message.find("multiple of 32"), std::string::npos) << e.err().message;
  EXPECT_TRUE(engine::create(m.plain, o).ok()) << "the checkpoint's weights split there";
  o.tp = 1;
  o.device = backend::cuda;
  auto c = engine::create(m.int8, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.err().code, errc::unsupported);
  EXPECT_NE(c.err().message.find("CPU backend only"), std::string::npos) << c.err().message;
}

TEST(Quantization, ANonFiniteWeightFailsTheLoadAndNamesTheTensor) {
  testing::temp_dir dir;
  ASSERT_TRUE(write_random_model(spec_with(64, 128, 4, 2, false), dir.path()).ok());
  // Overwrite the first element of layer 1's up_proj with +inf (bf16 0x7f80).
  const std::string file = dir.path() + "/model.safetensors";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  const auto h = nlohmann::json::parse(header);
  const uint64_t at = 8 + n + h["model.layers.1.mlp.up_proj.weight"]["data_offsets"][0].get<uint64_t>();
  const uint16_t inf = 0x7f80;
  f.seekp(static_cast<std::streamoff>(at));
  f.write(reinterpret_cast<const char*>(&inf), 2);
  f.close();
  ASSERT_TRUE(model::load(dir.path()).ok()) << "unquantized, the weights load as they are";
  auto q = model::load(dir.path(), {.dtype = {}, .quant = quantization::int8, .loras = {}});
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.err().code, errc::invalid_request);
  EXPECT_NE(q.err().message.find("layer 1 up_proj"), std::string::npos) << q.err().message;
  EXPECT_NE(q.err().message.find("non-finite"), std::string::npos) << q.err().message;
}

}  // namespace
}  // namespace llmesh::model
