// Tracing's plain parts (tracing.hpp) and the OTLP/HTTP exporter (otlp_exporter.hpp) against a
// stand-in collector (tests/otlp_collector.hpp, which reads the protobuf on its own).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <map>
#include <random>

#include "../otlp_collector.hpp"
#include "llmesh/gateway/otlp_exporter.hpp"
#include "llmesh/gateway/tracing.hpp"

namespace llmesh::gateway {
namespace {

using testing::otlp_collector;
using testing::pb_read_traces;
using testing::pb_value;

constexpr const char* kParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(Traceparent, W3CsExampleParses) {
  auto p = parse_traceparent(kParent, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
  ASSERT_TRUE(p);
  EXPECT_EQ(to_hex(p->trace), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(to_hex(p->span), "00f067aa0ba902b7");
  EXPECT_TRUE(p->sampled());
  EXPECT_EQ(p->state, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
  // Optional whitespace around the header value is not part of it.
  EXPECT_TRUE(parse_traceparent(std::string(" ") + kParent + "\t"));
  auto unsampled = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
  ASSERT_TRUE(unsampled);
  EXPECT_FALSE(unsampled->sampled());
}

TEST(Traceparent, InvalidHeadersAreRefused) {
  for (const char* bad : {
           "",                                                            // absent
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",     // uppercase
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",     // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",     // zero parent id
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",     // version ff
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx",  // version 00 with more
           "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",      // short trace id
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",     // separator
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",     // flags not hex
           "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",    // later version, no '-'
       }) {
    EXPECT_FALSE(parse_traceparent(bad)) << bad;
  }
  // A later version may carry more after a '-'; the first four fields are read as version 00's.
  auto later = parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff-what-the-future-holds");
  ASSERT_TRUE(later);
  EXPECT_EQ(to_hex(later->span), "00f067aa0ba902b7");
  EXPECT_EQ(later->flags, 1);  // its flags but the sampled bit mean nothing to version 00
  // A tracestate over 512 characters, or with control bytes, is dropped (the parent stays).
  auto long_state = parse_traceparent(kParent, std::string(513, 'a'));
  ASSERT_TRUE(long_state);
  EXPECT_EQ(long_state->state, "");
  EXPECT_EQ(parse_traceparent(kParent, "a=b\r\nX: y")->state, "");
}

TEST(Traceparent, MutatedHeadersParseOnlyWhenTheyAreWellFormed) {
  std::mt19937 rng(7);
  const std::string good = kParent;
  const std::string alphabet = "0123456789abcdefABCDEF-xz \t";
  for (int i = 0; i < 20000; ++i) {
    std::string h = good;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % (h.size() + 1);
      switch (rng() % 3) {
        case 0:
          if (at < h.size()) h[at] = alphabet[rng() % alphabet.size()];
          break;
        case 1: h.insert(h.begin() + static_cast<std::ptrdiff_t>(at), alphabet[rng() % alphabet.size()]); break;
        default:
          if (at < h.size()) h.erase(at, 1);
      }
    }
    const auto p = parse_traceparent(h);
    if (!p) continue;
    // Whatever parsed says back exactly what the header held.
    std::string trimmed = h;
    while (!trimmed.empty() && (trimmed.front() == ' ' || trimmed.front() == '\t')) trimmed.erase(0, 1);
    EXPECT_EQ(trimmed.substr(3, 32), to_hex(p->trace)) << h;
    EXPECT_EQ(trimmed.substr(36, 16), to_hex(p->span)) << h;
  }
}

span_record sample_span() {
  span_ids ids;
  request_facts f;
  f.id = "cmpl-abc";
  f.model = "kjv-tiny";
  f.operation = "text_completion";
  f.path = "/v1/completions";
  f.max_tokens = 8;
  f.temperature = 0.5;
  f.top_p = 0.9;
  f.n = 2;
  f.prompt_tokens = 5;
  f.completion_tokens = 16;
  f.sequences = 2;
  f.ttft_s = 0.25;
  f.e2e_s = 1.5;
  f.http_status = 200;
  return request_span(f, parse_traceparent(kParent, "k=v"), ids, 1'700'000'000'000'000'000ull, 1'700'000'001'500'000'000ull);
}

trace_resource sample_resource() {
  trace_resource r;
  r.attributes = {{"service.name", std::string("llmesh")}, {"deployment.environment", std::string("test")}};
  r.scope_version = "9.9";
  return r;
}

TEST(OtlpEncoding, ProtobufCarriesTheSpanAndItsAttributes) {
  const auto body = otlp_protobuf(sample_resource(), {sample_span()});
  const auto r = pb_read_traces(body);
  EXPECT_EQ(std::get<std::string>(r.resource.at("service.name")), "llmesh");
  EXPECT_EQ(std::get<std::string>(r.resource.at("deployment.environment")), "test");
  EXPECT_EQ(r.scope_name, "llmesh.gateway");
  ASSERT_EQ(r.spans.size(), 1u);
  const auto& s = r.spans[0];
  EXPECT_EQ(s.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(s.parent_span_id, "00f067aa0ba902b7");
  EXPECT_EQ(s.span_id.size(), 16u);
  EXPECT_NE(s.span_id, "0000000000000000");
  EXPECT_EQ(s.trace_state, "k=v");
  EXPECT_EQ(s.name, "llm_request");
  EXPECT_EQ(s.kind, 2u);  // SPAN_KIND_SERVER
  EXPECT_EQ(s.start_ns, 1'700'000'000'000'000'000ull);
  EXPECT_EQ(s.end_ns, 1'700'000'001'500'000'000ull);
  EXPECT_EQ(s.flags, 0x301u);  // sampled; the parent is known to be remote
  EXPECT_EQ(s.status_code, 0u);
  EXPECT_EQ(std::get<std::string>(s.attributes.at("gen_ai.request.id")), "cmpl-abc");
  EXPECT_EQ(std::get<std::string>(s.attributes.at("gen_ai.response.model")), "kjv-tiny");
  EXPECT_EQ(std::get<std::string>(s.attributes.at("gen_ai.operation.name")), "text_completion");
  EXPECT_EQ(std::get<int64_t>(s.attributes.at("gen_ai.request.max_tokens")), 8);
  EXPECT_EQ(std::get<int64_t>(s.attributes.at("gen_ai.request.n")), 2);
  EXPECT_DOUBLE_EQ(std::get<double>(s.attributes.at("gen_ai.request.temperature")), 0.5);
  EXPECT_DOUBLE_EQ(std::get<double>(s.attributes.at("gen_ai.request.top_p")), 0.9);
  EXPECT_EQ(std::get<int64_t>(s.attributes.at("gen_ai.usage.prompt_tokens")), 5);
  EXPECT_EQ(std::get<int64_t>(s.attributes.at("gen_ai.usage.completion_tokens")), 16);
  EXPECT_EQ(std::get<int64_t>(s.attributes.at("gen_ai.usage.output_tokens")), 16);
  EXPECT_EQ(std::get<int64_t>(s.attributes.at("gen_ai.usage.num_sequences")), 2);
  EXPECT_DOUBLE_EQ(std::get<double>(s.attributes.at("gen_ai.latency.time_to_first_token")), 0.25);
  EXPECT_DOUBLE_EQ(std::get<double>(s.attributes.at("gen_ai.latency.e2e")), 1.5);
  EXPECT_EQ(std::get<int64_t>(s.attributes.at("http.response.status_code")), 200);
  EXPECT_EQ(std::get<std::string>(s.attributes.at("url.path")), "/v1/completions");
  // Wire types as trace.proto declares the fields: ids and strings length-delimited, kind a
  // varint, the times fixed64, flags fixed32; AnyValue's int a varint, double a fixed64.
  const std::map<uint32_t, uint32_t> wires = {{1, 2}, {2, 2}, {3, 2}, {4, 2}, {5, 2}, {6, 0}, {7, 1}, {8, 1}, {9, 2}, {16, 5}};
  EXPECT_EQ(s.wires, wires);
  EXPECT_EQ(s.attribute_wires.at("gen_ai.request.id"), 2u);
  EXPECT_EQ(s.attribute_wires.at("gen_ai.usage.prompt_tokens"), 0u);
  EXPECT_EQ(s.attribute_wires.at("gen_ai.latency.e2e"), 1u);
}

TEST(OtlpEncoding, UnknownFactsAreLeftOutAndAFailureIsAnErrorStatus) {
  span_ids ids;
  request_facts f;
  f.id = "embd-1";
  f.operation = "embeddings";
  f.prompt_tokens = 3;
  f.http_status = 503;
  f.error = "no replica serves 'x'";
  const auto r = pb_read_traces(otlp_protobuf(sample_resource(), {request_span(f, std::nullopt, ids, 10, 5)}));
  ASSERT_EQ(r.spans.size(), 1u);
  const auto& s = r.spans[0];
  EXPECT_EQ(s.parent_span_id, "");  // a root span
  EXPECT_EQ(s.flags, 0x101u);       // sampled; no remote parent
  EXPECT_EQ(s.end_ns, 10u);         // never before its start
  EXPECT_EQ(s.status_code, 2u);
  EXPECT_EQ(s.wires.at(15), 2u);    // Status: a message
  EXPECT_EQ(s.status_message, "no replica serves 'x'");
  EXPECT_EQ(s.attributes.count("gen_ai.request.max_tokens"), 0u);
  EXPECT_EQ(s.attributes.count("gen_ai.latency.time_to_first_token"), 0u);
  EXPECT_EQ(s.attributes.count("gen_ai.usage.completion_tokens"), 0u);
  EXPECT_EQ(std::get<int64_t>(s.attributes.at("gen_ai.usage.prompt_tokens")), 3);
  // Two roots get two traces.
  const auto a = request_span(f, std::nullopt, ids, 0, 1), b = request_span(f, std::nullopt, ids, 0, 1);
  EXPECT_NE(to_hex(a.trace), to_hex(b.trace));
  EXPECT_NE(to_hex(a.span), to_hex(b.span));
}

TEST(OtlpEncoding, JsonFollowsOtlpsMapping) {
  auto span = sample_span();
  span.attributes.push_back({"odd", std::nan("")});
  span.attributes.push_back({"flag", true});
  const auto j = nlohmann::json::parse(otlp_json(sample_resource(), {span}));
  const auto& rs = j.at("resourceSpans").at(0);
  EXPECT_EQ(rs.at("resource").at("attributes").at(0).at("key"), "service.name");
  const auto& s = rs.at("scopeSpans").at(0).at("spans").at(0);
  EXPECT_EQ(rs.at("scopeSpans").at(0).at("scope").at("name"), "llmesh.gateway");
  EXPECT_EQ(s.at("traceId"), "4bf92f3577b34da6a3ce929d0e0e4736");  // hex, not base64
  EXPECT_EQ(s.at("parentSpanId"), "00f067aa0ba902b7");
  EXPECT_EQ(s.at("kind"), 2);
  EXPECT_EQ(s.at("startTimeUnixNano"), "1700000000000000000");  // 64-bit integers as strings
  EXPECT_EQ(s.at("endTimeUnixNano"), "1700000001500000000");
  EXPECT_EQ(s.at("flags"), 0x301);
  EXPECT_EQ(s.at("traceState"), "k=v");
  EXPECT_FALSE(s.contains("status"));  // unset
  auto failed = span;
  failed.status = span_status::error;
  failed.status_message = "boom";
  const auto f = nlohmann::json::parse(otlp_json(sample_resource(), {failed}));
  EXPECT_EQ(f["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["status"], nlohmann::json({{"message", "boom"}, {"code", 2}}));
  std::map<std::string, nlohmann::json> attrs;
  for (const auto& a : s.at("attributes")) attrs[a.at("key")] = a.at("value");
  EXPECT_EQ(attrs.at("gen_ai.usage.prompt_tokens").at("intValue"), "5");
  EXPECT_EQ(attrs.at("gen_ai.latency.e2e").at("doubleValue"), 1.5);
  EXPECT_EQ(attrs.at("odd").at("doubleValue"), "NaN");
  EXPECT_EQ(attrs.at("flag").at("boolValue"), true);
  EXPECT_EQ(attrs.at("gen_ai.request.id").at("stringValue"), "cmpl-abc");
}

/// An environment of these variables only.
env_reader env_of(std::map<std::string, std::string> vars) {
  auto owned = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [owned](const char* name) -> const char* {
    auto it = owned->find(name);
    return it == owned->end() ? nullptr : it->second.c_str();
  };
}

TEST(OtlpOptions, EndpointsAndTheEnvironment) {
  auto o = otlp_options_from("http://collector:4318", env_of({}));
  ASSERT_TRUE(o) << o.err().message;
  EXPECT_EQ(o->host, "collector");
  EXPECT_EQ(o->port, "4318");
  EXPECT_EQ(o->target, "/v1/traces");  // a bare endpoint means the collector's traces path
  EXPECT_FALSE(o->json);
  EXPECT_FALSE(o->tls);
  EXPECT_EQ(o->schedule_delay.count(), 5000);
  EXPECT_EQ(o->max_queue, 2048u);
  EXPECT_EQ(o->max_batch, 512u);
  EXPECT_EQ(std::get<std::string>(o->resource.attributes.at(0).value), "llmesh");

  o = otlp_options_from("https://[::1]:9999/otel/traces?x=1",
                        env_of({{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"},
                                {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"},
                                {"OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20abc , x-team=infra"},
                                {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2500"},
                                {"OTEL_BSP_SCHEDULE_DELAY", "100"},
                                {"OTEL_BSP_MAX_QUEUE_SIZE", "10"},
                                {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "50"},
                                {"OTEL_SERVICE_NAME", "chat-frontend"},
                                {"OTEL_RESOURCE_ATTRIBUTES", "service.name=ignored,k8s.pod.name=pod%2D1"}}));
  ASSERT_TRUE(o) << o.err().message;
  EXPECT_TRUE(o->tls);
  EXPECT_EQ(o->host, "::1");
  EXPECT_EQ(o->port, "9999");
  EXPECT_EQ(o->target, "/otel/traces?x=1");
  EXPECT_TRUE(o->json);  // the traces variable before the generic one
  ASSERT_EQ(o->headers.size(), 2u);
  EXPECT_EQ(o->headers[0], (std::pair<std::string, std::string>{"authorization", "Bearer abc"}));
  EXPECT_EQ(o->headers[1], (std::pair<std::string, std::string>{"x-team", "infra"}));
  EXPECT_EQ(o->timeout.count(), 2500);
  EXPECT_EQ(o->schedule_delay.count(), 100);
  EXPECT_EQ(o->max_queue, 10u);
  EXPECT_EQ(o->max_batch, 10u);  // never more than the queue holds
  EXPECT_EQ(std::get<std::string>(o->resource.attributes.at(0).value), "chat-frontend");
  bool pod = false;
  for (const auto& a : o->resource.attributes) pod |= a.key == "k8s.pod.name" && std::get<std::string>(a.value) == "pod-1";
  EXPECT_TRUE(pod);
  EXPECT_EQ(otlp_options_from("https://h", env_of({}))->port, "443");
}

TEST(OtlpOptions, WhatCannotBeSpokenIsRefusedByName) {
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> bad = {
      {"grpc://localhost:4317", {}},
      {"localhost:4317", {}},
      {"http://", {}},
      {"http://host:99999", {}},
      {"http://host:x", {}},
      {"http://user:pw@host", {}},
      {"http://[::1", {}},
      {"http://h", {{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"}}},
      {"http://h", {{"OTEL_EXPORTER_OTLP_HEADERS", "novalue"}}},
      {"http://h", {{"OTEL_EXPORTER_OTLP_HEADERS", "a=%zz"}}},
      {"http://h", {{"OTEL_EXPORTER_OTLP_HEADERS", "a=b%0d%0aX: y"}}},
      {"http://h", {{"OTEL_EXPORTER_OTLP_TIMEOUT", "soon"}}},
      {"http://h", {{"OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"}}},
      {"http://h", {{"OTEL_BSP_MAX_QUEUE_SIZE", "0"}}},
      {"http://h", {{"OTEL_BSP_SCHEDULE_DELAY", "-5"}}},
      {"http://h", {{"OTEL_RESOURCE_ATTRIBUTES", "=x"}}},
      {"https://h", {{"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/nonexistent/ca.pem"}}},
      {"http://h", {{"OTEL_BSP_SCHEDULE_DELAY", "99999999999999999"}}},  // would overflow the clock
      {"http://h", {{"OTEL_EXPORTER_OTLP_TIMEOUT", "86400001"}}},
  };
  for (const auto& [endpoint, vars] : bad) {
    auto o = otlp_options_from(endpoint, env_of(vars));
    EXPECT_FALSE(o) << endpoint << " " << (vars.empty() ? "" : vars.begin()->first + "=" + vars.begin()->second);
  }
  auto grpc = otlp_options_from("grpc://localhost:4317", env_of({}));
  ASSERT_FALSE(grpc);
  EXPECT_NE(grpc.err().message.find("4318"), std::string::npos) << grpc.err().message;
  // Errors name the variable that was set (the generic one here).
  auto timeout = otlp_options_from("http://h", env_of({{"OTEL_EXPORTER_OTLP_TIMEOUT", "soon"}}));
  ASSERT_FALSE(timeout);
  EXPECT_EQ(timeout.err().message.rfind("OTEL_EXPORTER_OTLP_TIMEOUT=soon", 0), 0u) << timeout.err().message;
  // The environment's resource attributes replace the SDK's own, keys staying unique.
  auto o = otlp_options_from("http://h", env_of({{"OTEL_RESOURCE_ATTRIBUTES", "telemetry.sdk.language=c++20,a=1,a=2"}}));
  ASSERT_TRUE(o);
  std::map<std::string, int> seen;
  for (const auto& a : o->resource.attributes) ++seen[a.key];
  for (const auto& [k, n] : seen) EXPECT_EQ(n, 1) << k;
  for (const auto& a : o->resource.attributes) {
    if (a.key == "telemetry.sdk.language") EXPECT_EQ(std::get<std::string>(a.value), "c++20");
    if (a.key == "a") EXPECT_EQ(std::get<std::string>(a.value), "2");
  }
}

otlp_options fast_options(const otlp_collector& c) {
  auto o = otlp_options_from(c.url(), env_of({{"OTEL_BSP_SCHEDULE_DELAY", "50"}, {"OTEL_EXPORTER_OTLP_TIMEOUT", "3000"}}));
  EXPECT_TRUE(o);
  o->retry_backoff = std::chrono::milliseconds(20);
  return *o;
}

span_record numbered(int64_t i) {
  auto s = sample_span();
  s.attributes = {{"i", i}};
  return s;
}

TEST(OtlpExporter, SendsBatchesWithItsHeadersAndCountsThem) {
  otlp_collector c;
  auto o = fast_options(c);
  o.headers = {{"authorization", "Bearer t"}};
  o.max_batch = 4;
  o.schedule_delay = std::chrono::minutes(1);  // batches leave full, the last one at shutdown
  actors::metrics_registry m;
  otlp_exporter x(o, &m);
  for (int64_t i = 0; i < 10; ++i) x.record(numbered(i));
  x.shutdown();  // sends what is queued
  const auto posts = c.posts();
  ASSERT_EQ(posts.size(), 3u);  // 4 + 4 + 2
  std::vector<int64_t> seen;
  for (const auto& p : posts) {
    EXPECT_EQ(p.target, "/v1/traces");
    EXPECT_EQ(p.headers.at("content-type"), "application/x-protobuf");
    EXPECT_EQ(p.headers.at("authorization"), "Bearer t");
    for (const auto& s : pb_read_traces(p.body).spans) seen.push_back(std::get<int64_t>(s.attributes.at("i")));
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(x.counts().exported, 10u);
  EXPECT_EQ(x.counts().failed, 0u);
  EXPECT_NE(m.render().find("llmesh_trace_spans_total{outcome=\"exported\"} 10"), std::string::npos) << m.render();
}

TEST(OtlpExporter, ASpanReachesTheCollectorWithinTheScheduleDelay) {
  otlp_collector c;
  auto o = fast_options(c);
  o.json = true;
  otlp_exporter x(o);
  x.record(sample_span());
  ASSERT_TRUE(c.wait_posts(1, std::chrono::seconds(10)));  // without a shutdown: the 50 ms timer
  const auto p = c.posts().at(0);
  EXPECT_EQ(p.headers.at("content-type"), "application/json");
  EXPECT_EQ(nlohmann::json::parse(p.body)["resourceSpans"][0]["scopeSpans"][0]["spans"].size(), 1u);
}

TEST(OtlpExporter, RetriesWhatTheCollectorCannotTakeYetAndGivesUpOnWhatItRefuses) {
  otlp_collector c;
  c.answer_next({503, 429});
  otlp_exporter x(fast_options(c));
  x.record(numbered(1));
  ASSERT_TRUE(c.wait_posts(3, std::chrono::seconds(10)));  // 503, 429, then taken
  c.answer_next({400});
  x.record(numbered(2));
  ASSERT_TRUE(c.wait_posts(4, std::chrono::seconds(10)));
  x.shutdown();
  EXPECT_EQ(c.posts().size(), 4u);  // a 400 is not tried again
  EXPECT_EQ(x.counts().exported, 1u);
  EXPECT_EQ(x.counts().failed, 1u);
}

/// A loopback port held until destroyed: bound only (connecting gets a refusal), or listening
/// but never accepting (connections complete in its backlog, requests are written, no answer
/// ever comes).
struct held_port {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int port = 0;
  explicit held_port(bool listening) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && (!listening || listen(fd, 64) == 0) &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
  }
  ~held_port() { close(fd); }
};

TEST(OtlpExporter, AFullQueueDropsAndAnAbsentCollectorFails) {
  held_port refusing(false);
  ASSERT_GT(refusing.port, 0);
  const int port = refusing.port;
  auto o = otlp_options_from("http://127.0.0.1:" + std::to_string(port), env_of({{"OTEL_BSP_SCHEDULE_DELAY", "60000"}}));
  ASSERT_TRUE(o);
  o->max_queue = 3;
  o->max_batch = 3;
  o->tries = 1;
  otlp_exporter x(*o);
  for (int64_t i = 0; i < 5; ++i) x.record(numbered(i));  // the batch of 3 may be taken at once; at most 3 wait
  x.shutdown();
  const auto t = x.counts();
  EXPECT_EQ(t.exported, 0u);
  EXPECT_EQ(t.failed + t.dropped, 5u);
  EXPECT_GE(t.failed, 3u);
  x.record(numbered(9));  // after shutdown: dropped
  EXPECT_EQ(x.counts().dropped, t.dropped + 1);
}

TEST(OtlpExporter, AShutdownDropsWhatItCannotSendWithinTheExportTimeout) {
  held_port silent(true);
  ASSERT_GT(silent.port, 0);
  auto o = otlp_options_from("http://127.0.0.1:" + std::to_string(silent.port),
                             env_of({{"OTEL_BSP_SCHEDULE_DELAY", "60000"}, {"OTEL_EXPORTER_OTLP_TIMEOUT", "1000"}}));
  ASSERT_TRUE(o);
  o->max_batch = 1;
  o->tries = 1;
  otlp_exporter x(*o);
  for (int64_t i = 0; i < 6; ++i) x.record(numbered(i));  // six batches; each try waits its whole timeout
  x.shutdown();
  // One export timeout from the shutdown in all: the try under way (or one after it) fails, the
  // batches behind it are dropped at the deadline — not six tries of a second each.
  const auto t = x.counts();
  EXPECT_EQ(t.exported, 0u);
  EXPECT_EQ(t.failed + t.dropped, 6u);
  EXPECT_LE(t.failed, 2u);
  EXPECT_GE(t.dropped, 4u);
}

}  // namespace
}  // namespace llmesh::gateway
