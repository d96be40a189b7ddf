// Tests of kv_write() and attention() over a paged cache: a double-precision reference with
// shuffled, non-contiguous block tables, GQA, sliding windows and mixed batches; bitwise
// invariance to batch neighbours, thread count and prefill-vs-decode; and block-table errors.
#include "test_seed.hpp"
#include "llmesh/kernels/attention.hpp"
#include "llmesh/kernels/elementwise.hpp"
#include "llmesh/kernels/matmul.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace llmesh::kernels {
namespace {

constexpr float poison = std::numeric_limits<float>::quiet_NaN();

/// One sequence of a test batch: its logical keys/values for every position it has, its query
/// rows, and its block table into the shared cache.
struct sequence {
  size_t pos0 = 0, n_tokens = 0;
  std::vector<float> k, v;       // [pos0 + n_tokens][n_kv_heads][head_dim], by position
  std::vector<float> q;          // [n_tokens][n_heads][head_dim]
  std::vector<int32_t> table;    // block ids
  std::vector<float> out;        // [n_tokens][n_heads][head_dim] + 1 guard element

  size_t end() const { return pos0 + n_tokens; }
  size_t q_row() const { return q.size() / std::max<size_t>(n_tokens, 1); }
  attention_seq view(size_t row0, size_t rows, float* dst) const {
    attention_seq s;
    s.q = q.data() + row0 * q_row();
    s.out = dst;
    s.pos0 = pos0 + row0;
    s.n_tokens = rows;
    s.block_table = table;
    return s;
  }
};

/// A poisoned cache of float32, bfloat16 or 8-bit float elements: positions never written read
/// as NaN, so reading one fails the test.
struct cache_storage {
  std::vector<float> keys, values;
  std::vector<uint16_t> keys16, values16;
  std::vector<uint8_t> keys8, values8;
  size_t n_blocks;
  dtype type;
  float k_scale = 1.0f, v_scale = 1.0f;  ///< an 8-bit cache's scales
  cache_storage(const attention_shape& s, size_t blocks, dtype t = dtype::f32) : n_blocks(blocks), type(t) {
    const size_t n = blocks * s.block_size * s.n_kv_heads * s.head_dim;
    if (t == dtype::bf16) {
      keys16.assign(n, 0x7fc0);
      values16.assign(n, 0x7fc0);
    } else if (is_f8(t)) {
      keys8.assign(n, 0x7f);  // NaN in both 8-bit types
      values8.assign(n, 0x7f);
    } else {
      keys.assign(n, poison);
      values.assign(n, poison);
    }
  }
  kv_layer_view view() {
    if (type == dtype::bf16) return {keys16.data(), values16.data(), n_blocks, type, k_scale, v_scale};
    if (is_f8(type)) return {keys8.data(), values8.data(), n_blocks, type, k_scale, v_scale};
    return {keys.data(), values.data(), n_blocks, type, k_scale, v_scale};
  }
};

/// A bf16 or 8-bit float cache holds each key and value rounded (an 8-bit one x / scale, read
/// back times the scale): the sequences' logical values become those, so the references below
/// describe what the kernel must compute from the cache.
void round_to_cache(dtype t, std::vector<struct sequence>& seqs, float k_scale = 1.0f, float v_scale = 1.0f) {
  if (t == dtype::f32) return;
  auto round = [t](float x, float s) {
    return t == dtype::bf16 ? bf16_to_f32(f32_to_bf16(x)) : f8_to_f32(t, f32_to_f8(t, x / s)) * s;
  };
  for (auto& seq : seqs) {
    for (float& x : seq.k) x = round(x, k_scale);
    for (float& x : seq.v) x = round(x, v_scale);
  }
}

std::string describe(const attention_shape& s) {
  return "block_size " + std::to_string(s.block_size) + " heads " + std::to_string(s.n_heads) + "/" +
         std::to_string(s.n_kv_heads) + " head_dim " + std::to_string(s.head_dim) + " window " +
         std::to_string(s.sliding_window) + " softcap " + std::to_string(s.softcap) + (s.sinks ? " sinks" : "");
}

/// Builds the sequences of one batch and hands out block ids from one shuffled pool, so every
/// table is non-contiguous and out of order. Returns the number of blocks the cache needs.
size_t make_batch(const attention_shape& s, const std::vector<std::pair<size_t, size_t>>& specs,
                  std::mt19937& rng, std::vector<sequence>& seqs) {
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  size_t blocks = 3;  // spares that nobody owns
  for (auto [pos0, n] : specs) blocks += (pos0 + n + s.block_size - 1) / s.block_size;
  std::vector<int32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next = 0;
  seqs.clear();
  for (auto [pos0, n] : specs) {
    sequence seq;
    seq.pos0 = pos0;
    seq.n_tokens = n;
    seq.k.resize(seq.end() * s.n_kv_heads * s.head_dim);
    seq.v.resize(seq.k.size());
    seq.q.resize(n * s.n_heads * s.head_dim);
    for (float& x : seq.k) x = val(rng);
    for (float& x : seq.v) x = val(rng);
    for (float& x : seq.q) x = 3.0f * val(rng);  // sharper softmax than unit queries give
    size_t need = (seq.end() + s.block_size - 1) / s.block_size;
    seq.table.assign(ids.begin() + next, ids.begin() + next + need);
    next += need;
    seq.out.assign(seq.q.size() + 1, poison);
    seqs.push_back(std::move(seq));
  }
  return blocks;
}

/// softmax(q·k · scale) · v in double for one (row, head), with the documented window rule.
std::vector<double> reference(const attention_shape& s, const sequence& seq, size_t row, size_t head) {
  const size_t pos = seq.pos0 + row, d = s.head_dim;
  const size_t kvh = head / (s.n_heads / s.n_kv_heads);
  const size_t begin = s.sliding_window > 0 && pos + 1 > s.sliding_window ? pos + 1 - s.sliding_window : 0;
  const float* qv = seq.q.data() + (row * s.n_heads + head) * d;
  std::vector<double> scores;
  double max_score = -1e300;
  for (size_t p = begin; p <= pos; ++p) {
    const float* kv = seq.k.data() + (p * s.n_kv_heads + kvh) * d;
    double sc = 0.0;
    for (size_t i = 0; i < d; ++i) sc += static_cast<double>(qv[i]) * kv[i];
    sc *= s.scale;
    if (s.softcap > 0.0f) sc = s.softcap * std::tanh(sc / s.softcap);
    scores.push_back(sc);
    max_score = std::max(max_score, scores.back());
  }
  if (s.sinks) max_score = std::max<double>(max_score, s.sinks[head]);
  double sum = 0.0;
  for (double& sc : scores) sum += (sc = std::exp(sc - max_score));
  if (s.sinks) sum += std::exp(s.sinks[head] - max_score);  // GPT-OSS's sink: in the softmax, no value
  std::vector<double> out(d, 0.0);
  for (size_t p = begin; p <= pos; ++p) {
    const float* vv = seq.v.data() + (p * s.n_kv_heads + kvh) * d;
    for (size_t i = 0; i < d; ++i) out[i] += scores[p - begin] / sum * vv[i];
  }
  return out;
}

/// Writes a sequence's keys and values in two calls, split at pos0 (mid-block in general).
void write_sequence(cache_storage& cache, const attention_shape& s, const sequence& seq) {
  const size_t row = s.n_kv_heads * s.head_dim;
  ASSERT_TRUE(kv_write(cache.view(), s, seq.table, 0, seq.pos0, seq.k.data(), seq.v.data()).ok());
  ASSERT_TRUE(kv_write(cache.view(), s, seq.table, seq.pos0, seq.n_tokens, seq.k.data() + seq.pos0 * row,
                       seq.v.data() + seq.pos0 * row)
                  .ok());
}

status attend(cache_storage& cache, const attention_shape& s, std::vector<sequence>& seqs, thread_pool& pool) {
  std::vector<attention_seq> views;
  for (auto& seq : seqs) views.push_back(seq.view(0, seq.n_tokens, seq.out.data()));
  return attention(cache.view(), s, views, pool);
}

/// GPT-OSS's sink logits for up to 40 heads: from well below the scores to above them (a head
/// that mostly attends to nothing).
const float sink_logits[40] = {-3.0f, 0.5f, 2.0f, -0.25f, 6.0f, 1.0f, -8.0f, 3.5f, 0.0f, 1.5f, -1.0f, 4.0f, 2.5f, -2.0f,
                               0.75f, 5.0f, -0.5f, 1.25f, 3.0f, -4.0f, 0.25f, 2.25f, -1.5f, 4.5f, 1.75f, -0.75f, 0.5f,
                               3.25f, -2.5f, 1.0f, 2.0f, -6.0f, 0.125f, 2.75f, -1.25f, 3.75f, 0.875f, -0.375f, 1.5f, 2.5f};

std::vector<attention_shape> all_shapes() {
  std::vector<attention_shape> shapes;
  for (size_t block_size : {4, 16})
    for (size_t n_kv : {6, 3, 2, 1})
      for (size_t head_dim : {8, 40})
        for (size_t window : {0, 5, 19}) {
          attention_shape s;
          s.softcap = window == 5 ? 2.0f : 0.0f;  // Gemma 2's soft-capping, strong enough to matter
          s.n_heads = 6;
          s.n_kv_heads = n_kv;
          s.head_dim = head_dim;
          s.block_size = block_size;
          s.sliding_window = window;
          s.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
          if (window != 5 && n_kv != 3) s.sinks = sink_logits;  // GPT-OSS's, with and without a window
          shapes.push_back(s);
        }
  return shapes;
}

// (pos0, n_tokens): a whole prompt, a decode step deep in context, a chunk continuing a prompt
// mid-block, an empty slot, and the very first token.
const std::vector<std::pair<size_t, size_t>> batch_specs = {{0, 21}, {33, 1}, {10, 8}, {4, 0}, {0, 1}};

TEST(Attention, MatchesDoublePrecisionReference) {
  thread_pool pool(2);
  std::mt19937 rng(testing::test_seed(21));
  for (const attention_shape& s : all_shapes()) {
    std::vector<sequence> seqs;
    cache_storage cache(s, make_batch(s, batch_specs, rng, seqs));
    for (const auto& seq : seqs) write_sequence(cache, s, seq);
    ASSERT_TRUE(attend(cache, s, seqs, pool).ok()) << describe(s);
    for (size_t si = 0; si < seqs.size(); ++si) {
      const sequence& seq = seqs[si];
      for (size_t row = 0; row < seq.n_tokens; ++row) {
        for (size_t h = 0; h < s.n_heads; ++h) {
          std::vector<double> want = reference(s, seq, row, h);
          const float* got = seq.out.data() + (row * s.n_heads + h) * s.head_dim;
          for (size_t i = 0; i < s.head_dim; ++i) {
            ASSERT_NEAR(got[i], want[i], 2e-5) << describe(s) << " seq " << si << " row " << row << " head " << h
                                               << " dim " << i;
          }
        }
      }
      EXPECT_TRUE(std::isnan(seq.out.back())) << describe(s) << " seq " << si << " wrote past its output";
    }
  }
}

/// The attention's definition one score at a time, in float, as the kernel was first written:
/// dot() per score, scale, soft-cap, max, exp_det, a sum in position order, then the value
/// rows added in position order. The tiled kernel must give these bits exactly.
std::vector<float> scalar_definition(const attention_shape& s, const sequence& seq, size_t row, size_t head) {
  const size_t pos = seq.pos0 + row, d = s.head_dim;
  const size_t kvh = head / (s.n_heads / s.n_kv_heads);
  const size_t begin = s.sliding_window > 0 && pos + 1 > s.sliding_window ? pos + 1 - s.sliding_window : 0;
  const float* qv = seq.q.data() + (row * s.n_heads + head) * d;
  std::vector<float> scores;
  float max_score = -3.4e38f;
  for (size_t p = begin; p <= pos; ++p) {
    float sc = dot(qv, seq.k.data() + (p * s.n_kv_heads + kvh) * d, d) * s.scale;
    if (s.softcap > 0.0f) sc = s.softcap * tanh_det(sc / s.softcap);
    scores.push_back(sc);
    max_score = std::max(max_score, sc);
  }
  if (s.sinks) max_score = std::max(max_score, s.sinks[head]);
  float sum = 0.0f;
  for (float& sc : scores) {
    sc = exp_det(sc - max_score);
    sum = sum + sc;
  }
  if (s.sinks) sum = sum + exp_det(s.sinks[head] - max_score);  // last
  const float inv = 1.0f / sum;
  std::vector<float> out(d, 0.0f);
  for (size_t p = begin; p <= pos; ++p) {
    const float w = scores[p - begin] * inv;
    const float* vv = seq.v.data() + (p * s.n_kv_heads + kvh) * d;
    for (size_t i = 0; i < d; ++i) out[i] = out[i] + w * vv[i];
  }
  return out;
}

// The tiled kernel (16-row tiles, a block of keys per micro-kernel call, the query heads of a
// kv head in one work item, head dims 64/128/256 specialised) against the scalar definition, bit
// for bit: tiles that cross block and window edges, decode rows, soft-capping, every specialised
// head dim and two that are not, GQA groups of 1, 2, 4, 6 and 17 heads (whole, split in parts when
// a lone decode row leaves too few items for the threads — 6 into 3s —, and 17 one by one), float32, bfloat16 and both 8-bit
// float caches (those: the same definition over the rounded keys and values).
TEST(Attention, EqualsTheScalarDefinitionBitForBit) {
  thread_pool pool(3);
  std::mt19937 rng(testing::test_seed(23));
  const std::vector<std::vector<std::pair<size_t, size_t>>> batches = {{{0, 45}, {70, 1}, {19, 33}}, {{70, 1}}};
  for (dtype type : {dtype::f32, dtype::bf16, dtype::f8_e4m3, dtype::f8_e5m2})
  for (auto [n_heads, n_kv] : {std::pair<size_t, size_t>{4, 2}, {8, 2}, {3, 3}, {12, 2}, {34, 2}}) {
    for (size_t head_dim : {8, 40, 64, 128, 256}) {
      for (size_t window : {0, 7, 40}) {
        for (const auto& batch : batches) {
          attention_shape s;
          s.n_heads = n_heads;
          s.n_kv_heads = n_kv;
          s.head_dim = head_dim;
          s.block_size = 16;
          s.sliding_window = window;
          s.softcap = window == 7 ? 3.0f : 0.0f;
          s.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
          if (head_dim == 40 || (head_dim == 64 && window == 0)) s.sinks = sink_logits;  // GPT-OSS's
          std::vector<sequence> seqs;
          cache_storage cache(s, make_batch(s, batch, rng, seqs), type);
          for (const auto& seq : seqs) write_sequence(cache, s, seq);
          round_to_cache(type, seqs);
          ASSERT_TRUE(attend(cache, s, seqs, pool).ok()) << describe(s);
          for (size_t si = 0; si < seqs.size(); ++si) {
            for (size_t row = 0; row < seqs[si].n_tokens; ++row) {
              for (size_t h = 0; h < s.n_heads; ++h) {
                const auto want = scalar_definition(s, seqs[si], row, h);
                ASSERT_EQ(std::memcmp(seqs[si].out.data() + (row * s.n_heads + h) * head_dim, want.data(),
                                      head_dim * sizeof(float)),
                          0)
                    << describe(s) << " " << dtype_name(type) << " seq " << si << " row " << row << " head " << h;
              }
            }
          }
        }
      }
    }
  }
}

// An 8-bit cache with a checkpoint's scales (vLLM's k_scale / v_scale): keys and values stored
// as f8(x / scale) — small scales saturate the largest, a large one sends small values to
// subnormals — and read back times the scale, bit for bit the scalar definition over those values.
TEST(Attention, ScaledEightBitCacheEqualsTheScalarDefinitionBitForBit) {
  thread_pool pool(3);
  std::mt19937 rng(testing::test_seed(27));
  const std::vector<std::pair<size_t, size_t>> batch = {{0, 45}, {70, 1}, {19, 33}};
  for (dtype type : {dtype::f8_e4m3, dtype::f8_e5m2})
  for (auto [ks, vs] : {std::pair<float, float>{0.0013f, 0.0071f}, {0.0173f, 2.9f}, {37.0f, 0.5f}}) {
    for (size_t head_dim : {8, 64, 128}) {
      attention_shape s;
      s.n_heads = 8;
      s.n_kv_heads = 2;
      s.head_dim = head_dim;
      s.block_size = 16;
      s.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      std::vector<sequence> seqs;
      cache_storage cache(s, make_batch(s, batch, rng, seqs), type);
      cache.k_scale = ks;
      cache.v_scale = vs;
      for (const auto& seq : seqs) write_sequence(cache, s, seq);
      const std::vector<sequence> unrounded = seqs;
      round_to_cache(type, seqs, ks, vs);
      size_t changed = 0;  // the scales matter: a scale-1 cache would hold other values
      for (size_t si = 0; si < seqs.size(); ++si) {
        for (size_t i = 0; i < seqs[si].k.size(); ++i) {
          changed += seqs[si].k[i] != f8_to_f32(type, f32_to_f8(type, unrounded[si].k[i]));
        }
      }
      EXPECT_GT(changed, seqs[0].k.size() / 4);
      ASSERT_TRUE(attend(cache, s, seqs, pool).ok()) << describe(s);
      for (size_t si = 0; si < seqs.size(); ++si) {
        for (size_t row = 0; row < seqs[si].n_tokens; ++row) {
          for (size_t h = 0; h < s.n_heads; ++h) {
            const auto want = scalar_definition(s, seqs[si], row, h);
            ASSERT_EQ(std::memcmp(seqs[si].out.data() + (row * s.n_heads + h) * head_dim, want.data(), head_dim * sizeof(float)), 0)
                << describe(s) << " " << dtype_name(type) << " scales " << ks << " " << vs << " seq " << si << " row " << row;
          }
        }
      }
    }
  }
}

TEST(Attention, SequenceOutputIsBitwiseIndependentOfBatchAndThreads) {
  thread_pool pool1(1), pool2(2), pool3(3);
  std::mt19937 rng(testing::test_seed(22));
  for (dtype type : {dtype::f32, dtype::bf16, dtype::f8_e4m3, dtype::f8_e5m2})
  for (const attention_shape& s : all_shapes()) {
    std::vector<sequence> seqs;
    cache_storage cache(s, make_batch(s, batch_specs, rng, seqs), type);
    for (const auto& seq : seqs) write_sequence(cache, s, seq);
    ASSERT_TRUE(attend(cache, s, seqs, pool2).ok()) << describe(s);
    for (thread_pool* pool : {&pool1, &pool3}) {
      std::vector<sequence> again = seqs;
      for (auto& seq : again) std::fill(seq.out.begin(), seq.out.end(), poison);
      ASSERT_TRUE(attend(cache, s, again, *pool).ok());
      for (size_t si = 0; si < seqs.size(); ++si) {
        ASSERT_EQ(std::memcmp(again[si].out.data(), seqs[si].out.data(), seqs[si].q.size() * sizeof(float)), 0)
            << describe(s) << " " << dtype_name(type) << " seq " << si << " batched with " << pool->size() << " threads";
      }
    }
    for (size_t si = 0; si < seqs.size(); ++si) {
      std::vector<sequence> alone = {seqs[si]};
      std::fill(alone[0].out.begin(), alone[0].out.end(), poison);
      ASSERT_TRUE(attend(cache, s, alone, pool1).ok());
      ASSERT_EQ(std::memcmp(alone[0].out.data(), seqs[si].out.data(), seqs[si].q.size() * sizeof(float)), 0)
          << describe(s) << " " << dtype_name(type) << " seq " << si << " alone vs batched";
    }
  }
}

TEST(Attention, PrefillAndTokenByTokenDecodeGiveTheSameBits) {
  thread_pool pool(2);
  std::mt19937 rng(testing::test_seed(23));
  for (dtype type : {dtype::f32, dtype::bf16, dtype::f8_e4m3, dtype::f8_e5m2})
  for (const attention_shape& s : all_shapes()) {
    std::vector<sequence> seqs;
    const size_t blocks = make_batch(s, batch_specs, rng, seqs);
    cache_storage cache(s, blocks, type);
    for (const auto& seq : seqs) write_sequence(cache, s, seq);
    ASSERT_TRUE(attend(cache, s, seqs, pool).ok()) << describe(s);
    const size_t row = s.n_kv_heads * s.head_dim, out_row = s.n_heads * s.head_dim;
    for (size_t si = 0; si < seqs.size(); ++si) {
      const sequence& seq = seqs[si];
      // A fresh cache filled one position at a time, attending after each write: positions
      // not written yet are NaN, so any look ahead shows.
      cache_storage fresh(s, blocks, type);
      std::vector<float> out(out_row + 1, poison);
      for (size_t p = 0; p < seq.end(); ++p) {
        ASSERT_TRUE(kv_write(fresh.view(), s, seq.table, p, 1, seq.k.data() + p * row, seq.v.data() + p * row).ok());
        if (p < seq.pos0) continue;
        const size_t r = p - seq.pos0;
        std::fill(out.begin(), out.end(), poison);
        attention_seq one = seq.view(r, 1, out.data());
        ASSERT_TRUE(attention(fresh.view(), s, std::span(&one, 1), pool).ok());
        ASSERT_EQ(std::memcmp(out.data(), seq.out.data() + r * out_row, out_row * sizeof(float)), 0)
            << describe(s) << " " << dtype_name(type) << " seq " << si << " position " << p;
        EXPECT_TRUE(std::isnan(out.back()));
      }
    }
  }
}

TEST(Attention, SlidingWindowIgnoresKeysOutsideIt) {
  // With window 3, the row at position 9 sees positions 7, 8, 9 only: garbage elsewhere in the
  // cache (here: huge keys that would dominate the softmax) must not change its output.
  attention_shape s;
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.head_dim = 8;
  s.block_size = 4;
  s.sliding_window = 3;
  s.scale = 0.5f;
  std::mt19937 rng(24);
  std::vector<sequence> seqs;
  cache_storage cache(s, make_batch(s, {{9, 1}}, rng, seqs));
  write_sequence(cache, s, seqs[0]);
  thread_pool pool(1);
  ASSERT_TRUE(attend(cache, s, seqs, pool).ok());
  std::vector<float> first(seqs[0].out);
  std::vector<float> loud_k(7 * 8, 1e3f), loud_v(7 * 8, 1e3f);
  ASSERT_TRUE(kv_write(cache.view(), s, seqs[0].table, 0, 7, loud_k.data(), loud_v.data()).ok());
  ASSERT_TRUE(attend(cache, s, seqs, pool).ok());
  EXPECT_EQ(std::memcmp(first.data(), seqs[0].out.data(), seqs[0].q.size() * sizeof(float)), 0);
}

attention_shape small_shape() {
  attention_shape s;
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.head_dim = 8;
  s.block_size = 4;
  s.scale = 0.35f;
  return s;
}

TEST(KvWrite, RejectsShortOrOutOfRangeBlockTables) {
  const attention_shape s = small_shape();
  cache_storage cache(s, 4);
  std::vector<float> kv(3 * 8, 1.0f);
  const std::vector<int32_t> short_table = {2, 0};  // covers positions 0..7 only
  EXPECT_FALSE(kv_write(cache.view(), s, short_table, 6, 3, kv.data(), kv.data()).ok());
  EXPECT_TRUE(kv_write(cache.view(), s, short_table, 5, 3, kv.data(), kv.data()).ok());
  const std::vector<int32_t> past_end = {1, 4};  // block 4 of 4
  EXPECT_FALSE(kv_write(cache.view(), s, past_end, 3, 2, kv.data(), kv.data()).ok());
  const std::vector<int32_t> negative = {-1};
  EXPECT_FALSE(kv_write(cache.view(), s, negative, 0, 1, kv.data(), kv.data()).ok());
  EXPECT_FALSE(kv_write(cache.view(), s, std::span<const int32_t>(), 0, 1, kv.data(), kv.data()).ok());
}

TEST(KvWrite, RefusesUnusableScales) {
  const attention_shape s = small_shape();
  std::vector<float> kv(3 * 8, 1.0f);
  const std::vector<int32_t> table = {2, 0};
  cache_storage f8(s, 4, dtype::f8_e4m3);
  for (float bad : {0.0f, -0.5f, std::numeric_limits<float>::infinity(), poison}) {
    f8.k_scale = bad;
    EXPECT_FALSE(kv_write(f8.view(), s, table, 0, 3, kv.data(), kv.data()).ok()) << bad;
    f8.k_scale = 1.0f;
    f8.v_scale = bad;
    EXPECT_FALSE(kv_write(f8.view(), s, table, 0, 3, kv.data(), kv.data()).ok()) << bad;
    f8.v_scale = 1.0f;
  }
  f8.k_scale = 0.25f;
  EXPECT_TRUE(kv_write(f8.view(), s, table, 0, 3, kv.data(), kv.data()).ok());
  const size_t first = 2 * s.block_size * s.n_kv_heads * s.head_dim;  // position 0 is in block 2
  EXPECT_EQ(f8.keys8[first], f32_to_f8(dtype::f8_e4m3, 4.0f));  // 1 / 0.25
  EXPECT_EQ(f8.values8[first], f32_to_f8(dtype::f8_e4m3, 1.0f));
  cache_storage wide(s, 4);  // float32 and bfloat16 caches hold values themselves: scales must be 1
  wide.k_scale = 2.0f;
  EXPECT_FALSE(kv_write(wide.view(), s, table, 0, 3, kv.data(), kv.data()).ok());
}

TEST(Attention, RejectsShortOrOutOfRangeBlockTables) {
  const attention_shape s = small_shape();
  std::mt19937 rng(25);
  std::vector<sequence> seqs;
  const size_t blocks = make_batch(s, {{0, 6}, {3, 2}}, rng, seqs);  // needs 2 + 2 blocks
  cache_storage cache(s, blocks);
  for (const auto& seq : seqs) write_sequence(cache, s, seq);
  thread_pool pool(2);
  ASSERT_TRUE(attend(cache, s, seqs, pool).ok());

  std::vector<sequence> bad = seqs;
  bad[1].table.pop_back();  // position 4 has no block
  EXPECT_FALSE(attend(cache, s, bad, pool).ok());
  bad = seqs;
  bad[0].table[1] = static_cast<int32_t>(blocks);
  EXPECT_FALSE(attend(cache, s, bad, pool).ok());
  bad = seqs;
  bad[1].table[0] = -3;
  EXPECT_FALSE(attend(cache, s, bad, pool).ok());
}

TEST(Attention, RejectsHeadsThatDoNotGroupEvenly) {
  attention_shape s = small_shape();
  std::mt19937 rng(26);
  std::vector<sequence> seqs;
  cache_storage cache(s, make_batch(s, {{0, 3}}, rng, seqs));
  write_sequence(cache, s, seqs[0]);
  thread_pool pool(1);
  attention_shape odd = s;
  odd.n_heads = 3;
  odd.n_kv_heads = 2;
  EXPECT_FALSE(attend(cache, odd, seqs, pool).ok());
  attention_shape none = s;
  none.n_kv_heads = 0;
  EXPECT_FALSE(attend(cache, none, seqs, pool).ok());
}

}  // namespace
}  // namespace llmesh::kernels
