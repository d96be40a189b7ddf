// The replica's work loop (replica_core.hpp): schedule → engine::forward → sample → complete.
#include "llmesh/actors/replica_core.hpp"

#include <string>

namespace llmesh::actors {

replica_core::replica_core(model::engine& eng, scheduler_config cfg, bool prefix_caching)
    : eng_(eng), blocks_(eng.kv_blocks(), eng.kv_block_size(), prefix_caching), sched_(cfg, blocks_) {}

status replica_core::submit(replica_request r) {
  const auto& c = eng_.config();
  const size_t longest = r.prompt.size() + r.max_tokens;
  if (longest > c.max_positions) {
    return make_error(errc::invalid_request, "prompt of " + std::to_string(r.prompt.size()) + " tokens plus max_tokens " +
                                                 std::to_string(r.max_tokens) + " exceeds the model's context of " +
                                                 std::to_string(c.max_positions));
  }
  if ((longest + eng_.kv_block_size() - 1) / eng_.kv_block_size() > blocks_.total_blocks()) {
    return make_error(errc::invalid_request, "request needs more KV cache than this replica has");
  }
  for (int32_t t : r.prompt) {
    if (t < 0 || static_cast<size_t>(t) >= c.vocab) {
      return make_error(errc::invalid_request, "token id " + std::to_string(t) + " is outside the vocabulary");
    }
  }
  request_spec spec;
  spec.id = r.id;
  spec.prompt = std::move(r.prompt);
  spec.max_tokens = r.max_tokens;
  spec.eos_ids = std::move(r.eos_ids);
  LLMESH_TRY(sched_.add(std::move(spec)));
  sampling_[r.id] = r.sampling;
  return ok_status();
}

bool replica_core::cancel(uint64_t id) {
  sampling_.erase(id);
  return sched_.cancel(id);
}

bool replica_core::begin_step() {
  plan_ = sched_.schedule();
  batch_.clear();
  rows_.clear();
  if (plan_.seqs.empty()) return false;
  for (const auto& s : plan_.seqs) {
    batch_.push_back({s.tokens, s.pos0, s.block_table, s.want_logits});
    // The token being drawn sits at position pos0 + n: the (seed, position) key generate uses.
    if (s.want_logits) rows_.push_back({sampling_.at(s.id), s.pos0 + s.tokens.size()});
  }
  in_step_ = true;
  return true;
}

std::vector<token_event> replica_core::finish_step(std::span<const int32_t> sampled, const kernels::row_logprobs& logprobs) {
  in_step_ = false;
  // Each request's row, before complete() forgets the requests that finish.
  std::unordered_map<uint64_t, size_t> row_of;
  if (!logprobs.empty()) {
    size_t row = 0;
    for (const auto& s : plan_.seqs) {
      if (s.want_logits) row_of[s.id] = row++;
    }
  }
  auto events = sched_.complete(plan_, sampled);
  for (auto& e : events) {
    if (auto it = row_of.find(e.id); it != row_of.end() && it->second < logprobs.size()) e.logprobs = logprobs[it->second];
    if (e.finish != finish_reason::none) sampling_.erase(e.id);
  }
  return events;
}

result<std::vector<token_event>> replica_core::step() {
  if (!begin_step()) return std::vector<token_event>{};
  std::vector<int32_t> sampled;
  kernels::row_logprobs logprobs;
  if (auto s = eng_.forward_sample(batch_, rows_, sampled, &logprobs); !s) {
    in_step_ = false;
    return s.take_error();
  }
  return finish_step(sampled, logprobs);
}

}  // namespace llmesh::actors
