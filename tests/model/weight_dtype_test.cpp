// vLLM's --dtype (load_options::dtype): every weight matrix rewritten at load in another float
// type; and --gpu-memory-utilization's KV budget (kv_mb_for_gpu_memory). What the loader keeps (types, values, a tied head beside its embedding, bytes), that a
// widening cast changes no number the engine computes, that a narrowing one holds exactly the
// matrices of a checkpoint written in that type, and the refusals (float16's range, names).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmesh/kernels/quantize.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/generate.hpp"
#include "llmesh/model/random_model.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using kernels::dtype;

random_model_spec spec_of(dtype t, bool tied) {
  random_model_spec s;
  s.hidden = 96;
  s.intermediate = 200;
  s.n_layers = 2;
  s.n_heads = 6;
  s.n_kv_heads = 2;
  s.vocab = 300;
  s.dtype = t;
  s.tie_embeddings = tied;
  s.seed = 21;
  return s;
}

std::shared_ptr<const model> load_as(const std::string& dir, std::optional<dtype> t) {
  auto m = model::load(dir, {.dtype = t, .quant = quantization::none, .loras = {}});
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
  return m.ok() ? *m : nullptr;
}

/// Every matrix of a model, by name, in a fixed order.
std::vector<std::pair<std::string, const weight_matrix*>> matrices(const model& m) {
  std::vector<std::pair<std::string, const weight_matrix*>> out{{"embed", &m.weights().embed}, {"lm_head", &m.weights().lm_head}};
  for (size_t i = 0; i < m.weights().layers.size(); ++i) {
    const auto& l = m.weights().layers[i];
    for (auto [w, n] : {std::pair{&l.q, "q"}, {&l.k, "k"}, {&l.v, "v"}, {&l.o, "o"}, {&l.gate, "gate"}, {&l.up, "up"}, {&l.down, "down"}}) {
      out.emplace_back("layer " + std::to_string(i) + " " + n, w);
    }
  }
  return out;
}

std::unique_ptr<engine> make_engine(std::shared_ptr<const model> m) {
  engine_options o;
  o.threads = 2;
  o.kv_tokens = 512;
  o.block_size = 4;
  auto e = engine::create(std::move(m), o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
  return e.ok() ? std::move(*e) : nullptr;
}

generate_result run(const std::shared_ptr<const model>& m) {
  auto e = make_engine(m);
  generate_request req;
  for (int i = 0; i < 13; ++i) req.prompt.push_back((i * 41 + 7) % 300);
  req.max_tokens = 12;
  auto r = generate(*e, req);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
  return r.ok() ? *r : generate_result{};
}

TEST(WeightDtype, NamesParse) {
  EXPECT_FALSE(parse_weight_dtype("auto")->has_value());
  EXPECT_EQ(**parse_weight_dtype("float32"), dtype::f32);
  EXPECT_EQ(**parse_weight_dtype("float"), dtype::f32);
  EXPECT_EQ(**parse_weight_dtype("bfloat16"), dtype::bf16);
  EXPECT_EQ(**parse_weight_dtype("float16"), dtype::f16);
  EXPECT_EQ(**parse_weight_dtype("half"), dtype::f16);
  auto bad = parse_weight_dtype("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("--dtype must be auto, bfloat16"), std::string::npos) << bad.err().message;
  EXPECT_EQ(weight_dtype_name(std::nullopt), "auto");
  EXPECT_EQ(weight_dtype_name(dtype::bf16), "bfloat16");
  EXPECT_EQ(weight_dtype_name(dtype::f16), "float16");
}

TEST(WeightDtype, ConvertRowsRoundsToNearestEvenAndRefusesWhatFloat16CannotHold) {
  const std::vector<float> src{1.0f, -3.14159265f, 1e-3f, 65504.0f, 1.00390625f /* bf16 tie: 1 + 2^-8 */, 0.0f};
  std::vector<uint16_t> bf(src.size()), hf(src.size());
  std::vector<float> back(src.size());
  ASSERT_TRUE(kernels::convert_rows(src.data(), dtype::f32, 2, 3, bf.data(), dtype::bf16).ok());
  ASSERT_TRUE(kernels::convert_rows(src.data(), dtype::f32, 2, 3, hf.data(), dtype::f16).ok());
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(bf[i], kernels::f32_to_bf16(src[i])) << i;
    EXPECT_EQ(hf[i], kernels::f32_to_f16(src[i])) << i;
  }
  EXPECT_EQ(kernels::bf16_to_f32(bf[4]), 1.0f) << "a tie rounds to the even neighbour";
  // Widening is exact.
  ASSERT_TRUE(kernels::convert_rows(bf.data(), dtype::bf16, 2, 3, back.data(), dtype::f32).ok());
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(back[i], kernels::bf16_to_f32(bf[i])) << i;

  const std::vector<float> big{1.0f, 2.0f, 3.0f, 4.0f, 70000.0f, 5.0f};
  auto s = kernels::convert_rows(big.data(), dtype::f32, 3, 2, hf.data(), dtype::f16, 10);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("weight row 12"), std::string::npos) << s.err().message;
  EXPECT_NE(s.err().message.find("float16's range"), std::string::npos) << s.err().message;
  EXPECT_TRUE(kernels::convert_rows(big.data(), dtype::f32, 3, 2, bf.data(), dtype::bf16).ok()) << "bfloat16 holds it";
  const std::vector<float> nan{1.0f, std::nanf("")};
  EXPECT_FALSE(kernels::convert_rows(nan.data(), dtype::f32, 1, 2, bf.data(), dtype::bf16).ok());
  EXPECT_FALSE(kernels::convert_rows(big.data(), dtype::f32, 1, 2, bf.data(), dtype::q8).ok());
}

