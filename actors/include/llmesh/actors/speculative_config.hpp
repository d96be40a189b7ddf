// vLLM's speculative_config (`--speculative-config` JSON, a cluster config model's
// `speculative_config`): prompt lookup ("ngram") or a draft model, parsed into the scheduler's
// speculation settings and the draft model's directory.
#pragma once

#include <string>

#include "llmesh/actors/ngram_proposer.hpp"
#include "llmesh/common/error.hpp"

namespace llmesh::actors {

/// Prompt lookup: method "ngram" (or left out without a model), num_speculative_tokens,
/// prompt_lookup_max, prompt_lookup_min and disable_by_batch_size set `c`. A draft model:
/// "model" names its directory (method "draft_model" or left out), with num_speculative_tokens
/// (required), disable_by_batch_size and draft_tensor_parallel_size 1; `draft_model` receives
/// the directory (cleared otherwise). Another method (EAGLE, Medusa, MTP) or key is refused by
/// name, errors start with `flag`, and nothing changes.
[[nodiscard]] status apply_speculative_config(const std::string& json_text, speculation_config& c, std::string& draft_model,
                                              const std::string& flag = "--speculative-config");

}  // namespace llmesh::actors
