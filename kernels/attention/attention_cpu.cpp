// Causal GQA attention over the paged KV cache: per head, tiles of up to 16 query rows take
// their scores against each block of keys as one small matmul (the canonical dot, so each score
// has dot()'s bits), then per row a max-subtracted deterministic exp, a sequential sum, and the
// value rows accumulated in increasing position order. Work items are (sequence, tile, the query
// heads of one kv head), so a GQA group's keys and values are read once for all its heads.
// Benchmark: part of `llmesh bench engine` (prefill and decode).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <bit>
#include <string>
#include <vector>

#include "llmesh/kernels/attention.hpp"
#include "llmesh/kernels/elementwise.hpp"
#include "llmesh/kernels/matmul.hpp"
#include "attention/kv_widen.hpp"
#include "llmesh/kernels/cpu_features.hpp"
#include "matmul/matmul_isa.hpp"

namespace llmesh::kernels {

void detail::widen_f8_rows_portable(dtype t, const uint8_t* src, size_t stride, size_t n, size_t width, float* dst) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t d = 0; d < width; ++d) dst[i * width + d] = f8_to_f32(t, src[i * stride + d]);
  }
}

namespace {

size_t row_stride(const attention_shape& s) { return s.n_kv_heads * s.head_dim; }
size_t block_stride(const attention_shape& s) { return s.block_size * row_stride(s); }

status check_table(const kv_layer_view& cache, const attention_shape& shape,
                   std::span<const int32_t> table, size_t end_pos) {
  if (shape.block_size == 0) return make_error(errc::internal, "attention: block_size is 0");
  if (cache.type != dtype::f32 && cache.type != dtype::bf16 && !is_f8(cache.type)) {
    return make_error(errc::internal, "attention: a KV cache of " + std::string(dtype_name(cache.type)) + " (f32, bf16, f8_e4m3 or f8_e5m2)");
  }
  const auto usable = [](float s) { return s > 0.0f && std::isfinite(s); };
  if (!usable(cache.k_scale) || !usable(cache.v_scale) || (!is_f8(cache.type) && (cache.k_scale != 1.0f || cache.v_scale != 1.0f))) {
    return make_error(errc::internal, "attention: KV scales must be finite and positive, and 1 unless the cache is 8-bit");
  }
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

// The two elementwise loops of a row, built for the CPU's widest vectors (GCC's target_clones
// picks one at load time). -ffp-contract=off holds for every clone: no fused multiply-add, so
// each clone gives the portable code's bits.
#if defined(__GNUC__) && defined(__x86_64__) && !defined(LLMESH_NO_X86_KERNELS)
#define LLMESH_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LLMESH_VECTOR_CLONES
#endif

/// x[i] = exp_det(x[i] - shift).
LLMESH_VECTOR_CLONES void exp_shifted(float* x, size_t n, float shift) {
  for (size_t i = 0; i < n; ++i) x[i] = exp_det(x[i] - shift);
}

/// For each of n value rows (stride apart), in order: out[d] = out[d] + (e[i] · inv) · v_i[d].
/// HD > 0: the head dimension, known at compile time, so `out` lives in registers across the
/// rows (the same operations in the same order as the general loop).
template <size_t HD>
LLMESH_VECTOR_CLONES void add_weighted_rows(float* __restrict out, const float* __restrict e, float inv,
                                            const float* __restrict v, size_t stride, size_t n, size_t head_dim) {
  if constexpr (HD > 0) {
    float acc[HD];
    for (size_t d = 0; d < HD; ++d) acc[d] = out[d];
    for (size_t i = 0; i < n; ++i) {
      const float w = e[i] * inv;
      const float* row = v + i * stride;
      for (size_t d = 0; d < HD; ++d) acc[d] = acc[d] + w * row[d];
    }
    for (size_t d = 0; d < HD; ++d) out[d] = acc[d];
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float w = e[i] * inv;
      const float* row = v + i * stride;
      for (size_t d = 0; d < head_dim; ++d) out[d] = out[d] + w * row[d];
    }
  }
}

using add_rows_fn = void (*)(float*, const float*, float, const float*, size_t, size_t, size_t);

add_rows_fn add_rows_for(size_t head_dim) {
  switch (head_dim) {
    case 64: return add_weighted_rows<64>;
    case 128: return add_weighted_rows<128>;
    case 256: return add_weighted_rows<256>;
    default: return add_weighted_rows<0>;
  }
}

/// n bf16 rows of `width` (stride apart) widened (exactly) into n contiguous float rows.
LLMESH_VECTOR_CLONES void widen_rows(const uint16_t* __restrict src, size_t stride, size_t n, size_t width,
                                     float* __restrict dst) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t d = 0; d < width; ++d) {
      dst[i * width + d] = std::bit_cast<float>(static_cast<uint32_t>(src[i * stride + d]) << 16);
    }
  }
}

