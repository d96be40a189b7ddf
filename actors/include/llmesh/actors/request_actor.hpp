// The request actor (CAF): one per client request, a thin shell over request_tracker. It asks
// the router for a replica, submits the request there, monitors it, and passes every token to
// the client's sink. When its replica dies (a down message, or a failed token saying the
// replica or a shard is gone) it asks the router again with the prompt plus the tokens already
// streamed — the client sees one unbroken stream. It ends after the last token, a failure, or
// a cancel (the client went away: the replica frees the sequence at its next step).
// Disaggregated prefill: when the router names a prefill replica for a long prompt, the request
// goes there first; the prompt's blocks it answers with go to the request's replica just before
// the request itself (in that order, so they are in its prefix cache when it is admitted). If
// none come in time — a refusal, a failure, its death, prefill_timeout — the request's replica
// computes the prompt.
#pragma once

#include <caf/all.hpp>
#include <optional>

#include "llmesh/actors/metrics.hpp"
#include "llmesh/actors/replica_core.hpp"
#include "llmesh/actors/request_tracker.hpp"
#include "llmesh/actors/token_stream.hpp"

namespace llmesh::actors {

struct request_options {
  caf::actor router;
  size_t max_migrations = 3;
  std::chrono::milliseconds route_timeout{10000};
  metrics_registry* metrics = nullptr;  ///< optional: counts migrations
  /// Disaggregated prefill: a prefill replica's blocks not here by then, the request's replica
  /// computes the prompt (a frame the mesh dropped must not hold a request forever).
  std::chrono::milliseconds prefill_timeout{60000};
};

struct request_state {
  std::unique_ptr<request_tracker> tracker;
  token_sink sink;
  request_options opt;
  caf::actor replica;  ///< where the request runs now (invalid while routing)
  caf::actor prefill;  ///< the replica computing its prompt first (invalid: none, or done)
  std::optional<replica_request> held;  ///< the request while its prefill runs
  uint64_t prefill_attempt = 0;         ///< which prefill a timeout is for
  bool cancelled = false;
  static inline const char* name = "request";
};

/// Spawned per request; `(cancel_atom)` cancels it. The sink sees the tokens, then exactly one
/// final message (finish set, or failed: no replica, migrations spent, or refused).
caf::behavior request_actor(caf::stateful_actor<request_state>* self, replica_request req, token_sink sink,
                            request_options opt);

}  // namespace llmesh::actors
