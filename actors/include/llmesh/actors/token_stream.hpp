// What flows back to whoever submitted a request: one token_msg per generated token, the last
// one carrying the finish reason, or a single failed one. Plain structs (no CAF): the gateway
// sees only these and mesh_client.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "llmesh/actors/batch_scheduler.hpp"
#include "llmesh/common/error.hpp"
#include "llmesh/kernels/sampling.hpp"

namespace llmesh::actors {

/// A token for the request `id` (or its end: finish != none; or a failure: failed set).
struct token_msg {
  uint64_t id = 0;
  int32_t token = -1;
  finish_reason finish = finish_reason::none;
  bool failed = false;
  error err;  ///< when failed
  /// The token's log-probabilities, when the request asked for them (sampling.logprobs >= 0).
  std::optional<kernels::token_logprobs> logprobs;
  /// With the request's first token, when it asked (sampling.prompt_logprobs >= 0): entry i is
  /// prompt token i + 1's log-probability and alternatives.
  std::vector<kernels::token_logprobs> prompt_logprobs;
  /// With the request's first token: how many of the request's tokens the replica's prefix cache
  /// held (OpenAI's usage.prompt_tokens_details.cached_tokens); -1 otherwise.
  int32_t cached_tokens = -1;
  /// An embedding request's end (replica_request::pool): its pooled hidden state.
  std::vector<float> embedding = {};
  /// The request's time on the replica that runs it (batch_scheduler.hpp's replica_times): queued
  /// and prefill with its first token, all three with its last; -1 otherwise.
  replica_times times = {};
};

/// Receives a request's stream. Called on an actor's thread, one call at a time per request,
/// in order; the call after which nothing more comes is the one with `finish != none` or
/// `failed`.
using token_sink = std::function<void(const token_msg&)>;

}  // namespace llmesh::actors
