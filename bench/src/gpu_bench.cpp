// The GPU engine benchmark (gpu_bench.hpp). Timing: host wall clock around whole steps that end
// in a synchronisation (what a caller sees), median of `reps`; ceilings with CUDA events,
// median of 10 after a warm-up, on random data (never zeros).
#include "llmesh/bench/gpu_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>

#include "llmesh/kernels/cuda_ops.hpp"
#include "llmesh/kernels/cuda_runtime.hpp"
#include "llmesh/model/cuda_executor.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::bench {
namespace {

namespace cuda = kernels::cuda;
using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

result<model::model_config> shape_config(const std::string& shape) {
  model::model_config c;
  c.arch_name = "LlamaForCausalLM";
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.vocab = 128256;
  c.max_positions = 131072;
  c.rms_norm_eps = 1e-5f;
  c.rope.theta = 500000;
  if (shape == "1b") {  // Llama 3.2 1B
    c.hidden = 2048; c.intermediate = 8192; c.n_layers = 16; c.tie_embeddings = true;
  } else if (shape == "8b") {  // Llama 3.1 8B
    c.hidden = 4096; c.intermediate = 14336; c.n_layers = 32;
  } else {
    return make_error(errc::invalid_request, "--shape must be 1b or 8b");
  }
  c.head_dim = c.hidden / c.n_heads;
  c.rope.head_dim = c.head_dim;
  return c;
}

/// Bytes every decode step reads from the weights at any batch size (embedding rows aside).
size_t weight_bytes(const model::model_config& c, size_t es) {
  const size_t hd = c.head_dim;
  size_t layer = c.hidden * (c.n_heads * hd) * 2 + c.hidden * (c.n_kv_heads * hd) * 2 + 3 * c.hidden * c.intermediate;
  return (layer * c.n_layers + c.vocab * c.hidden) * es;
}

/// Matmul FLOPs of a prefill of n tokens (one logits row), plus causal attention.
double prefill_flops(const model::model_config& c, size_t n) {
  const double hd = static_cast<double>(c.head_dim);
  double per_token = 2.0 * (weight_bytes(c, 1) - c.vocab * c.hidden);
  double attn = 2.0 * 2.0 * c.n_heads * hd * (static_cast<double>(n) * (n + 1) / 2) * c.n_layers;
  return per_token * static_cast<double>(n) + attn + 2.0 * c.vocab * c.hidden;
}

struct ceilings {
  double copy_bytes_per_s = 0, gemm_flops_per_s = 0, gemm_square_flops_per_s = 0;
};

result<double> time_events(cuda::stream_t s, const std::function<status()>& fn) {
  auto t = cuda::event_timer::create();
  if (!t) return t.take_error();
  for (int i = 0; i < 3; ++i) LLMESH_TRY(fn());
  std::vector<double> ms;
  for (int i = 0; i < 10; ++i) {
    LLMESH_TRY(t->start(s));
    LLMESH_TRY(fn());
    LLMESH_TRY(t->stop(s));
    auto e = t->elapsed_ms();
    if (!e) return e.take_error();
    ms.push_back(*e);
  }
  return median(ms) / 1e3;
}

result<double> gemm_rate(cuda::blas& blas, cuda::stream_t s, size_t m, size_t n, size_t k) {
  auto w = cuda::buffer::device(n * k * 2);
  auto x = cuda::buffer::device(m * k * 4);
  auto y = cuda::buffer::device(m * n * 4);
  auto scratch = cuda::buffer::device(m * k * 2);
  if (!w || !x || !y || !scratch) return make_error(errc::overloaded, "bench: no device memory for the GEMM");
  LLMESH_TRY(cuda::fill_random(w->get(), kernels::dtype::bf16, n * k, 0.05f, 1, s));
  LLMESH_TRY(cuda::fill_random(x->get(), kernels::dtype::f32, m * k, 1.0f, 2, s));
  cuda::dense_job j;
  j.x = x->as<float>();
  j.ldx = k;
  j.w = w->get();
  j.ldw = k;
  j.w_type = kernels::dtype::bf16;
  j.y = y->as<float>();
  j.ldy = n;
  j.n = n;
  j.k = k;
  LLMESH_TRY(cuda::fill_random(scratch->get(), kernels::dtype::bf16, m * k, 1.0f, 3, s));
  auto t = time_events(s, [&] { return blas.gemm_16bit(j, m, scratch->get(), s); });
  if (!t) return t.take_error();
  return 2.0 * m * n * k / *t;
}

result<ceilings> measure_ceilings(const model::model_config& c, size_t pp) {
  ceilings out;
  auto st = cuda::stream::create();
  if (!st) return st.take_error();
  const size_t bytes = size_t{2} << 30;  // 2 GiB each way: far beyond the 60 MB L2
  auto a = cuda::buffer::device(bytes), b = cuda::buffer::device(bytes);
  if (!a || !b) return make_error(errc::overloaded, "bench: no device memory for the copy test");
  LLMESH_TRY(cuda::fill_random(a->get(), kernels::dtype::f32, bytes / 4, 1.0f, 3, st->get()));
  auto t = time_events(st->get(), [&] { return cuda::copy_on_device(b->get(), a->get(), bytes, st->get()); });
  if (!t) return t.take_error();
  out.copy_bytes_per_s = 2.0 * static_cast<double>(bytes) / *t;
  auto blas = cuda::blas::create();
  if (!blas) return blas.take_error();
  auto g = gemm_rate(**blas, st->get(), pp, c.intermediate, c.hidden);
  if (!g) return g.take_error();
  out.gemm_flops_per_s = *g;
  auto sq = gemm_rate(**blas, st->get(), 8192, 8192, 8192);
  if (!sq) return sq.take_error();
  out.gemm_square_flops_per_s = *sq;
  return out;
}

struct mode_result {
  double pp_seconds = 0;
  std::vector<double> decode_tok_s, decode_bw;  // per batch
};

/// Contiguous block tables: sequence i owns blocks [i·per, (i+1)·per).
struct bench_tables {
  size_t per = 0;
  std::vector<std::vector<int32_t>> tables;
  bench_tables(size_t n_seqs, size_t tokens, size_t bs) : per((tokens + bs - 1) / bs) {
    for (size_t i = 0; i < n_seqs; ++i) {
      std::vector<int32_t> t(per);
      for (size_t b = 0; b < per; ++b) t[b] = static_cast<int32_t>(i * per + b);
      tables.push_back(std::move(t));
    }
  }
};

/// Greedy rows for every sequence of a batch (each wants a token).
std::vector<kernels::sample_row> greedy_rows(size_t n) { return std::vector<kernels::sample_row>(n); }

/// Rows with the usual chat sampling: temperature 0.8, top-k 50, top-p 0.95.
std::vector<kernels::sample_row> sampled_rows(size_t n, size_t position) {
  std::vector<kernels::sample_row> rows(n);
  for (size_t i = 0; i < n; ++i) rows[i] = {{0.8f, 50, 0.95f, 1234 + i}, position};
  return rows;
}

result<mode_result> run_mode(model::step_executor& ex, const model::model_config& c, const gpu_bench_options& o,
                             size_t bs, size_t kv_bytes_per_token) {
  mode_result r;
  std::mt19937 rng(42);
  auto tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % c.vocab);
    return t;
  };
  std::vector<int32_t> ids;
  // Prefill: one sequence of pp tokens, rewritten in place each repetition.
  {
    bench_tables bt(1, o.prompt_tokens, bs);
    auto prompt = tokens(o.prompt_tokens);
    model::step_sequence s{prompt, 0, bt.tables[0], true};
    LLMESH_TRY(ex.forward_sample(std::span(&s, 1), greedy_rows(1), ids));  // warm-up (plans, allocations)
    std::vector<double> times;
    for (int i = 0; i < std::max(1, o.reps); ++i) {
      auto t0 = clock_type::now();
      LLMESH_TRY(ex.forward_sample(std::span(&s, 1), greedy_rows(1), ids));
      times.push_back(since(t0));
    }
    r.pp_seconds = median(times);
  }
  for (size_t batch : o.batches) {
    bench_tables bt(batch, o.context + o.gen_tokens + 1, bs);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<model::step_sequence> seqs;
    for (size_t i = 0; i < batch; ++i) prompts.push_back(tokens(o.context));
    for (size_t i = 0; i < batch; ++i) seqs.push_back({prompts[i], 0, bt.tables[i], true});
    LLMESH_TRY(ex.forward_sample(seqs, greedy_rows(seqs.size()), ids));
    std::vector<std::vector<int32_t>> next(batch);
    for (size_t i = 0; i < batch; ++i) next[i] = {ids[i]};
    auto step_at = [&](size_t step) -> status {
      for (size_t i = 0; i < batch; ++i) seqs[i] = {next[i], o.context + step, bt.tables[i], true};
      LLMESH_TRY(ex.forward_sample(seqs, greedy_rows(seqs.size()), ids));
      for (size_t i = 0; i < batch; ++i) next[i][0] = ids[i];
      return ok_status();
    };
    LLMESH_TRY(step_at(0));  // captures the graph for this bucket
    auto t0 = clock_type::now();
    for (size_t step = 1; step <= o.gen_tokens; ++step) LLMESH_TRY(step_at(step));
    const double secs = since(t0);
    const double steps = static_cast<double>(o.gen_tokens);
    const double avg_ctx = static_cast<double>(o.context) + steps / 2 + 1;
    const double bytes = static_cast<double>(weight_bytes(c, 2)) + batch * avg_ctx * kv_bytes_per_token;
    r.decode_tok_s.push_back(batch * steps / secs);
    r.decode_bw.push_back(bytes * steps / secs);
  }
  return r;
}

