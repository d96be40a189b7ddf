// The OTLP/HTTP span exporter (otlp_exporter.hpp): its settings, its thread, and one POST per
// batch (a Beast client on a private io_context, a connection per export: at most one export
// per schedule delay, so a kept-alive connection would save little).
#include <utility>  // before Asio: asio/awaitable.hpp needs std::exchange (g++ 12)

#include "llmesh/gateway/otlp_exporter.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <openssl/ssl.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <exception>
#include <optional>

#include "llmesh/gateway/version.hpp"

namespace llmesh::gateway {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using net::awaitable;
using net::use_awaitable;

namespace {

constexpr const char* spans_metric = "llmesh_trace_spans_total";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// Percent-decoding (the W3C Baggage form OTEL_*_HEADERS and OTEL_RESOURCE_ATTRIBUTES use).
result<std::string> percent_decode(std::string_view s, const std::string& what) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    unsigned v = 0;
    if (i + 2 >= s.size()) return make_error(errc::invalid_request, what + ": a '%' without two hex digits");
    const auto r = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
    if (r.ec != std::errc() || r.ptr != s.data() + i + 3) {
      return make_error(errc::invalid_request, what + ": a '%' without two hex digits");
    }
    out.push_back(static_cast<char>(v));
    i += 2;
  }
  return out;
}

/// "k=v,k2=v2" (keys trimmed, values trimmed and percent-decoded; empty entries skipped).
result<std::vector<std::pair<std::string, std::string>>> key_values(std::string_view list, const std::string& what) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view entry = trim(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    if (entry.empty()) continue;
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos || trim(entry.substr(0, eq)).empty()) {
      return make_error(errc::invalid_request, what + ": '" + std::string(entry) + "' is not key=value");
    }
    auto value = percent_decode(trim(entry.substr(eq + 1)), what);
    if (!value) return value.take_error();
    out.emplace_back(std::string(trim(entry.substr(0, eq))), std::move(*value));
  }
  return out;
}

/// A set variable: its name and value.
struct env_value {
  std::string name;
  std::string value;
};

/// The traces-specific variable, else its generic twin; none when neither is set (or empty).
std::optional<env_value> setting(const env_reader& env, const char* traces, const char* generic) {
  for (const char* name : {traces, generic}) {
    const char* v = env(name);
    if (v != nullptr && *v != '\0') return env_value{name, v};
  }
  return std::nullopt;
}

/// At most a day: a bigger delay or timeout is surely a slip, and would overflow the clocks.
constexpr size_t max_ms = 86'400'000;

result<size_t> positive(const std::optional<env_value>& v, size_t fallback, size_t most) {
  if (!v) return fallback;
  size_t n = 0;
  const std::string_view s = trim(v->value);
  const auto r = std::from_chars(s.data(), s.data() + s.size(), n);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || n == 0 || n > most) {
    return make_error(errc::invalid_request,
                      v->name + "=" + v->value + ": not a whole number from 1 to " + std::to_string(most));
  }
  return n;
}

std::optional<env_value> plain(const env_reader& env, const char* name) {
  const char* v = env(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return env_value{name, v};
}

}  // namespace