/// x[i] · scale for n floats (an 8-bit cache's widened rows): one multiply each, the same bits
/// in every clone.
LLMESH_VECTOR_CLONES void scale_rows(float* __restrict x, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) x[i] = x[i] * scale;
}

/// Rows [p, end) of one kv head's keys or values as float32 rows: in place in a float32 cache
/// (row_stride apart), or widened once into `scratch` from a bf16 or 8-bit float cache
/// (head_dim apart) — an 8-bit cache's times its `scale` — so every (row, head) pair of a work
/// item reads floats. Returns the first row and the stride.
std::pair<const float*, size_t> float_rows(const void* base, dtype type, float scale, size_t offset, size_t n,
                                           const attention_shape& s, std::vector<float>& scratch) {
  const size_t stride = row_stride(s);
  if (type == dtype::f32) return {static_cast<const float*>(base) + offset, stride};
  scratch.resize(n * s.head_dim);
  if (type == dtype::bf16) {
    widen_rows(static_cast<const uint16_t*>(base) + offset, stride, n, s.head_dim, scratch.data());
  } else {
    widen_kv_rows(type, static_cast<const uint8_t*>(base) + offset, stride, n, s.head_dim, scratch.data(), active_isa());
    if (scale != 1.0f) scale_rows(scratch.data(), n * s.head_dim, scale);
  }
  return {scratch.data(), s.head_dim};
}

/// Query rows per work item: their scores against a block of keys are one small matmul (the
/// canonical dot per score, so the bits are dot()'s), the keys read once for the tile.
constexpr size_t rows_per_tile = 16;
/// Query heads of one kv head per work item, at most (their keys and values are read once).
constexpr size_t max_heads_per_item = 16;

size_t window_begin(const attention_shape& s, size_t pos) {
  return (s.sliding_window > 0 && pos + 1 > s.sliding_window) ? pos + 1 - s.sliding_window : 0;
}

