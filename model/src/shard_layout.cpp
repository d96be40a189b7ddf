// How a model splits over tensor-parallel ranks (vLLM's rules: even head and MLP splits, KV
// heads replicated when there are fewer of them than ranks; expert-parallel, whole experts per
// rank as vLLM's determine_expert_map places them).
#include <algorithm>

#include "llmesh/model/shard_executor.hpp"

namespace llmesh::model {

result<shard_layout> make_shard_layout(const model_config& c, int rank, int tp, bool expert_parallel) {
  if (tp < 1 || rank < 0 || rank >= tp) return make_error(errc::invalid_request, "tensor parallel rank out of range");
  const size_t n = static_cast<size_t>(tp), r = static_cast<size_t>(rank);
  auto cannot = [&](const std::string& what, size_t value) {
    return make_error(errc::invalid_request, "--tp " + std::to_string(tp) + " cannot split " + what + " (" +
                                                 std::to_string(value) + ") evenly");
  };
  const size_t experts = c.moe.n_experts;
  expert_parallel = expert_parallel && experts > 0;  // a dense model has no experts to place
  if (expert_parallel && experts < n) {
    return make_error(errc::invalid_request, "--enable-expert-parallel with --tp " + std::to_string(tp) +
                                                 " needs at least as many experts as ranks; the model has " +
                                                 std::to_string(experts));
  }
  if (c.n_heads % n != 0) return cannot("num_attention_heads", c.n_heads);
  if (!expert_parallel && c.intermediate % n != 0) return cannot("intermediate_size", c.intermediate);
  if (c.moe.shared_intermediate % n != 0) return cannot("shared_expert_intermediate_size", c.moe.shared_intermediate);
  if (c.n_kv_heads >= n ? c.n_kv_heads % n != 0 : n % c.n_kv_heads != 0) {
    return cannot("num_key_value_heads", c.n_kv_heads);
  }
  shard_layout l;
  l.rank = rank;
  l.tp = tp;
  l.n_heads = c.n_heads / n;
  l.q_head0 = r * l.n_heads;
  if (c.n_kv_heads >= n) {
    l.n_kv_heads = c.n_kv_heads / n;
    l.kv_head0 = r * l.n_kv_heads;
  } else {  // replicate: ranks r*kv/n .. share one kv head
    l.n_kv_heads = 1;
    l.kv_head0 = r * c.n_kv_heads / n;
  }
  l.expert_parallel = expert_parallel;
  if (expert_parallel) {  // whole experts: n / tp a rank, the first n % tp ranks one more
    l.n_inter = c.intermediate;
    l.n_experts = experts / n + (r < experts % n ? 1 : 0);
    l.expert0 = r * (experts / n) + std::min(r, experts % n);
  } else {
    l.n_inter = c.intermediate / n;
    l.inter0 = r * l.n_inter;
    l.n_experts = experts;
  }
  l.n_shared = c.moe.shared_intermediate / n;
  l.shared0 = r * l.n_shared;
  size_t per = (c.vocab + n - 1) / n;
  l.vocab0 = std::min(c.vocab, r * per);
  l.n_vocab = std::min(c.vocab, l.vocab0 + per) - l.vocab0;
  return l;
}

}  // namespace llmesh::model
