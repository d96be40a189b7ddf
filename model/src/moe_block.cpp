// An MoE layer's MLP on one tensor-parallel rank (shard_executor::moe_block; HF's
// Qwen3MoeSparseMoeBlock and MixtralSparseMoeBlock): router logits → softmax → each token's
// experts_per_token most probable experts (ties: the lower id), their probabilities
// renormalised over the chosen (norm_topk_prob) → each of the rank's experts (every expert, or
// expert-parallel its own whole ones: shard_layout) runs the rank's slice of its SwiGLU on the
// rows routed to it (gate/up of all experts in one parallel region, down in another) → each
// token's rows on this rank weighted and summed in its experts' order → all-reduce →
// residual, in chunks of tokens (bounded scratch). Batch-invariant: a row's matmul does not
// depend on the rows beside it, and a token's sum runs in an order of its own. The router's
// logits are float32 (HF's are the model dtype's), its softmax double. GPT-OSS (GptOssMLP): the
// router's bias, softmax over the chosen logits (norm_topk_prob's weights), the experts' biases
// and clamped SwiGLU (kernels::gpt_oss_glu). Qwen2-MoE's shared
// expert (Qwen2MoeSparseMoeBlock) runs this rank's slice on every token in the same parallel
// regions; sigmoid(shared_expert_gate · x) scales it, added after the routed experts' sum.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "llmesh/kernels/elementwise.hpp"
#include "llmesh/model/shard_executor.hpp"
#include "matmul_jobs.hpp"
#include "row_slices.hpp"

namespace llmesh::model {

namespace {

/// Tokens routed at once: the scratch rows (at most tokens × experts_per_token × (2 hidden + 2
/// of the rank's intermediate) floats) stay bounded whatever the prompt; each token's work is its own,
/// so the chunking changes no bit.
constexpr size_t chunk_tokens = 512;

}  // namespace

status shard_executor::moe_block(size_t layer, size_t n_tokens) {
  const size_t hidden = model_->config().hidden;
  for (size_t t0 = 0; t0 < n_tokens; t0 += chunk_tokens) {
    LLMESH_TRY(moe_chunk(layer, t0, std::min(chunk_tokens, n_tokens - t0)));
  }
  if (layout_.tp > 1) LLMESH_TRY(comm_->all_reduce_sum(std::span(proj_.data(), n_tokens * hidden)));
  kernels::add_inplace(h_.data(), proj_.data(), n_tokens * hidden);
  return ok_status();
}

status shard_executor::moe_chunk(size_t layer, size_t t0, size_t n_tokens) {
  using detail::cols_from;
  using detail::job;
  using detail::rows_from;
  const auto& c = model_->config();
  const auto& lw = model_->weights().layers[layer];
  const size_t n_experts = c.moe.n_experts, k = c.moe.experts_per_token, hidden = c.hidden;
  const size_t ni = layout_.n_inter, i0 = layout_.inter0;
  const float* xn = &xn_[t0 * hidden];

  // The router is whole on every rank: each decides the same experts.
  router_.resize(n_tokens * n_experts);
  LLMESH_TRY(kernels::matmul(job(xn, hidden, lw.router, lw.router.data, router_.data(), n_experts, n_tokens, n_experts,
                                 hidden, lw.router_bias.empty() ? nullptr : lw.router_bias.data()),
                             *pool_));
  chosen_.resize(n_tokens * k);
  weight_.resize(n_tokens * k);
  std::vector<uint32_t> order(n_experts);
  std::vector<double> p(n_experts);
  for (size_t t = 0; t < n_tokens; ++t) {
    const float* logits = &router_[t * n_experts];
    // A NaN logit counts as -inf (a strict weak order for the sort; no expert chosen for it).
    float top = -std::numeric_limits<float>::infinity();
    for (size_t e = 0; e < n_experts; ++e) {
      if (!std::isnan(logits[e])) top = std::max(top, logits[e]);
    }
    const bool finite_top = std::isfinite(top);
    double sum = 0.0;
    for (size_t e = 0; e < n_experts; ++e) {
      if (!finite_top) {
        p[e] = 1.0;  // no finite logit: the experts tie (the lowest ids win)
      } else if (std::isnan(logits[e])) {
        p[e] = 0.0;
      } else {
        p[e] = std::exp(static_cast<double>(logits[e]) - top);
      }
      sum += p[e];
    }
    std::iota(order.begin(), order.end(), 0u);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [&](uint32_t a, uint32_t b) { return p[a] != p[b] ? p[a] > p[b] : a < b; });
    double kept = 0.0;
    for (size_t s = 0; s < k; ++s) kept += p[order[s]];
    for (size_t s = 0; s < k; ++s) {
      chosen_[t * k + s] = order[s];
      weight_[t * k + s] = static_cast<float>(p[order[s]] / (c.moe.norm_topk_prob ? kept : sum));
    }
  }