result<otlp_options> otlp_options_from(const std::string& endpoint, const env_reader& env) {
  otlp_options o;
  o.endpoint = endpoint;
  const std::string grpc_hint =
      "; llmesh exports OTLP over HTTP (http/protobuf or http/json): give the collector's OTLP/HTTP endpoint, "
      "e.g. http://localhost:4318/v1/traces";
  std::string_view rest = endpoint;
  if (rest.rfind("https://", 0) == 0) {
    o.tls = true;
    rest.remove_prefix(8);
  } else if (rest.rfind("http://", 0) == 0) {
    rest.remove_prefix(7);
  } else {
    return make_error(errc::invalid_request,
                      "--otlp-traces-endpoint '" + endpoint + "' is not an http:// or https:// URL" + grpc_hint);
  }
  const size_t slash = rest.find_first_of("/?");
  std::string_view authority = rest.substr(0, slash);
  std::string target = slash == std::string_view::npos ? "" : std::string(rest.substr(slash));
  if (target.empty() || target == "/") target = "/v1/traces";  // a collector serves traces there
  if (target.front() == '?') target = "/v1/traces" + target;
  if (authority.find('@') != std::string_view::npos) {
    return make_error(errc::invalid_request, "--otlp-traces-endpoint '" + endpoint +
                                                 "': credentials go in OTEL_EXPORTER_OTLP_TRACES_HEADERS, not the URL");
  }
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return make_error(errc::invalid_request, "--otlp-traces-endpoint '" + endpoint + "': an unclosed '['");
    o.host = std::string(authority.substr(1, close - 1));
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return make_error(errc::invalid_request, "--otlp-traces-endpoint '" + endpoint + "': junk after ']'");
      port = authority.substr(close + 2);
    }
  } else {
    const size_t colon = authority.rfind(':');
    o.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port = authority.substr(colon + 1);
  }
  if (o.host.empty()) return make_error(errc::invalid_request, "--otlp-traces-endpoint '" + endpoint + "' names no host");
  unsigned port_number = o.tls ? 443 : 80;
  if (!port.empty()) {
    const auto r = std::from_chars(port.data(), port.data() + port.size(), port_number);
    if (r.ec != std::errc() || r.ptr != port.data() + port.size() || port_number == 0 || port_number > 65535) {
      return make_error(errc::invalid_request, "--otlp-traces-endpoint '" + endpoint + "': '" + std::string(port) +
                                                   "' is not a port");
    }
  }
  o.port = std::to_string(port_number);
  o.target = std::move(target);

  if (auto p = setting(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")) {
    const std::string_view proto = trim(p->value);
    if (proto == "http/json") {
      o.json = true;
    } else if (proto != "http/protobuf") {
      return make_error(errc::invalid_request, p->name + "=" + std::string(proto) + ": not spoken" + grpc_hint);
    }
  }
  if (auto h = setting(env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")) {
    auto headers = key_values(h->value, h->name);
    if (!headers) return headers.take_error();
    for (const auto& [k, v] : *headers) {
      const bool clean = std::all_of(k.begin(), k.end(), [](char c) { return c > 0x20 && c < 0x7f && c != ':'; }) &&
                         std::none_of(v.begin(), v.end(), [](char c) { return c == '\r' || c == '\n' || c == '\0'; });
      if (!clean) return make_error(errc::invalid_request, h->name + ": header '" + k + "' cannot be sent");
    }
    o.headers = std::move(*headers);
  }
  auto timeout = positive(setting(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"), 10000, max_ms);
  if (!timeout) return timeout.take_error();
  o.timeout = std::chrono::milliseconds(*timeout);
  if (auto c = setting(env, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION")) {
    if (trim(c->value) != "none") {
      return make_error(errc::invalid_request, c->name + "=" + c->value + ": compression is not supported (none only)");
    }
  }
  if (auto ca = setting(env, "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"); ca && o.tls) {
    // Read now, so that a wrong path fails the start rather than every export.
    beast::error_code ec;
    try {
      net::ssl::context probe(net::ssl::context::tls_client);
      probe.load_verify_file(ca->value, ec);
    } catch (const std::exception& e) {
      return make_error(errc::internal, std::string("cannot make a TLS context: ") + e.what());
    }
    if (ec) return make_error(errc::invalid_request, ca->name + "=" + ca->value + ": " + ec.message());
    o.ca_file = ca->value;
  }
  auto delay = positive(plain(env, "OTEL_BSP_SCHEDULE_DELAY"), 5000, max_ms);
  auto queue = positive(plain(env, "OTEL_BSP_MAX_QUEUE_SIZE"), 2048, size_t{1} << 20);
  auto batch = positive(plain(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"), 512, size_t{1} << 20);
  for (auto* r : {&delay, &queue, &batch}) {
    if (!*r) return r->take_error();
  }
  o.schedule_delay = std::chrono::milliseconds(*delay);
  o.max_queue = *queue;
  o.max_batch = std::min(*batch, *queue);

  // The resource: OTEL_RESOURCE_ATTRIBUTES, with service.name from OTEL_SERVICE_NAME (else
  // those attributes', else "llmesh") first.
  std::string service = "llmesh";
  std::vector<attribute> attrs;
  if (const char* ra = env("OTEL_RESOURCE_ATTRIBUTES"); ra != nullptr && *ra != '\0') {
    auto kv = key_values(ra, "OTEL_RESOURCE_ATTRIBUTES");
    if (!kv) return kv.take_error();
    for (auto& [k, v] : *kv) {
      if (k == "service.name") {
        service = v;
      } else {
        attrs.push_back({k, v});
      }
    }
  }
  if (const char* sn = env("OTEL_SERVICE_NAME"); sn != nullptr && *sn != '\0') service = sn;
  o.resource.attributes.push_back({"service.name", service});
  // The SDK's own attributes, unless the environment names them (keys are unique in OTLP).
  for (auto [k, v] : {std::pair<const char*, std::string>{"telemetry.sdk.name", "llmesh"},
                      {"telemetry.sdk.language", "cpp"},
                      {"telemetry.sdk.version", std::string(version())}}) {
    if (std::none_of(attrs.begin(), attrs.end(), [&](const attribute& a) { return a.key == k; })) {
      o.resource.attributes.push_back({k, v});
    }
  }
  for (auto& a : attrs) {  // the last of a repeated key wins
    auto same = [&](const attribute& b) { return b.key == a.key; };
    auto it = std::find_if(o.resource.attributes.begin(), o.resource.attributes.end(), same);
    if (it != o.resource.attributes.end()) {
      it->value = std::move(a.value);
    } else {
      o.resource.attributes.push_back(std::move(a));
    }
  }
  o.resource.scope_version = std::string(version());
  return o;
}

namespace {

/// What one POST got: the status (0: none — no connection, a timeout, a broken answer), the
/// Retry-After seconds, and why it failed.
struct post_outcome {
  int status = 0;
  int retry_after_s = -1;
  std::string why;
};

template <class Stream>
awaitable<void> exchange(Stream& stream, const http::request<http::string_body>& req, post_outcome& out) {
  co_await http::async_write(stream, req, use_awaitable);
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1 << 20);
  co_await http::async_read(stream, buf, parser, use_awaitable);
  const auto& res = parser.get();
  out.status = static_cast<int>(res.result_int());
  if (auto ra = res.find(http::field::retry_after); ra != res.end()) {
    int s = -1;
    const auto v = ra->value();
    if (std::from_chars(v.data(), v.data() + v.size(), s).ec == std::errc()) out.retry_after_s = s;
  }
  if (out.status / 100 != 2) out.why = "HTTP " + std::to_string(out.status) + ": " + res.body().substr(0, 200);
}

awaitable<void> post(const otlp_options& o, net::ssl::context* tls, std::string body, post_outcome& out) {
  auto ex = co_await net::this_coro::executor;
  http::request<http::string_body> req{http::verb::post, o.target, 11};
  req.set(http::field::host, o.host.find(':') != std::string::npos ? "[" + o.host + "]:" + o.port : o.host + ":" + o.port);
  req.set(http::field::user_agent, "llmesh/" + std::string(version()));
  req.set(http::field::content_type, o.json ? "application/json" : "application/x-protobuf");
  for (const auto& [k, v] : o.headers) req.set(k, v);
  req.keep_alive(false);
  req.body() = std::move(body);
  req.prepare_payload();
  // Name resolution is not bounded by the export timeout (getaddrinfo cannot be cancelled);
  // an address literal skips it.
  tcp::resolver resolver(ex);
  const auto found = co_await resolver.async_resolve(o.host, o.port, use_awaitable);
  if (tls == nullptr) {
    beast::tcp_stream stream(ex);
    stream.expires_after(o.timeout);
    co_await stream.async_connect(found, use_awaitable);
    co_await exchange(stream, req, out);
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    co_return;
  }
  beast::ssl_stream<beast::tcp_stream> stream(ex, *tls);
  beast::get_lowest_layer(stream).expires_after(o.timeout);
  beast::error_code not_ip;
  (void)net::ip::make_address(o.host, not_ip);
  // SNI names a host, never an address (RFC 6066); the certificate is checked against either.
  if (not_ip && !SSL_set_tlsext_host_name(stream.native_handle(), o.host.c_str())) {
    out.why = "cannot set the TLS server name";
    co_return;
  }
  stream.set_verify_callback(net::ssl::host_name_verification(o.host));
  co_await beast::get_lowest_layer(stream).async_connect(found, use_awaitable);
  co_await stream.async_handshake(net::ssl::stream_base::client, use_awaitable);
  co_await exchange(stream, req, out);
  beast::get_lowest_layer(stream).close();  // no close_notify wait: the answer is read
}

}  // namespace

otlp_exporter::otlp_exporter(otlp_options o, actors::metrics_registry* metrics) : opt_(std::move(o)), metrics_(metrics) {
  if (metrics_) metrics_->declare_counter(spans_metric, "Trace spans by what became of them (exported, dropped, failed).", {"outcome"});
  thread_ = std::thread([this] { run(); });
}

otlp_exporter::~otlp_exporter() { shutdown(); }

void otlp_exporter::count(outcome o, uint64_t n) {
  if (n == 0) return;
  {
    std::lock_guard lk(mu_);
    (o == outcome::exported ? totals_.exported : o == outcome::dropped ? totals_.dropped : totals_.failed) += n;
  }
  if (metrics_) {
    const char* label = o == outcome::exported ? "exported" : o == outcome::dropped ? "dropped" : "failed";
    if (auto* c = metrics_->get_counter(spans_metric, {label})) c->add(static_cast<double>(n));
  }
}

void otlp_exporter::record(span_record s) {
  {
    std::lock_guard lk(mu_);
    if (!stop_ && queue_.size() < opt_.max_queue) {
      queue_.push_back(std::move(s));
      if (queue_.size() >= opt_.max_batch) wake_.notify_one();
      return;
    }
  }
  count(outcome::dropped, 1);
}

void otlp_exporter::shutdown() {
  {
    std::lock_guard lk(mu_);
    if (!stop_) {
      stop_ = true;
      drain_until_ = std::chrono::steady_clock::now() + opt_.timeout;
    }
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

otlp_exporter::totals otlp_exporter::counts() const {
  std::lock_guard lk(mu_);
  return totals_;
}

void otlp_exporter::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    const auto due = std::chrono::steady_clock::now() + opt_.schedule_delay;
    wake_.wait_until(lk, due, [&] { return stop_ || queue_.size() >= opt_.max_batch; });
    while (!queue_.empty()) {
      if (stop_ && std::chrono::steady_clock::now() >= drain_until_) {
        const uint64_t left = queue_.size();
        queue_.clear();
        lk.unlock();
        count(outcome::dropped, left);  // shutdown's time is up
        lk.lock();
        break;
      }
      const size_t n = std::min(queue_.size(), opt_.max_batch);
      std::vector<span_record> batch(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.begin() + n));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
      lk.unlock();
      const sent s = send(batch);
      count(s == sent::yes ? outcome::exported : s == sent::failed ? outcome::failed : outcome::dropped, batch.size());
      lk.lock();
      if (!stop_ && queue_.size() < opt_.max_batch) break;  // a partial batch waits for the delay
    }
    if (stop_ && queue_.empty()) return;
  }
}

otlp_exporter::sent otlp_exporter::send(const std::vector<span_record>& batch) {
  post_outcome out;
  std::optional<net::ssl::context> tls;
  try {
    if (opt_.tls) {
      tls.emplace(net::ssl::context::tls_client);
      beast::error_code ec;
      if (opt_.ca_file.empty()) {
        tls->set_default_verify_paths(ec);
      } else {
        tls->load_verify_file(opt_.ca_file, ec);
      }
      tls->set_verify_mode(net::ssl::verify_peer);
      if (ec) out.why = "cannot load the CAs (" + (opt_.ca_file.empty() ? std::string("the system's") : opt_.ca_file) + "): " + ec.message();
    }
  } catch (const std::exception& e) {
    out.why = std::string("cannot make a TLS context: ") + e.what();
  }
  const std::string body = opt_.json ? otlp_json(opt_.resource, batch) : otlp_protobuf(opt_.resource, batch);
  auto backoff = opt_.retry_backoff;
  const int tries = std::max(1, opt_.tries);
  bool tried_stopping = false;  // shutting down, a batch gets one try more at most, within the drain
  int attempt = 0;
  while (out.why.empty() || attempt > 0) {  // (a TLS setup error: no try)
    // The try's end as a time point (a duration rounded down would end it before the drain's
    // deadline, and the next batch would find time left that is not there).
    auto until = std::chrono::steady_clock::now() + opt_.timeout;
    {
      std::lock_guard lk(mu_);
      if (stop_) {
        if (tried_stopping || attempt >= tries || std::chrono::steady_clock::now() >= drain_until_) {
          if (attempt == 0) return sent::not_tried;
          break;
        }
        tried_stopping = true;
        until = std::min(until, drain_until_);
      }
    }
    ++attempt;
    out = {};
    net::io_context ioc;
    net::co_spawn(ioc, post(opt_, tls ? &*tls : nullptr, body, out), [&out](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        out.status = 0;
        out.why = x.what();
      }
    });
    // The stream's own timeout bounds each step; this bounds the whole try (and, at shutdown,
    // keeps it within the drain). Left unfinished, the try is dropped with its io_context.
    ioc.run_until(until);
    if (!ioc.stopped()) {
      ioc.stop();
      out.status = 0;
      out.why = "no answer in time";
    }
    if (out.status / 100 == 2) return sent::yes;
    const bool retryable = out.status == 0 || out.status == 429 || out.status == 502 || out.status == 503 || out.status == 504;
    if (!retryable || attempt >= tries) break;
    std::unique_lock lk(mu_);
    if (!stop_) {
      auto wait = backoff;
      if (out.retry_after_s >= 0) wait = std::chrono::milliseconds(1000 * std::min(out.retry_after_s, 5));
      backoff *= 2;
      wake_.wait_for(lk, wait, [&] { return stop_; });  // a shutdown ends the wait: one last try
    }
    if (out.why.empty()) out.why = "HTTP " + std::to_string(out.status);
  }
  // One line per 10 s at most: a collector that is down must not flood the log.
  const auto now = std::chrono::steady_clock::now();
  if (now - last_failure_log_ >= std::chrono::seconds(10)) {
    last_failure_log_ = now;
    std::string hint;
    if (opt_.port == "4317") hint = " (4317 is OTLP/gRPC's port; llmesh speaks OTLP/HTTP, usually 4318)";
    std::fprintf(stderr, "llmesh: OTLP export of %zu span(s) to %s failed: %s%s\n", batch.size(), opt_.endpoint.c_str(),
                 out.why.empty() ? "no answer" : out.why.c_str(), hint.c_str());
  }
  return sent::failed;
}

}  // namespace llmesh::gateway
