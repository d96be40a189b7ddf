// The forward step of one tensor-parallel rank. Per layer: RMSNorm → q/k/v (one parallel
// region) → RoPE → KV write → attention → o (partial) → all-reduce → residual; RMSNorm →
// gate/up (one region) → SwiGLU → down (partial) → all-reduce → residual (an MoE layer's
// experts instead: moe_block.cpp). Then the final norm
// and this rank's vocabulary slice of the LM head, all-gathered into full logits.
// Gemma adds: the embedding scaled, GeGLU for SwiGLU, Gemma 2/3's norms of the attention's and
// the MLP's outputs before their residual adds, per-layer windows and rotary, soft-capping.
// Granite: the embedding, the blocks' outputs and the logits scaled by its multipliers.
#include "llmesh/model/shard_executor.hpp"

#include <algorithm>
#include <cstring>
#include <cmath>

#include "llmesh/kernels/elementwise.hpp"
#include "llmesh/kernels/matmul.hpp"
#include "llmesh/kernels/quantize.hpp"
#include "llmesh/kernels/rope.hpp"
#include "llmesh/kernels/sampling.hpp"
#include "llmesh/kernels/thread_pool.hpp"
#include "lora_runner.hpp"
#include "matmul_jobs.hpp"
#include "row_slices.hpp"

namespace llmesh::model {
namespace {

using detail::cols_from;
using detail::for_rows;
using detail::job;
using detail::rows_from;
using detail::slice;
using detail::lora_job;
using kernels::matmul_args;

}  // namespace

shard_executor::~shard_executor() = default;

status shard_executor::make_row_slices() {
  const auto& c = model_->config();
  const auto& layers = model_->weights().layers;
  o_slices_.assign(layers.size(), nullptr);
  down_slices_.assign(layers.size(), nullptr);
  expert_down_slices_.assign(layers.size(), {});
  if (layout_.tp == 1) return ok_status();  // whole rows
  auto slice = [this](const weight_matrix& w, size_t c0, size_t k, size_t layer, const std::string& what,
                      std::shared_ptr<const detail::row_slice>& out) -> status {
    if (const weight_matrix* own = model_->column_slice(w, c0)) {  // a model held for this rank: its copy
      out = std::make_shared<const detail::row_slice>(detail::row_slice{*own, nullptr});
      return ok_status();
    }
    auto s = detail::k_quant_slice(w, c0, k);
    if (!s) return make_error(s.err().code, "layer " + std::to_string(layer) + " " + what + ": " + s.err().message);
    if (*s) out = std::make_shared<const detail::row_slice>(std::move(**s));
    return ok_status();
  };
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& l = layers[i];
    LLMESH_TRY(slice(l.o, layout_.q_head0 * c.head_dim, layout_.n_heads * c.head_dim, i, "o_proj", o_slices_[i]));
    if (l.down.rows != 0) {
      LLMESH_TRY(slice(l.down, layout_.inter0, layout_.n_inter, i, "down_proj", down_slices_[i]));
      continue;
    }
    if (l.experts.empty()) continue;
    auto& own = expert_down_slices_[i];
    own.assign(l.experts.size(), nullptr);
    std::vector<status> failed(l.experts.size(), ok_status());
    pool_->run([&](int t, int n) {  // experts on every thread: a model of 128 per layer has thousands
      auto [b, end] = kernels::thread_pool::split(l.experts.size(), t, n);
      for (size_t e = b; e < end; ++e) {
        failed[e] = slice(l.experts[e].down, layout_.inter0, layout_.n_inter, i, "expert " + std::to_string(e) + " down_proj", own[e]);
      }
    });
    for (auto& s : failed) LLMESH_TRY(s);
    if (layout_.n_shared > 0) {
      LLMESH_TRY(slice(l.shared.down, layout_.shared0, layout_.n_shared, i, "shared expert down_proj", down_slices_[i]));
    }
  }
  return ok_status();
}

