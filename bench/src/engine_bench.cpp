// The engine benchmark. Prints one table; every number is measured in this run.
#include <algorithm>
#include <tuple>
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "llmesh/bench/engine_bench.hpp"
#include "llmesh/kernels/cpu_features.hpp"
#include "llmesh/kernels/matmul.hpp"
#include "llmesh/model/engine.hpp"

namespace llmesh::bench {
namespace {

using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

std::vector<int32_t> bench_tokens(size_t n, size_t vocab) {
  std::vector<int32_t> ids(n);
  uint64_t x = 12345;
  for (auto& id : ids) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((x >> 33) % vocab);
  }
  return ids;
}

struct gemm_result {
  double ours_model_dtype = 0, ours_f32 = 0, openblas = 0;
};

/// Prefill's largest GEMM shape (M prompt tokens × N intermediate × K hidden), ours on the
/// model's own gate weights (an MoE model's first expert's) and on an f32 copy, against
/// OpenBLAS sgemm on the f32 copy.
gemm_result bench_gemm(const model::model& m, size_t rows, int threads, int reps) {
  const auto& l0 = m.weights().layers[0];
  const auto& w = l0.experts.empty() ? l0.gate : l0.experts.front().gate;
  const size_t M = rows, N = w.rows, K = w.cols;
  std::vector<float> x(M * K), wf(N * K), y(M * N);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = kernels::load_as_f32(w.data, w.type, (i / K) * w.ld() + i % K);
  kernels::thread_pool pool(threads);
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  auto seconds = [](auto&& fn) {
    auto t0 = clock_type::now();
    fn();
    return since(t0);
  };
  kernels::matmul_args a{x.data(), K, w.data, w.ld(), w.type, nullptr, y.data(), N, M, N, K};
  kernels::matmul_args af = a;
  af.w = wf.data();
  af.w_type = kernels::dtype::f32;
  openblas_set_num_threads(threads);
  // Rounds alternate the three contenders so a noisy neighbour hurts them alike; best of each.
  double best[3] = {1e30, 1e30, 1e30};
  for (int r = 0; r < std::max(reps, 5); ++r) {
    best[0] = std::min(best[0], seconds([&] { (void)kernels::matmul(a, pool); }));
    best[1] = std::min(best[1], seconds([&] { (void)kernels::matmul(af, pool); }));
    best[2] = std::min(best[2], seconds([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
                  1.0f, x.data(), static_cast<int>(K), wf.data(), static_cast<int>(K), 0.0f, y.data(), static_cast<int>(N));
    }));
  }
  gemm_result g;
  g.ours_model_dtype = flops / best[0] / 1e9;
  g.ours_f32 = flops / best[1] / 1e9;
  g.openblas = flops / best[2] / 1e9;
  return g;
}

}  // namespace

