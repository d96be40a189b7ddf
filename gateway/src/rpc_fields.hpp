// The native API's messages beside the HTTP API's (private to the gateway): a GenerateRequest's
// fields beyond sampling as /v1/completions' JSON for apply_extra_fields (the HTTP API's checks
// and messages), and a token's log-probability entry as rpc.capnp's TokenLogprob.
#pragma once

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/detokenizer.hpp"
#include "llmesh/schemas/rpc.capnp.h"

namespace llmesh::gateway {

/// One token's log-probability entry (rpc.capnp's TokenLogprob).
void set_logprob(rpc::TokenLogprob::Builder out, int32_t id, const kernels::token_logprobs& lp, const model::detokenizer& d);

/// A request's fields beyond sampling, in /v1/completions' names for apply_extra_fields (the
/// HTTP API's checks and error messages); an error for what JSON cannot say (a bias's id twice).
/// `max_logprobs`: the server's bound (--max-logprobs).
[[nodiscard]] result<nlohmann::ordered_json> extra_fields(rpc::GenerateRequest::Reader in, int max_logprobs);

}  // namespace llmesh::gateway
