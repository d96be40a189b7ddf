// Sends spans (tracing.hpp) to an OpenTelemetry collector over OTLP/HTTP — vLLM's
// --otlp-traces-endpoint — the way the OpenTelemetry SDKs' batch span processor does: spans
// queue (bounded; beyond it they are dropped and counted), a thread sends them in batches every
// schedule delay or as soon as a batch is full, retries a batch the collector may take later
// (no answer, 429, 502, 503, 504), and on shutdown sends what is queued within the export
// timeout (drops the rest). Protobuf (http/protobuf, the SDKs' default for HTTP) or JSON (http/json); http:// or
// https:// (the system's CAs, or OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE). gRPC is not spoken.
//
// Settings come from the endpoint and the OpenTelemetry SDK environment variables, each
// OTEL_EXPORTER_OTLP_TRACES_* before its OTEL_EXPORTER_OTLP_* twin: _PROTOCOL, _HEADERS
// ("k=v,k2=v2", values percent-decoded), _TIMEOUT (ms), _COMPRESSION (none only),
// _CERTIFICATE; OTEL_BSP_SCHEDULE_DELAY, OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE
// (ms, spans); OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES for the resource.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "llmesh/actors/metrics.hpp"
#include "llmesh/common/error.hpp"
#include "llmesh/gateway/tracing.hpp"

namespace llmesh::gateway {

struct otlp_options {
  std::string endpoint;               ///< as given
  bool tls = false;                   ///< https
  std::string host, port, target;     ///< where to POST (target: path and query)
  bool json = false;                  ///< http/json; false: http/protobuf
  std::vector<std::pair<std::string, std::string>> headers;
  std::string ca_file;                ///< https: the CAs to trust (empty: the system's)
  std::chrono::milliseconds timeout{10000};         ///< one export (connect to answer)
  std::chrono::milliseconds schedule_delay{5000};   ///< between exports
  size_t max_queue = 2048, max_batch = 512;
  trace_resource resource;
  /// Backoff before retrying a batch (doubled each time; the collector's Retry-After, at most
  /// 5 s, when it gives one), and how many tries a batch gets at most (a shutdown cuts them
  /// short: then a batch gets one try more at most, if its tries are not spent).
  std::chrono::milliseconds retry_backoff{500};
  int tries = 3;
};

/// Reads an environment variable; null when unset.
using env_reader = std::function<const char*(const char*)>;

/// The exporter's options for `endpoint` (http[s]://host[:port][/path]; no path: /v1/traces)
/// and the environment. Errors name the setting: a gRPC endpoint or protocol, a bad header
/// list, a number that is not one or out of range (delays and timeouts at most a day, queue
/// and batch at most 1 Mi spans), gzip compression, an https endpoint's CA file that does not load.
[[nodiscard]] result<otlp_options> otlp_options_from(const std::string& endpoint, const env_reader& env);

/// Thread affinity: record() from any thread; the rest from the owner's.
class otlp_exporter {
 public:
  /// Starts the sending thread. `metrics` (may be null; borrowed) gets
  /// llmesh_trace_spans_total{outcome="exported"|"dropped"|"failed"}.
  explicit otlp_exporter(otlp_options o, actors::metrics_registry* metrics = nullptr);
  /// shutdown().
  ~otlp_exporter();
  otlp_exporter(const otlp_exporter&) = delete;
  otlp_exporter& operator=(const otlp_exporter&) = delete;

  /// Queues a finished span (dropped and counted when max_queue are waiting or after shutdown).
  void record(span_record s);
  /// Sends what is queued — one try per batch, all within the export timeout from now (name
  /// resolution aside: getaddrinfo cannot be cut short) — and stops the thread. What is left
  /// at the deadline is dropped. Idempotent.
  void shutdown();

  struct totals {
    uint64_t exported = 0, dropped = 0, failed = 0;
  };
  totals counts() const;
  const otlp_options& options() const { return opt_; }

 private:
  void run();
  enum class sent { yes, failed, not_tried };
  /// One batch, with its retries (after shutdown() one more try at most, within the drain):
  /// taken, failed, or not tried at all (the drain's time was up).
  sent send(const std::vector<span_record>& batch);
  enum class outcome { exported, dropped, failed };
  void count(outcome o, uint64_t n);

  otlp_options opt_;
  actors::metrics_registry* metrics_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<span_record> queue_;
  bool stop_ = false;
  std::chrono::steady_clock::time_point drain_until_{};  ///< set by shutdown(): export timeout from then
  totals totals_;
  std::chrono::steady_clock::time_point last_failure_log_{};
  std::thread thread_;
};

}  // namespace llmesh::gateway
