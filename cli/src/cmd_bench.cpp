// `llmesh bench engine` (prompt-processing and decode speed against the machine's limits),
// `llmesh bench tokenizer` (encode/decode throughput) and `llmesh bench serve` (a serving
// benchmark client against an OpenAI-compatible server, vLLM `bench serve` style).
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "llmesh/bench/engine_bench.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/bench/gpu_bench.hpp"
#include "llmesh/bench/grammar_bench.hpp"
#include "llmesh/bench/matmul_bench.hpp"
#include "llmesh/bench/speculation_bench.hpp"
#include "llmesh/bench/serve_bench.hpp"
#include "llmesh/bench/tokenizer_bench.hpp"
#include "llmesh/bench/allreduce_bench.hpp"
#include "llmesh/bench/transport_bench.hpp"

namespace llmesh::cli {

void add_bench(CLI::App& app, command_set& commands) {
  auto* bench_cmd = app.add_subcommand("bench", "Benchmarks");
  bench_cmd->require_subcommand(1);
  auto o = std::make_shared<bench::engine_bench_options>();
  auto g = std::make_shared<bench::gpu_bench_options>();
  auto device = std::make_shared<std::string>("cpu");
  auto batches = std::make_shared<std::vector<size_t>>(std::vector<size_t>{1, 8, 64});
  auto* sub = bench_cmd->add_subcommand("engine", "Engine pp/tg tokens/s vs memory bandwidth and OpenBLAS (or, on "
                                                   "CUDA, vs copy bandwidth and cuBLAS)");
  sub->add_option("--model", o->model_dir, "HF model directory");
  sub->add_option("--device", *device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  sub->add_option("--shape", g->shape, "cuda: random BF16 weights made on the GPU instead of --model: 1b or 8b")
      ->check(CLI::IsMember({"1b", "8b"}));
  sub->add_option("--batches", *batches, "Decode batch sizes (cpu: aggregate tok/s against batch 1)")
      ->delimiter(',')
      ->capture_default_str();
  auto* ctx = sub->add_option("--ctx", g->context,
                              "Context before decoding: cuda, of each decode sequence (default 128); cpu, of the tg run "
                              "(default 1)")
                  ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  sub->add_flag("--profile", g->profile, "cuda: also print per-op device time (prefill, decode)");
  sub->add_option("--tp", o->tp, "Tensor-parallel ranks")->capture_default_str();
  sub->add_flag("--enable-expert-parallel", o->expert_parallel, "A mixture of experts' ranks run whole experts (vLLM's flag)");
  sub->add_option("--threads", o->threads, "Kernel threads in all; 0 = one per core")->capture_default_str();
  sub->add_option("--pp", o->prompt_tokens, "Prompt tokens (prefill test)")->capture_default_str();
  sub->add_option("--tg", o->gen_tokens, "Generated tokens (decode test)")->capture_default_str();
  sub->add_option("--reps", o->reps, "Repetitions; the best is reported")->capture_default_str();
  sub->add_option("--quantization", o->quantization, "cpu: none, int8 (weight-only, blocks of 32) or fp8 (vLLM's online FP8; an FP8 checkpoint's own)")->capture_default_str();
  sub->add_option("--kv-cache-dtype", o->kv_cache_dtype, "cpu: auto/float32, bfloat16, fp8 (fp8_e4m3) or fp8_e5m2")->capture_default_str();
  sub->add_option("--dtype", o->dtype, "cpu: the weight matrices' type: auto (as stored), bfloat16, float16, float32")
      ->capture_default_str();
  sub->add_option("--lora", o->lora, "cpu: a LoRA adapter's directory: pp and tg with it, as ratios to the base model's");
  commands.emplace_back(sub, [o, g, device, batches, ctx]() -> status {
    if (*device == "cuda") {
      if (o->model_dir.empty() == g->shape.empty()) return make_error(errc::invalid_request, "give exactly one of --model, --shape");
      if (o->quantization != "none") return make_error(errc::unsupported, "--quantization runs on the CPU backend only");
      if (o->dtype != "auto") return make_error(errc::unsupported, "--dtype: the CUDA bench runs the checkpoint's weights");
      if (!o->lora.empty()) return make_error(errc::unsupported, "--lora runs on the CPU backend only");
      auto kv_type = model::parse_kv_cache_dtype(o->kv_cache_dtype);
      if (!kv_type) return kv_type.take_error();
      if (*kv_type != kernels::dtype::f32) {
        return make_error(errc::unsupported, "--kv-cache-dtype: the CUDA bench runs float32 KV caches only");
      }
      g->model_dir = o->model_dir;
      g->batches = *batches;
      g->prompt_tokens = o->prompt_tokens;
      g->gen_tokens = o->gen_tokens;
      g->reps = o->reps;
      return bench::run_gpu_bench(*g);
    }
    if (o->model_dir.empty()) return make_error(errc::invalid_request, "--model is required");
    o->batches = *batches;
    if (ctx->count() > 0) o->context = g->context;
    return bench::run_engine_bench(*o);
  });

  auto mm = std::make_shared<bench::matmul_bench_options>();
  auto* msub = bench_cmd->add_subcommand("matmul", "Decode matmul per weight type: weights/s and GB/s against read bandwidth and int8");
  msub->add_option("--rows", mm->rows, "Weight rows (outputs)")->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1} << 24));
  msub->add_option("--cols", mm->cols, "Weight columns (a multiple of 256)")->capture_default_str()->check(CLI::Range(size_t{256}, size_t{1} << 20));
  msub->add_option("--m", mm->m, "Activation rows per call (1: decode)")->delimiter(',')->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{4096}));
  msub->add_option("--types", mm->types, "Weight types: f32, f16, bf16, int8, fp8, int4, mxfp4, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs (default: all but f32, f16)")
      ->delimiter(',');
  msub->add_option("--threads", mm->threads, "Kernel threads")->capture_default_str()->check(CLI::Range(1, 1024));
  msub->add_option("--reps", mm->reps, "Calls per type, interleaved; the best is reported")->capture_default_str()->check(CLI::Range(1, 100000));
  commands.emplace_back(msub, [mm]() -> status { return bench::run_matmul_bench(*mm); });

  auto t = std::make_shared<bench::tokenizer_bench_options>();
  auto* tsub = bench_cmd->add_subcommand("tokenizer", "Tokenizer encode/decode throughput");
  tsub->add_option("--model", t->model_dir, "Model directory (tokenizer.json)")->required();
  tsub->add_option("--file", t->file, "Text to encode (default: ~1 MB of built-in prose)");
  tsub->add_option("--reps", t->reps, "Repetitions; the best is reported")->capture_default_str();
  commands.emplace_back(tsub, [t] { return bench::run_tokenizer_bench(*t); });

  auto gr = std::make_shared<bench::grammar_bench_options>();
  auto* gsub = bench_cmd->add_subcommand("grammar", "Structured outputs: token-mask cost per step against a sampling draw");
  gsub->add_option("--model", gr->model_dir, "Model directory (tokenizer.json)")->required();
  gsub->add_option("--schema", gr->schema_file, "A JSON Schema file; default: a built-in one")->check(CLI::ExistingFile);
  gsub->add_option("--documents", gr->documents, "Documents to generate by random walks")->capture_default_str();
  gsub->add_option("--max-tokens", gr->max_tokens, "Tokens per document at most")->capture_default_str();
  commands.emplace_back(gsub, [gr] { return bench::run_grammar_bench(*gr); });

  auto sp = std::make_shared<bench::speculation_bench_options>();
  auto* spsub = bench_cmd->add_subcommand("speculate", "Speculative decoding (prompt lookup or a draft model) against plain decoding");
  spsub->add_option("--model", sp->model_dir, "Model directory")->required();
  spsub->add_option("--prompts", sp->prompt_file, "Prompts, one a line (needs tokenizer.json); default: built in")
      ->check(CLI::ExistingFile);
  spsub->add_option("--speculative-tokens", sp->tokens, "Drafts per step")->capture_default_str();
  spsub->add_option("--prompt-lookup-max", sp->max_n, "Longest n-gram looked up")->check(CLI::Range(1, 64))->capture_default_str();
  spsub->add_option("--prompt-lookup-min", sp->min_n, "Shortest n-gram that matches")->check(CLI::Range(1, 64))->capture_default_str();
  spsub->add_option("--speculative-disable-by-batch-size", sp->disable_by_batch_size,
                    "No drafts while more requests run (0: no limit)")->capture_default_str();
  spsub->add_option("--max-tokens", sp->max_tokens, "Tokens per request")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  spsub->add_option("--concurrency", sp->concurrency, "Requests in flight")->check(CLI::Range(1, 4096))->capture_default_str();
  spsub->add_option("--temperature", sp->temperature, "0: greedy")->check(CLI::Range(0.0, 2.0))->capture_default_str();
  spsub->add_option("--threads", sp->threads, "Kernel threads; 0 = one per core")->check(CLI::Range(0, 1024));
  spsub->add_option("--quantization", sp->quantization, "none, int8 (weight-only, blocks of 32) or fp8")->capture_default_str();
  spsub->add_option("--draft-model", sp->draft_model,
                    "Draft with this model (same tokenizer) instead of prompt lookup: its greedy continuation");
  commands.emplace_back(spsub, [sp] { return bench::run_speculation_bench(*sp); });

  auto x = std::make_shared<bench::transport_bench_options>();
  auto* xsub = bench_cmd->add_subcommand("transport", "UCX transport between two processes vs ucx_perftest");
  xsub->add_option("--iters", x->iters, "Round trips of small frames")->capture_default_str();
  xsub->add_option("--small-bytes", x->small_bytes, "Small frame size (1..4096)")->capture_default_str();
  xsub->add_option("--frames", x->frames, "Large frames in the bandwidth run")->capture_default_str();
  xsub->add_option("--large-bytes", x->large_bytes, "Large frame size")->capture_default_str();
  xsub->add_option("--spin-us", x->spin_us, "Progress-thread spin after activity, microseconds (0: sleep at once)")
      ->check(CLI::Range(0, 100000))->capture_default_str();
  xsub->add_flag("--queued-sends", x->queued_sends, "Every send through the progress thread's queue (ucx_options::direct_send off)");
  xsub->add_option("--echo", x->echo, "internal: run as the echo peer")->group("");
  commands.emplace_back(xsub, [x] { return bench::run_transport_bench(*x); });

  auto ar = std::make_shared<bench::allreduce_bench_options>();
  auto* arsub = bench_cmd->add_subcommand("allreduce", "Tensor-plane collectives over UCX vs shared memory, per decode step");
  arsub->add_option("--model", ar->model_dir, "Model directory (config.json gives the shapes)");
  arsub->add_option("--hidden", ar->hidden, "Hidden size, without --model")->capture_default_str();
  arsub->add_option("--vocab", ar->vocab, "Vocabulary size, without --model")->capture_default_str();
  arsub->add_option("--layers", ar->layers, "Layers, without --model")->capture_default_str();
  arsub->add_option("--iters", ar->iters, "Collectives timed per shape")->capture_default_str();
  arsub->add_option("--spin-us", ar->spin_us, "Progress-thread spin after activity, microseconds")
      ->check(CLI::Range(0, 100000))->capture_default_str();
  commands.emplace_back(arsub, [ar] { return bench::run_allreduce_bench(*ar); });

  auto s = std::make_shared<bench::serve_bench_options>();
  auto* ssub = bench_cmd->add_subcommand("serve", "Serving benchmark against an OpenAI-compatible server (vLLM "
                                                   "bench serve's metrics: TTFT, TPOT, ITL, E2EL, throughput)");
  ssub->add_option("--url", s->url, "Server base URL, http://HOST:PORT or https://HOST:PORT")->required();
  ssub->add_option("--cacert", s->cacert, "https: PEM CAs the server's certificate is checked against (default: the system's)");
  ssub->add_flag("--insecure", s->insecure, "https: do not check the server's certificate");
  ssub->add_option("--model", s->model, "Model name to request (default: the first id of GET /v1/models)");
  ssub->add_option("--api-key", s->api_key, "Sent as 'Authorization: Bearer KEY'");
  ssub->add_option("--num-prompts", s->num_prompts, "Requests to send")->capture_default_str();
  ssub->add_option("--request-rate", s->request_rate, "Poisson arrival rate, requests/s; inf: all at once")
      ->capture_default_str();
  ssub->add_option("--max-concurrency", s->max_concurrency, "Requests in flight at most; 0: unlimited")
      ->capture_default_str();
  ssub->add_option("--input-len", s->input_len, "Prompt tokens per request (random ids)")->capture_default_str();
  auto* prefix_len = ssub->add_option("--random-prefix-len", s->random_prefix_len,
                   "vLLM's: random ids that every prompt starts with, before its --input-len own (prefix caching, "
                   "a conversation's history)")
      ->capture_default_str();
  ssub->add_option("--num-prefixes", s->num_prefixes,
                   "That many different --random-prefix-len prefixes, taken in turn (vLLM's prefix repetition, "
                   "unshuffled: the worst order for an LRU cache)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20))
      ->needs(prefix_len)
      ->capture_default_str();
  ssub->add_option("--output-len", s->output_len, "Generated tokens per request (max_tokens, ignore_eos)")
      ->capture_default_str();
  ssub->add_option("--tokenizer-dir", s->tokenizer_dir, "Model directory whose config.json's vocab_size bounds the ids");
  ssub->add_option("--vocab", s->vocab, "Prompt ids are drawn from [0, vocab); 0: --tokenizer-dir's, else 256")
      ->capture_default_str();
  ssub->add_option("--seed", s->seed, "Seed of the prompts and the arrival times")->capture_default_str();
  ssub->add_option("--timeout", s->timeout_s, "Seconds without data before a request fails")->capture_default_str();
  commands.emplace_back(ssub, [s] { return bench::run_serve_bench(*s); });
}

}  // namespace llmesh::cli