shard_executor::shard_executor(std::shared_ptr<const model> m, shard_layout layout, kv_cache_config kv,
                               kernels::communicator* comm, kernels::thread_pool* pool)
    : model_(std::move(m)), layout_(layout), kv_(kv), comm_(comm), pool_(pool), lora_(std::make_unique<detail::lora_runner>()) {
  const auto& c = model_->config();
  attn_shape_.n_heads = layout_.n_heads;
  attn_shape_.n_kv_heads = layout_.n_kv_heads;
  attn_shape_.head_dim = c.head_dim;
  attn_shape_.block_size = kv_.block_size;
  attn_shape_.sliding_window = c.sliding_window;  // per layer: attention_block
  attn_shape_.scale = static_cast<float>(c.attn_scale > 0.0 ? c.attn_scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  attn_shape_.softcap = c.gemma.attn_softcap;
  inv_freq_ = kernels::rope_inv_freq(c.rope);
  rope_scale_ = kernels::rope_scale(c.rope);
  if (c.rope_local) {
    inv_freq_local_ = kernels::rope_inv_freq(*c.rope_local);
    rope_scale_local_ = kernels::rope_scale(*c.rope_local);
  }
  embed_scale_ = c.scaling.embedding;  // Granite's embedding_multiplier, else 1
  if (c.gemma.on) {  // HF: the normalizer is a tensor of the embedding's dtype
    const auto type = model_->weights().embed.type;
    const float root = static_cast<float>(std::sqrt(static_cast<double>(c.hidden)));
    embed_scale_ = type == kernels::dtype::bf16  ? kernels::bf16_to_f32(kernels::f32_to_bf16(root))
                   : type == kernels::dtype::f16 ? kernels::f16_to_f32(kernels::f32_to_f16(root))
                                                 : root;
  }
  const size_t bytes = kv_.n_blocks * kv_.block_size * layout_.n_kv_heads * c.head_dim * kernels::dtype_size(kv_.type);
  keys_.assign(c.n_layers, std::vector<std::byte>(bytes));
  values_.assign(c.n_layers, std::vector<std::byte>(bytes));
}

void shard_executor::ensure_buffers(size_t t) {
  const auto& c = model_->config();
  const size_t hd = c.head_dim;
  h_.resize(t * c.hidden);
  xn_.resize(t * c.hidden);
  proj_.resize(t * c.hidden);
  q_.resize(t * layout_.n_heads * hd);
  attn_.resize(t * layout_.n_heads * hd);
  k_.resize(t * layout_.n_kv_heads * hd);
  v_.resize(t * layout_.n_kv_heads * hd);
  gate_.resize(t * layout_.n_inter);
  up_.resize(t * layout_.n_inter);
  cos_.resize(t * hd / 2);
  sin_.resize(t * hd / 2);
  q_temp_.resize(t);
  if (!inv_freq_local_.empty()) {
    cos_local_.resize(t * hd / 2);
    sin_local_.resize(t * hd / 2);
  }
}

status shard_executor::forward(std::span<const step_sequence> batch, std::vector<float>& logits) {
  return run(batch, logits, nullptr, nullptr);
}

status shard_executor::run(std::span<const step_sequence> batch, std::vector<float>& logits, std::vector<int32_t>* greedy,
                           std::vector<kernels::token_logprobs>* scored, std::vector<float>* hidden) {
  const auto& c = model_->config();
  const auto& w = model_->weights();
  size_t n_tokens = 0;
  for (const auto& s : batch) n_tokens += s.tokens.size();
  if (n_tokens == 0) return make_error(errc::invalid_request, "forward: empty batch");
  ensure_buffers(n_tokens);
  LLMESH_TRY(lora_->plan(batch, *model_));

  // Embedding rows and rotary angles for every token of the step.
  size_t t = 0;
  const size_t half = c.rope.head_dim / 2;
  for (const auto& s : batch) {
    for (size_t i = 0; i < s.tokens.size(); ++i, ++t) {
      size_t id = static_cast<size_t>(s.tokens[i]);
      float* row = &h_[t * c.hidden];
      if (kernels::is_quantized(w.embed.type)) {  // a block row from its start (a K-quant's factors decoded once)
        kernels::dequantize_row(static_cast<const uint8_t*>(w.embed.data) + kernels::dtype_offset(w.embed.type, id * w.embed.ld()),
                                w.embed.type, c.hidden, row);
        for (size_t d = 0; d < c.hidden; ++d) row[d] *= embed_scale_;
      } else {
        for (size_t d = 0; d < c.hidden; ++d) row[d] = kernels::load_as_f32(w.embed.data, w.embed.type, id * c.hidden + d) * embed_scale_;
      }
      kernels::rope_angles(inv_freq_, s.pos0 + i, cos_.data() + t * half, sin_.data() + t * half, rope_scale_);
      const auto& qt = c.query_temperature;
      q_temp_[t] = qt.beta == 0.0 ? 1.0f : kernels::llama4_query_scale(s.pos0 + i, qt.beta, qt.original);
      if (!inv_freq_local_.empty()) {
        kernels::rope_angles(inv_freq_local_, s.pos0 + i, cos_local_.data() + t * half, sin_local_.data() + t * half, rope_scale_local_);
      }
    }
  }
  for (size_t layer = 0; layer < c.n_layers; ++layer) {
    LLMESH_TRY(attention_block(layer, batch, n_tokens));
    LLMESH_TRY(mlp_block(layer, n_tokens));
  }
  if (hidden) hidden_out(batch, *hidden);
  LLMESH_TRY(lm_head(batch, logits, greedy));
  return score_prompts(batch, scored);
}

void shard_executor::hidden_out(std::span<const step_sequence> batch, std::vector<float>& out) {
  const auto& c = model_->config();
  const auto& w = model_->weights();
  size_t n = 0;
  for (const auto& s : batch) n += hidden_row_count(s);
  out.resize(n * c.hidden);
  size_t t = 0, row = 0;
  for (const auto& s : batch) {
    const size_t k = hidden_row_count(s), i0 = hidden_row_first(s);
    for (size_t i = i0; i < i0 + k; ++i, ++row) {
      kernels::rmsnorm(&h_[(t + i) * c.hidden], w.final_norm.data(), &out[row * c.hidden], c.hidden, c.rms_norm_eps);
    }
    t += s.tokens.size();
  }
}

size_t scored_positions(const step_sequence& s) {
  if (s.prompt_logprobs < 0 || s.tokens.empty()) return 0;
  return s.next >= 0 ? s.tokens.size() : s.tokens.size() - 1;
}

status check_sample_rows(std::span<const step_sequence> batch, size_t rows) {
  size_t want = 0;
  for (const auto& s : batch) want += drawn_rows(s);
  if (want == rows) return ok_status();
  return make_error(errc::invalid_request, "sampling: " + std::to_string(rows) + " rows for " + std::to_string(want) +
                                               " drawn positions");
}

status shard_executor::forward_sample(std::span<const step_sequence> batch, std::span<const kernels::sample_row> rows,
                                      std::vector<int32_t>& tokens, step_logprobs* logprobs) {
  LLMESH_TRY(check_sample_rows(batch, rows.size()));
  tokens.clear();
  if (logprobs) logprobs->clear();
  // Greedy steps of a split LM head gather each slice's argmax, not the slices' logits (every
  // rank decides alike from the rows: a row that wants logprobs needs its whole row).
  auto* scored = logprobs ? &logprobs->prompt : nullptr;
  auto* hidden = logprobs && layout_.rank == 0 ? &logprobs->hidden : nullptr;
  const bool greedy = layout_.tp > 1 && kernels::argmax_only(rows);
  if (greedy) return run(batch, sample_logits_, &tokens, scored, hidden);
  LLMESH_TRY(run(batch, sample_logits_, nullptr, scored, hidden));
  if (layout_.rank != 0) return ok_status();
  const size_t vocab = model_->config().vocab;
  tokens = kernels::sample_rows(sample_logits_, vocab, rows, pool_);
  if (logprobs) logprobs->rows = kernels::logprobs_rows(sample_logits_, vocab, rows, tokens);
  return ok_status();
}

status shard_executor::attention_block(size_t layer, std::span<const step_sequence> batch, size_t n_tokens) {
  const auto& c = model_->config();
  const auto& lw = model_->weights().layers[layer];
  const size_t hd = c.head_dim, q_dim = layout_.n_heads * hd, kv_dim = layout_.n_kv_heads * hd;
  for_rows(*pool_, n_tokens, c.hidden, [&](size_t t) {
    kernels::rmsnorm(&h_[t * c.hidden], lw.attn_norm.data(), &xn_[t * c.hidden], c.hidden, c.rms_norm_eps);
  });
  const size_t q0 = layout_.q_head0 * hd, kv0 = layout_.kv_head0 * hd;
  const matmul_args qkv[3] = {
      job(xn_.data(), c.hidden, lw.q, rows_from(lw.q, q0), q_.data(), q_dim, n_tokens, q_dim, c.hidden, slice(lw.q_bias, q0)),
      job(xn_.data(), c.hidden, lw.k, rows_from(lw.k, kv0), k_.data(), kv_dim, n_tokens, kv_dim, c.hidden, slice(lw.k_bias, kv0)),
      job(xn_.data(), c.hidden, lw.v, rows_from(lw.v, kv0), v_.data(), kv_dim, n_tokens, kv_dim, c.hidden, slice(lw.v_bias, kv0)),
  };
  const lora_job qkv_lora[3] = {{lora_target::q, xn_.data(), c.hidden, 0, c.hidden, q_.data(), q_dim, q0, q_dim},
                                {lora_target::k, xn_.data(), c.hidden, 0, c.hidden, k_.data(), kv_dim, kv0, kv_dim},
                                {lora_target::v, xn_.data(), c.hidden, 0, c.hidden, v_.data(), kv_dim, kv0, kv_dim}};
  LLMESH_TRY(lora_->project(qkv, layer, qkv_lora, *pool_));  // plus each sequence's LoRA deltas
  if (c.qk_norm) {  // Qwen3: every head of q and k RMS-normalised on its own, before RoPE
    for_rows(*pool_, n_tokens * layout_.n_heads, hd, [&](size_t r) {
      kernels::rmsnorm(&q_[r * hd], lw.q_norm.data(), &q_[r * hd], hd, c.rms_norm_eps);
    });
    for_rows(*pool_, n_tokens * layout_.n_kv_heads, hd, [&](size_t r) {
      kernels::rmsnorm(&k_[r * hd], lw.k_norm.data(), &k_[r * hd], hd, c.rms_norm_eps);
    });
  }
  const size_t rot = c.rope.head_dim, half = rot / 2;  // the rotary part of each head (partial_rotary_factor)
  const bool local = !inv_freq_local_.empty() && layer_sliding(c, layer);  // Gemma 3's sliding layers
  const float* cos = local ? cos_local_.data() : cos_.data();
  const float* sin = local ? sin_local_.data() : sin_.data();
  if (!layer_nope(c, layer)) {  // SmolLM3's NoPE layers leave q and k as projected
    for_rows(*pool_, n_tokens, q_dim + kv_dim, [&](size_t t) {
      kernels::rope_apply(&q_[t * q_dim], layout_.n_heads, hd, rot, cos + t * half, sin + t * half);
      kernels::rope_apply(&k_[t * kv_dim], layout_.n_kv_heads, hd, rot, cos + t * half, sin + t * half);
    });
  }
  if (c.query_temperature.beta != 0.0) {  // Ministral 3: the queries' temperature past the original context
    for_rows(*pool_, n_tokens, q_dim, [&](size_t t) {
      if (q_temp_[t] == 1.0f) return;
      for (size_t d = 0; d < q_dim; ++d) q_[t * q_dim + d] *= q_temp_[t];
    });
  }

  kernels::kv_layer_view cache{keys_[layer].data(), values_[layer].data(), kv_.n_blocks, kv_.type};
  if (kernels::is_f8(kv_.type) && lw.k_scale > 0.0f) {  // the checkpoint's calibrated scales (else 1)
    cache.k_scale = lw.k_scale;
    cache.v_scale = lw.v_scale;
  }
  kernels::attention_shape shape = attn_shape_;
  shape.sliding_window = layer_window(c, layer);
  if (!lw.sinks.empty()) shape.sinks = &lw.sinks[layout_.q_head0];  // GPT-OSS: this rank's heads' sinks
  std::vector<kernels::attention_seq> seqs;
  seqs.reserve(batch.size());
  size_t t = 0;
  for (const auto& s : batch) {
    LLMESH_TRY(kernels::kv_write(cache, shape, s.block_table, s.pos0, s.tokens.size(), &k_[t * kv_dim], &v_[t * kv_dim]));
    seqs.push_back({&q_[t * q_dim], &attn_[t * q_dim], s.pos0, s.tokens.size(), s.block_table});
    t += s.tokens.size();
  }
  LLMESH_TRY(kernels::attention(cache, shape, seqs, *pool_));

  // Row-parallel output projection: each rank multiplies its heads' columns; rank 0 adds the
  // bias, so the all-reduce (summing in rank order) yields it exactly once.
  const float* o_bias = layout_.rank == 0 ? slice(lw.o_bias, 0) : nullptr;
  const detail::row_slice* o_own = layer < o_slices_.size() ? o_slices_[layer].get() : nullptr;
  const matmul_args o = o_own ? job(attn_.data(), q_dim, o_own->w, o_own->w.data, proj_.data(), c.hidden, n_tokens, c.hidden, q_dim, o_bias)
                              : job(attn_.data(), q_dim, lw.o, cols_from(lw.o, q0), proj_.data(), c.hidden, n_tokens, c.hidden, q_dim, o_bias);
  const lora_job o_lora{lora_target::o, attn_.data(), q_dim, q0, q_dim, proj_.data(), c.hidden, 0, c.hidden};
  LLMESH_TRY(lora_->project(std::span(&o, 1), layer, std::span(&o_lora, 1), *pool_));
  if (layout_.tp > 1) LLMESH_TRY(comm_->all_reduce_sum(std::span(proj_.data(), n_tokens * c.hidden)));
  return add_residual(lw.post_attn_norm, n_tokens);
}

status shard_executor::add_residual(const std::vector<float>& post_norm, size_t n_tokens) {
  const auto& c = model_->config();
  if (!post_norm.empty()) {  // Gemma 2/3: the block's output is normalised before the add
    for_rows(*pool_, n_tokens, c.hidden, [&](size_t t) {
      kernels::rmsnorm(&proj_[t * c.hidden], post_norm.data(), &proj_[t * c.hidden], c.hidden, c.rms_norm_eps);
    });
  }
  if (c.scaling.residual != 1.0f) {  // Granite's residual_multiplier
    const float m = c.scaling.residual;
    for (size_t i = 0; i < n_tokens * c.hidden; ++i) proj_[i] = proj_[i] * m;
  }
  kernels::add_inplace(h_.data(), proj_.data(), n_tokens * c.hidden);
  return ok_status();
}

status shard_executor::mlp_block(size_t layer, size_t n_tokens) {
  const auto& c = model_->config();
  const auto& lw = model_->weights().layers[layer];
  const size_t ni = layout_.n_inter, i0 = layout_.inter0;
  for_rows(*pool_, n_tokens, c.hidden, [&](size_t t) {
    kernels::rmsnorm(&h_[t * c.hidden], lw.mlp_norm.data(), &xn_[t * c.hidden], c.hidden, c.rms_norm_eps);
  });
  if (c.moe.n_experts > 0) return moe_block(layer, n_tokens);
  const matmul_args gate_up[2] = {
      job(xn_.data(), c.hidden, lw.gate, rows_from(lw.gate, i0), gate_.data(), ni, n_tokens, ni, c.hidden, nullptr),
      job(xn_.data(), c.hidden, lw.up, rows_from(lw.up, i0), up_.data(), ni, n_tokens, ni, c.hidden, nullptr),
  };
  const lora_job gate_up_lora[2] = {{lora_target::gate, xn_.data(), c.hidden, 0, c.hidden, gate_.data(), ni, i0, ni},
                                    {lora_target::up, xn_.data(), c.hidden, 0, c.hidden, up_.data(), ni, i0, ni}};
  LLMESH_TRY(lora_->project(gate_up, layer, gate_up_lora, *pool_));
  pool_->run([&](int th, int n_threads) {
    auto [b, e] = kernels::thread_pool::split(n_tokens * ni, th, n_threads);
    if (c.gemma.on) {
      kernels::geglu_tanh(gate_.data() + b, up_.data() + b, gate_.data() + b, e - b);
    } else {
      kernels::swiglu(gate_.data() + b, up_.data() + b, gate_.data() + b, e - b);
    }
  });
  const detail::row_slice* down_own = layer < down_slices_.size() ? down_slices_[layer].get() : nullptr;
  const matmul_args down = down_own ? job(gate_.data(), ni, down_own->w, down_own->w.data, proj_.data(), c.hidden, n_tokens, c.hidden, ni, nullptr)
                                    : job(gate_.data(), ni, lw.down, cols_from(lw.down, i0), proj_.data(), c.hidden, n_tokens, c.hidden, ni, nullptr);
  const lora_job down_lora{lora_target::down, gate_.data(), ni, i0, ni, proj_.data(), c.hidden, 0, c.hidden};
  LLMESH_TRY(lora_->project(std::span(&down, 1), layer, std::span(&down_lora, 1), *pool_));
  if (layout_.tp > 1) LLMESH_TRY(comm_->all_reduce_sum(std::span(proj_.data(), n_tokens * c.hidden)));
  return add_residual(lw.post_mlp_norm, n_tokens);
}

status shard_executor::lm_head(std::span<const step_sequence> batch, std::vector<float>& logits, std::vector<int32_t>* greedy) {
  const auto& c = model_->config();
  const auto& w = model_->weights();
  size_t n_want = 0, t = 0;
  for (const auto& s : batch) {
    t += s.tokens.size();
    for (size_t r = drawn_rows(s); r > 0; --r, ++n_want) {  // the last drawn_rows positions, in order
      kernels::rmsnorm(&h_[(t - r) * c.hidden], w.final_norm.data(), &xn_[n_want * c.hidden], c.hidden, c.rms_norm_eps);
    }
  }
  if (greedy != nullptr && layout_.tp > 1) return greedy_head(n_want, *greedy);
  return head_rows(n_want, logits);
}

status shard_executor::head_rows(size_t n, std::vector<float>& logits) {
  const auto& c = model_->config();
  const auto& w = model_->weights();
  logits.resize(n * c.vocab);
  if (n == 0) return ok_status();
  if (layout_.tp == 1) {
    LLMESH_TRY(kernels::matmul(job(xn_.data(), c.hidden, w.lm_head, w.lm_head.data, logits.data(), c.vocab, n, c.vocab,
                                   c.hidden, nullptr),
                               *pool_));
    finish_logits(logits.data(), n * c.vocab);
    return ok_status();
  }
  // Vocabulary-parallel: each rank computes its rows, the all-gather concatenates rank slices
  // ([rank][n][n_vocab_r]), then each rank reorders them into [n][vocab].
  std::vector<float> local, gathered(n * c.vocab);
  LLMESH_TRY(lm_head_slice(n, local));
  LLMESH_TRY(comm_->all_gather(local, gathered));
  size_t at = 0;
  for (int r = 0; r < layout_.tp; ++r) {
    auto peer = make_shard_layout(c, r, layout_.tp, layout_.expert_parallel);  // cannot fail: ours did not
    const size_t v0 = peer->vocab0, nv = peer->n_vocab;
    for (size_t row = 0; row < n; ++row) {
      std::copy_n(&gathered[at + row * nv], nv, &logits[row * c.vocab + v0]);
    }
    at += n * nv;
  }
  return ok_status();
}

status shard_executor::score_prompts(std::span<const step_sequence> batch, std::vector<kernels::token_logprobs>* out) {
  if (out) out->clear();
  struct position {
    size_t t;        ///< its row in h_
    int32_t target;  ///< the token that follows it
    int n;           ///< alternatives asked for
  };
  std::vector<position> rows_to_score;
  size_t t0 = 0;
  for (const auto& s : batch) {
    const size_t k = scored_positions(s);
    for (size_t i = 0; i < k; ++i) {
      rows_to_score.push_back({t0 + i, scored_target(s, i), s.prompt_logprobs});
    }
    t0 += s.tokens.size();
  }
  if (rows_to_score.empty()) return ok_status();
  // Blocks of rows bound the logits held at once ([block][vocab]); every rank runs the same
  // blocks (each is one LM-head collective at tp > 1). The matmul's rows are independent of
  // one another, so a position's logits are those a step ending there would give.
  constexpr size_t score_block = 32;
  const auto& c = model_->config();
  const auto& w = model_->weights();
  const bool keep = out != nullptr && layout_.rank == 0;
  if (keep) out->resize(rows_to_score.size());
  for (size_t b = 0; b < rows_to_score.size(); b += score_block) {
    const size_t n = std::min(score_block, rows_to_score.size() - b);
    for (size_t r = 0; r < n; ++r) {
      kernels::rmsnorm(&h_[rows_to_score[b + r].t * c.hidden], w.final_norm.data(), &xn_[r * c.hidden], c.hidden, c.rms_norm_eps);
    }
    LLMESH_TRY(head_rows(n, score_logits_));
    if (!keep) continue;
    pool_->run([&](int th, int n_threads) {
      auto [r0, r1] = kernels::thread_pool::split(n, th, n_threads);
      for (size_t r = r0; r < r1; ++r) {
        const auto& p = rows_to_score[b + r];
        (*out)[b + r] = kernels::compute_logprobs(std::span<const float>(score_logits_).subspan(r * c.vocab, c.vocab),
                                                  p.target, p.n);
      }
    });
  }
  return ok_status();
}

status shard_executor::lm_head_slice(size_t n_want, std::vector<float>& local) {
  const auto& c = model_->config();
  const auto& w = model_->weights();
  const size_t nv = layout_.n_vocab;
  local.assign(n_want * nv, 0.0f);
  if (nv == 0 || n_want == 0) return ok_status();
  LLMESH_TRY(kernels::matmul(job(xn_.data(), c.hidden, w.lm_head, rows_from(w.lm_head, layout_.vocab0), local.data(), nv,
                                 n_want, nv, c.hidden, nullptr),
                             *pool_));
  finish_logits(local.data(), local.size());
  return ok_status();
}

void shard_executor::finish_logits(float* logits, size_t n) {
  const float cap = model_->config().gemma.final_softcap, divisor = model_->config().scaling.logits_divisor;
  if (cap <= 0.0f && divisor == 1.0f) return;
  pool_->run([&](int th, int n_threads) {  // elementwise: the split never changes the bits
    auto [b, e] = kernels::thread_pool::split(n, th, n_threads);
    if (divisor != 1.0f) {  // Granite's logits_scaling
      for (size_t i = b; i < e; ++i) logits[i] = logits[i] / divisor;
    }
    if (cap > 0.0f) kernels::softcap_inplace(logits + b, e - b, cap);
  });
}

status shard_executor::greedy_head(size_t n_want, std::vector<int32_t>& tokens) {
  const size_t nv = layout_.n_vocab;
  std::vector<float> local;
  LLMESH_TRY(lm_head_slice(n_want, local));
  // Each rank sends (value, id) per row: two floats, the id's bits in the second.
  std::vector<float> mine(2 * n_want), all(2 * n_want * static_cast<size_t>(layout_.tp));
  for (size_t row = 0; row < n_want; ++row) {
    const auto cand = kernels::argmax_part(std::span<const float>(local).subspan(row * nv, nv), static_cast<int32_t>(layout_.vocab0));
    mine[2 * row] = cand.value;
    std::memcpy(&mine[2 * row + 1], &cand.id, sizeof(float));
  }
  LLMESH_TRY(comm_->all_gather(mine, all));
  tokens.clear();
  if (layout_.rank != 0) return ok_status();
  std::vector<kernels::argmax_candidate> parts(static_cast<size_t>(layout_.tp));
  for (size_t row = 0; row < n_want; ++row) {
    for (size_t r = 0; r < parts.size(); ++r) {  // rank order is id order
      const float* at = &all[(r * n_want + row) * 2];
      parts[r].value = at[0];
      std::memcpy(&parts[r].id, &at[1], sizeof(int32_t));
    }
    tokens.push_back(kernels::argmax_merge(parts));
  }
  return ok_status();
}

}  // namespace llmesh::model