/// Rows [r0, r1) of one sequence for query heads h0 .. h0 + nh - 1, which share one kv head:
/// each block of keys and of values is read from memory once for all of them (GQA) and stays in
/// L1 while every (row, head) pair takes its part. `scores` grows to nh × (r1 - r0) × (span of the
/// rows' visible positions) floats. A (row, head) pair's numbers are those of the one-pair
/// definition: each score is dot()'s, the softmax and the value rows run in position order.
void attend_tile(const kv_layer_view& cache, const attention_shape& s, const attention_seq& seq, size_t r0, size_t r1,
                 size_t h0, size_t nh, std::vector<float>& score_buffer, std::vector<float>& scratch) {
  const size_t group = s.n_heads / s.n_kv_heads;
  const size_t kvh = h0 / group;
  const size_t rows = r1 - r0;
  const size_t lo = window_begin(s, seq.pos0 + r0), last = seq.pos0 + r1 - 1;
  const size_t span = last + 1 - lo;
  if (score_buffer.size() < nh * rows * span) score_buffer.resize(nh * rows * span);
  float* scores = score_buffer.data();
  auto offset = [&](size_t p) {
    return static_cast<size_t>(seq.block_table[p / s.block_size]) * block_stride(s) +
           (p % s.block_size) * row_stride(s) + kvh * s.head_dim;
  };
  auto scores_of = [&](size_t j, size_t row) { return scores + (j * rows + (row - r0)) * span; };
  // Scores of every (head, row) pair against positions lo..last, a block of keys at a time
  // (positions a row cannot see are computed and not used). One row (decode): the heads' query
  // vectors are consecutive, so one micro-kernel call takes them all.
  const auto& isa = detail::cpu_kernels();
  for (size_t p = lo; p <= last;) {
    const size_t end = std::min((p / s.block_size + 1) * s.block_size, last + 1);
    const auto [keys, ldk] = float_rows(cache.keys, cache.type, cache.k_scale, offset(p), end - p, s, scratch);
    matmul_args a;
    a.w = keys;
    a.ldw = ldk;
    a.w_type = dtype::f32;
    a.n = end - p;
    a.k = s.head_dim;
    a.ldy = span;
    if (rows == 1) {
      a.x = seq.q + (r0 * s.n_heads + h0) * s.head_dim;
      a.ldx = s.head_dim;
      a.y = scores + (p - lo);
      a.m = nh;
      isa.gemm_block(a, 0, a.m, 0, a.n);
    } else {
      a.ldx = s.n_heads * s.head_dim;
      a.m = rows;
      for (size_t j = 0; j < nh; ++j) {
        a.x = seq.q + (r0 * s.n_heads + h0 + j) * s.head_dim;
        a.y = scores_of(j, r0) + (p - lo);
        isa.gemm_block(a, 0, a.m, 0, a.n);
      }
    }
    p = end;
  }
  // Per (head, row): scale, soft-cap, max, exp and the sum in position order.
  float inv[rows_per_tile * max_heads_per_item];
  for (size_t j = 0; j < nh; ++j) {
    for (size_t row = r0; row < r1; ++row) {
      const size_t pos = seq.pos0 + row, begin = window_begin(s, pos);
      float* sc_row = scores_of(j, row) + (begin - lo);
      float max_score = -3.4e38f;
      for (size_t p = begin; p <= pos; ++p) {
        float sc = sc_row[p - begin] * s.scale;
        if (s.softcap > 0.0f) sc = s.softcap * tanh_det(sc / s.softcap);
        sc_row[p - begin] = sc;
        max_score = std::max(max_score, sc);
      }
      if (s.sinks) max_score = std::max(max_score, s.sinks[h0 + j]);
      const size_t count = pos + 1 - begin;
      exp_shifted(sc_row, count, max_score);
      float sum = 0.0f;
      for (size_t i = 0; i < count; ++i) sum = sum + sc_row[i];  // in position order
      if (s.sinks) sum = sum + exp_det(s.sinks[h0 + j] - max_score);
      inv[j * rows + (row - r0)] = 1.0f / sum;
      float* out = seq.out + (row * s.n_heads + h0 + j) * s.head_dim;
      std::fill(out, out + s.head_dim, 0.0f);
    }
  }
  // The value rows a block at a time, positions in order for every pair.
  const add_rows_fn add_rows = add_rows_for(s.head_dim);
  for (size_t p = lo; p <= last;) {
    const size_t end = std::min((p / s.block_size + 1) * s.block_size, last + 1);
    const auto [values, ldv] = float_rows(cache.values, cache.type, cache.v_scale, offset(p), end - p, s, scratch);
    for (size_t j = 0; j < nh; ++j) {
      for (size_t row = r0; row < r1; ++row) {
        const size_t pos = seq.pos0 + row, begin = std::max(p, window_begin(s, pos)), stop = std::min(end, pos + 1);
        if (begin >= stop) continue;
        float* out = seq.out + (row * s.n_heads + h0 + j) * s.head_dim;
        const float* e = scores_of(j, row) + (begin - lo);
        add_rows(out, e, inv[j * rows + (row - r0)], values + (begin - p) * ldv, ldv, stop - begin,
                 s.head_dim);
      }
    }
    p = end;
  }
}

}  // namespace

void widen_kv_rows(dtype t, const void* src, size_t stride, size_t n, size_t width, float* dst, isa level) {
  const auto* bytes = static_cast<const uint8_t*>(src);
#if !defined(LLMESH_NO_X86_KERNELS) && defined(__x86_64__)
  if (level == isa::avx512) return detail::widen_f8_rows_avx512(t, bytes, stride, n, width, dst);
  if (level == isa::avx2) return detail::widen_f8_rows_avx2(t, bytes, stride, n, width, dst);
#else
  (void)level;
#endif
  detail::widen_f8_rows_portable(t, bytes, stride, n, width, dst);
}

