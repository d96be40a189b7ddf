// The shard actor (CAF): one rank of a replica's tensor-parallel group, a thin shell over
// engine::forward_rank. Each step its replica sends every shard the same step message (the
// fan-out); the shards run their slices of the model together, meeting in the engine's
// collectives, and each answers with its status; rank 0 also samples the step's rows and
// answers with the tokens. The replica merges: the step succeeded only if every shard did.
// Spawned detached and linked to its replica: a step holds the shard's thread (it is thread 0
// of its rank's kernel pool), and a shard's death is its replica's (the group fails as a unit).
#pragma once

#include <caf/all.hpp>

#include "llmesh/actors/replica_core.hpp"

namespace llmesh::actors {

using shard_step_atom = caf::atom_constant<caf::atom("shardstep")>;

/// One step for every shard. In-process it points into the replica's state, which stays put
/// until every shard has answered (the replica takes no submit or cancel in between).
struct shard_step {
  uint64_t step = 0;
  std::span<const model::step_sequence> batch;
  std::span<const sample_row> rows;  ///< rank 0 samples these rows of its logits
};

struct shard_result {
  uint64_t step = 0;
  int rank = 0;
  bool ok = true;
  error err;                     ///< when !ok
  std::vector<int32_t> sampled;  ///< rank 0: one token per row
};

struct shard_state {
  std::vector<float> logits;
  static inline const char* name = "shard";
};

/// `(shard_step_atom, shard_step)` → shard_result. Borrows the engine (whose rank it runs).
caf::behavior shard_actor(caf::stateful_actor<shard_state>* self, model::engine* eng, int rank);

}  // namespace llmesh::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::actors::shard_step)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmesh::actors::shard_result)
