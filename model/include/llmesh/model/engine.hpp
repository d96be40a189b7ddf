// The engine: a model's tensor-parallel group of shard executors in one process, the
// in-process communicator between them, and a simple paged KV block allocator.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/communicator.hpp"
#include "llmesh/kernels/device_communicator.hpp"
#include "llmesh/kernels/dtype.hpp"
#include "llmesh/kernels/thread_pool.hpp"
#include "llmesh/model/shard_executor.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model {

/// Where the shards run. `automatic`: CUDA when a device is present, else the CPU (one log line).
enum class backend { cpu, cuda, automatic };

/// Parses "cpu", "cuda" or "auto".
[[nodiscard]] result<backend> parse_backend(const std::string& name);

struct engine_options {
  int tp = 1;                 ///< tensor-parallel ranks (executors) in this process
  bool expert_parallel = false;  ///< vLLM's --enable-expert-parallel: an MoE model's ranks run whole experts (shard_layout)
  int threads = 0;            ///< kernel threads in all; 0 = one per hardware thread
  size_t kv_tokens = 0;       ///< KV cache capacity in positions; 0 = min(max positions, 8192)
  size_t block_size = 16;
  kernels::dtype kv_type = kernels::dtype::f32;  ///< the KV cache's elements: f32; bf16, f8_e4m3 or f8_e5m2 (CPU only)
  backend device = backend::cpu;
  bool deterministic = false;  ///< CUDA: batch-invariant projections at every batch size
  bool cuda_graphs = true;     ///< CUDA: replay decode steps from captured graphs
};

/// Where an engine of `m` under `opt` runs, and (automatic, on the CPU in a CUDA build) the
/// one-line reason why not on a GPU.
struct backend_choice {
  backend device = backend::cpu;
  std::string note;
};
/// opt.device, or for automatic the CUDA backend when at least opt.tp devices are found and
/// the model runs there (no int8 weights, LoRA adapters, bfloat16 or fp8 KV cache or CPU-only
/// family), else the CPU. unsupported: CUDA asked for what runs on the CPU only.
[[nodiscard]] result<backend_choice> choose_backend(const model& m, const engine_options& opt);

/// vLLM's --gpu-memory-utilization on the CUDA backend: the KV cache budget per shard, in MiB,
/// when `replicas` replicas of `tp` ranks share devices of `device_bytes` each (rank r of every
/// replica runs on device r) and together may take `utilization` (0..1] of each: that share,
/// less each shard's weights (the whole embedding, `embed_bytes`, and a tp-th of the rest of
/// `weight_bytes`, which counts a tied head once) and working memory (activations of
/// `max_batch_tokens` tokens, the logits, 512 MiB for the CUDA context, cuBLAS and graphs),
/// split over the replicas. invalid_request when nothing is left for the KV cache.
[[nodiscard]] result<size_t> kv_mb_for_gpu_memory(const model_config& c, size_t device_bytes, double utilization,
                                                  size_t weight_bytes, size_t embed_bytes, int tp, int replicas,
                                                  size_t max_batch_tokens);

/// vLLM's --kv-cache-dtype: "auto" and "float32" (this server's reference precision), "bfloat16"
/// (half the bytes per position), "fp8" / "fp8_e4m3" and "fp8_e5m2" (a quarter; the checkpoint's
/// KV scales or 1; CPU backend). vLLM's other fp8 kinds (fp8_inc, fp8_ds_mla) are refused by name.
[[nodiscard]] result<kernels::dtype> parse_kv_cache_dtype(std::string_view s);
/// "float32", "bfloat16", "fp8_e4m3" or "fp8_e5m2".
std::string_view kv_cache_dtype_name(kernels::dtype t);

/// Part of a step for one sequence: tokens to append, and whether to return the logits of
/// the last one.
struct step_item {
  int seq = 0;
  std::span<const int32_t> tokens;
  bool want_logits = true;
  int32_t lora = -1;  ///< step_sequence::lora
};

