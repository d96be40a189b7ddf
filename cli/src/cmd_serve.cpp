// `llmesh serve`: the whole mesh in one process — HTTP gateway, router, replicas (each a
// tensor-parallel engine) — on one model, until SIGINT or SIGTERM (then it drains).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "commands.hpp"
#include "gateway_flags.hpp"
#include "replica_flags.hpp"
#include "vllm_flags.hpp"
#include "llmesh/actors/node_agent.hpp"
#include "llmesh/kernels/device.hpp"
#include "stop_signal.hpp"
#include "llmesh/actors/draft_model_proposer.hpp"
#include "llmesh/actors/local_mesh.hpp"
#include "llmesh/gateway/http_server.hpp"
#include "llmesh/gateway/rpc_server.hpp"

namespace llmesh::cli {
namespace {

struct serve_flags {
  std::string model_dir, http = "127.0.0.1:8080", rpc = "127.0.0.1:8081", device = "auto", policy = "least-load";
  std::vector<std::string> served_names;  ///< vLLM's --served-model-name: the first is the model's, the rest aliases
  std::string quantization = "none", kv_cache_dtype = "auto", dtype = "auto";
  bool rpc_given = false;  ///< --rpc was on the command line
  bool kv_cache_mb_given = false;  ///< --kv-cache-mb was on the command line
  std::optional<double> gpu_memory_utilization;  ///< vLLM's --gpu-memory-utilization (CUDA: sizes the KV cache)
  bool prefix_caching = true;  ///< vLLM's --enable-prefix-caching / --no-enable-prefix-caching
  std::string host;  ///< vLLM's --host: replaces --http's host
  int port = -1;     ///< vLLM's --port: replaces --http's port (-1: not given)
  size_t block_size = 16;                   ///< vLLM's --block-size: positions per KV block
  bool enforce_eager = false;               ///< vLLM's --enforce-eager: no CUDA graphs
  std::string generation_config = "auto";   ///< vLLM's --generation-config: auto | vllm | DIR
  lora_flags lora;
  vllm_model_flags vllm;
  int replicas = 1, tp = 1, threads = 0;
  int prefill_replicas = 0;          ///< disaggregated prefill: replicas that only compute long prompts
  size_t max_local_prefill = 1000;   ///< Dynamo's max_local_prefill_length
  size_t max_prefill_queue = 0;      ///< Dynamo's max_prefill_queue_size (0: no limit)
  bool no_kv_events = false;         ///< Dynamo's --no-kv-events: the router predicts what replicas cache
  bool expert_parallel = false;  ///< vLLM's --enable-expert-parallel
  size_t kv_cache_mb = 1024, max_batch_tokens = 2048, max_seqs = 256;
  size_t long_prefill_threshold = 0, max_partial_prefills = 1, max_long_partial_prefills = 1;  ///< vLLM's partial-prefill flags
  size_t max_migrations = 3, drain_s = 10;
  bool deterministic = false;
  gateway_flags gw;
  actors::speculation_config speculation;
};

result<std::pair<std::string, uint16_t>> parse_host_port(const std::string& s, const char* flag) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return make_error(errc::invalid_request, std::string(flag) + " must be HOST:PORT, got '" + s + "'");
  }
  char* end = nullptr;
  const long port = std::strtol(s.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port < 0 || port > 65535 || end == s.c_str() + colon + 1) {
    return make_error(errc::invalid_request, std::string(flag) + " has a bad port in '" + s + "'");
  }
  std::string host = s.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return std::make_pair(host, static_cast<uint16_t>(port));
}

