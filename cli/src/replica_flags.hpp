// A replica's flags shared by `llmesh serve` and `llmesh node` (a replica node): speculative
// decoding (the same names as vLLM's ngram speculation settings) and weight quantization.
#pragma once

#include <CLI/CLI.hpp>

#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "llmesh/actors/ngram_proposer.hpp"
#include "llmesh/common/error.hpp"
#include "llmesh/model/engine.hpp"

namespace llmesh::cli {

/// Adds --speculative-tokens, --prompt-lookup-max, --prompt-lookup-min and
/// --speculative-disable-by-batch-size to `sub`.
inline void add_speculation_flags(CLI::App* sub, actors::speculation_config& c) {
  sub->add_option("--speculative-tokens", c.tokens,
                  "Speculative decoding by prompt lookup: drafts per step (0: off); the output is unchanged")
      ->check(CLI::Range(size_t{0}, actors::max_speculative_tokens))
      ->capture_default_str();
  sub->add_option("--prompt-lookup-max", c.max_n, "Speculation: longest n-gram looked up in the context")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--prompt-lookup-min", c.min_n, "Speculation: shortest n-gram that counts as a match")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--speculative-disable-by-batch-size", c.disable_by_batch_size,
                  "Speculation: no drafts while more requests than this run (0: no limit)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
}

/// Adds vLLM's --enable-prefix-caching / --no-enable-prefix-caching (on by default) to `sub`.
inline void add_prefix_caching_flag(CLI::App* sub, bool& on) {
  sub->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", on,
                "Automatic prefix caching: a request reuses the KV blocks of an earlier one with the same leading tokens "
                "(on; --no-enable-prefix-caching: every prompt computed whole)");
}

/// Adds --quantization (how the replica holds the model's weights) to `sub`.
inline void add_quantization_flag(CLI::App* sub, std::string& q) {
  sub->add_option("--quantization", q,
                  "Weights in memory: none (as stored) or int8 (weight-only, blocks of 32 with a float32 scale; "
                  "CPU backend; about half the bytes per decode step of BF16); fp8: an FP8 checkpoint's own, or on an "
                  "unquantized one vLLM's online FP8 (a scale per fused layer; CPU backend); vLLM's awq (awq_marlin), "
                  "gptq (gptq_marlin), compressed-tensors, mxfp4 (GPT-OSS) and gguf name the checkpoint's own quantization (as none, "
                  "refused for another checkpoint)")
      ->check(CLI::Validator(
          [](std::string& s) {
            auto parsed = model::parse_quantization(s);
            return parsed ? std::string() : parsed.err().message;
          },
          "QUANTIZATION"))
      ->capture_default_str();
}

/// Parses --quantization against --device before anything loads: int8 and fp8 run on the CPU only.
[[nodiscard]] inline result<model::quantization> quantization_for(const std::string& flag, model::backend device) {
  auto q = model::parse_quantization(flag);
  if (!q) return q.take_error();
  if ((*q == model::quantization::int8 || *q == model::quantization::fp8) && device == model::backend::cuda) {
    return make_error(errc::unsupported, "--quantization " + flag + " runs on the CPU backend only (use --device cpu or auto)");
  }
  return q;
}

/// Adds vLLM's --dtype (the type the replica holds the model's weight matrices in) to `sub`.
inline void add_dtype_flag(CLI::App* sub, std::string& t) {
  sub->add_option("--dtype", t,
                  "vLLM's: the weight matrices' type in memory: auto (as the checkpoint stores them), bfloat16, float16 "
                  "(half) or float32 (float); computation stays float32")
      ->capture_default_str();
}

/// Adds vLLM's --kv-cache-dtype (how the replica's KV cache holds keys and values) to `sub`.
inline void add_kv_cache_dtype_flag(CLI::App* sub, std::string& t) {
  sub->add_option("--kv-cache-dtype", t,
                  "KV cache elements: auto or float32 (the reference precision), bfloat16 (half the memory per position, "
                  "so twice the context in --kv-cache-mb), fp8 = fp8_e4m3 or fp8_e5m2 (a quarter: 8-bit floats, scaled by "
                  "the checkpoint's per-layer k_scale / v_scale where it has them, else 1, as vLLM's); CPU backend")
      ->capture_default_str();
}

/// Parses --kv-cache-dtype against --device before anything loads: bfloat16 and fp8 run on the CPU only.
[[nodiscard]] inline result<kernels::dtype> kv_cache_dtype_for(const std::string& flag, model::backend device) {
  auto t = model::parse_kv_cache_dtype(flag);
  if (!t) return t.take_error();
  if (*t != kernels::dtype::f32 && device == model::backend::cuda) {
    return make_error(errc::unsupported, "--kv-cache-dtype " + flag + " runs on the CPU backend only (use --device cpu or auto)");
  }
  return t;
}