/// Per-op device time (events around every op, no graphs): one prefill, then 8 decode steps
/// at each batch size, fast mode.
status profile_ops(std::shared_ptr<const model::model> m, const model::model_config& c, const gpu_bench_options& o,
                   const model::kv_cache_config& kv, size_t bs) {
  model::cuda_options co;
  co.profile = true;
  auto ex = m ? model::make_cuda_executor(m, *model::make_shard_layout(c, 0, 1), kv, co, nullptr)
              : model::make_cuda_executor_random(c, kernels::dtype::bf16, 7, kv, co);
  if (!ex) return ex.take_error();
  std::vector<int32_t> ids;
  {
    bench_tables bt(1, o.prompt_tokens, bs);
    std::vector<int32_t> prompt(o.prompt_tokens, 1);
    model::step_sequence s{prompt, 0, bt.tables[0], true};
    LLMESH_TRY((*ex)->forward_sample(std::span(&s, 1), greedy_rows(1), ids));
    (*ex)->profile_reset();
    LLMESH_TRY((*ex)->forward_sample(std::span(&s, 1), greedy_rows(1), ids));
    std::printf("\nprofile: prefill %zu tokens (fast mode)\n%s", o.prompt_tokens, (*ex)->profile_report().c_str());
  }
  for (size_t batch : o.batches) {
    bench_tables bt(batch, o.context + 9, bs);
    std::vector<std::vector<int32_t>> prompts(batch, std::vector<int32_t>(o.context, 2)), next(batch, {3});
    std::vector<model::step_sequence> seqs;
    for (size_t i = 0; i < batch; ++i) seqs.push_back({prompts[i], 0, bt.tables[i], true});
    LLMESH_TRY((*ex)->forward_sample(seqs, greedy_rows(batch), ids));
    (*ex)->profile_reset();
    for (size_t step = 0; step < 8; ++step) {
      for (size_t i = 0; i < batch; ++i) seqs[i] = {next[i], o.context + step, bt.tables[i], true};
      LLMESH_TRY((*ex)->forward_sample(seqs, greedy_rows(batch), ids));
    }
    std::printf("\nprofile: 8 decode steps at batch %zu (fast mode, no graphs)\n%s", batch,
                (*ex)->profile_report().c_str());
    (*ex)->profile_reset();
    for (size_t step = 0; step < 8; ++step) {  // the same positions again: the cache slots are rewritten
      for (size_t i = 0; i < batch; ++i) seqs[i] = {next[i], o.context + step, bt.tables[i], true};
      LLMESH_TRY((*ex)->forward_sample(seqs, sampled_rows(batch, o.context + step + 1), ids));
    }
    std::printf("\nprofile: the same 8 steps sampled (temperature 0.8, top-k 50, top-p 0.95)\n%s",
                (*ex)->profile_report().c_str());
  }
  return ok_status();
}

}  // namespace

