// Causal GQA attention over the paged KV cache, one (query row, head) at a time:
// scores with the canonical dot, max-subtracted deterministic exp, a sequential sum, then the
// value rows accumulated in increasing position order. Work items are (row, head) pairs.
// Benchmark: part of `llmesh bench engine` (prefill and decode).
#include <algorithm>
#include <string>
#include <vector>

#include "llmesh/kernels/attention.hpp"
#include "llmesh/kernels/elementwise.hpp"
#include "llmesh/kernels/matmul.hpp"

namespace llmesh::kernels {
namespace {

size_t row_stride(const attention_shape& s) { return s.n_kv_heads * s.head_dim; }
size_t block_stride(const attention_shape& s) { return s.block_size * row_stride(s); }

status check_table(const kv_layer_view& cache, const attention_shape& shape,
                   std::span<const int32_t> table, size_t end_pos) {
  if (shape.block_size == 0) return make_error(errc::internal, "attention: block_size is 0");
  size_t need = (end_pos + shape.block_size - 1) / shape.block_size;
  if (table.size() < need) {
    return make_error(errc::internal, "attention: block table has " + std::to_string(table.size()) +
                                          " blocks, positions need " + std::to_string(need));
  }
  for (size_t i = 0; i < need; ++i) {
    if (table[i] < 0 || static_cast<size_t>(table[i]) >= cache.n_blocks) {
      return make_error(errc::internal, "attention: block id out of range: " + std::to_string(table[i]));
    }
  }
  return ok_status();
}

void attend_one(const kv_layer_view& cache, const attention_shape& s, const attention_seq& seq,
                size_t row, size_t head, float* scores) {
  const size_t pos = seq.pos0 + row;
  const size_t group = s.n_heads / s.n_kv_heads;
  const size_t kvh = head / group;
  const size_t begin = (s.sliding_window > 0 && pos + 1 > s.sliding_window) ? pos + 1 - s.sliding_window : 0;
  const float* q = seq.q + (row * s.n_heads + head) * s.head_dim;
  float* out = seq.out + (row * s.n_heads + head) * s.head_dim;
  auto offset = [&](size_t p) {
    return static_cast<size_t>(seq.block_table[p / s.block_size]) * block_stride(s) +
           (p % s.block_size) * row_stride(s) + kvh * s.head_dim;
  };

  float max_score = -3.4e38f;
  for (size_t p = begin; p <= pos; ++p) {
    float sc = dot(q, cache.keys + offset(p), s.head_dim) * s.scale;
    if (s.softcap > 0.0f) sc = s.softcap * tanh_det(sc / s.softcap);
    scores[p - begin] = sc;
    max_score = std::max(max_score, sc);
  }
  float sum = 0.0f;
  for (size_t p = begin; p <= pos; ++p) {
    float e = exp_det(scores[p - begin] - max_score);
    scores[p - begin] = e;
    sum = sum + e;
  }
  float inv = 1.0f / sum;
  std::fill(out, out + s.head_dim, 0.0f);
  for (size_t p = begin; p <= pos; ++p) {
    float w = scores[p - begin] * inv;
    const float* v = cache.values + offset(p);
    for (size_t d = 0; d < s.head_dim; ++d) out[d] = out[d] + w * v[d];
  }
}

}  // namespace

status kv_write(const kv_layer_view& cache, const attention_shape& shape,
                std::span<const int32_t> block_table, size_t pos0, size_t n_tokens,
                const float* k, const float* v) {
  LLMESH_TRY(check_table(cache, shape, block_table, pos0 + n_tokens));
  const size_t row = row_stride(shape);
  for (size_t t = 0; t < n_tokens; ++t) {
    size_t p = pos0 + t;
    size_t off = static_cast<size_t>(block_table[p / shape.block_size]) * block_stride(shape) +
                 (p % shape.block_size) * row;
    std::copy(k + t * row, k + (t + 1) * row, cache.keys + off);
    std::copy(v + t * row, v + (t + 1) * row, cache.values + off);
  }
  return ok_status();
}

status attention(const kv_layer_view& cache, const attention_shape& shape,
                 std::span<const attention_seq> seqs, thread_pool& pool) {
  if (shape.n_kv_heads == 0 || shape.n_heads % shape.n_kv_heads != 0 || shape.head_dim == 0) {
    return make_error(errc::internal, "attention: heads do not group evenly over kv heads");
  }
  size_t items = 0, max_ctx = 0;
  std::vector<size_t> first_item;
  first_item.reserve(seqs.size() + 1);
  for (const auto& seq : seqs) {
    LLMESH_TRY(check_table(cache, shape, seq.block_table, seq.pos0 + seq.n_tokens));
    first_item.push_back(items);
    items += seq.n_tokens * shape.n_heads;
    max_ctx = std::max(max_ctx, seq.pos0 + seq.n_tokens);
  }
  first_item.push_back(items);
  pool.run([&](int t, int n_threads) {
    auto [i0, i1] = thread_pool::split(items, t, n_threads);
    if (i0 >= i1) return;
    std::vector<float> scores(max_ctx);
    size_t s = std::upper_bound(first_item.begin(), first_item.end(), i0) - first_item.begin() - 1;
    for (size_t i = i0; i < i1; ++i) {
      while (i >= first_item[s + 1]) ++s;
      size_t local = i - first_item[s];
      attend_one(cache, shape, seqs[s], local / shape.n_heads, local % shape.n_heads, scores.data());
    }
  });
  return ok_status();
}

}  // namespace llmesh::kernels
