// The model's kernels on a CUDA device: one entry point per op taking an args struct (or plain
// device pointers) and a stream, returning the launch status. Defined only in CUDA builds, in
// `<op>/<op>_cuda.cu` beside each CPU version; tests/gpu holds a parity test per op against the
// CPU oracle. Activations and the KV cache are float32, as on the CPU; weights stay in their
// stored dtype. All .cu files build with --fmad=false, so an expression rounds exactly as
// written (fused multiply-adds only where a kernel asks for them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/cuda_runtime.hpp"
#include "llmesh/kernels/dtype.hpp"

namespace llmesh::kernels::cuda {

/// out[t][:] = table[ids[t]][:] as float32, for t < n. REQUIRES: ids < rows of table.
[[nodiscard]] status embed(const void* table, dtype type, size_t hidden, const int32_t* ids, size_t n, float* out,
                           stream_t s);

/// out[r] = rmsnorm(x[r]) * w for rows r < rows of n floats (HF LlamaRMSNorm). out may alias x.
[[nodiscard]] status rmsnorm(const float* x, const float* w, float* out, size_t rows, size_t n, float eps,
                             stream_t s);

/// The residual add fused with the next norm: h[r] += delta[r]; out[r] = rmsnorm(h[r]) * w.
[[nodiscard]] status add_rmsnorm(float* h, const float* delta, const float* w, float* out, size_t rows, size_t n,
                                 float eps, stream_t s);

/// out[i][:] = x[rows[i]][:] for i < n_rows, rows of n floats with leading dimension ld.
[[nodiscard]] status gather_rows(const float* x, size_t ld, const int32_t* rows, size_t n_rows, size_t n, float* out,
                                 stream_t s);

/// out[i] = silu(gate[i]) * up[i] (exp as kernels::exp_det). out may alias gate.
[[nodiscard]] status swiglu(const float* gate, const float* up, float* out, size_t n, stream_t s);

/// Rotary embedding of q [T][n_heads][hd] and k [T][n_kv_heads][hd] in place over each head's
/// first rotary_dim entries (0: all of it) for the token at pos[t] (cos/sin tables
/// [positions][rotary_dim/2], as kernels::rope_angles fills them), then the
/// token's k and v written to cache slot slot[t] ([slot][n_kv_heads][hd]). Tokens with
/// slot[t] < 0 (batch padding) are left alone. rotate false (SmolLM3's NoPE layers): q and k
/// are left as they are, k and v written. q_scale ([positions], Ministral 3's query
/// temperature): the rotated q times q_scale[pos[t]]; null: none.
struct rope_kv_args {
  float* q = nullptr;
  float* k = nullptr;
  const float* v = nullptr;
  size_t n_tokens = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  size_t rotary_dim = 0;
  bool rotate = true;
  const float* q_scale = nullptr;
  const int32_t* pos = nullptr;
  const int32_t* slot = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  float* k_cache = nullptr;
  float* v_cache = nullptr;
};
[[nodiscard]] status rope_kv(const rope_kv_args& a, stream_t s);

/// Attention's fixed structure, the same for every row wherever it sits: keys are taken in
/// 32-key tiles at absolute positions; a tile's softmax state (max, sum, Σp·v) is folded into
/// its partition's state in order, and 128-position partitions are folded into the row's state
/// in order, with one fold function. So a row's numbers depend on its position and sequence
/// alone — never on the batch, the tiling of the step, or how the prompt was chunked.
inline constexpr size_t attention_partition = 128;
/// Query rows per tile: a multi-row tile's rows share the K/V tiles staged in shared memory
/// and walk all partitions in one block; a one-row tile (decode) gets one block per partition
/// (4 warps = 4 key tiles in parallel) and a merge kernel.
inline constexpr size_t attention_tile_rows = 16;

/// Causal GQA attention over the paged cache for T query rows grouped in tiles of consecutive
/// tokens of one sequence. Row t sees positions max(0, pos[t] - window + 1) .. pos[t] of its
/// sequence, whose block table starts at block_tables[bt_offset[t]].
struct attention_args {
  const float* q = nullptr;  ///< [T][n_heads][hd]
  float* out = nullptr;      ///< [T][n_heads][hd]
  const float* k_cache = nullptr;
  const float* v_cache = nullptr;  ///< [slot][n_kv_heads][hd]
  const int32_t* pos = nullptr;        ///< [T]; < 0 for padding
  const int32_t* bt_offset = nullptr;  ///< [T]
  const int32_t* block_tables = nullptr;
  const int32_t* tile_token0 = nullptr;   ///< [n_tiles]
  const int32_t* tile_rows = nullptr;     ///< [n_tiles]; 0 for padding
  const int32_t* tile_partial = nullptr;  ///< [n_tiles]: one-row tiles' slot in `partials`, else -1
  size_t n_tiles = 0, n_tokens = 0;
  size_t n_heads = 0, n_kv_heads = 0, head_dim = 0, block_size = 16, sliding_window = 0;
  float scale = 1.0f;
  size_t max_partitions = 1;  ///< ≥ partitions of any one-row tile's row in this call
  float* partials = nullptr;  ///< [partial slots][n_heads][max_partitions][hd + 2]
};
[[nodiscard]] status attention(const attention_args& a, stream_t s);
/// Floats of scratch attention() needs for `partials` (0 when no row spans two partitions).
size_t attention_partials_floats(size_t partial_slots, size_t n_heads, size_t head_dim, size_t max_partitions);

/// One projection y[i][j] = dot(x[i], w[j]) (+ bias[j]) for i < m, j < n over k; weights in
/// HF [out, in] layout with leading dimension ldw (a tensor-parallel slice is used in place).
struct dense_job {
  const float* x = nullptr;
  size_t ldx = 0;
  const void* w = nullptr;
  size_t ldw = 0;
  dtype w_type = dtype::bf16;
  const float* bias = nullptr;
  float* y = nullptr;
  size_t ldy = 0;
  size_t n = 0, k = 0;
};

/// Up to 4 projections of the same m (e.g. q, k, v) in one launch, on CUDA cores with float32
/// activations. Reduction order of every element: lane l of a warp sums k in 8-element chunks
/// l, l+32, l+64, ... with fused multiply-adds in increasing k, then a fixed xor-butterfly
/// across the warp; it depends on k alone, so results are batch-invariant. Memory-bound at
/// small m (decode); m > 8 re-reads the weights once per 8 rows.
[[nodiscard]] status dense(std::span<const dense_job> jobs, size_t m, stream_t s);

/// cuBLASLt GEMMs: BF16/F16 operands (activations rounded to the weights' type), float32
/// accumulation and output; the fast path for prefill and large decode batches. Its reduction
/// order is cuBLAS's choice and may change with m: not batch-invariant.
/// Thread affinity: one thread at a time; owns its handle and workspace.
class blas {
 public:
  [[nodiscard]] static result<std::unique_ptr<blas>> create();
  ~blas();
  /// y = x · wᵀ (+ bias) for m rows; `scratch` holds ≥ m·k 16-bit values.
  /// REQUIRES: w_type is bf16 or f16.
  [[nodiscard]] status gemm(const dense_job& job, size_t m, void* scratch, stream_t s);
  /// The GEMM alone, on activations already in the weights' 16-bit type (x16 [m][k]; job.x
  /// unused): what benchmarks measure as "a cuBLAS GEMM".
  [[nodiscard]] status gemm_16bit(const dense_job& job, size_t m, const void* x16, stream_t s);