status run_engine_bench(const engine_bench_options& opt) {
  auto quant = model::parse_quantization(opt.quantization);
  if (!quant) return quant.take_error();
  auto kv_type = model::parse_kv_cache_dtype(opt.kv_cache_dtype);
  if (!kv_type) return kv_type.take_error();
  auto dtype = model::parse_weight_dtype(opt.dtype);
  if (!dtype) return dtype.take_error();
  model::load_options lo;
  lo.dtype = *dtype;
  lo.quant = *quant;
  if (!opt.lora.empty()) lo.loras = {{"bench", opt.lora}};
  auto m = model::model::load(opt.model_dir, lo);
  if (!m) return m.take_error();
  model::engine_options eo;
  eo.tp = opt.tp;
  eo.expert_parallel = opt.expert_parallel;
  eo.threads = opt.threads;
  eo.kv_type = *kv_type;
  size_t widest = 1;
  for (size_t b : opt.batches) widest = std::max(widest, b);
  eo.kv_tokens = std::max({opt.prompt_tokens, widest * (opt.gen_tokens + 1 + 16), opt.context + opt.gen_tokens + 16}) + 16;
  auto eng_r = model::engine::create(m.value(), eo);
  if (!eng_r) return eng_r.take_error();
  auto& eng = **eng_r;
  const auto& c = eng.config();
  if (opt.prompt_tokens + opt.gen_tokens + 1 > c.max_positions || opt.context + opt.gen_tokens > c.max_positions || opt.context == 0) {
    return make_error(errc::invalid_request, "--pp + --tg or --ctx + --tg exceed the model's context (or --ctx is 0)");
  }
  const int threads = eng.threads();
  const int reps = std::max(1, opt.reps);

  // The machine's bandwidth drifts on shared hosts: measure it before, between and after the
  // timed runs and use the best, so the roofline is never understated.
  double bw = measure_read_bandwidth(threads, size_t{1} << 30, 3);

  // pp: one step over the whole prompt on a fresh sequence (with adapter `lora`, or none: -1).
  auto prompt = bench_tokens(opt.prompt_tokens, c.vocab);
  std::vector<float> logits;
  auto time_pp = [&](int32_t lora) -> result<double> {
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      int seq = eng.open_sequence();
      model::step_item item{seq, prompt, true, lora};
      auto t0 = clock_type::now();
      LLMESH_TRY(eng.step(std::span(&item, 1), logits));
      best = std::min(best, since(t0));
      eng.close_sequence(seq);
    }
    return best;
  };
  auto pp_r = time_pp(-1);
  if (!pp_r) return pp_r.take_error();
  const double pp_best = *pp_r;

  bw = std::max(bw, measure_read_bandwidth(threads, size_t{1} << 30, 3));

  // tg: decode token by token after a context of opt.context tokens (prefilled, not timed).
  auto gen = bench_tokens(opt.gen_tokens + 1, c.vocab);
  const auto context = bench_tokens(opt.context, c.vocab);
  auto time_tg = [&](int32_t lora) -> result<double> {
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      int seq = eng.open_sequence();
      model::step_item first{seq, opt.context == 1 ? std::span(gen.data(), 1) : std::span(context), true, lora};
      LLMESH_TRY(eng.step(std::span(&first, 1), logits));
      auto t0 = clock_type::now();
      for (size_t i = 1; i <= opt.gen_tokens; ++i) {
        model::step_item item{seq, std::span(gen.data() + i, 1), true, lora};
        LLMESH_TRY(eng.step(std::span(&item, 1), logits));
      }
      best = std::min(best, since(t0));
      eng.close_sequence(seq);
    }
    return best;
  };
  auto tg_r = time_tg(-1);
  if (!tg_r) return tg_r.take_error();
  const double tg_best = *tg_r;
  // The same with the adapter, interleaved with a second base run (the host drifts).
  double pp_lora = 0, tg_lora = 0, pp_base2 = 0, tg_base2 = 0;
  if (!opt.lora.empty()) {
    for (auto [fn_pp, lora, out] : {std::tuple{true, 0, &pp_lora}, std::tuple{false, 0, &tg_lora},
                                    std::tuple{true, -1, &pp_base2}, std::tuple{false, -1, &tg_base2}}) {
      auto t = fn_pp ? time_pp(lora) : time_tg(lora);
      if (!t) return t.take_error();
      *out = *t;
    }
  }

  // Batched decode: b sequences step together, as a replica's running batch does; one read of
  // the weights serves them all, so aggregate tok/s should grow with b until compute binds.
  std::vector<std::pair<size_t, double>> batched;
  for (size_t b : opt.batches) {
    if (b < 1) continue;
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      std::vector<int> seqs;
      std::vector<model::step_item> items;
      for (size_t i = 0; i < b; ++i) {
        seqs.push_back(eng.open_sequence());
        items.push_back({seqs.back(), std::span(gen.data() + i % gen.size(), 1), true});
      }
      LLMESH_TRY(eng.step(items, logits));
      auto t0 = clock_type::now();
      for (size_t t = 1; t <= opt.gen_tokens; ++t) {
        for (size_t i = 0; i < b; ++i) items[i].tokens = std::span(gen.data() + (t + i) % gen.size(), 1);
        LLMESH_TRY(eng.step(items, logits));
      }
      best = std::min(best, since(t0));
      for (int s : seqs) eng.close_sequence(s);
    }
    batched.emplace_back(b, static_cast<double>(b * opt.gen_tokens) / best);
  }

  bw = std::max(bw, measure_read_bandwidth(threads, size_t{1} << 30, 3));
  const double weight_bytes = static_cast<double>(m.value()->decode_weight_bytes());
  // KV bytes read per decode token at the average context of the tg run (keys + values).
  const double kv_bytes = 2.0 * static_cast<double>(kernels::dtype_size(*kv_type)) * static_cast<double>(c.n_layers * c.n_kv_heads * c.head_dim) *
                          (static_cast<double>(opt.context) + static_cast<double>(opt.gen_tokens) / 2.0);
  const double bytes_per_token = weight_bytes + kv_bytes;
  const double roofline = bw / bytes_per_token;
  const double pp = static_cast<double>(opt.prompt_tokens) / pp_best;
  const double tg = static_cast<double>(opt.gen_tokens) / tg_best;
  auto g = bench_gemm(*m.value(), std::min<size_t>(opt.prompt_tokens, 512), threads, reps);

  std::printf("llmesh bench engine: %s\n", opt.model_dir.c_str());
  std::printf("  model        %s, hidden %zu, layers %zu, heads %zu/%zu, vocab %zu, %.2f B decode params\n",
              c.arch_name.c_str(), c.hidden, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab,
              static_cast<double>(m.value()->decode_params()) / 1e9);
  std::printf("  setup        tp %d%s, threads %d, isa %s, weights %s, KV cache %s\n", eng.tp(),
              opt.expert_parallel && c.moe.n_experts > 0 ? " (expert-parallel)" : "", threads,
              std::string(kernels::isa_name(kernels::active_isa())).c_str(),
              (m.value()->quantized_weights().empty() ? std::string(kernels::dtype_name(m.value()->weights().layers[0].q.type))
                                                      : m.value()->quantized_weights())
                  .c_str(),
              std::string(model::kv_cache_dtype_name(*kv_type)).c_str());
  std::printf("  bandwidth    %.1f GB/s (read, %d threads, 1 GiB, best of 3 x 3 around the runs)\n", bw / 1e9, threads);
  std::printf("  bytes/token  %.3f GB (weights %.3f + KV %.4f)\n", bytes_per_token / 1e9, weight_bytes / 1e9, kv_bytes / 1e9);
  std::printf("  pp%-8zu  %.2f tok/s\n", opt.prompt_tokens, pp);
  std::printf("  tg%-8zu  %.2f tok/s = %.1f%% of the roofline %.2f tok/s (after a context of %zu)\n", opt.gen_tokens, tg,
              100.0 * tg / roofline, roofline, opt.context);
  if (!opt.lora.empty()) {
    const auto& ad = *m.value()->loras().get(0);
    const double base_pp = std::min(pp_best, pp_base2), base_tg = std::min(tg_best, tg_base2);
    std::printf("  lora         %s: rank %zu, %.1f MB as held; pp %.2fx, tg %.2fx of the base model's (the bytes alone: tg %.3fx)\n",
                opt.lora.c_str(), ad.max_rank, static_cast<double>(ad.bytes()) / 1e6, base_pp / pp_lora, base_tg / tg_lora,
                bytes_per_token / (bytes_per_token + static_cast<double>(ad.bytes())));
  }
  for (const auto& [b, tps] : batched) {
    std::printf("  decode b%-5zu %.2f tok/s aggregate = %.2fx batch 1\n", b, tps, tps / tg);
  }
  std::printf("  gemm         %zux%zux%zu: ours %.1f GFLOP/s (model dtype), %.1f (f32); OpenBLAS sgemm %.1f -> %.1f%% / %.1f%%\n",
              std::min<size_t>(opt.prompt_tokens, 512), c.intermediate, c.hidden, g.ours_model_dtype, g.ours_f32,
              g.openblas, 100.0 * g.ours_model_dtype / g.openblas, 100.0 * g.ours_f32 / g.openblas);
  return ok_status();
}

}  // namespace llmesh::bench
