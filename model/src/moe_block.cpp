// An MoE layer's MLP on one tensor-parallel rank (shard_executor::moe_block; HF's
// Qwen3MoeSparseMoeBlock and MixtralSparseMoeBlock): router logits → softmax → each token's
// experts_per_token most probable experts (ties: the lower id), their probabilities
// renormalised over the chosen (norm_topk_prob) → every expert runs this rank's slice of its
// SwiGLU on the rows routed to it (gate/up of all experts in one parallel region, down in
// another) → each token's rows weighted and summed in its experts' order → all-reduce →
// residual. Batch-invariant: a row's matmul does not depend on the rows beside it, and a
// token's sum runs in an order of its own.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "llmesh/kernels/elementwise.hpp"
#include "llmesh/model/shard_executor.hpp"
#include "matmul_jobs.hpp"

namespace llmesh::model {

status shard_executor::moe_block(size_t layer, size_t n_tokens) {
  using detail::cols_from;
  using detail::job;
  using detail::rows_from;
  const auto& c = model_->config();
  const auto& lw = model_->weights().layers[layer];
  const size_t n_experts = c.moe.n_experts, k = c.moe.experts_per_token, hidden = c.hidden;
  const size_t ni = layout_.n_inter, i0 = layout_.inter0;

  // The router is whole on every rank: each decides the same experts.
  router_.resize(n_tokens * n_experts);
  LLMESH_TRY(kernels::matmul(job(xn_.data(), hidden, lw.router, lw.router.data, router_.data(), n_experts, n_tokens,
                                 n_experts, hidden, nullptr),
                             *pool_));
  std::vector<uint32_t> chosen(n_tokens * k);
  std::vector<float> weight(n_tokens * k);
  std::vector<uint32_t> order(n_experts);
  std::vector<double> p(n_experts);
  for (size_t t = 0; t < n_tokens; ++t) {
    const float* logits = &router_[t * n_experts];
    const float top = *std::max_element(logits, logits + n_experts);
    double sum = 0.0;
    for (size_t e = 0; e < n_experts; ++e) sum += p[e] = std::exp(static_cast<double>(logits[e]) - top);
    std::iota(order.begin(), order.end(), 0u);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [&](uint32_t a, uint32_t b) { return p[a] != p[b] ? p[a] > p[b] : a < b; });
    double kept = 0.0;
    for (size_t s = 0; s < k; ++s) kept += p[order[s]];
    for (size_t s = 0; s < k; ++s) {
      chosen[t * k + s] = order[s];
      weight[t * k + s] = static_cast<float>(p[order[s]] / (c.moe.norm_topk_prob ? kept : sum));
    }
  }

  // The (token, slot) rows grouped by expert, tokens in order within each.
  std::vector<size_t> count(n_experts + 1, 0), row_of(n_tokens * k);
  for (uint32_t e : chosen) ++count[e + 1];
  std::partial_sum(count.begin(), count.end(), count.begin());  // count[e]: expert e's first row
  std::vector<size_t> next(count.begin(), count.end() - 1);
  const size_t rows = n_tokens * k;
  expert_x_.resize(rows * hidden);
  expert_gate_.resize(rows * ni);
  expert_up_.resize(rows * ni);
  expert_y_.resize(rows * hidden);
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t s = 0; s < k; ++s) {
      const size_t r = next[chosen[t * k + s]]++;
      row_of[t * k + s] = r;
      std::copy_n(&xn_[t * hidden], hidden, &expert_x_[r * hidden]);
    }
  }
  std::vector<kernels::matmul_args> gate_up, down;
  for (size_t e = 0; e < n_experts; ++e) {
    const size_t r0 = count[e], m = count[e + 1] - count[e];
    if (m == 0) continue;
    const auto& x = lw.experts[e];
    gate_up.push_back(job(&expert_x_[r0 * hidden], hidden, x.gate, rows_from(x.gate, i0), &expert_gate_[r0 * ni], ni, m,
                          ni, hidden, nullptr));
    gate_up.push_back(job(&expert_x_[r0 * hidden], hidden, x.up, rows_from(x.up, i0), &expert_up_[r0 * ni], ni, m, ni,
                          hidden, nullptr));
    down.push_back(job(&expert_gate_[r0 * ni], ni, x.down, cols_from(x.down, i0), &expert_y_[r0 * hidden], hidden, m,
                       hidden, ni, nullptr));
  }
  LLMESH_TRY(kernels::matmul(gate_up, *pool_));
  pool_->run([&](int th, int n_threads) {
    auto [b, e] = kernels::thread_pool::split(rows * ni, th, n_threads);
    kernels::swiglu(expert_gate_.data() + b, expert_up_.data() + b, expert_gate_.data() + b, e - b);
  });
  LLMESH_TRY(kernels::matmul(down, *pool_));

  // Each token: its experts' rows, weighted, summed in its own order.
  std::fill_n(proj_.begin(), n_tokens * hidden, 0.0f);
  for (size_t t = 0; t < n_tokens; ++t) {
    float* out = &proj_[t * hidden];
    for (size_t s = 0; s < k; ++s) {
      const float w = weight[t * k + s];
      const float* y = &expert_y_[row_of[t * k + s] * hidden];
      for (size_t h = 0; h < hidden; ++h) out[h] += w * y[h];
    }
  }
  if (layout_.tp > 1) LLMESH_TRY(comm_->all_reduce_sum(std::span(proj_.data(), n_tokens * hidden)));
  kernels::add_inplace(h_.data(), proj_.data(), n_tokens * hidden);
  return ok_status();
}

}  // namespace llmesh::model
