// The replica's work loop as a plain class: requests in, one engine step per call, tokens out.
// It joins the batch scheduler (what runs), the block manager (where its KV lives, with
// prefix caching) and the engine (the tensor-parallel group), and samples each finished row
// with the request's own (seed, position) RNG — so a request's tokens are the ones
// model::generate would produce alone, whatever else shares its steps (the kernels are
// batch- and chunk-invariant). The replica actor will be a thin shell over this.
#pragma once

#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "llmesh/actors/batch_scheduler.hpp"
#include "llmesh/actors/block_manager.hpp"
#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/engine.hpp"

namespace llmesh::actors {

struct replica_request {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  size_t max_tokens = 16;
  kernels::sampling_params sampling;  ///< seed included (the gateway picks one if absent)
  std::vector<int32_t> eos_ids;       ///< generation ends after any of these
};

/// Thread affinity: one thread (the replica actor's). Ownership: borrows the engine, which it
/// drives through engine::forward with its own block tables.
class replica_core {
 public:
  replica_core(model::engine& eng, scheduler_config cfg, bool prefix_caching = true);

  /// Queues a request. Refuses empty prompts, max_tokens 0, duplicate ids, and prompts that
  /// cannot fit the model's context or the KV cache even alone.
  [[nodiscard]] status submit(replica_request r);
  /// Drops a request (a client went away); its blocks are free for the next step.
  bool cancel(uint64_t id);

  /// Runs one step. Returns the new tokens (with finish reasons); empty when nothing is
  /// queued. An engine failure is returned as is: the replica is then dead.
  [[nodiscard]] result<std::vector<token_event>> step();

  bool idle() const { return sched_.waiting() + sched_.running() == 0; }
  size_t waiting() const { return sched_.waiting(); }
  size_t running() const { return sched_.running(); }
  const block_manager& blocks() const { return blocks_; }
  const batch_scheduler& scheduler() const { return sched_; }

 private:
  model::engine& eng_;
  block_manager blocks_;
  batch_scheduler sched_;
  std::unordered_map<uint64_t, kernels::sampling_params> sampling_;
  std::vector<model::step_sequence> batch_;
  std::vector<float> logits_;
};

}  // namespace llmesh::actors