/// Thread affinity: one caller at a time. The caller's thread is rank 0; ranks 1..tp-1 run on
/// threads of the engine. Kernel threads: `threads` split evenly over the ranks, so the
/// process never runs more kernel threads than asked for.
/// Failure: if one rank fails mid-step, the group is aborted (no rank waits forever) and the
/// engine refuses further steps: a tensor-parallel group fails as a unit.
class engine {
 public:
  [[nodiscard]] static result<std::unique_ptr<engine>> create(std::shared_ptr<const model> m, engine_options opt);
  /// Part of a tensor-parallel group whose other ranks run elsewhere (other processes): this
  /// engine holds the ranks of `comms` (each communicator's rank() of opt.tp; its size() must
  /// be opt.tp) and only their slices of the weights and the KV cache. Only forward_rank()
  /// runs on such an engine (the ranks meet their peers through `comms`). CPU only.
  [[nodiscard]] static result<std::unique_ptr<engine>> create_part(std::shared_ptr<const model> m, engine_options opt,
                                                                    std::vector<std::unique_ptr<kernels::communicator>> comms);
  ~engine();

  /// Starts an empty sequence and returns its id.
  int open_sequence();
  /// Frees a sequence's KV blocks. Unknown ids are ignored.
  void close_sequence(int seq);
  /// Tokens stored for a sequence so far (0 for unknown ids).
  size_t sequence_length(int seq) const;

  /// Runs one forward step over all items: appends their tokens to their sequences and writes
  /// [n_want][vocab] logits. Checks ids, lengths and KV capacity first; on such errors nothing
  /// is changed.
  [[nodiscard]] status step(std::span<const step_item> items, std::vector<float>& logits);

  /// As step(), but draws the token of each wanted row instead of returning its logits: rows
  /// holds one kernels::sample_row per item with want_logits, in order (on a GPU, only the ids
  /// leave the device). With `logprobs`: the rows' logprobs as kernels::logprobs_rows gives
  /// them (empty when no row asks).
  [[nodiscard]] status step_sample(std::span<const step_item> items, std::span<const kernels::sample_row> rows,
                                   std::vector<int32_t>& tokens, kernels::row_logprobs* logprobs = nullptr);
  /// step_sample() with greedy rows.
  [[nodiscard]] status step_greedy(std::span<const step_item> items, std::vector<int32_t>& tokens);

  /// Runs one step over sequences whose KV blocks the caller manages (a replica's block
  /// manager, ids in [0, kv_blocks())): checks ids, lengths and tables, then runs every rank.
  /// An engine is driven either this way or through open_sequence/step, never both.
  [[nodiscard]] status forward(std::span<const step_sequence> batch, std::vector<float>& logits);
  /// As forward(), drawing one token per wanted row (rows as in step_sample); with `logprobs`,
  /// the rows' and the scored positions' log-probabilities (step_sequence::prompt_logprobs).
  [[nodiscard]] status forward_sample(std::span<const step_sequence> batch, std::span<const kernels::sample_row> rows,
                                      std::vector<int32_t>& tokens, step_logprobs* logprobs = nullptr);
  /// `batch`, or a copy in `copy` whose sequences naming an adapter by id alone point at it,
  /// held in `pins` for the step (so every rank runs the same adapters even if one is removed
  /// meanwhile); invalid_request when an id names none.
  result<std::span<const step_sequence>> pin_adapters(std::span<const step_sequence> batch, std::vector<step_sequence>& copy,
                                                      std::vector<std::shared_ptr<const lora_adapter>>& pins) const;
  /// The checks forward() makes before running the ranks (ids, lengths, block tables, a failed group).
  [[nodiscard]] status check_batch(std::span<const step_sequence> batch) const;
  /// Rank `rank`'s part of forward(), for callers that run the ranks themselves (the shard
  /// actors): every rank must be called with the same batch, each from its own thread, at
  /// the same time (they meet in collectives); rank 0's `logits` receive the result. The
  /// caller checks the batch first (check_batch) and merges the statuses. A failing rank
  /// aborts its communicator (its peers fail instead of waiting) and marks the group failed.
  [[nodiscard]] status forward_rank(int rank, std::span<const step_sequence> batch, std::vector<float>& logits);
  /// As forward_rank(), drawing the rows' tokens: rank 0's `tokens` receive one per row (the
  /// other ranks' stay empty), and its `logprobs` (if given) the rows' logprobs and the scored
  /// positions' (step_sequence::prompt_logprobs). Every rank must get the same rows.
  [[nodiscard]] status forward_rank_sample(int rank, std::span<const step_sequence> batch,
                                           std::span<const kernels::sample_row> rows, std::vector<int32_t>& tokens,
                                           step_logprobs* logprobs = nullptr);
  /// Marks the group failed and aborts this engine's collectives (a peer rank must not wait
  /// for a step this engine will not run).
  void abort();
  size_t kv_blocks() const { return kv_.n_blocks; }
  kernels::dtype kv_type() const { return kv_.type; }
  size_t kv_block_size() const { return kv_.block_size; }

