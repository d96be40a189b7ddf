// vLLM's `serve` flags about the model and the engine that map onto llmesh (--tokenizer,
// --load-format, --task/--runner/--convert, --tokenizer-mode, --pipeline-parallel-size, --calculate-kv-scales,
// --override-generation-config, --speculative-config, --hf-overrides, --config FILE), and those naming what it
// always does or what a local model never needs, accepted so that a vLLM command line runs
// unchanged. What llmesh cannot do is refused by name, never silently dropped.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "llmesh/actors/ngram_proposer.hpp"
#include "llmesh/actors/speculative_config.hpp"
#include "llmesh/common/error.hpp"
#include "llmesh/model/config.hpp"

namespace llmesh::cli {

struct vllm_model_flags {
  std::string tokenizer;  ///< --tokenizer DIR: the tokenizer and chat template from there ("": the model's)
  std::string tokenizer_mode = "auto", load_format = "auto";
  std::string task = "auto", runner = "auto", convert = "auto";
  int pipeline_parallel_size = 1;
  bool calculate_kv_scales = false;  ///< refused: scales from a replica's first batch would differ between replicas
  std::string distributed_executor_backend = "mp";
  std::string override_generation_config;  ///< JSON object
  std::string speculative_config;          ///< JSON object
  std::string hf_overrides;                ///< JSON object over config.json (model::apply_hf_overrides)
  std::string rope_scaling;                ///< vLLM's --rope-scaling: a JSON object, config.json's rope_scaling
  std::string rope_theta;                  ///< vLLM's --rope-theta: a positive number ("": the model's)
  std::string pooler_config;               ///< JSON object (gateway::parse_pooler_config)
};

/// Adds the flags above and the accepted ones to `sub`, and --config for its help.
void add_vllm_model_flags(CLI::App* sub, vllm_model_flags& f);

/// vLLM's --config FILE: `args` (the command's name, then its arguments) with --config FILE
/// replaced by the YAML map's flags (keys with - or _; a list: the flag once per item; a map:
/// its JSON), put ahead of the command line's, whose own flags win (a key it names is skipped;
/// the last of two values wins). Without --config: `args` unchanged. Errors name the file.
[[nodiscard]] result<std::vector<std::string>> expand_config_file(std::vector<std::string> args);

/// Refuses what llmesh does not do (a load format other than safetensors or GGUF, or one the
/// model path is not; pipeline parallelism; a task other than generation and embeddings; the
/// mistral tokenizer), naming the flag. `model_path`: the model directory or GGUF file.
[[nodiscard]] status check_vllm_model_flags(const vllm_model_flags& f, const std::string& model_path);

/// --hf-overrides with --rope-scaling and --rope-theta folded in (they win over its keys, as in
/// vLLM): what model::load takes. invalid_request naming the flag for a malformed value.
[[nodiscard]] result<std::string> effective_hf_overrides(const vllm_model_flags& f);

/// --task/--runner/--convert against the loaded model: a sequence classifier refuses generate
/// and embed; any other model refuses classify (score is either's: a cross-encoder's, or over
/// embeddings).
[[nodiscard]] status check_vllm_task(const vllm_model_flags& f, const model::model_config& c);

/// vLLM's --speculative-config JSON (actors/speculative_config.hpp).
using actors::apply_speculative_config;

/// The directory the tokenizer and chat template come from: --tokenizer's, else the model's.
inline const std::string& tokenizer_dir(const vllm_model_flags& f, const std::string& model_path) {
  return f.tokenizer.empty() ? model_path : f.tokenizer;
}

}  // namespace llmesh::cli
