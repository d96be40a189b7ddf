// The shard actor (CAF): one rank of a replica's tensor-parallel group, a thin shell over
// engine::forward_rank. Each step its replica sends every shard the same step message (the
// fan-out); the shards run their slices of the model together, meeting in the engine's
// collectives, and each answers with its status; rank 0 also samples the step's rows and
// answers with the tokens. The replica merges: the step succeeded only if every shard did.
// Spawned detached and linked to its replica: a step holds the shard's thread (it is thread 0
// of its rank's kernel pool), and a shard's death is its replica's (the group fails as a unit).
#pragma once

#include <caf/all.hpp>
#include <memory>

#include "llmesh/actors/replica_core.hpp"

namespace llmesh::actors {

using shard_step_atom = caf::atom_constant<caf::atom("shardstep")>;

/// One step's data, owned: every shard reads it, and it outlives the replica if the replica is
/// stopped while its shards are mid-step (they finish reading, then stop).
struct step_data {
  std::vector<int32_t> tokens, tables;          ///< the sequences' tokens and block tables, packed
  std::vector<model::step_sequence> batch;      ///< spans into tokens and tables
  /// The LoRA adapters the batch points at, held while the step data lives (a replica stopped
  /// mid-step, and with it its requests' pins, leaves them to the shards still reading).
  std::vector<std::shared_ptr<const model::lora_adapter>> adapters;
  std::vector<sample_row> rows;                 ///< one per sequence with want_logits; rank 0 draws them
  /// Copies a planned step.
  static std::shared_ptr<const step_data> copy(std::span<const model::step_sequence> batch,
                                               std::span<const sample_row> rows);
};

/// One step for every shard.
struct shard_step {
  uint64_t step = 0;
  std::shared_ptr<const step_data> data;
};

struct shard_result {
  uint64_t step = 0;
  int rank = 0;
  bool ok = true;
  error err;                     ///< when !ok
  std::vector<int32_t> sampled;  ///< rank 0: one token per row
  model::step_logprobs logprobs;  ///< rank 0: the rows' and the scored positions' logprobs
};

struct shard_state {
  std::vector<int32_t> tokens;
  static inline const char* name = "shard";
};

/// `(shard_step_atom, shard_step)` → shard_result. Borrows the engine (whose rank it runs).
caf::behavior shard_actor(caf::stateful_actor<shard_state>* self, model::engine* eng, int rank);

/// A shard whose replica is in another process: as shard_actor, but it checks every step first
/// (the batch came over the network), and a step it refuses aborts the group, so that the
/// peer ranks, already in the step, fail instead of waiting for this one.
caf::behavior remote_shard_actor(caf::stateful_actor<shard_state>* self, model::engine* eng, int rank);

}  // namespace llmesh::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::actors::shard_step)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::actors::shard_result)