  /// The backend the shards run on ("cpu" or "cuda").
  const char* backend_name() const { return on_cuda_ ? "cuda" : "cpu"; }
  /// Whether a position's logits are the same whatever shares its step and however its
  /// sequence is chunked: always on the CPU, on CUDA with `deterministic`. Speculative
  /// decoding relies on it to give exactly the tokens a plain decode would.
  bool batch_invariant() const { return !on_cuda_ || opt_.deterministic; }
  /// Why `auto` chose the CPU on a CUDA build ("" otherwise): for the caller's log line.
  const std::string& device_note() const { return device_note_; }

  const model_config& config() const { return model_->config(); }
  const model& loaded_model() const { return *model_; }
  /// model::classify on the first local rank's thread pool (the CPU backend's; CUDA's runs on
  /// the caller's thread). Between steps only: the pool is the step's.
  std::vector<float> classify(std::span<const float> rows) const {
    return model_->classify(rows, pools_.empty() ? nullptr : pools_.front().get());
  }
  const std::shared_ptr<const model>& shared_model() const { return model_; }
  int tp() const { return opt_.tp; }
  /// The ranks this engine runs (all of 0..tp-1, unless made by create_part).
  const std::vector<int>& local_ranks() const { return local_; }
  int threads() const { return opt_.threads; }
  size_t free_blocks() const { return free_blocks_.size(); }

  /// KV transfer (disaggregated prefill: a prefill replica's blocks become a decode replica's):
  /// bytes one block takes in the transfer layout (step_executor::kv_copy_out; every rank's
  /// heads, so engines of any tp that run the same model and KV dtype agree).
  size_t kv_block_bytes() const;
  /// The contents of KV blocks `blocks` (ids as forward() takes them), each kv_block_bytes().
  /// Between steps only. unsupported on CUDA and on an engine holding part of its group.
  [[nodiscard]] result<std::vector<std::byte>> export_kv(std::span<const int32_t> blocks) const;
  /// Writes export_kv's bytes (blocks × kv_block_bytes()) into blocks `blocks` of every rank.
  /// Between steps only; on a refusal nothing is written.
  [[nodiscard]] status import_kv(std::span<const int32_t> blocks, std::span<const std::byte> data);

 private:
  struct sequence {
    std::vector<int32_t> blocks;
    size_t length = 0;
  };
  engine(std::shared_ptr<const model> m, engine_options opt);
  [[nodiscard]] status create_cuda_shards(const std::vector<shard_layout>& layouts);
  /// Validates and allocates, then runs `fn(rank, batch)` on every rank (the map) and merges.
  template <class Fn>
  [[nodiscard]] status run_step(std::span<const step_item> items, Fn fn);
  /// Runs `fn(rank, batch, scratch)` on every rank (the map) and merges their statuses.
  template <class Fn>
  [[nodiscard]] status run_ranks(std::span<const step_sequence> batch, Fn fn);

  /// Runs `fn(executor)` as rank `rank`; a failure (or exception) aborts the rank's collectives.
  template <class Fn>
  [[nodiscard]] status guarded_rank(int rank, Fn fn);

  /// Index into shards_, comms_ and pools_ of `rank`, or -1 when it runs elsewhere.
  int index_of(int rank) const;
  [[nodiscard]] status all_local(const char* what) const;

  std::shared_ptr<const model> model_;
  engine_options opt_;
  std::vector<int> local_;  ///< ranks held here, ascending
  kv_cache_config kv_;
  std::vector<std::unique_ptr<kernels::communicator>> comms_;
  std::vector<std::unique_ptr<kernels::thread_pool>> pools_;  ///< one per rank
  std::unique_ptr<kernels::thread_pool> ranks_;               ///< runs the ranks (tp > 1)
  std::vector<std::unique_ptr<kernels::device_communicator>> device_comms_;
  std::vector<std::unique_ptr<step_executor>> shards_;
  std::vector<int32_t> free_blocks_;
  std::map<int, sequence> seqs_;
  int next_seq_ = 0;
  std::atomic<bool> failed_{false};
  bool on_cuda_ = false;
  std::string device_note_;
};

}  // namespace llmesh::model