TEST(WeightDtype, Float32OfABfloat16CheckpointHoldsTheSameValuesAndGivesTheSameLogits) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(spec_of(dtype::bf16, tied), dir.path()).ok());
    auto plain = load_as(dir.path(), std::nullopt);
    auto wide = load_as(dir.path(), dtype::f32);
    ASSERT_TRUE(plain && wide);
    const auto a = matrices(*plain), b = matrices(*wide);
    for (size_t i = 0; i < a.size(); ++i) {
      const weight_matrix &p = *a[i].second, &w = *b[i].second;
      ASSERT_EQ(p.type, dtype::bf16) << a[i].first;
      ASSERT_EQ(w.type, dtype::f32) << a[i].first;
      ASSERT_EQ(w.rows, p.rows);
      ASSERT_EQ(w.cols, p.cols);
      for (size_t k = 0; k < p.rows * p.cols; ++k) {
        ASSERT_EQ(kernels::load_as_f32(w.data, dtype::f32, k), kernels::load_as_f32(p.data, dtype::bf16, k)) << a[i].first << " " << k;
      }
    }
    if (tied) {
      EXPECT_EQ(wide->weights().lm_head.data, wide->weights().embed.data) << "a tied head moves with its embedding";
    }
    EXPECT_EQ(wide->weight_bytes(), 2 * plain->weight_bytes());
    const auto rp = run(plain), rw = run(wide);
    EXPECT_EQ(rp.tokens, rw.tokens);
    ASSERT_EQ(rp.first_logits.size(), rw.first_logits.size());
    EXPECT_EQ(std::memcmp(rp.first_logits.data(), rw.first_logits.data(), rp.first_logits.size() * 4), 0)
        << "widening changes no weight, so no logit";
  }
}

TEST(WeightDtype, NarrowingHoldsTheMatricesOfACheckpointWrittenInThatType) {
  // The random writer rounds the same draws to the dtype it writes: a float32 checkpoint cast
  // to bfloat16 (float16) at load must hold the bytes of the bfloat16 (float16) one.
  testing::temp_dir f32_dir;
  ASSERT_TRUE(write_random_model(spec_of(dtype::f32, false), f32_dir.path()).ok());
  for (dtype t : {dtype::bf16, dtype::f16}) {
    SCOPED_TRACE(std::string(kernels::dtype_name(t)));
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(spec_of(t, false), dir.path()).ok());
    auto stored = load_as(dir.path(), std::nullopt);
    auto cast = load_as(f32_dir.path(), t);
    auto full = load_as(f32_dir.path(), std::nullopt);
    ASSERT_TRUE(stored && cast && full);
    const auto a = matrices(*stored), b = matrices(*cast);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(b[i].second->type, t) << b[i].first;
      ASSERT_EQ(std::memcmp(a[i].second->data, b[i].second->data, a[i].second->bytes()), 0) << a[i].first;
    }
    EXPECT_EQ(2 * cast->weight_bytes(), full->weight_bytes());
    // The norms stay the float32 checkpoint's: the logits are near the float32 model's, not equal.
    const auto rf = run(full), rc = run(cast);
    float max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < rf.first_logits.size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(rf.first_logits[i]));
      max_diff = std::max(max_diff, std::fabs(rf.first_logits[i] - rc.first_logits[i]));
    }
    EXPECT_GT(max_diff, 0.0f);
    EXPECT_LT(max_diff / max_abs, 3e-2f);
  }
}

TEST(WeightDtype, CombinesWithInt8AsABfloat16CheckpointQuantizes) {
  // A float32 checkpoint cast to bfloat16 and then quantized holds the bytes of the bfloat16
  // checkpoint quantized: the same int8 blocks, the same (tied) embedding rows.
  testing::temp_dir f32_dir, bf16_dir;
  ASSERT_TRUE(write_random_model(spec_of(dtype::f32, true), f32_dir.path()).ok());
  ASSERT_TRUE(write_random_model(spec_of(dtype::bf16, true), bf16_dir.path()).ok());
  auto m = model::load(f32_dir.path(), {.dtype = dtype::bf16, .quant = quantization::int8, .loras = {}});
  auto want = model::load(bf16_dir.path(), {.dtype = {}, .quant = quantization::int8, .loras = {}});
  ASSERT_TRUE(m.ok() && want.ok()) << (m.ok() ? want.err().message : m.err().message);
  EXPECT_EQ((*m)->weights().embed.type, dtype::bf16) << "the embedding takes --dtype";
  EXPECT_EQ((*m)->weights().lm_head.type, dtype::q8);
  const auto a = matrices(**m), b = matrices(**want);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].second->type, b[i].second->type) << a[i].first;
    ASSERT_EQ(a[i].second->bytes(), b[i].second->bytes()) << a[i].first;
    EXPECT_EQ(std::memcmp(a[i].second->data, b[i].second->data, a[i].second->bytes()), 0) << a[i].first;
  }
  EXPECT_EQ(run(*m).tokens.size(), 12u);
}

