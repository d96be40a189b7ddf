// `llmesh bench engine` (prompt-processing and decode speed against the machine's limits) and
// `llmesh bench tokenizer` (encode/decode throughput).
#include <memory>

#include "commands.hpp"
#include "llmesh/bench/engine_bench.hpp"
#include "llmesh/bench/tokenizer_bench.hpp"

namespace llmesh::cli {

void add_bench(CLI::App& app, command_set& commands) {
  auto* bench_cmd = app.add_subcommand("bench", "Benchmarks");
  bench_cmd->require_subcommand(1);
  auto o = std::make_shared<bench::engine_bench_options>();
  auto* sub = bench_cmd->add_subcommand("engine", "Engine pp/tg tokens/s vs memory bandwidth and OpenBLAS");
  sub->add_option("--model", o->model_dir, "HF model directory")->required();
  sub->add_option("--tp", o->tp, "Tensor-parallel ranks")->capture_default_str();
  sub->add_option("--threads", o->threads, "Kernel threads in all; 0 = one per core")->capture_default_str();
  sub->add_option("--pp", o->prompt_tokens, "Prompt tokens (prefill test)")->capture_default_str();
  sub->add_option("--tg", o->gen_tokens, "Generated tokens (decode test)")->capture_default_str();
  sub->add_option("--reps", o->reps, "Repetitions; the best is reported")->capture_default_str();
  commands.emplace_back(sub, [o] { return bench::run_engine_bench(*o); });

  auto t = std::make_shared<bench::tokenizer_bench_options>();
  auto* tsub = bench_cmd->add_subcommand("tokenizer", "Tokenizer encode/decode throughput");
  tsub->add_option("--model", t->model_dir, "Model directory (tokenizer.json)")->required();
  tsub->add_option("--file", t->file, "Text to encode (default: ~1 MB of built-in prose)");
  tsub->add_option("--reps", t->reps, "Repetitions; the best is reported")->capture_default_str();
  commands.emplace_back(tsub, [t] { return bench::run_tokenizer_bench(*t); });
}

}  // namespace llmesh::cli