/// vLLM's flags that map onto this server (--block-size, --enforce-eager, --generation-config),
/// and those naming what it always does, accepted so that a vLLM command line runs unchanged.
void add_vllm_flags(CLI::App* sub, serve_flags& f) {
  sub->add_option("--block-size", f.block_size, "vLLM's: positions per KV-cache block")
      ->check(CLI::Range(size_t{1}, size_t{1024}))
      ->capture_default_str();
  sub->add_option("--gpu-memory-utilization", f.gpu_memory_utilization,
                  "vLLM's: the share of each GPU the replicas may take; the KV cache gets what the weights and working "
                  "memory leave (instead of --kv-cache-mb; the CPU backend sizes by --kv-cache-mb)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_flag("--enforce-eager", f.enforce_eager, "vLLM's: CUDA steps launch their kernels one by one (no CUDA graphs)");
  sub->add_option("--generation-config", f.generation_config,
                  "vLLM's: auto (sampling fields left out take the model's generation_config.json values), vllm (they "
                  "take the API's defaults) or a directory whose generation_config.json gives them")
      ->capture_default_str();
  const std::pair<const char*, const char*> always[] = {
      {"--enable-chunked-prefill", "vLLM's; accepted: long prompts always run in chunks beside decodes"},
      {"--enable-auto-tool-choice", "vLLM's; accepted: tool_choice \"auto\" is always served (--tool-call-parser)"},
      {"--trust-remote-code", "vLLM's; accepted: this server runs no code from a model's directory"},
      {"--disable-log-requests", "vLLM's; accepted: requests are logged only with --enable-log-requests"},
      {"--disable-log-stats", "vLLM's; accepted: this server logs no periodic stats (/metrics has them)"},
      {"--disable-fastapi-docs", "vLLM's; accepted: this server serves no API docs pages"}};
  for (const auto& [flag, text] : always) sub->add_flag_function(flag, [](int64_t) {}, text);
  sub->add_option_function<std::string>("--uvicorn-log-level", [](const std::string&) {},
                                        "vLLM's; accepted: this server logs its start and errors only");
}

status run_serve(serve_flags f) {
  LLMESH_TRY(check_vllm_model_flags(f.vllm, f.model_dir));
  std::string draft_dir;  // --speculative-config's draft model
  if (!f.vllm.speculative_config.empty()) {
    LLMESH_TRY(apply_speculative_config(f.vllm.speculative_config, f.speculation, draft_dir));
  }
  LLMESH_TRY(check_speculation_flags(f.speculation));
  auto where = parse_host_port(f.http, "--http");
  if (!where) return where.take_error();
  if (!f.host.empty()) where->first = f.host.size() > 2 && f.host.front() == '[' && f.host.back() == ']' ? f.host.substr(1, f.host.size() - 2) : f.host;
  if (f.port >= 0) where->second = static_cast<uint16_t>(f.port);
  auto cors = cors_options_of(f.gw);
  if (!cors) return cors.take_error();
  auto otlp = otlp_options_of(f.gw);
  if (!otlp) return otlp.take_error();
  LLMESH_TRY(gateway::check_tls(f.gw.tls));
  auto policy = actors::parse_balance_policy(f.policy);
  if (!policy) return policy.take_error();
  auto device = model::parse_backend(f.device);
  if (!device) return device.take_error();
  const std::string& tok_dir = tokenizer_dir(f.vllm, f.model_dir);
  auto tok = model::tokenizer::load(tok_dir);
  if (!tok) return tok.take_error();
  auto reasoning = gateway::parse_reasoning_parser(f.gw.reasoning_parser);
  if (!reasoning) return reasoning.take_error();
  if (*reasoning != gateway::reasoning_parser::none) LLMESH_TRY(gateway::check_reasoning_tokens(**tok, tok_dir, *reasoning));
  auto tool_parser = gateway::parse_tool_call_parser(f.gw.tool_call_parser);
  if (!tool_parser) return tool_parser.take_error();
  auto tool_tokens = gateway::tool_parser_kept_tokens(**tok, *tool_parser, tok_dir);
  if (!tool_tokens) return tool_tokens.take_error();
  auto pooler = gateway::parse_pooler_config(f.vllm.pooler_config);
  if (!pooler) return pooler.take_error();
  auto pooling = gateway::load_embedding_defaults(f.model_dir, f.gw.pooling, *pooler);
  if (!pooling) return pooling.take_error();
  std::optional<model::chat_template> chat;
  if (auto t = model::chat_template::load(tok_dir); t) chat = std::move(*t);
  auto quant = quantization_for(f.quantization, *device);
  if (!quant) return quant.take_error();
  auto kv_type = kv_cache_dtype_for(f.kv_cache_dtype, *device);
  if (!kv_type) return kv_type.take_error();
  auto dtype = model::parse_weight_dtype(f.dtype);
  if (!dtype) return dtype.take_error();
  gateway::api_options ao;
  ao.model_name = f.served_names.empty() ? std::filesystem::path(f.model_dir).lexically_normal().filename().string()
                                         : f.served_names[0];
  if (ao.model_name.empty()) ao.model_name = std::filesystem::path(f.model_dir).parent_path().filename().string();
  auto loras = lora_sources(f.lora.modules, ao.model_name);
  if (!loras) return loras.take_error();
  auto lora_dtype = parse_lora_dtype(f.lora.dtype);
  if (!lora_dtype) return lora_dtype.take_error();
  auto hf_overrides = effective_hf_overrides(f.vllm);
  if (!hf_overrides) return hf_overrides.take_error();
  auto m = model::model::load(f.model_dir, {.dtype = *dtype,
                                                 .quant = *quant,
                                                 .loras = *loras,
                                                 .enable_lora = f.lora.enabled(),
                                                 .max_loras = f.lora.max_cpu_loras,
                                                 .tokenizer_dir = f.vllm.tokenizer,
                                                 .lora_dtype = *lora_dtype,
                                                 .hf_overrides = *hf_overrides,
                                                 .ranks = {},
                                                 .max_model_len = f.gw.max_model_len});
  if (!m) return m.take_error();
  const auto& cfg = (*m)->config();
  LLMESH_TRY(check_vllm_task(f.vllm, cfg));
  std::shared_ptr<const model::model> draft;
  if (!draft_dir.empty()) {
    auto d = actors::load_draft_model(draft_dir, **m, tok_dir, f.gw.max_model_len);
    if (!d) return make_error(d.err().code, "--speculative-config: " + d.err().message);
    draft = std::move(*d);
  }
  gateway::served_model served{ao.model_name, *tok, std::move(chat), cfg, *reasoning, *tool_parser, *tool_tokens, *pooling, *loras};
  LLMESH_TRY(apply_model_overrides(served, tok_dir, f.gw.chat_template, f.gw.max_model_len));
  for (size_t i = 1; i < f.served_names.size(); ++i) {  // vLLM's further names for the model
    const std::string& n = f.served_names[i];
    const bool adapter = std::any_of(loras->begin(), loras->end(), [&](const auto& l) { return l.name == n; });
    if (n.empty() || n == ao.model_name || adapter || std::count(f.served_names.begin(), f.served_names.end(), n) > 1) {
      return make_error(errc::invalid_request, "--served-model-name: '" + n + "' is empty, given twice or an adapter's name");
    }
    served.aliases.push_back(n);
  }
  // vLLM names the model by its argument as given: a client configured for that name is served
  // too (unlisted: /v1/models lists the directory's name).
  if (f.served_names.empty() && f.model_dir != ao.model_name) served.unlisted_aliases.push_back(f.model_dir);
  if (f.generation_config == "vllm") {
    served.cfg.sampling = {};  // no generation_config.json defaults
  } else if (f.generation_config != "auto") {
    LLMESH_TRY(model::load_generation_config(served.cfg, f.generation_config));
  }
  if (!f.vllm.override_generation_config.empty()) {
    LLMESH_TRY(model::override_generation_config(served.cfg, f.vllm.override_generation_config));
  }

  // Thread budget: kernel threads are the cores, split over the replicas (a replica's own
  // actor thread is its rank 0); CAF gets 2 mostly idle threads; Asio is this thread.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  actors::mesh_options mo;
  mo.replicas = f.replicas;
  mo.engine.tp = f.tp;
  mo.engine.expert_parallel = f.expert_parallel;
  mo.prefill_replicas = f.prefill_replicas;
  mo.max_local_prefill = f.max_local_prefill;
  mo.max_prefill_queue = f.max_prefill_queue;
  mo.kv_events = !f.no_kv_events;
  mo.engine.threads = f.threads > 0 ? f.threads : std::max(f.tp, cores / (f.replicas + f.prefill_replicas));
  // No more than max_seqs contexts of the granted length (--max-model-len) could ever be used.
  mo.engine.kv_type = *kv_type;
  mo.engine.device = *device;
  size_t kv_mb = f.kv_cache_mb;
  std::string kv_note;  // how --gpu-memory-utilization sized the cache, or why it did not
  if (f.gpu_memory_utilization) {
    if (*f.gpu_memory_utilization <= 0.0) return make_error(errc::invalid_request, "--gpu-memory-utilization must be in (0, 1]");
    auto where = model::choose_backend(**m, mo.engine);
    if (!where) return where.take_error();
    if (where->device != model::backend::cuda) {
      kv_note = "--gpu-memory-utilization applies to CUDA devices; the CPU's KV cache is --kv-cache-mb";
    } else if (f.kv_cache_mb_given) {
      return make_error(errc::invalid_request, "give one of --gpu-memory-utilization and --kv-cache-mb");
    } else {
      size_t device_bytes = kernels::cuda_device_memory(0);  // rank r runs on device r: the smallest bounds all
      for (int d = 1; d < f.tp; ++d) device_bytes = std::min(device_bytes, kernels::cuda_device_memory(d));
      auto mb = model::kv_mb_for_gpu_memory(served.cfg, device_bytes, *f.gpu_memory_utilization, (*m)->weight_bytes(),
                                            (*m)->weights().embed.bytes(), f.tp, f.replicas, f.max_batch_tokens);
      if (!mb) return mb.take_error();
      kv_mb = *mb;
      kv_note = "KV cache " + std::to_string(kv_mb) + " MiB per shard from --gpu-memory-utilization";
    }
  }
  mo.engine.kv_tokens = actors::kv_tokens_for_budget(served.cfg, f.tp, kv_mb, f.max_seqs, *kv_type);
  mo.engine.block_size = f.block_size;
  mo.engine.cuda_graphs = !f.enforce_eager;
  mo.engine.deterministic = f.deterministic;
  mo.sched.max_batch_tokens = f.max_batch_tokens;
  mo.sched.max_seqs = f.max_seqs;
  if (f.max_long_partial_prefills > f.max_partial_prefills) {
    return make_error(errc::invalid_request, "--max-long-partial-prefills must be at most --max-num-partial-prefills");
  }
  if (f.long_prefill_threshold > served.cfg.max_positions) {
    return make_error(errc::invalid_request, "--long-prefill-token-threshold " + std::to_string(f.long_prefill_threshold) +
                                                 " exceeds the model's context (" + std::to_string(served.cfg.max_positions) + ")");
  }
  mo.sched.long_prefill_threshold = f.long_prefill_threshold;
  mo.sched.max_partial_prefills = f.max_partial_prefills;
  mo.sched.max_long_partial_prefills = f.max_long_partial_prefills;
  actors::default_long_prefill_threshold(mo.sched, served.cfg.max_positions);
  mo.sched.speculation = f.speculation;
  mo.sched.draft_model = std::move(draft);
  mo.sched.prefix_caching = f.prefix_caching;
  mo.policy = *policy;
  mo.max_migrations = f.max_migrations;
  mo.model_name = ao.model_name;
  actors::metrics_registry metrics;
  auto mesh = actors::local_mesh::create(*m, mo, &metrics);
  if (!mesh) return mesh.take_error();

  gateway::http_options ho;
  ho.host = where->first;
  ho.port = where->second;
  apply_gateway_flags(f.gw, ao, ho);
  ho.cors = *cors;
  ho.tracer = start_tracer(std::move(*otlp), metrics);
  ao.runtime_lora_updates = f.lora.updates_allowed();
  auto api = std::make_unique<gateway::api_service>(ao, std::vector{std::move(served)}, **mesh, metrics);
  auto server = gateway::http_server::listen(*api, ho);
  if (!server) return server.take_error();
  std::unique_ptr<gateway::rpc_server> rpc;
  std::string rpc_host;
  if (f.rpc != "none") {
    auto rpc_where = parse_host_port(f.rpc, "--rpc");
    if (!rpc_where) return rpc_where.take_error();
    // A vLLM command line (--host / --port, no --rpc): the native API beside the HTTP one, on any
    // free port (the start line names it), so that two such servers, or --port 8081, never collide.
    if (!f.rpc_given && (!f.host.empty() || f.port >= 0)) *rpc_where = {where->first, 0};
    rpc_host = rpc_where->first;
    auto r = gateway::rpc_server::start(*api, {rpc_where->first, rpc_where->second, f.gw.tls, ho.tracer});
    if (!r) return r.take_error();
    rpc = std::move(*r);
  }

  if (rpc) {
    std::fprintf(stderr, "llmesh: native API (Cap'n Proto RPC%s, schemas/rpc.capnp) on %s:%u\n",
                 f.gw.tls.enabled() ? " over TLS" : "", rpc_host.c_str(), rpc->port());
  }
  const std::string url_host = ho.host.find(':') != std::string::npos ? "[" + ho.host + "]" : ho.host;  // IPv6 in a URL
  const auto& e0 = (*mesh)->engine(0);
  if (f.prefill_replicas > 0) {
    kv_note += (kv_note.empty() ? "" : "; ") + std::to_string(f.prefill_replicas) + " prefill replica(s) for prompts over " +
               std::to_string(f.max_local_prefill) + " uncached tokens" +
               (f.max_prefill_queue ? ", at most " + std::to_string(f.max_prefill_queue) + " queued on each" : std::string());
  }
  const std::string notes = e0.device_note() + (e0.device_note().empty() || kv_note.empty() ? "" : "; ") + kv_note;
  std::fprintf(stderr,
               "llmesh: serving '%s' on %s://%s:%u (%d replica(s), tp %d, %s%s%s, %d kernel threads each, KV %zu "
               "positions per replica%s%s%s)\n",
               ao.model_name.c_str(), url_scheme(f.gw), url_host.c_str(), (*server)->port(), f.replicas, f.tp, e0.backend_name(),
               !(*m)->quantized_weights().empty() ? (", " + (*m)->quantized_weights() + " weights").c_str()
               : *dtype             ? (", " + std::string(model::weight_dtype_name(*dtype)) + " weights").c_str()
                                    : "",
               !f.lora.enabled() ? ""
               : ao.runtime_lora_updates
                   ? (", " + std::to_string(loras->size()) + " LoRA adapter(s), runtime updates on").c_str()
                   : (", " + std::to_string(loras->size()) + " LoRA adapter(s)").c_str(),
               mo.engine.threads, e0.kv_blocks() * e0.kv_block_size(),
               *kv_type == kernels::dtype::f32 ? "" : (", " + std::string(model::kv_cache_dtype_name(*kv_type))).c_str(),
               notes.empty() ? "" : "; ", notes.c_str());
  if (const auto limits = actors::prefill_limits_text(mo.sched); !limits.empty()) {
    std::fprintf(stderr, "llmesh: scheduler: %s\n", limits.c_str());
  }
  std::fprintf(stderr,
               "llmesh: try: curl %s://%s:%u/v1/completions -H 'Content-Type: application/json'%s -d "
               "'{\"model\":\"%s\",\"prompt\":\"In the beginning God created\",\"max_tokens\":32}'\n",
               url_scheme(f.gw), url_host.c_str(), (*server)->port(), ao.api_key.empty() ? "" : " -H 'Authorization: Bearer KEY'",
               ao.model_name.c_str());
  std::fflush(stderr);

  gateway::http_server* srv = server->get();
  const auto drain = std::chrono::seconds(f.drain_s);
  if (auto s = stop_signal::install(); !s) return s;
  std::thread waiter([srv, drain] {
    const int sig = stop_signal::wait();
    if (sig == 0) return;  // woken: the server stopped on its own
    std::fprintf(stderr, "llmesh: %s: draining (up to %llds), then stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
                 static_cast<long long>(drain.count()));
    srv->stop(drain);
  });
  (*server)->run();
  // Stop order: the RPC server (its calls cancel their generations), the mesh (its sinks post
  // into the server's io_context, still alive), then the HTTP server, then the API they borrowed.
  rpc.reset();
  api->close_background();
  mesh->reset();
  server->reset();
  api.reset();
  stop_signal::wake();  // the waiter, if no signal came
  waiter.join();
  stop_signal::uninstall();
  std::fprintf(stderr, "llmesh: stopped\n");
  return ok_status();
}

}  // namespace

