// W3C Trace Context parsing and the OTLP encodings of spans (tracing.hpp).
#include "llmesh/gateway/tracing.hpp"

#include "llmesh/actors/batch_scheduler.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace llmesh::gateway {

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // W3C: lowercase only
}

/// `text` (2 * out.size() lowercase hex digits) into `out`; false on any other character.
template <size_t N>
bool read_hex(std::string_view text, std::array<uint8_t, N>& out) {
  if (text.size() != 2 * N) return false;
  for (size_t i = 0; i < N; ++i) {
    const int hi = hex_value(text[2 * i]), lo = hex_value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

template <size_t N>
bool all_zero(const std::array<uint8_t, N>& a) {
  return std::all_of(a.begin(), a.end(), [](uint8_t b) { return b == 0; });
}

template <size_t N>
std::string hex_of(const std::array<uint8_t, N>& a) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(2 * N, '0');
  for (size_t i = 0; i < N; ++i) {
    s[2 * i] = digits[a[i] >> 4];
    s[2 * i + 1] = digits[a[i] & 15];
  }
  return s;
}

// --- protobuf wire format (varints, length-delimited fields, fixed 32/64) ---

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, uint32_t field, uint32_t wire_type) { put_varint(out, (uint64_t{field} << 3) | wire_type); }

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