 private:
  blas() = default;
  struct state;
  std::unique_ptr<state> st_;
};

/// out[i][c] = x[i][c] rounded to `type` (bf16 or f16, nearest-even) for i < m, c < k: the
/// activations of blas::gemm_16bit, converted once for several projections of the same x.
[[nodiscard]] status to_16bit(const float* x, size_t ldx, size_t m, size_t k, dtype type, void* out, stream_t s);

/// out[r] = index of the largest of logits[r][0..vocab) (lowest index on ties, as kernels::argmax).
[[nodiscard]] status argmax(const float* logits, size_t rows, size_t vocab, int32_t* out, stream_t s);

/// One row's draw on the device: kernels::sample_row, flattened.
struct device_sample_row {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  uint64_t position = 0;
};

/// out[r] = kernels::sample(logits[r][0..vocab), args[r]): the CPU's token, bit for bit (the
/// same integer masses). args: `rows` entries in device memory.
[[nodiscard]] status sample(const float* logits, size_t rows, size_t vocab, const device_sample_row* args, int32_t* out,
                            stream_t s);

/// One change to a row's logits before its draw (kernels::apply_adjust, flattened).
struct device_adjust {
  uint32_t row = 0;
  int32_t id = 0;
  int32_t count = 0;      ///< a seen token's count in the output
  uint32_t kind = 0;      ///< 0: a seen token's penalties; 1: a ban (-inf); 2: add `presence` (a bias)
  float presence = 0.0f, frequency = 0.0f, repetition = 1.0f;
  uint32_t reserved = 0;
};

/// logits[e.row][e.id] changed as kernels::apply_adjust changes it, for each of the n entries
/// (device memory; each (row, id) at most once per call: launch the biases, then the
/// penalties, then the bans).
[[nodiscard]] status adjust_logits(float* logits, size_t vocab, const device_adjust* entries, size_t n, stream_t s);

/// Structured outputs' masks: for each i < n_masks, logits[rows[i]][id] = -inf for every id
/// whose bit (bit id % 32 of word id / 32) is clear in masks[i * words ..] (words =
/// mask_words(vocab)), as kernels::apply_adjust's `allowed` does. Device memory; launch it after
/// the bans (-inf stays -inf either way).
[[nodiscard]] status mask_logits(float* logits, size_t vocab, const uint32_t* masks, const uint32_t* rows, size_t n_masks,
                                 stream_t s);
inline size_t mask_words(size_t vocab) { return (vocab + 31) / 32; }

/// Fills n elements of type `type` with uniform values in [-scale, scale) from (seed, index)
/// (for benchmarks: random weights straight on the device).
[[nodiscard]] status fill_random(void* dst, dtype type, size_t n, float scale, uint64_t seed, stream_t s);

}  // namespace llmesh::kernels::cuda