void add_serve(CLI::App& app, command_set& commands) {
  auto f = std::make_shared<serve_flags>();
  auto* sub = app.add_subcommand("serve", "Serve a model over the OpenAI-compatible HTTP API (the mesh in one process)");
  // A flag given twice takes its last value, as vLLM's argparse does (--config's values come first).
  sub->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sub->add_option("model,--model", f->model_dir, "HF model directory (or GGUF file), as the first argument or --model")
      ->required();
  sub->add_option("--replicas,--data-parallel-size", f->replicas, "Model replicas (vLLM's data parallelism)")->check(CLI::Range(1, 64))->capture_default_str();
  sub->add_option("--prefill-replicas", f->prefill_replicas,
                  "Disaggregated prefill: replicas beside --replicas that compute long prompts and hand their KV blocks "
                  "to the request's replica (CPU backend, prefix caching on)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  sub->add_option("--max-local-prefill-length", f->max_local_prefill,
                  "Dynamo's: prompts of which more than this many tokens are not in their replica's prefix cache go to a "
                  "prefill replica first (with --prefill-replicas)")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  sub->add_option("--max-prefill-queue-size", f->max_prefill_queue,
                  "Dynamo's: ...unless every prefill replica already has this many requests; then the request's replica "
                  "computes the prompt (0: no limit)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  sub->add_flag("--no-kv-events", f->no_kv_events,
                "Dynamo's: the router does not ask replicas what their prefix caches hold (KV events) and predicts it from "
                "where it sent each prompt (prefix-aware routing, --prefill-replicas)");
  sub->add_option("--tp,--tensor-parallel-size", f->tp, "Tensor-parallel shards per replica")->check(CLI::Range(1, 64))->capture_default_str();
  sub->add_flag("--enable-expert-parallel", f->expert_parallel,
                "vLLM's: a mixture of experts' shards run whole experts instead of a slice of each (dense models: no effect)");
  sub->add_option("--http", f->http, "HTTP listen address HOST:PORT (port 0: any free port)")->capture_default_str();
  sub->add_option("--host", f->host, "vLLM's: the HTTP host, with --http's port (or --port)");
  sub->add_option("--port", f->port, "vLLM's: the HTTP port, with --http's host (or --host)")->check(CLI::Range(0, 65535));
  sub->add_option("--rpc", f->rpc, "Native API (Cap'n Proto RPC) address HOST:PORT (port 0: any; 'none': off)")
      ->capture_default_str();
  sub->add_option("--served-model-name", f->served_names,
                  "Model id in the API (default: the directory's name); more names after it: the model answers to each");
  sub->add_option("--device", f->device, "auto, cpu or cuda")->capture_default_str();
  sub->add_flag("--deterministic", f->deterministic, "CUDA: batch-invariant projections at every batch size");
  sub->add_option("--threads", f->threads, "Kernel threads per replica; 0 = the cores split over the replicas")
      ->check(CLI::Range(0, 1024));
  sub->add_option("--kv-cache-mb", f->kv_cache_mb, "KV-cache budget per shard, MiB")->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  sub->add_option("--max-batch-tokens,--max-num-batched-tokens", f->max_batch_tokens, "Tokens per engine step (prefill chunks + decodes)")
      ->check(CLI::Range(16, 1 << 20))->capture_default_str();
  sub->add_option("--max-seqs,--max-num-seqs", f->max_seqs, "Sequences per engine step")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  sub->add_option("--long-prefill-token-threshold", f->long_prefill_threshold,
                  "vLLM's: a prompt runs at most this many tokens a step, leaving the rest of the step to the requests "
                  "behind it; longer prompts count as long (0: no cap)")
      ->check(CLI::Range(size_t{0}, size_t{1} << 30))->capture_default_str();
  sub->add_option("--max-num-partial-prefills", f->max_partial_prefills,
                  "vLLM's: above 1, at most this many prompts computed at once (the threshold then defaults to 4 % of "
                  "the context)")
      ->check(CLI::Range(1, 1 << 16))->capture_default_str();
  sub->add_option("--max-long-partial-prefills", f->max_long_partial_prefills,
                  "vLLM's: of those, at most this many long ones; shorter prompts pass a long one waiting for it")
      ->check(CLI::Range(1, 1 << 16))->capture_default_str();
  add_gateway_flags(sub, f->gw);
  add_speculation_flags(sub, f->speculation);
  add_quantization_flag(sub, f->quantization);
  add_kv_cache_dtype_flag(sub, f->kv_cache_dtype);
  add_dtype_flag(sub, f->dtype);
  add_lora_flags(sub, f->lora);
  add_vllm_flags(sub, *f);
  add_vllm_model_flags(sub, f->vllm);
  add_prefix_caching_flag(sub, f->prefix_caching);
  sub->add_option("--policy", f->policy, "Router policy: round-robin, least-load, power-of-two, prefix-aware")
      ->capture_default_str();
  sub->add_option("--max-migrations", f->max_migrations, "Replica failures a request survives")
      ->check(CLI::Range(0, 100))->capture_default_str();
  sub->add_option("--drain-timeout", f->drain_s, "Seconds to let requests finish on SIGTERM")
      ->check(CLI::Range(0, 3600))->capture_default_str();
  commands.emplace_back(sub, [f, rpc = sub->get_option("--rpc"), kv_mb = sub->get_option("--kv-cache-mb")] {
    f->rpc_given = rpc->count() > 0;
    f->kv_cache_mb_given = kv_mb->count() > 0;
    return run_serve(*f);
  });
}

}  // namespace llmesh::cli