status run_gpu_bench(const gpu_bench_options& o) {
  if (!model::cuda_available()) return make_error(errc::invalid_request, "no CUDA device");
  model::model_config c;
  std::shared_ptr<const model::model> m;
  if (!o.shape.empty()) {
    auto sc = shape_config(o.shape);
    if (!sc) return sc.take_error();
    c = *sc;
  } else {
    auto lm = model::model::load(o.model_dir);
    if (!lm) return lm.take_error();
    m = *lm;
    c = m->config();
  }
  const size_t bs = 16;
  const size_t max_batch = o.batches.empty() ? 1 : *std::max_element(o.batches.begin(), o.batches.end());
  const size_t per_seq = (o.context + o.gen_tokens + 1 + bs - 1) / bs;
  model::kv_cache_config kv;
  kv.block_size = bs;
  kv.n_blocks = std::max(max_batch * per_seq, (o.prompt_tokens + bs - 1) / bs);
  const size_t kv_bytes_per_token = c.n_layers * 2 * c.n_kv_heads * c.head_dim * sizeof(float);

  auto ceil = measure_ceilings(c, o.prompt_tokens);
  if (!ceil) return ceil.take_error();
  int sms = 0;
  std::string name;
  LLMESH_TRY(cuda::device_info(sms, name));
  std::printf("device: %s, %d SMs | copy %.0f GB/s (read+write) | cuBLASLt bf16 GEMM %zux%zux%zu: %.0f TFLOP/s, "
              "8192^3: %.0f TFLOP/s\n",
              name.c_str(), sms, ceil->copy_bytes_per_s / 1e9, o.prompt_tokens, c.intermediate, c.hidden,
              ceil->gemm_flops_per_s / 1e12, ceil->gemm_square_flops_per_s / 1e12);

  mode_result modes[2];
  for (int det = 0; det < 2; ++det) {
    model::cuda_options co;
    co.deterministic = det == 1;
    result<std::unique_ptr<model::step_executor>> ex =
        m ? model::make_cuda_executor(m, *model::make_shard_layout(c, 0, 1), kv, co, nullptr)
          : model::make_cuda_executor_random(c, kernels::dtype::bf16, 7, kv, co);
    if (!ex) return ex.take_error();
    auto r = run_mode(**ex, c, o, bs, kv_bytes_per_token);
    if (!r) return r.take_error();
    modes[det] = *r;
  }
  const std::string label = o.shape.empty() ? o.model_dir : o.shape;
  const double pp_flops = prefill_flops(c, o.prompt_tokens);
  std::printf("\n| model | mode | test | tokens/s | vs ceiling |\n|---|---|---|---|---|\n");
  std::string json = "{\"model\":\"" + label + "\",\"copy_gbs\":" + std::to_string(ceil->copy_bytes_per_s / 1e9) +
                     ",\"gemm_tflops\":" + std::to_string(ceil->gemm_flops_per_s / 1e12);
  for (int det = 0; det < 2; ++det) {
    const auto& r = modes[det];
    const char* mode = det ? "deterministic" : "fast";
    const double tflops = pp_flops / r.pp_seconds / 1e12;
    std::printf("| %s | %s | pp%zu | %.0f | %.1f TFLOP/s = %.0f%% of cuBLAS |\n", label.c_str(), mode, o.prompt_tokens,
                o.prompt_tokens / r.pp_seconds, tflops, 100.0 * tflops * 1e12 / ceil->gemm_flops_per_s);
    json += std::string(",\"") + mode + "_pp_tflops\":" + std::to_string(tflops);
    for (size_t i = 0; i < o.batches.size(); ++i) {
      std::printf("| %s | %s | tg%zu batch %zu | %.0f | %.0f GB/s = %.0f%% of copy |\n", label.c_str(), mode,
                  o.gen_tokens, o.batches[i], r.decode_tok_s[i], r.decode_bw[i] / 1e9,
                  100.0 * r.decode_bw[i] / ceil->copy_bytes_per_s);
      json += std::string(",\"") + mode + "_b" + std::to_string(o.batches[i]) + "_tok_s\":" +
              std::to_string(r.decode_tok_s[i]) + ",\"" + mode + "_b" + std::to_string(o.batches[i]) +
              "_bw_frac\":" + std::to_string(r.decode_bw[i] / ceil->copy_bytes_per_s);
    }
  }
  std::printf("%s}\n", json.c_str());
  if (o.profile) LLMESH_TRY(profile_ops(m, c, o, kv, bs));
  return ok_status();
}

}  // namespace llmesh::bench
