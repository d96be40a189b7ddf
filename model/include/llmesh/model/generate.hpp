// The reference generation loop over an engine: prefill (whole or in chunks), then decode
// token by token with deterministic sampling. `llmesh generate` and the tests use it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/engine.hpp"

namespace llmesh::model {

struct generate_request {
  std::vector<int32_t> prompt;
  size_t max_tokens = 16;
  kernels::sampling_params sampling;   ///< seed included: the caller picks one if the user did not;
                                       ///< penalties count the prompt and output tokens
  std::vector<int32_t> stop_ids;       ///< generation ends after emitting one of these (never
                                       ///< before sampling.min_tokens tokens: they are banned)
  size_t prefill_chunk = 0;            ///< 0: the whole prompt in one step
  std::vector<kernels::token_bias> logit_bias;  ///< added to these logits before every draw
  int32_t lora = -1;                            ///< the LoRA adapter (an id in model::loras(); -1: none)
};

struct generate_result {
  std::vector<int32_t> tokens;
  std::vector<float> first_logits;  ///< logits after the last prompt token
  std::string finish_reason;        ///< "length" or "stop"
  double prefill_seconds = 0, decode_seconds = 0;
};

/// Generates on a fresh sequence of `eng` and closes it afterwards. on_token (optional) sees
/// each token as it is produced.
[[nodiscard]] result<generate_result> generate(engine& eng, const generate_request& req,
                                               const std::function<void(int32_t)>& on_token = {});

}  // namespace llmesh::model
