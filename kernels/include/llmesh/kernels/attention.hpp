// Causal grouped-query attention over a paged KV cache, and the cache writes it reads.
//
// KV layout (one layer of one shard): blocks of `block_size` positions; a block holds
// [block_size][n_kv_heads][head_dim] keys, and the same for values in a second array, as
// float32, bfloat16 or an 8-bit float (`--kv-cache-dtype`: a half or a quarter of the bytes, so
// two or four times the positions in the same memory; such a cache holds each key and value
// rounded to nearest even — an 8-bit float saturating at its largest finite value; an 8-bit
// cache holds x / scale with the layer's key or value scale, vLLM's k_scale / v_scale from the
// checkpoint or 1 — and attention reads them widened exactly, times the scale, so its numbers
// are those of float32 attention over the rounded values).
// A sequence's block table maps its position p to block block_table[p / block_size].
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/cpu_features.hpp"
#include "llmesh/kernels/dtype.hpp"
#include "llmesh/kernels/thread_pool.hpp"

namespace llmesh::kernels {

/// Shape shared by every sequence of one attention call.
struct attention_shape {
  size_t n_heads = 0;     ///< query heads on this shard
  size_t n_kv_heads = 0;  ///< kv heads on this shard; n_heads % n_kv_heads == 0
  size_t head_dim = 0;
  size_t block_size = 16;
  size_t sliding_window = 0;  ///< 0: none; else position i sees keys j with i - window < j <= i
  float scale = 1.0f;         ///< usually 1/sqrt(head_dim)
  float softcap = 0.0f;       ///< > 0: each scaled score s becomes softcap · tanh(s / softcap) (Gemma 2)
  /// [n_heads]: each query head's sink logit (GPT-OSS), which joins every row's softmax — in its
  /// max and, last, its sum — and carries no value (a row may attend to nothing); null: none.
  const float* sinks = nullptr;
};

/// One layer's cache of one shard: keys and values, each [n_blocks][block_size][n_kv_heads][head_dim]
/// elements of `type`.
struct kv_layer_view {
  void* keys = nullptr;
  void* values = nullptr;
  size_t n_blocks = 0;
  dtype type = dtype::f32;  ///< f32, bf16, f8_e4m3 or f8_e5m2 (vLLM's fp8 caches)
  /// An 8-bit cache's scales (vLLM's per-layer k_scale and v_scale): a key x is stored as
  /// f8(x / k_scale) and read as f8 · k_scale, in float32; finite and positive. Must be 1 for
  /// f32 and bf16 caches.
  float k_scale = 1.0f, v_scale = 1.0f;
};

/// One sequence's slice of an attention call: `n_tokens` consecutive query rows at positions
/// pos0 .. pos0 + n_tokens - 1, whose keys and values are already in the cache.
struct attention_seq {
  const float* q = nullptr;  ///< [n_tokens][n_heads][head_dim]
  float* out = nullptr;      ///< [n_tokens][n_heads][head_dim]
  size_t pos0 = 0;
  size_t n_tokens = 0;
  std::span<const int32_t> block_table;  ///< covers positions 0 .. pos0 + n_tokens - 1
};

/// n rows of `width` 8-bit float cache elements of type t (f8_e4m3 or f8_e5m2), `stride`
/// elements apart, widened exactly into n contiguous float rows at dst with the code of
/// instruction set `level` (every level gives dtype.hpp's f8_to_f32 bits): what attention reads
/// from an fp8 cache.
void widen_kv_rows(dtype t, const void* src, size_t stride, size_t n, size_t width, float* dst, isa level);

/// Writes keys/values [n_tokens][n_kv_heads][head_dim] at positions pos0.. into the cache.
[[nodiscard]] status kv_write(const kv_layer_view& cache, const attention_shape& shape,
                              std::span<const int32_t> block_table, size_t pos0, size_t n_tokens,
                              const float* k, const float* v);

/// For every query row: softmax(scale · q·K, soft-capped when configured) · V over its visible positions, keys in
/// increasing position order (fixed order: results never depend on batch neighbours or on how
/// the prompt was chunked). Work is split over (row, head) pairs across the pool.
[[nodiscard]] status attention(const kv_layer_view& cache, const attention_shape& shape,
                               std::span<const attention_seq> seqs, thread_pool& pool);

}  // namespace llmesh::kernels
