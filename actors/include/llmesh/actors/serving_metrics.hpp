// The serving metrics of DESIGN.md §Metrics: their names and one function that declares them,
// so that the router, the request actors and the gateway record into the same families.
#pragma once

#include <string>

#include "llmesh/actors/metrics.hpp"

namespace llmesh::actors {
struct replica_times;
}

namespace llmesh::actors::metric {

inline constexpr const char* ttft = "llmesh_time_to_first_token_seconds";
inline constexpr const char* itl = "llmesh_inter_token_latency_seconds";
inline constexpr const char* e2e = "llmesh_e2e_request_latency_seconds";
/// A finished request's time on its replica (replica_times; vLLM's request_queue_time_seconds,
/// request_prefill_time_seconds, request_decode_time_seconds, request_inference_time_seconds).
inline constexpr const char* queue_time = "llmesh_request_queue_time_seconds";
inline constexpr const char* prefill_time = "llmesh_request_prefill_time_seconds";
inline constexpr const char* decode_time = "llmesh_request_decode_time_seconds";
inline constexpr const char* inference_time = "llmesh_request_inference_time_seconds";
inline constexpr const char* prompt_tokens = "llmesh_prompt_tokens_total";
/// Of those, the ones a replica's prefix cache held (the hit rate: this over prompt_tokens).
inline constexpr const char* prompt_tokens_cached = "llmesh_prompt_tokens_cached_total";
inline constexpr const char* generation_tokens = "llmesh_generation_tokens_total";
inline constexpr const char* requests = "llmesh_requests_total";  ///< label: status (HTTP code)
/// Generation and embedding requests the gateway accepted, by the model they name (a LoRA
/// adapter counts under its own name; vLLM's per-adapter view); label: model.
inline constexpr const char* model_requests = "llmesh_model_requests_total";
inline constexpr const char* running = "llmesh_requests_running";        ///< label: replica
inline constexpr const char* waiting = "llmesh_requests_waiting";        ///< label: replica
inline constexpr const char* kv_usage = "llmesh_kv_cache_usage_ratio";   ///< label: replica
/// KV blocks the router knows a replica's prefix cache holds, from its KV events (replicas it
/// asks for them: prefix-aware routing, models with prefill replicas); label: replica.
inline constexpr const char* kv_reported = "llmesh_router_cached_blocks";
inline constexpr const char* migrations = "llmesh_request_migrations_total";
inline constexpr const char* routed = "llmesh_replica_requests_total";  ///< label: replica
inline constexpr const char* replicas_ready = "llmesh_replicas_ready";
/// Speculative decoding (vLLM's spec_decode_num_draft_tokens / num_accepted_tokens); label: replica.
inline constexpr const char* spec_drafted = "llmesh_spec_decode_draft_tokens_total";
inline constexpr const char* spec_accepted = "llmesh_spec_decode_accepted_tokens_total";
/// Running requests a replica sent back to wait for KV blocks (vLLM's num_preemptions); label: replica.
inline constexpr const char* preemptions = "llmesh_preemptions_total";
/// Generations that ended, by why (vLLM's request_success; label finished_reason: stop — an end
/// id or a stop string — or length), and their sizes (vLLM's
/// request_prompt_tokens and request_generation_tokens histograms).
inline constexpr const char* request_success = "llmesh_request_success_total";
inline constexpr const char* request_prompt_tokens = "llmesh_request_prompt_tokens";
inline constexpr const char* request_generation_tokens = "llmesh_request_generation_tokens";
/// Disaggregated prefill: prompts a prefill replica computed for another, by outcome (moved: its
/// blocks went to the decode replica; fallback: none came — the prefill replica refused, failed
/// or died, or held no whole block — and the decode replica computed the prompt), and the bytes
/// of KV that moved.
inline constexpr const char* kv_transfers = "llmesh_kv_transfers_total";
inline constexpr const char* kv_transfer_bytes = "llmesh_kv_transfer_bytes_total";
/// Long prompts the router kept on their decode replica (label: reason — cached, queue, unavailable).
inline constexpr const char* prefill_local = "llmesh_prefill_local_total";
/// The receiving side (label: replica): KV blocks a replica took into its prefix cache, and
/// imports it refused (another block shape or KV dtype, a full cache: its request computed the
/// prompt) — a pair misconfigured shows here, not in kv_transfers.
inline constexpr const char* kv_imported = "llmesh_kv_imported_blocks_total";
inline constexpr const char* kv_refused = "llmesh_kv_import_refusals_total";
inline constexpr const char* gateway_inflight = "llmesh_gateway_requests_inflight";
/// The Responses API's state in the gateway: background runs live, stored responses and
/// conversations (with the bytes of JSON they hold).
inline constexpr const char* background_running = "llmesh_background_responses_running";
inline constexpr const char* stored_responses = "llmesh_stored_responses";
inline constexpr const char* stored_response_bytes = "llmesh_stored_responses_bytes";
inline constexpr const char* conversations = "llmesh_conversations";
inline constexpr const char* conversation_bytes = "llmesh_conversations_bytes";

/// Declares every family above in `r` (idempotent).
void declare_serving(metrics_registry& r);

/// Observes a generation's replica_times as its messages bring them: its first message's
/// (`first`: the generation's first, not a migrated one's first on another replica) queue and
/// prefill times, its last message's decode (inference - prefill) and inference times. A
/// generation a stop string ends before its last token (cancelled, no last message) has queue
/// and prefill times only.
/// Nothing in a registry without declare_serving's families.
void observe_replica_times(metrics_registry& r, const replica_times& t, bool first);

/// A generation that ended with `finished_reason` ("stop" or "length"), its prompt's and
/// its output's token counts. Nothing in a registry without declare_serving's families.
void observe_finished(metrics_registry& r, const std::string& finished_reason, size_t prompt_tokens, size_t generated);

}  // namespace llmesh::actors::metric
