// A replica's flags shared by `llmesh serve` and `llmesh node` (a replica node): speculative
// decoding (the same names as vLLM's ngram speculation settings) and weight quantization.
#pragma once

#include <CLI/CLI.hpp>

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
                  "CPU backend; about half the bytes per decode step of BF16)")
      ->check(CLI::IsMember({"none", "int8"}))
      ->capture_default_str();
}

/// Parses --quantization against --device before anything loads: int8 runs on the CPU only.
[[nodiscard]] inline result<model::quantization> quantization_for(const std::string& flag, model::backend device) {
  auto q = model::parse_quantization(flag);
  if (!q) return q.take_error();
  if (*q != model::quantization::none && device == model::backend::cuda) {
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
                  "so twice the context in --kv-cache-mb; CPU backend)")
      ->capture_default_str();
}

/// Parses --kv-cache-dtype against --device before anything loads: bfloat16 runs on the CPU only.
[[nodiscard]] inline result<kernels::dtype> kv_cache_dtype_for(const std::string& flag, model::backend device) {
  auto t = model::parse_kv_cache_dtype(flag);
  if (!t) return t.take_error();
  if (*t != kernels::dtype::f32 && device == model::backend::cuda) {
    return make_error(errc::unsupported, "--kv-cache-dtype " + flag + " runs on the CPU backend only (use --device cpu or auto)");
  }
  return t;
}

/// Adds vLLM's --lora-modules (NAME=PATH or {"name": ..., "path": ...}, several after one flag
/// or the flag repeated) and --enable-lora (vLLM needs it; here the adapters alone enable LoRA).
inline void add_lora_flags(CLI::App* sub, std::vector<std::string>& modules) {
  sub->add_option("--lora-modules", modules,
                  "LoRA adapters (PEFT directories) served beside the model, each under its own model name: NAME=PATH ... "
                  "(CPU backend)");
  sub->add_flag_function("--enable-lora", [](int64_t) {}, "Accepted for vLLM's command lines; --lora-modules is what enables adapters");
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