/// vLLM's --lora-dtype: the type adapters are held in (auto: the weights' --dtype, else as stored).
inline void add_lora_dtype_flag(CLI::App* sub, std::string& dtype) {
  sub->add_option("--lora-dtype", dtype,
                  "vLLM's: auto (the weights' --dtype, else as each adapter stores them), float32, bfloat16 or float16")
      ->capture_default_str();
}

/// --lora-dtype's type (nullopt: auto); invalid_request names the choices.
[[nodiscard]] inline result<std::optional<kernels::dtype>> parse_lora_dtype(const std::string& flag) {
  auto t = model::parse_weight_dtype(flag);
  if (!t) {
    return make_error(errc::invalid_request,
                      "--lora-dtype must be auto, bfloat16, float16 (half) or float32 (float), not '" + flag + "'");
  }
  return t;
}

/// vLLM's LoRA flags of `llmesh serve`.
struct lora_flags {
  std::vector<std::string> modules;  ///< --lora-modules
  bool enable = false;               ///< --enable-lora: adapters may come later (runtime updates)
  bool runtime_updates = false;      ///< --allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING)
  size_t max_cpu_loras = 0;          ///< --max-cpu-loras: adapters loaded at once (0: model::lora_set's default)
  std::string dtype = "auto";        ///< --lora-dtype
  /// Whether runtime updates are allowed: the flag, or vLLM's environment variable set to
  /// true/1 (as vLLM reads it).
  bool updates_allowed() const {
    if (runtime_updates) return true;
    const char* v = std::getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING");
    if (!v) return false;
    std::string s(v);
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s == "1" || s == "true";
  }
  /// LoRA is on (and the replicas on the CPU): adapters given, or --enable-lora. Runtime updates
  /// need it, as vLLM's do: the environment variable alone moves nothing to the CPU.
  bool enabled() const { return !modules.empty() || enable; }
};

/// Adds --lora-modules (NAME=PATH or {"name": ..., "path": ...}, several after one flag or the
/// flag repeated), --enable-lora, --allow-runtime-lora-updating, --max-cpu-loras and (accepted)
/// --max-loras and --max-lora-rank to `sub`.
inline void add_lora_flags(CLI::App* sub, lora_flags& f) {
  sub->add_option("--lora-modules", f.modules,
                  "LoRA adapters (PEFT directories) served beside the model, each under its own model name: NAME=PATH ... "
                  "(CPU backend)");
  sub->add_flag("--enable-lora", f.enable, "vLLM's: serve LoRA adapters (implied by --lora-modules; CPU backend)");
  sub->add_flag("--allow-runtime-lora-updating", f.runtime_updates,
                "POST /v1/load_lora_adapter and /v1/unload_lora_adapter add and remove adapters while serving, with "
                "--enable-lora (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING=true does the same)");
  add_lora_dtype_flag(sub, f.dtype);
  sub->add_option("--max-cpu-loras", f.max_cpu_loras, "vLLM's: LoRA adapters loaded at once (0: 64; at least --lora-modules' count)")
      ->check(CLI::Range(size_t{0}, size_t{1} << 16));
  sub->add_option_function<size_t>("--max-loras", [](const size_t&) {},
                                   "vLLM's (adapters in one batch); accepted: here any number of adapters share a step");
  sub->add_option_function<size_t>("--max-lora-rank", [](const size_t&) {},
                                   "vLLM's; accepted: an adapter's rank is checked when it loads (at most 512)");
}

/// The adapters of --lora-modules, their names checked against each other and `base_name`.
[[nodiscard]] inline result<std::vector<model::lora_source>> lora_sources(const std::vector<std::string>& modules,
                                                                         const std::string& base_name) {
  std::vector<model::lora_source> out;
  for (const auto& m : modules) {
    auto s = model::parse_lora_source(m);
    if (!s) return s.take_error();
    out.push_back(std::move(*s));
  }
  LLMESH_TRY(model::check_lora_names(out, base_name));
  return out;
}

/// Refuses settings CLI11's ranges cannot see: a lookup whose shortest n-gram is above its longest.
[[nodiscard]] inline status check_speculation_flags(const actors::speculation_config& c) {
  if (c.min_n > c.max_n) return make_error(errc::invalid_request, "--prompt-lookup-min is above --prompt-lookup-max");
  return ok_status();
}

}  // namespace llmesh::cli