  // The (token, slot) rows of this rank's experts grouped by expert, tokens in order within each.
  const size_t e_begin = layout_.expert0, e_end = e_begin + layout_.n_experts;
  constexpr size_t elsewhere = std::numeric_limits<size_t>::max();  // another rank's expert
  std::vector<size_t> first(n_experts + 1, 0);
  for (uint32_t e : chosen_) ++first[e + 1];
  for (size_t e = 0; e < n_experts; ++e) {
    if (e < e_begin || e >= e_end) first[e + 1] = 0;
  }
  std::partial_sum(first.begin(), first.end(), first.begin());  // first[e]: expert e's first row
  std::vector<size_t> next(first.begin(), first.end() - 1);
  const size_t slots = n_tokens * k, rows = first[n_experts];
  row_of_.resize(slots);
  for (size_t i = 0; i < slots; ++i) {
    const uint32_t e = chosen_[i];
    row_of_[i] = e >= e_begin && e < e_end ? next[e]++ : elsewhere;
  }
  expert_x_.resize(rows * hidden);
  expert_gate_.resize(rows * ni);
  expert_up_.resize(rows * ni);
  expert_y_.resize(rows * hidden);
  pool_->run([&](int th, int n_threads) {
    auto [b, e] = kernels::thread_pool::split(slots, th, n_threads);
    for (size_t i = b; i < e; ++i) {
      if (row_of_[i] != elsewhere) std::copy_n(&xn[(i / k) * hidden], hidden, &expert_x_[row_of_[i] * hidden]);
    }
  });
  std::vector<kernels::matmul_args> gate_up, down;
  for (size_t e = e_begin; e < e_end; ++e) {
    const size_t r0 = first[e], m = first[e + 1] - first[e];
    if (m == 0) continue;
    const auto& x = lw.experts[e];
    // GPT-OSS's biases: gate's and up's for this rank's slice; down's added by the rank whose
    // slice starts the intermediate (the only one that runs the expert under expert parallelism),
    // so the all-reduce yields it once.
    const float* gate_bias = x.gate_bias.empty() ? nullptr : x.gate_bias.data() + i0;
    const float* up_bias = x.up_bias.empty() ? nullptr : x.up_bias.data() + i0;
    const float* down_bias = x.down_bias.empty() || i0 != 0 ? nullptr : x.down_bias.data();
    gate_up.push_back(job(&expert_x_[r0 * hidden], hidden, x.gate, rows_from(x.gate, i0), &expert_gate_[r0 * ni], ni, m,
                          ni, hidden, gate_bias));
    gate_up.push_back(job(&expert_x_[r0 * hidden], hidden, x.up, rows_from(x.up, i0), &expert_up_[r0 * ni], ni, m, ni,
                          hidden, up_bias));
    // This rank's int8 copy of a K-quant slice that would cut a super-block, if any.
    const detail::row_slice* own = layer < expert_down_slices_.size() && e < expert_down_slices_[layer].size()
                                       ? expert_down_slices_[layer][e].get()
                                       : nullptr;
    if (own) {
      down.push_back(job(&expert_gate_[r0 * ni], ni, own->w, own->w.data, &expert_y_[r0 * hidden], hidden, m, hidden, ni,
                         down_bias));
    } else {
      down.push_back(job(&expert_gate_[r0 * ni], ni, x.down, cols_from(x.down, i0), &expert_y_[r0 * hidden], hidden, m,
                         hidden, ni, down_bias));
    }
  }
  const size_t ns = layout_.n_shared, s0 = layout_.shared0;
  const bool shared = ns > 0;
  if (shared) {  // every token, this rank's slice; the gate's logit whole on every rank
    const auto& x = lw.shared;
    shared_gate_.resize(n_tokens * ns);
    shared_up_.resize(n_tokens * ns);
    shared_y_.resize(n_tokens * hidden);
    shared_scale_.resize(n_tokens);
    gate_up.push_back(job(xn, hidden, x.gate, rows_from(x.gate, s0), shared_gate_.data(), ns, n_tokens, ns, hidden, nullptr));
    gate_up.push_back(job(xn, hidden, x.up, rows_from(x.up, s0), shared_up_.data(), ns, n_tokens, ns, hidden, nullptr));
    gate_up.push_back(job(xn, hidden, lw.shared_gate, lw.shared_gate.data, shared_scale_.data(), 1, n_tokens, 1, hidden, nullptr));
    const detail::row_slice* own = layer < down_slices_.size() ? down_slices_[layer].get() : nullptr;
    down.push_back(own ? job(shared_gate_.data(), ns, own->w, own->w.data, shared_y_.data(), hidden, n_tokens, hidden, ns, nullptr)
                       : job(shared_gate_.data(), ns, x.down, cols_from(x.down, s0), shared_y_.data(), hidden, n_tokens, hidden,
                             ns, nullptr));
  }
  LLMESH_TRY(kernels::matmul(gate_up, *pool_));
  pool_->run([&](int th, int n_threads) {
    auto [b, e] = kernels::thread_pool::split(rows * ni, th, n_threads);
    if (c.moe.swiglu_limit > 0.0f) {  // GPT-OSS
      kernels::gpt_oss_glu(expert_gate_.data() + b, expert_up_.data() + b, expert_gate_.data() + b, e - b, c.moe.swiglu_limit);
    } else {
      kernels::swiglu(expert_gate_.data() + b, expert_up_.data() + b, expert_gate_.data() + b, e - b);
    }
    if (!shared) return;
    auto [sb, se] = kernels::thread_pool::split(n_tokens * ns, th, n_threads);
    kernels::swiglu(shared_gate_.data() + sb, shared_up_.data() + sb, shared_gate_.data() + sb, se - sb);
  });
  LLMESH_TRY(kernels::matmul(down, *pool_));

  // Each token: its experts' rows on this rank, weighted, summed in its own order.
  pool_->run([&](int th, int n_threads) {
    auto [b, e] = kernels::thread_pool::split(n_tokens, th, n_threads);
    for (size_t t = b; t < e; ++t) {
      float* out = &proj_[(t0 + t) * hidden];
      std::fill_n(out, hidden, 0.0f);
      for (size_t s = 0; s < k; ++s) {
        if (row_of_[t * k + s] == elsewhere) continue;
        const float w = weight_[t * k + s];
        const float* y = &expert_y_[row_of_[t * k + s] * hidden];
        for (size_t h = 0; h < hidden; ++h) out[h] += w * y[h];
      }
      if (shared) {  // + sigmoid(gate · x) · shared(x); linear in the rank's partial output
        const float w = 1.0f / (1.0f + kernels::exp_det(-shared_scale_[t]));
        const float* y = &shared_y_[t * hidden];
        for (size_t h = 0; h < hidden; ++h) out[h] += w * y[h];
      }
    }
  });
  return ok_status();
}

}  // namespace llmesh::model
