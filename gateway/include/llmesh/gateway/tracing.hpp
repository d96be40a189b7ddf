// OpenTelemetry tracing's plain parts (vLLM's --otlp-traces-endpoint): the W3C Trace Context
// a request brings (its traceparent and tracestate headers), the span the gateway records for
// a request it ran, and that span's OTLP encodings — protobuf (OTLP/HTTP's default,
// application/x-protobuf) and JSON (application/json) — of an ExportTraceServiceRequest.
// Written by hand: Debian 12 packages no OpenTelemetry C++ SDK. The exporter that sends them
// is otlp_exporter.hpp.
//
// References: W3C Trace Context (traceparent: version-traceid-parentid-flags, lowercase hex);
// opentelemetry-proto's trace/v1/trace.proto, common/v1/common.proto, resource/v1/resource.proto
// (field numbers below), and OTLP's JSON mapping (trace and span ids as hex, 64-bit integers as
// decimal strings, enums as numbers).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace llmesh::actors {
struct replica_times;
}

namespace llmesh::gateway {

using trace_id = std::array<uint8_t, 16>;
using span_id = std::array<uint8_t, 8>;

/// A remote parent: what a request's traceparent (and tracestate) header said.
struct trace_parent {
  trace_id trace{};
  span_id span{};
  uint8_t flags = 0;        ///< bit 0: sampled
  std::string state = {};   ///< tracestate, as sent (at most 512 bytes kept; longer: dropped)
  bool sampled() const { return (flags & 1) != 0; }
};

/// The traceparent header parsed, W3C's rules: version 2 hex digits, not "ff"; version 00 is
/// exactly 55 characters, a later version at least that with '-' after the flags; ids lowercase
/// hex, neither all zeros. nullopt: invalid (the request then starts a trace of its own, as
/// W3C asks). `state`: the tracestate header, kept only with a valid traceparent.
std::optional<trace_parent> parse_traceparent(std::string_view header, std::string_view state = {});

/// Lowercase hex of ids.
std::string to_hex(const trace_id& id);
std::string to_hex(const span_id& id);

using attribute_value = std::variant<std::string, int64_t, double, bool>;
struct attribute {
  std::string key;
  attribute_value value;
};

/// OTLP's Span.SpanKind and Status.StatusCode.
enum class span_kind : int { internal = 1, server = 2, client = 3 };
enum class span_status : int { unset = 0, ok = 1, error = 2 };

/// One finished span.
struct span_record {
  trace_id trace{};
  span_id span{};
  span_id parent{};  ///< all zeros: a root span
  std::string trace_state = {};
  std::string name;
  span_kind kind = span_kind::server;
  uint64_t start_unix_ns = 0, end_unix_ns = 0;
  std::vector<attribute> attributes = {};
  span_status status = span_status::unset;
  std::string status_message = {};  ///< with status error
  uint8_t flags = 1;                ///< the W3C trace flags (sampled)
};

/// Fresh ids (random, never all zeros) for a span of its own trace or of `parent`'s.
class span_ids {
 public:
  span_ids();
  trace_id new_trace();
  span_id new_span();

 private:
  std::mt19937_64 rng_;
};

/// What the gateway knows of a request it ran (a generation or pooling job): its span's
/// attributes. Unknown numbers are negative (left out).
struct request_facts {
  std::string id;         ///< the response id ("cmpl-…", "chatcmpl-…", "embd-…")
  std::string model;      ///< the served model's name the request used
  std::string operation;  ///< gen_ai.operation.name: chat, text_completion, embeddings
  std::string method = "POST", path;  ///< HTTP's (empty: left out)
  std::string rpc_method = {};        ///< the native API's call (rpc.system "capnp", rpc.method)
  bool cancelled = false;             ///< the client dropped the call (llmesh.cancelled; not an error)
  int64_t max_tokens = -1, n = -1;
  double temperature = -1, top_p = -1;
  int64_t prompt_tokens = -1, completion_tokens = -1, sequences = -1;
  double ttft_s = -1, e2e_s = -1;
  /// Its time on the replica (its slowest generation's, all from that one): queued before its
  /// first scheduling, then prefill to its first token, decode to its last, inference the two
  /// together. A generation a stop string ended before its last token (the gateway cancels it)
  /// has no decode or inference time; a beam search's none at all.
  double queue_s = -1, prefill_s = -1, decode_s = -1, inference_s = -1;
  int http_status = 0;
  std::string error = {};  ///< why it failed (the span's status is then error)
};

/// The span of a request: vLLM's "llm_request" (kind server) with vLLM's gen_ai.* attribute
/// names (gen_ai.request.id, .max_tokens, .temperature, .top_p, .n; gen_ai.response.model;
/// gen_ai.usage.prompt_tokens, .completion_tokens, .num_sequences; gen_ai.latency.e2e,
/// .time_to_first_token, .time_in_queue, .time_in_model_prefill, .time_in_model_decode,
/// .time_in_model_inference in seconds), OpenTelemetry's GenAI and HTTP names beside them
/// (gen_ai.operation.name, gen_ai.request.model, gen_ai.response.id, gen_ai.usage.input_tokens,
/// .output_tokens, http.request.method, url.path, http.response.status_code; for a native-API
/// call rpc.system "capnp" and rpc.method, and llmesh.cancelled when its client dropped it). A
/// child of `parent`'s span in its trace, or the root of a new trace.
span_record request_span(const request_facts& f, const std::optional<trace_parent>& parent, span_ids& ids,
                         uint64_t start_unix_ns, uint64_t end_unix_ns);

/// A request's span in the making (the HTTP server's and the native API's alike): when it came,
/// its remote parent, when its first token came, and what is known of it so far.
struct request_trace {
  std::chrono::system_clock::time_point arrived = std::chrono::system_clock::now();
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  std::optional<trace_parent> parent;
  std::optional<std::chrono::steady_clock::time_point> first_token;
  request_facts facts;

  /// A token came (the first one sets the time to first token).
  void saw_token() {
    if (!first_token) first_token = std::chrono::steady_clock::now();
  }
  /// The span, ending now: facts plus the time to first token, end to end, and `rt` (the
  /// request's slowest generation's replica times) as queue, prefill, decode and inference.
  span_record finish(const actors::replica_times& rt, span_ids& ids);
};

/// The process the spans come from (OTLP's Resource) and the library that made them
/// (InstrumentationScope).
struct trace_resource {
  std::vector<attribute> attributes;  ///< service.name first
  std::string scope_name = "llmesh.gateway";
  std::string scope_version;
};

/// An ExportTraceServiceRequest holding `spans` in one ResourceSpans: protobuf bytes.
std::string otlp_protobuf(const trace_resource& resource, const std::vector<span_record>& spans);
/// The same request in OTLP's JSON mapping.
std::string otlp_json(const trace_resource& resource, const std::vector<span_record>& spans);

}  // namespace llmesh::gateway
