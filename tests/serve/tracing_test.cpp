// vLLM's --otlp-traces-endpoint on `llmesh serve`, over real HTTP, against a stand-in
// collector (tests/otlp_collector.hpp): each completion or embedding request becomes one
// llm_request span — a child of the traceparent it sent, else the root of its own trace, none
// when the caller says "not sampled" — whose token counts and id are the response's; spans still
// queued when the server stops are sent before it exits; an endpoint it cannot speak to (gRPC)
// stops the start with a reason.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <optional>

#include "../cli/subprocess.hpp"
#include "../otlp_collector.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";
constexpr const char* kTrace = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr const char* kParentSpan = "00f067aa0ba902b7";

int64_t int_attr(const read_span& s, const std::string& key) { return std::get<int64_t>(s.attributes.at(key)); }

TEST(ServeTracing, RequestsBecomeSpansInTheirCallersTraces) {
  otlp_collector c;
  scoped_otel_env env{{"OTEL_BSP_SCHEDULE_DELAY", "50"}, {"OTEL_SERVICE_NAME", "serve-test"}};
  const auto before_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  server_process s(bin, {"--model", model_dir, "--otlp-traces-endpoint", c.url("")});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_NE(s.log().find("tracing: a span per request to " + c.url("")), std::string::npos) << s.log();

  // A caller's trace: the span is its child.
  const json body = {{"model", "kjv-tiny"}, {"prompt", "In the beginning"}, {"max_tokens", 4}, {"n", 2},
                     {"temperature", 0.5}, {"top_p", 0.9}, {"seed", 3}, {"ignore_eos", true}};
  auto traced = http_request(s.port(), "POST", "/v1/completions", body.dump(),
                             std::string("traceparent: 00-") + kTrace + "-" + kParentSpan + "-01\r\ntracestate: v=1\r\n");
  ASSERT_EQ(traced.status, 200) << traced.body;
  const json tr = json::parse(traced.body);
  // No traceparent, streamed: a trace of its own.
  json streamed = {{"model", "kjv-tiny"}, {"prompt", "And God said"}, {"max_tokens", 3}, {"stream", true},
                   {"ignore_eos", true}, {"stream_options", {{"include_usage", true}}}};
  auto st = http_request(s.port(), "POST", "/v1/completions", streamed.dump());
  ASSERT_EQ(st.status, 200) << st.body;
  const auto events = sse_payloads(st.body);
  ASSERT_GE(events.size(), 2u);
  const json usage_chunk = json::parse(events[events.size() - 2]);
  // An embedding request is traced too.
  auto emb = http_request(s.port(), "POST", "/v1/embeddings", json({{"model", "kjv-tiny"}, {"input", "light"}}).dump());
  ASSERT_EQ(emb.status, 200) << emb.body;
  // Not recorded: a caller that says "not sampled", and a request refused before it ran.
  auto unsampled = http_request(s.port(), "POST", "/v1/completions", body.dump(),
                                "traceparent: 00-11111111111111111111111111111111-2222222222222222-00\r\n");
  ASSERT_EQ(unsampled.status, 200);
  auto refused = http_request(s.port(), "POST", "/v1/completions", R"({"model": "kjv-tiny", "prompt": "x", "max_tokens": -1})");
  ASSERT_EQ(refused.status, 400);
  // Two traceparent fields: no parent (W3C), so a trace of its own.
  const json one = {{"model", "kjv-tiny"}, {"prompt", "Let there be"}, {"max_tokens", 2}, {"temperature", 0},
                    {"ignore_eos", true}};
  auto doubled = http_request(s.port(), "POST", "/v1/completions", one.dump(),
                              std::string("traceparent: 00-") + kTrace + "-" + kParentSpan + "-01\r\n" +
                                  "traceparent: 00-22222222222222222222222222222222-3333333333333333-01\r\n");
  ASSERT_EQ(doubled.status, 200) << doubled.body;
  // A stop string (a space, within 12 tokens of this text): the gateway cancels the generation,
  // whose replica then sends no last message.
  const json stopped_body = {{"model", "kjv-tiny"}, {"prompt", "And the earth was"}, {"max_tokens", 12}, {"stop", " "}, {"temperature", 0}};
  auto stopped = http_request(s.port(), "POST", "/v1/completions", stopped_body.dump());
  ASSERT_EQ(stopped.status, 200) << stopped.body;
  const json stopped_json = json::parse(stopped.body);
  // Ended by the stop string before its last token (a stop on the replica's last token would
  // come after that token's message, which carries the decode time).
  ASSERT_EQ(stopped_json["choices"][0]["finish_reason"], "stop") << stopped.body;
  ASSERT_LT(stopped_json["usage"]["completion_tokens"].get<int64_t>(), 11) << stopped.body;
  const bool by_stop = true;

  ASSERT_TRUE(wait_spans(c, 5)) << s.log();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // nothing more is to come
  const auto spans = spans_of(c);
  ASSERT_EQ(spans.size(), 5u) << "the unsampled and the refused request leave no span";
  const auto r0 = pb_read_traces(c.posts().at(0).body);
  EXPECT_EQ(std::get<std::string>(r0.resource.at("service.name")), "serve-test");

  const read_span* a = span_with(spans, tr["id"]);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->name, "llm_request");
  EXPECT_EQ(a->kind, 2u);
  EXPECT_EQ(a->trace_id, kTrace);
  EXPECT_EQ(a->parent_span_id, kParentSpan);
  EXPECT_EQ(a->trace_state, "v=1");
  EXPECT_EQ(int_attr(*a, "gen_ai.usage.prompt_tokens"), tr["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(int_attr(*a, "gen_ai.usage.completion_tokens"), tr["usage"]["completion_tokens"].get<int64_t>());
  EXPECT_EQ(int_attr(*a, "gen_ai.usage.completion_tokens"), 8);  // 2 choices of 4, EOS ignored
  EXPECT_EQ(int_attr(*a, "gen_ai.usage.num_sequences"), 2);
  EXPECT_EQ(int_attr(*a, "gen_ai.request.n"), 2);
  EXPECT_EQ(int_attr(*a, "gen_ai.request.max_tokens"), 4);
  EXPECT_NEAR(std::get<double>(a->attributes.at("gen_ai.request.temperature")), 0.5, 1e-6);
  EXPECT_NEAR(std::get<double>(a->attributes.at("gen_ai.request.top_p")), 0.9, 1e-6);
  EXPECT_EQ(std::get<std::string>(a->attributes.at("gen_ai.response.model")), "kjv-tiny");
  EXPECT_EQ(std::get<std::string>(a->attributes.at("gen_ai.operation.name")), "text_completion");
  EXPECT_EQ(std::get<std::string>(a->attributes.at("url.path")), "/v1/completions");
  EXPECT_EQ(int_attr(*a, "http.response.status_code"), 200);
  const double ttft = std::get<double>(a->attributes.at("gen_ai.latency.time_to_first_token"));
  const double e2e = std::get<double>(a->attributes.at("gen_ai.latency.e2e"));
  EXPECT_GT(ttft, 0.0);
  EXPECT_LE(ttft, e2e);
  // Its time on the replica (the slower choice's): queued, then prefill and decode within the inference.
  const double queued = std::get<double>(a->attributes.at("gen_ai.latency.time_in_queue"));
  const double prefill = std::get<double>(a->attributes.at("gen_ai.latency.time_in_model_prefill"));
  const double decode = std::get<double>(a->attributes.at("gen_ai.latency.time_in_model_decode"));
  const double inference = std::get<double>(a->attributes.at("gen_ai.latency.time_in_model_inference"));
  EXPECT_GE(queued, 0.0);
  EXPECT_GT(prefill, 0.0);
  EXPECT_GT(decode, 0.0);  // three more tokens after the first
  EXPECT_LE(prefill, inference);
  EXPECT_LE(queued + inference, e2e);  // one generation's times, within the request's
  EXPECT_GE(a->start_ns, before_ns);
  EXPECT_NEAR(static_cast<double>(a->end_ns - a->start_ns) * 1e-9, e2e, 1e-3);
  EXPECT_EQ(a->status_code, 0u);

  const read_span* b = span_with(spans, json::parse(events.front())["id"]);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->parent_span_id, "");
  EXPECT_NE(b->trace_id, kTrace);
  EXPECT_EQ(b->trace_id.size(), 32u);
  EXPECT_EQ(int_attr(*b, "gen_ai.usage.completion_tokens"), usage_chunk["usage"]["completion_tokens"].get<int64_t>());
  EXPECT_EQ(int_attr(*b, "gen_ai.usage.prompt_tokens"), usage_chunk["usage"]["prompt_tokens"].get<int64_t>());

  const read_span* e = span_with(spans, json::parse(emb.body)["id"]);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(std::get<std::string>(e->attributes.at("gen_ai.operation.name")), "embeddings");
  EXPECT_EQ(int_attr(*e, "gen_ai.usage.prompt_tokens"), json::parse(emb.body)["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(e->attributes.count("gen_ai.latency.time_to_first_token"), 0u);
  const read_span* d = span_with(spans, json::parse(doubled.body)["id"]);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->parent_span_id, "");
  EXPECT_NE(d->trace_id, kTrace);
  EXPECT_GT(std::get<double>(e->attributes.at("gen_ai.latency.time_in_model_inference")), 0.0);

  // The exporter counts a batch once the collector's answer is read: a moment after the POST.
  http_response metrics;
  for (int i = 0; i < 200; ++i) {
    metrics = http_request(s.port(), "GET", "/metrics");
    if (metrics.body.find("llmesh_trace_spans_total{outcome=\"exported\"} 5") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(metrics.body.find("llmesh_trace_spans_total{outcome=\"exported\"} 5"), std::string::npos) << metrics.body;
  // vLLM's per-request replica times, traced or not: queue and prefill for every generation
  // or pooled input (2 + 1 + 2 + 1 + 1 completions' choices, 1 embedding), decode and inference
  // for those the replica ended (all but one a stop string ended).
  for (const char* h : {"queue_time", "prefill_time"}) {
    EXPECT_NE(metrics.body.find("llmesh_request_" + std::string(h) + "_seconds_count 8"), std::string::npos) << h << metrics.body;
  }
  const std::string ended = by_stop ? "7" : "8";
  for (const char* h : {"decode_time", "inference_time"}) {
    EXPECT_NE(metrics.body.find("llmesh_request_" + std::string(h) + "_seconds_count " + ended), std::string::npos) << h << metrics.body;
  }
  // Generations that ended, by why (vLLM's request_success), and their sizes: every choice above
  // ran to max_tokens (ignore_eos) but the one the stop string ended.
  EXPECT_NE(metrics.body.find("llmesh_request_success_total{finished_reason=\"stop\"} 1"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("llmesh_request_success_total{finished_reason=\"length\"} 6"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("llmesh_request_generation_tokens_count 7"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("llmesh_request_prompt_tokens_count 7"), std::string::npos) << metrics.body;
}

TEST(ServeTracing, SpansStillQueuedAreSentWhenTheServerStops) {
  otlp_collector c;
  // A minute between exports: the span is still queued when the server is told to stop.
  scoped_otel_env env{{"OTEL_BSP_SCHEDULE_DELAY", "60000"}};
  server_process s(bin, {"--model", model_dir, "--otlp-traces-endpoint", c.url()});
  ASSERT_GT(s.port(), 0) << s.log();
  auto r = http_request(s.port(), "POST", "/v1/completions",
                        json({{"model", "kjv-tiny"}, {"prompt", "In the"}, {"max_tokens", 2}}).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(spans_of(c).empty());
  EXPECT_EQ(s.stop(), 0) << s.log();
  const auto spans = spans_of(c);
  ASSERT_EQ(spans.size(), 1u) << s.log();
  EXPECT_NE(span_with(spans, json::parse(r.body)["id"]), nullptr);
}

TEST(ServeTracing, AnEndpointItCannotSpeakToStopsTheStart) {
  scoped_otel_env env{};
  const auto grpc = run_command(bin + " serve --model " + model_dir + " --http 127.0.0.1:0 --rpc none --otlp-traces-endpoint grpc://localhost:4317");
  EXPECT_NE(grpc.exit_code, 0);
  EXPECT_NE(grpc.err.find("OTLP over HTTP"), std::string::npos) << grpc.err;
  const auto gzip = run_command("OTEL_EXPORTER_OTLP_COMPRESSION=gzip " + bin + " serve --model " + model_dir +
                                " --http 127.0.0.1:0 --rpc none --otlp-traces-endpoint http://localhost:4318");
  EXPECT_NE(gzip.exit_code, 0);
  EXPECT_NE(gzip.err.find("OTEL_EXPORTER_OTLP_COMPRESSION=gzip: compression is not supported"), std::string::npos) << gzip.err;
}

}  // namespace
}  // namespace llmesh::testing
