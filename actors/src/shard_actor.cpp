// The shard actor (shard_actor.hpp): a step in, engine::forward_rank, a result out.
#include "llmesh/actors/shard_actor.hpp"

namespace llmesh::actors {

caf::behavior shard_actor(caf::stateful_actor<shard_state>* self, model::engine* eng, int rank) {
  return {
      [=](shard_step_atom, const shard_step& s) -> shard_result {
        auto& logits = self->state.logits;
        if (auto st = eng->forward_rank(rank, s.batch, logits); !st) return shard_result{s.step, rank, false, st.err(), {}};
        if (rank != 0) return shard_result{s.step, rank, true, {}, {}};
        return shard_result{s.step, rank, true, {}, sample_rows(logits, eng->config().vocab, s.rows)};
      },
  };
}

}  // namespace llmesh::actors
