// The serving metric families (serving_metrics.hpp).
#include "llmesh/actors/serving_metrics.hpp"

#include <algorithm>

#include "llmesh/actors/batch_scheduler.hpp"

namespace llmesh::actors::metric {

void declare_serving(metrics_registry& r) {
  const auto lat = metrics_registry::latency_buckets();
  r.declare_histogram(ttft, "Time from request arrival to its first token.", lat);
  r.declare_histogram(itl, "Time between consecutive tokens of a stream.", lat);
  r.declare_histogram(e2e, "Time from request arrival to its last token.", lat);
  r.declare_histogram(queue_time, "Time a request waited at its replica before it was first scheduled.", lat);
  r.declare_histogram(prefill_time, "Time from a request's first scheduling to its first token.", lat);
  r.declare_histogram(decode_time, "Time from a request's first token to its last.", lat);
  r.declare_histogram(inference_time, "Time from a request's first scheduling to its last token (prefill + decode).", lat);
  r.declare_counter(prompt_tokens, "Prompt tokens of admitted requests.");
  r.declare_counter(prompt_tokens_cached, "Prompt tokens a replica's prefix cache held (not computed again).");
  r.declare_counter(generation_tokens, "Tokens generated.");
  r.declare_counter(requests, "Finished HTTP requests by status code.", {"status"});
  r.declare_counter(model_requests, "Requests accepted, by the model (or LoRA adapter) they name.", {"model"});
  r.declare_gauge(running, "Requests in the replica's running batch.", {"replica"});
  r.declare_gauge(waiting, "Requests queued at the replica.", {"replica"});
  r.declare_gauge(kv_usage, "Fraction of the replica's KV-cache blocks held by requests.", {"replica"});
  r.declare_gauge(kv_reported, "KV blocks the router knows the replica's prefix cache holds (its KV events).", {"replica"});
  r.declare_counter(migrations, "Requests moved to another replica after theirs failed.");
  r.declare_counter(routed, "Requests (and migrated continuations) the router sent to the replica.", {"replica"});
  r.declare_gauge(replicas_ready, "Replicas ready to take requests.");
  r.declare_counter(spec_drafted, "Speculative decoding: draft tokens the replica ran.", {"replica"});
  r.declare_counter(spec_accepted, "Speculative decoding: draft tokens the model drew as proposed (kept).", {"replica"});
  r.declare_counter(preemptions, "Running requests the replica sent back to wait for KV-cache blocks.", {"replica"});
  r.declare_counter(request_success, "Generations that ended, by the finish reason their response gives.", {"finished_reason"});
  // 1, 2, 5, 10, ... 5M tokens (vLLM's 1-2-5 buckets).
  std::vector<double> sizes;
  for (double d = 1; d <= 1e6; d *= 10) {
    for (double m : {1.0, 2.0, 5.0}) sizes.push_back(d * m);
  }
  r.declare_histogram(request_prompt_tokens, "Prompt tokens of each generation that ended.", sizes);
  r.declare_histogram(request_generation_tokens, "Tokens each generation that ended produced.", sizes);
  r.declare_counter(kv_transfers, "Disaggregated prefill: prompts a prefill replica computed for another, by outcome (moved: its blocks were sent on).", {"outcome"});
  r.declare_counter(kv_transfer_bytes, "Disaggregated prefill: bytes of KV blocks moved to decode replicas.");
  r.declare_counter(prefill_local,
                    "Disaggregated prefill: prompts over the length limit the router left to their decode replica, by reason "
                    "(cached: it holds enough of the prompt; queue: the prefill replicas are busy; unavailable: none is ready).",
                    {"reason"});
  r.declare_counter(kv_imported, "Disaggregated prefill: KV blocks the replica took into its prefix cache.", {"replica"});
  r.declare_counter(kv_refused, "Disaggregated prefill: KV imports the replica refused (its request computed the prompt).",
                    {"replica"});
  r.declare_gauge(gateway_inflight, "Generation requests the gateway is serving.");
  r.declare_gauge(background_running, "Background responses running (the Responses API's background mode).");
  r.declare_gauge(stored_responses, "Responses the gateway keeps for previous_response_id and GET.");
  r.declare_gauge(stored_response_bytes, "Bytes of JSON the stored responses take.");
  r.declare_gauge(conversations, "Conversations the gateway keeps (the Conversations API).");
  r.declare_gauge(conversation_bytes, "Bytes of JSON the conversations take.");
  // Unlabelled series exist from the start (a scrape before the first request sees zeros).
  for (const char* name : {prompt_tokens, prompt_tokens_cached, generation_tokens, migrations, kv_transfer_bytes}) {
    r.get_counter(name)->add(0);
  }
  for (const char* name : {ttft, itl, e2e, queue_time, prefill_time, decode_time, inference_time, request_prompt_tokens,
                           request_generation_tokens}) {
    r.get_histogram(name);
  }
  for (const char* name : {gateway_inflight, background_running, stored_responses, stored_response_bytes, conversations,
                           conversation_bytes}) {
    r.get_gauge(name)->add(0);
  }
}

void observe_replica_times(metrics_registry& r, const replica_times& t, bool first) {
  const auto observe = [&r](const char* name, int64_t us) {
    if (auto* h = r.get_histogram(name)) h->observe(1e-6 * static_cast<double>(us));
  };
  if (first && t.queued_us >= 0 && t.prefill_us >= 0) {
    observe(queue_time, t.queued_us);
    observe(prefill_time, t.prefill_us);
  }
  if (t.prefill_us >= 0 && t.inference_us >= 0) {
    observe(decode_time, std::max<int64_t>(0, t.inference_us - t.prefill_us));
    observe(inference_time, t.inference_us);
  }
}

void observe_finished(metrics_registry& r, const std::string& finished_reason, size_t prompt_tokens, size_t generated) {
  if (auto* c = r.get_counter(request_success, {finished_reason})) c->add();
  if (auto* h = r.get_histogram(request_prompt_tokens)) h->observe(static_cast<double>(prompt_tokens));
  if (auto* h = r.get_histogram(request_generation_tokens)) h->observe(static_cast<double>(generated));
}

}  // namespace llmesh::actors::metric