void put_fixed64(std::string& out, uint32_t field, uint64_t v) {
  put_tag(out, field, 1);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_fixed32(std::string& out, uint32_t field, uint32_t v) {
  put_tag(out, field, 5);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_uint(std::string& out, uint32_t field, uint64_t v) {
  put_tag(out, field, 0);
  put_varint(out, v);
}

template <size_t N>
std::string_view raw(const std::array<uint8_t, N>& a) {
  return {reinterpret_cast<const char*>(a.data()), N};
}

/// common.proto's KeyValue { key = 1; AnyValue value = 2 }, AnyValue's oneof: string_value 1,
/// bool_value 2, int_value 3, double_value 4.
std::string key_value(const attribute& a) {
  std::string any;
  if (const auto* s = std::get_if<std::string>(&a.value)) {
    put_bytes(any, 1, *s);
  } else if (const auto* b = std::get_if<bool>(&a.value)) {
    put_uint(any, 2, *b ? 1 : 0);
  } else if (const auto* i = std::get_if<int64_t>(&a.value)) {
    put_uint(any, 3, static_cast<uint64_t>(*i));  // int64: two's complement as a varint
  } else {
    uint64_t bits;
    const double d = std::get<double>(a.value);
    std::memcpy(&bits, &d, sizeof bits);
    put_fixed64(any, 4, bits);
  }
  std::string kv;
  put_bytes(kv, 1, a.key);
  put_bytes(kv, 2, any);
  return kv;
}

/// Span.flags: the W3C trace flags in bits 0-7; bit 8 says bit 9 is known, bit 9 that the
/// parent is remote (every parent here is: it came in a request's traceparent).
uint32_t span_flags(const span_record& s) { return uint32_t{s.flags} | 0x100u | (all_zero(s.parent) ? 0u : 0x200u); }

/// trace.proto's Span: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5, kind 6,
/// start_time_unix_nano 7, end_time_unix_nano 8, attributes 9, status 15, flags 16.
std::string span_bytes(const span_record& s) {
  std::string out;
  put_bytes(out, 1, raw(s.trace));
  put_bytes(out, 2, raw(s.span));
  if (!s.trace_state.empty()) put_bytes(out, 3, s.trace_state);
  if (!all_zero(s.parent)) put_bytes(out, 4, raw(s.parent));
  put_bytes(out, 5, s.name);
  put_uint(out, 6, static_cast<uint64_t>(s.kind));
  put_fixed64(out, 7, s.start_unix_ns);
  put_fixed64(out, 8, s.end_unix_ns);
  for (const auto& a : s.attributes) put_bytes(out, 9, key_value(a));
  if (s.status != span_status::unset) {
    std::string st;  // Status { message = 2; code = 3 }
    if (!s.status_message.empty()) put_bytes(st, 2, s.status_message);
    put_uint(st, 3, static_cast<uint64_t>(s.status));
    put_bytes(out, 15, st);
  }
  put_fixed32(out, 16, span_flags(s));
  return out;
}

nlohmann::ordered_json json_attributes(const std::vector<attribute>& attrs) {
  auto list = nlohmann::ordered_json::array();
  for (const auto& a : attrs) {
    nlohmann::ordered_json v;
    if (const auto* s = std::get_if<std::string>(&a.value)) {
      v["stringValue"] = *s;
    } else if (const auto* b = std::get_if<bool>(&a.value)) {
      v["boolValue"] = *b;
    } else if (const auto* i = std::get_if<int64_t>(&a.value)) {
      v["intValue"] = std::to_string(*i);  // OTLP JSON: 64-bit integers as decimal strings
    } else {
      const double d = std::get<double>(a.value);
      if (std::isfinite(d)) {
        v["doubleValue"] = d;
      } else {  // proto3 JSON's spellings (JSON numbers cannot say these)
        v["doubleValue"] = std::isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity";
      }
    }
    list.push_back({{"key", a.key}, {"value", std::move(v)}});
  }
  return list;
}

}  // namespace

std::optional<trace_parent> parse_traceparent(std::string_view h, std::string_view state) {
  // Surrounding blanks are the header's optional whitespace, not the value's.
  while (!h.empty() && (h.front() == ' ' || h.front() == '\t')) h.remove_prefix(1);
  while (!h.empty() && (h.back() == ' ' || h.back() == '\t')) h.remove_suffix(1);
  if (h.size() < 55 || h[2] != '-' || h[35] != '-' || h[52] != '-') return std::nullopt;
  std::array<uint8_t, 1> version{}, flags{};
  if (!read_hex(h.substr(0, 2), version) || version[0] == 0xff) return std::nullopt;
  if (version[0] == 0 ? h.size() != 55 : h.size() > 55 && h[55] != '-') return std::nullopt;
  trace_parent p;
  if (!read_hex(h.substr(3, 32), p.trace) || !read_hex(h.substr(36, 16), p.span) || !read_hex(h.substr(53, 2), flags)) {
    return std::nullopt;
  }
  if (all_zero(p.trace) || all_zero(p.span)) return std::nullopt;
  // Version 00 defines the sampled bit only; a later version's other bits mean nothing here.
  p.flags = version[0] == 0 ? flags[0] : static_cast<uint8_t>(flags[0] & 1);
  // tracestate: at most 512 characters are to be propagated (W3C); a longer one is dropped
  // rather than cut mid-entry. Printable ASCII only.
  const bool printable = std::all_of(state.begin(), state.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
  if (state.size() <= 512 && printable) p.state = std::string(state);
  return p;
}

std::string to_hex(const trace_id& id) { return hex_of(id); }
std::string to_hex(const span_id& id) { return hex_of(id); }

span_ids::span_ids() {
  // 256 bits of seed: two gateways must not draw the same ids (one 32-bit seed would give them
  // even odds of a collision somewhere among ~77k processes).
  std::random_device rd;
  std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
  rng_.seed(seq);
}

trace_id span_ids::new_trace() {
  trace_id t{};
  while (all_zero(t)) {
    const uint64_t a = rng_(), b = rng_();
    std::memcpy(t.data(), &a, 8);
    std::memcpy(t.data() + 8, &b, 8);
  }
  return t;
}

span_id span_ids::new_span() {
  span_id s{};
  while (all_zero(s)) {
    const uint64_t a = rng_();
    std::memcpy(s.data(), &a, 8);
  }
  return s;
}

span_record request_span(const request_facts& f, const std::optional<trace_parent>& parent, span_ids& ids,
                         uint64_t start_unix_ns, uint64_t end_unix_ns) {
  span_record s;
  if (parent) {
    s.trace = parent->trace;
    s.parent = parent->span;
    s.trace_state = parent->state;
    s.flags = parent->flags;
  } else {
    s.trace = ids.new_trace();
    s.flags = 1;  // sampled: every request is recorded
  }
  s.span = ids.new_span();
  s.name = "llm_request";
  s.kind = span_kind::server;
  s.start_unix_ns = start_unix_ns;
  s.end_unix_ns = std::max(end_unix_ns, start_unix_ns);
  auto& a = s.attributes;
  auto text = [&a](const char* key, const std::string& v) {
    if (!v.empty()) a.push_back({key, v});
  };
  auto count = [&a](const char* key, int64_t v) {
    if (v >= 0) a.push_back({key, v});
  };
  auto real = [&a](const char* key, double v) {
    if (v >= 0) a.push_back({key, v});
  };
  text("gen_ai.operation.name", f.operation);
  text("gen_ai.request.id", f.id);
  text("gen_ai.response.id", f.id);
  text("gen_ai.request.model", f.model);
  text("gen_ai.response.model", f.model);
  count("gen_ai.request.max_tokens", f.max_tokens);
  real("gen_ai.request.temperature", f.temperature);
  real("gen_ai.request.top_p", f.top_p);
  count("gen_ai.request.n", f.n);
  count("gen_ai.usage.prompt_tokens", f.prompt_tokens);
  count("gen_ai.usage.input_tokens", f.prompt_tokens);
  count("gen_ai.usage.completion_tokens", f.completion_tokens);
  count("gen_ai.usage.output_tokens", f.completion_tokens);
  count("gen_ai.usage.num_sequences", f.sequences);
  real("gen_ai.latency.time_to_first_token", f.ttft_s);
  real("gen_ai.latency.e2e", f.e2e_s);
  real("gen_ai.latency.time_in_queue", f.queue_s);
  real("gen_ai.latency.time_in_model_prefill", f.prefill_s);
  real("gen_ai.latency.time_in_model_decode", f.decode_s);
  real("gen_ai.latency.time_in_model_inference", f.inference_s);
  text("http.request.method", f.method);
  text("url.path", f.path);
  if (!f.rpc_method.empty()) {
    a.push_back({"rpc.system", std::string("capnp")});
    a.push_back({"rpc.method", f.rpc_method});
  }
  if (f.cancelled) a.push_back({"llmesh.cancelled", true});
  if (f.http_status > 0) a.push_back({"http.response.status_code", int64_t{f.http_status}});
  if (!f.error.empty()) {
    s.status = span_status::error;
    s.status_message = f.error;
  }
  return s;
}

span_record request_trace::finish(const actors::replica_times& rt, span_ids& ids) {
  const auto now = std::chrono::steady_clock::now();
  request_facts& f = facts;
  if (first_token) f.ttft_s = std::chrono::duration<double>(*first_token - t0).count();
  f.e2e_s = std::chrono::duration<double>(now - t0).count();
  if (rt.queued_us >= 0) f.queue_s = 1e-6 * static_cast<double>(rt.queued_us);
  if (rt.prefill_us >= 0) f.prefill_s = 1e-6 * static_cast<double>(rt.prefill_us);
  if (rt.inference_us >= 0) {
    f.inference_s = 1e-6 * static_cast<double>(rt.inference_us);
    f.decode_s = std::max(0.0, f.inference_s - std::max(f.prefill_s, 0.0));
  }
  const auto ns = [](std::chrono::system_clock::time_point p) {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(p.time_since_epoch()).count());
  };
  const auto end = arrived + std::chrono::duration_cast<std::chrono::system_clock::duration>(now - t0);
  return request_span(f, parent, ids, ns(arrived), ns(end));
}

std::string otlp_protobuf(const trace_resource& resource, const std::vector<span_record>& spans) {
  std::string res;  // Resource { attributes = 1 }
  for (const auto& a : resource.attributes) put_bytes(res, 1, key_value(a));
  std::string scope;  // InstrumentationScope { name = 1; version = 2 }
  put_bytes(scope, 1, resource.scope_name);
  if (!resource.scope_version.empty()) put_bytes(scope, 2, resource.scope_version);
  std::string scope_spans;  // ScopeSpans { scope = 1; spans = 2 }
  put_bytes(scope_spans, 1, scope);
  for (const auto& s : spans) put_bytes(scope_spans, 2, span_bytes(s));
  std::string resource_spans;  // ResourceSpans { resource = 1; scope_spans = 2 }
  put_bytes(resource_spans, 1, res);
  put_bytes(resource_spans, 2, scope_spans);
  std::string request;  // ExportTraceServiceRequest { resource_spans = 1 }
  put_bytes(request, 1, resource_spans);
  return request;
}

std::string otlp_json(const trace_resource& resource, const std::vector<span_record>& spans) {
  using json = nlohmann::ordered_json;
  json list = json::array();
  for (const auto& s : spans) {
    json j;
    j["traceId"] = hex_of(s.trace);  // OTLP JSON: ids in hex, not base64
    j["spanId"] = hex_of(s.span);
    if (!s.trace_state.empty()) j["traceState"] = s.trace_state;
    if (!all_zero(s.parent)) j["parentSpanId"] = hex_of(s.parent);
    j["flags"] = span_flags(s);
    j["name"] = s.name;
    j["kind"] = static_cast<int>(s.kind);
    j["startTimeUnixNano"] = std::to_string(s.start_unix_ns);
    j["endTimeUnixNano"] = std::to_string(s.end_unix_ns);
    j["attributes"] = json_attributes(s.attributes);
    if (s.status != span_status::unset) {
      json st;
      if (!s.status_message.empty()) st["message"] = s.status_message;
      st["code"] = static_cast<int>(s.status);
      j["status"] = std::move(st);
    }
    list.push_back(std::move(j));
  }
  json scope = {{"name", resource.scope_name}};
  if (!resource.scope_version.empty()) scope["version"] = resource.scope_version;
  json body = {{"resourceSpans",
                json::array({{{"resource", {{"attributes", json_attributes(resource.attributes)}}},
                              {"scopeSpans", json::array({{{"scope", scope}, {"spans", std::move(list)}}})}}})}};
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace llmesh::gateway