status kv_write(const kv_layer_view& cache, const attention_shape& shape,
                std::span<const int32_t> block_table, size_t pos0, size_t n_tokens,
                const float* k, const float* v) {
  LLMESH_TRY(check_table(cache, shape, block_table, pos0 + n_tokens));
  const size_t row = row_stride(shape);
  for (size_t t = 0; t < n_tokens; ++t) {
    size_t p = pos0 + t;
    size_t off = static_cast<size_t>(block_table[p / shape.block_size]) * block_stride(shape) +
                 (p % shape.block_size) * row;
    if (cache.type == dtype::bf16) {
      uint16_t* keys = static_cast<uint16_t*>(cache.keys) + off;
      uint16_t* values = static_cast<uint16_t*>(cache.values) + off;
      for (size_t i = 0; i < row; ++i) keys[i] = f32_to_bf16(k[t * row + i]);
      for (size_t i = 0; i < row; ++i) values[i] = f32_to_bf16(v[t * row + i]);
    } else if (is_f8(cache.type)) {
      uint8_t* keys = static_cast<uint8_t*>(cache.keys) + off;
      uint8_t* values = static_cast<uint8_t*>(cache.values) + off;
      // vLLM's scaled conversion: x / scale in float32, then rounded (scale 1: x itself).
      const float ks = cache.k_scale, vs = cache.v_scale;
      for (size_t i = 0; i < row; ++i) keys[i] = f32_to_f8(cache.type, k[t * row + i] / ks);
      for (size_t i = 0; i < row; ++i) values[i] = f32_to_f8(cache.type, v[t * row + i] / vs);
    } else {
      std::copy(k + t * row, k + (t + 1) * row, static_cast<float*>(cache.keys) + off);
      std::copy(v + t * row, v + (t + 1) * row, static_cast<float*>(cache.values) + off);
    }
  }
  return ok_status();
}

status attention(const kv_layer_view& cache, const attention_shape& shape,
                 std::span<const attention_seq> seqs, thread_pool& pool) {
  if (shape.n_kv_heads == 0 || shape.n_heads % shape.n_kv_heads != 0 || shape.head_dim == 0) {
    return make_error(errc::internal, "attention: heads do not group evenly over kv heads");
  }
  // Work items: (sequence, tile of rows, kv head, part of its query heads), handed out
  // dynamically (later tiles see more keys). A kv head's query heads share one item unless that
  // leaves fewer than two items per thread (decode of one sequence with few kv heads): then
  // they split in halves while they can. Which thread runs an item, and which heads share it,
  // never changes a (row, head) pair's numbers.
  const size_t group = shape.n_heads / shape.n_kv_heads;
  auto tiles_of = [](const attention_seq& seq) { return (seq.n_tokens + rows_per_tile - 1) / rows_per_tile; };
  size_t tiles = 0, max_span = 0;
  for (const auto& seq : seqs) {
    LLMESH_TRY(check_table(cache, shape, seq.block_table, seq.pos0 + seq.n_tokens));
    tiles += tiles_of(seq);
    max_span = std::max(max_span, seq.pos0 + seq.n_tokens);
  }
  // An item's scores (heads × rows × span floats) stay within a budget: a long prompt's tiles
  // share their keys among 16 rows already, so they take fewer heads rather than more memory.
  const size_t score_budget = size_t{1} << 20;  // floats per thread
  size_t heads_per_item = group;
  while (heads_per_item > max_heads_per_item ||
         (heads_per_item % 2 == 0 && tiles * shape.n_heads / heads_per_item < 2 * static_cast<size_t>(pool.size())) ||
         (heads_per_item > 1 && heads_per_item * rows_per_tile * max_span > score_budget)) {
    heads_per_item = heads_per_item % 2 == 0 ? heads_per_item / 2 : 1;
  }
  const size_t parts = shape.n_heads / heads_per_item;  // items per tile
  std::vector<size_t> first_item;
  first_item.reserve(seqs.size() + 1);
  size_t items = 0;
  for (const auto& seq : seqs) {
    first_item.push_back(items);
    items += tiles_of(seq) * parts;
  }
  first_item.push_back(items);
  std::atomic<size_t> next{0};
  pool.run([&](int, int) {
    thread_local std::vector<float> scores, scratch;  // kept between calls: no allocation per layer
    size_t s = 0;
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < items; i = next.fetch_add(1, std::memory_order_relaxed)) {
      while (i >= first_item[s + 1]) ++s;
      const auto& seq = seqs[s];
      const size_t local = i - first_item[s], tile = local / parts, h0 = local % parts * heads_per_item;
      const size_t r0 = tile * rows_per_tile, r1 = std::min(seq.n_tokens, r0 + rows_per_tile);
      attend_tile(cache, shape, seq, r0, r1, h0, heads_per_item, scores, scratch);
    }
  });
  return ok_status();
}

}  // namespace llmesh::kernels