TEST(WeightDtype, Float16RefusesAWeightBeyondItsRangeByTensor) {
  // Gemma's embedding is scaled at run time, not in the file; a weight of 1e5 is simply out of
  // float16's range. Write one into a float32 checkpoint's gate_proj.
  testing::temp_dir dir;
  auto spec = spec_of(dtype::f32, false);
  ASSERT_TRUE(write_random_model(spec, dir.path()).ok());
  auto m = load_as(dir.path(), std::nullopt);
  ASSERT_TRUE(m);
  const auto& gate = m->weights().layers[1].gate;
  // The mapping is private and read-only: find the value's file offset through the view.
  const std::string file = dir.path() + "/model.safetensors";
  std::FILE* f = std::fopen(file.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::vector<char> bytes;
  {
    std::fseek(f, 0, SEEK_END);
    bytes.resize(static_cast<size_t>(std::ftell(f)));
    std::fseek(f, 0, SEEK_SET);
    ASSERT_EQ(std::fread(bytes.data(), 1, bytes.size(), f), bytes.size());
  }
  const char* hit = static_cast<const char*>(::memmem(bytes.data(), bytes.size(), gate.data, gate.cols * 4));
  ASSERT_NE(hit, nullptr);
  const float huge = 1e5f;
  std::fseek(f, static_cast<long>(hit - bytes.data()) + static_cast<long>(3 * gate.cols * 4), SEEK_SET);
  ASSERT_EQ(std::fwrite(&huge, 4, 1, f), 1u);
  std::fclose(f);
  m.reset();
  auto half = model::load(dir.path(), {.dtype = dtype::f16, .quant = quantization::none, .loras = {}});
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.err().message.find("--dtype float16: layer 1 gate_proj: weight row 3"), std::string::npos) << half.err().message;
  EXPECT_NE(half.err().message.find("float16's range"), std::string::npos) << half.err().message;
  EXPECT_TRUE(load_as(dir.path(), dtype::bf16)) << "bfloat16 has float32's range";
}

TEST(GpuMemoryUtilization, TheKvCacheGetsWhatWeightsAndWorkingMemoryLeave) {
  model_config c;
  c.hidden = 4096;
  c.intermediate = 14336;
  c.n_layers = 32;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.head_dim = 128;
  c.vocab = 128256;
  const size_t gib = size_t{1} << 30, weights = 16 * gib, device = 140 * gib, embed = 1 * gib;
  // Working memory of 2048 tokens: (4·4096 + 6144 + 3·14336) · 4 · 2048 and the logits
  // 128256 · 4 · 2048, plus 512 MiB.
  const size_t work = (4 * 4096 + 6144 + 3 * 14336) * size_t{4} * 2048 + size_t{128256} * 4 * 2048 + (size_t{512} << 20);
  auto one = kv_mb_for_gpu_memory(c, device, 0.9, weights, embed, 1, 1, 2048);
  ASSERT_TRUE(one.ok()) << one.err().message;
  const size_t share = static_cast<size_t>(static_cast<double>(device) * 0.9);
  EXPECT_EQ(*one, (share - weights - work) >> 20);
  // tp 2: each shard holds the whole embedding, half the other weights and half the
  // projections' activations.
  auto two = kv_mb_for_gpu_memory(c, device, 0.9, weights, embed, 2, 1, 2048);
  ASSERT_TRUE(two.ok());
  const size_t work2 = (4 * 4096 + 3072 + 3 * 7168) * size_t{4} * 2048 + size_t{128256} * 4 * 2048 + (size_t{512} << 20);
  EXPECT_EQ(*two, (share - embed - (weights - embed) / 2 - work2) >> 20);
  // Two replicas on the same devices split what is left after both shards.
  auto pair = kv_mb_for_gpu_memory(c, device, 0.9, weights, embed, 1, 2, 2048);
  ASSERT_TRUE(pair.ok());
  EXPECT_EQ(*pair, ((share - 2 * (weights + work)) / 2) >> 20);
  auto none = kv_mb_for_gpu_memory(c, 16 * gib, 0.9, weights, embed, 1, 1, 2048);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.err().message.find("leaves no memory for the KV cache"), std::string::npos) << none.err().message;
  for (double u : {0.0, -0.5, 1.5}) EXPECT_FALSE(kv_mb_for_gpu_memory(c, device, u, weights, embed, 1, 1, 2048).ok()) << u;
}

}  // namespace
}  // namespace llmesh::model
