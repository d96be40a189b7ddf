// The shard actor (shard_actor.hpp): a step in, engine::forward_rank_sample, a result out.
#include "llmesh/actors/shard_actor.hpp"

namespace llmesh::actors {

std::shared_ptr<const step_data> step_data::copy(std::span<const model::step_sequence> batch,
                                                 std::span<const sample_row> rows) {
  auto d = std::make_shared<step_data>();
  size_t n_tokens = 0, n_tables = 0;
  for (const auto& s : batch) n_tokens += s.tokens.size(), n_tables += s.block_table.size();
  d->tokens.reserve(n_tokens);
  d->tables.reserve(n_tables);
  for (const auto& s : batch) {  // reserved: the spans below stay valid
    const size_t t0 = d->tokens.size(), b0 = d->tables.size();
    d->tokens.insert(d->tokens.end(), s.tokens.begin(), s.tokens.end());
    d->tables.insert(d->tables.end(), s.block_table.begin(), s.block_table.end());
    d->batch.push_back({std::span<const int32_t>(d->tokens.data() + t0, s.tokens.size()), s.pos0,
                        std::span<const int32_t>(d->tables.data() + b0, s.block_table.size()), s.want_logits,
                        s.prompt_logprobs, s.next, s.draws, s.hidden, s.lora, s.adapter});
    if (s.adapter) d->adapters.push_back(s.adapter->shared_from_this());
  }
  d->rows.assign(rows.begin(), rows.end());
  return d;
}

caf::behavior shard_actor(caf::stateful_actor<shard_state>* /*self*/, model::engine* eng, int rank) {
  return {
      [=](shard_step_atom, const shard_step& s) -> shard_result {
        const auto& d = *s.data;
        std::vector<int32_t> tokens;
        model::step_logprobs logprobs;
        if (auto st = eng->forward_rank_sample(rank, d.batch, d.rows, tokens, &logprobs); !st) {
          return shard_result{s.step, rank, false, st.err(), {}, {}};
        }
        return shard_result{s.step, rank, true, {}, std::move(tokens), std::move(logprobs)};  // rank 0's; others' empty
      },
  };
}

caf::behavior remote_shard_actor(caf::stateful_actor<shard_state>* self, model::engine* eng, int rank) {
  return {
      [=](shard_step_atom, const shard_step& s) -> shard_result {
        if (auto ok = eng->check_batch(s.data->batch); !ok) {
          eng->abort();
          return shard_result{s.step, rank, false, ok.err(), {}, {}};
        }
        auto st = eng->forward_rank_sample(rank, s.data->batch, s.data->rows, self->state.tokens);
        return shard_result{s.step, rank, static_cast<bool>(st), st ? error{} : st.err(), {}, {}};
      },
  };
}

}  // namespace llmesh::actors
