// The Beast HTTP front end (http_server.hpp). One io_context thread serves every connection;
// a request's own work (parsing, tokenizing, the chat template, compiling a structured-output
// spec) runs on a small worker pool, so a costly one never stalls the other connections' streams.
#include <utility>  // before Asio: asio/awaitable.hpp needs std::exchange (g++ 12)

#include "llmesh/gateway/http_server.hpp"

#include <poll.h>
#include <sys/socket.h>

#include "llmesh/actors/serving_metrics.hpp"
#include "llmesh/gateway/background_runs.hpp"
#include "llmesh/gateway/messages_api.hpp"
#include "llmesh/gateway/metrics_endpoint.hpp"
#include "llmesh/gateway/otlp_exporter.hpp"
#include "llmesh/gateway/tracing.hpp"
#include "tls_context.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <sstream>

namespace llmesh::gateway {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using net::awaitable;
using net::use_awaitable;
using error_code = boost::system::error_code;
using tls_stream = beast::ssl_stream<beast::tcp_stream>;

struct http_server::impl {
  impl(api_service& a, http_options o) : api(&a), metrics(a.metrics()), opt(std::move(o)) {}
  impl(actors::metrics_registry& m, http_options o) : metrics(m), opt(std::move(o)) {}
  api_service* api = nullptr;  ///< null: a metrics endpoint (metrics_endpoint.hpp), no API
  actors::metrics_registry& metrics;
  http_options opt;
  // Before ioc: ~io_context destroys suspended sessions, whose guards still count here.
  size_t connections = 0;
  std::map<net::ip::address, size_t> per_client;  ///< open connections by client address
  bool stopping = false;
  uint16_t port = 0;
  /// The whole 429 replies to a connection over max_connections / over its client's share,
  /// serialized once (the limits are fixed): a refusal costs one non-blocking send.
  std::string full_reply, client_full_reply;
  /// POSTs being handled on the worker pool (io thread only): the drain waits for them too,
  /// since a job's slots are taken only at the end of its handling.
  size_t handling = 0;
  /// HTTPS (tls.hpp): the context new connections take; none: plain HTTP.
  std::optional<tls_contexts> tls;
  std::mt19937_64 ids{std::random_device{}()};  ///< X-Request-Id values (io thread only)
  span_ids trace_ids;                           ///< span and trace ids (io thread only)
  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  /// Runs api_service::handle for POSTs. After ioc: destroyed (joined) first, so a handle in
  /// progress finishes while the session it reads from still exists.
  net::thread_pool workers{2};
};

namespace {

/// A GET that waits for the mesh (SGLang's GET /flush_cache: every replica told, the router's
/// answer awaited) runs on the worker pool as POSTs do, never on the one Asio thread.
bool waits_on_the_mesh(std::string_view target) {
  return target.substr(0, target.find('?')).ends_with("/flush_cache");
}

std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

/// The TCP layer under a connection's stream (itself for plain HTTP): timeouts and the socket.
template <class Stream>
beast::tcp_stream& tcp_of(Stream& stream) {
  return beast::get_lowest_layer(stream);
}

void count_request(http_server::impl* s, int status) {
  if (!s->api) return;  // a metrics endpoint's scrapes are not API requests
  s->metrics.get_counter(actors::metric::requests, {std::to_string(status)})->add();
}

/// What a generation's connection waits on: the mesh's messages (posted here from actor
/// threads) and the client's disconnect.
struct job_state {
  explicit job_state(const net::any_io_executor& ex) : timer(ex) {}
  net::steady_timer timer;  ///< cancelled to wake the connection
  std::deque<actors::token_msg> queue;
  bool gone = false;      ///< the client disconnected
  bool finished = false;  ///< the job is over: the watch must not touch the socket any more
  bool woken = false;     ///< a background run has more (run_tail)
};

/// Marks a job over however its coroutine leaves (an exception too): the watch, which may sleep
/// on its own timer, then never touches the connection's socket again.
struct finish_guard {
  job_state& st;
  ~finish_guard() { st.finished = true; }
};

/// Watches a connection while its request runs: readable with nothing to read means the
/// client closed (or reset) it. Bytes that came early (a next request, a TLS close_notify) stay
/// unread; a client that has also shut its side of the connection is gone (so, since this
/// version, is a plain-HTTP client that sends bytes after its request and then half-closes).
awaitable<void> watch(std::shared_ptr<job_state> st, tcp::socket& sock) {
  std::optional<net::steady_timer> recheck;
  for (;;) {
    error_code ec;
    co_await sock.async_wait(tcp::socket::wait_read, net::redirect_error(use_awaitable, ec));
    // Cancelled, or completed just as the job ended (the socket may be gone by now).
    if (ec || st->finished) co_return;
    char c;
    const ssize_t n = ::recv(sock.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n > 0) {
      // Bytes: a next request (HTTP) or a record (TLS: a client's close_notify comes as bytes,
      // its FIN maybe a moment later). They stay unread, so readiness says nothing more: until
      // the job ends, look every 100 ms whether the client has shut its side (gone) meanwhile.
      if (!recheck) recheck.emplace(sock.get_executor());
      for (;;) {
        pollfd p{sock.native_handle(), POLLRDHUP, 0};
        if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) break;
        recheck->expires_after(std::chrono::milliseconds(100));
        error_code ignored;
        co_await recheck->async_wait(net::redirect_error(use_awaitable, ignored));
        if (st->finished) co_return;  // the socket may be gone by now
      }
    }
    st->gone = true;
    st->timer.cancel();
    co_return;
  }
}

template <class Stream>
awaitable<bool> write_reply(http_server::impl* s, Stream& stream, const http_reply& r, unsigned version,
                            bool keep, const header_list& extra = {}) {
  http::response<http::string_body> res;
  res.version(version);
  res.result(static_cast<unsigned>(r.status));
  res.set(http::field::server, "llmesh");
  res.set(http::field::content_type, r.content_type);
  for (const auto& [k, v] : r.headers) res.set(k, v);
  for (const auto& [k, v] : extra) res.set(k, v);
  res.keep_alive(keep);
  res.body() = r.body;
  res.prepare_payload();
  tcp_of(stream).expires_after(s->opt.write_timeout);
  error_code ec;
  co_await http::async_write(stream, res, net::redirect_error(use_awaitable, ec));
  co_return !ec;
}

/// The head of an SSE response: HTTP/1.1 streams in chunks; HTTP/1.0 has no chunked encoding
/// (the raw stream, then close).
http::response<http::empty_body> sse_head(unsigned version, bool keep, const header_list& extra) {
  http::response<http::empty_body> head{http::status::ok, version};
  head.set(http::field::server, "llmesh");
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  for (const auto& [k, v] : extra) head.set(k, v);
  head.keep_alive(keep && version >= 11);
  head.chunked(version >= 11);
  return head;
}

/// Writes SSE bytes after the head: one chunk, or raw on HTTP/1.0.
template <class Stream>
awaitable<void> write_sse(http_server::impl* s, Stream& stream, const std::string& bytes, bool chunked, error_code& ec) {
  tcp_of(stream).expires_after(s->opt.write_timeout);
  if (chunked) {
    co_await net::async_write(stream, http::make_chunk(net::buffer(bytes)), net::redirect_error(use_awaitable, ec));
  } else {
    co_await net::async_write(stream, net::buffer(bytes), net::redirect_error(use_awaitable, ec));
  }
}

/// Ends a streamed reply that went out whole (counted 200): the last chunk, or on HTTP/1.0 the
/// connection's end. Returns false when the connection must close.
template <class Stream>
awaitable<bool> end_sse(http_server::impl* s, Stream& stream, bool chunked) {
  count_request(s, 200);
  if (!chunked) co_return false;  // the end of an HTTP/1.0 stream is the connection's end
  tcp_of(stream).expires_after(s->opt.write_timeout);
  error_code ec;
  co_await net::async_write(stream, http::make_chunk_last(), net::redirect_error(use_awaitable, ec));
  co_return !ec;
}

/// The trace of a request about to run (null: not traced — no tracer, not a POST, or a parent
/// that says "not sampled"). W3C: repeated traceparent fields make none (a trace of its own),
/// repeated tracestate fields are one list.
template <class Request>
std::unique_ptr<request_trace> trace_of(http_server::impl* s, const Request& req) {
  if (!s->opt.tracer || req.method() != http::verb::post) return nullptr;
  auto t = std::make_unique<request_trace>();  // stamped now: the request has just been read
  const std::string_view path = sv(req.target());
  t->facts.path = std::string(path.substr(0, path.find('?')));
  if (req.count("traceparent") == 1) {
    std::string state;
    for (auto [it, end] = req.equal_range("tracestate"); it != end; ++it) {
      state += (state.empty() ? "" : ",") + std::string(sv(it->value()));
    }
    t->parent = parse_traceparent(sv(req["traceparent"]), state);
    if (t->parent && !t->parent->sampled()) return nullptr;
  }
  return t;
}

/// The job's span, to the exporter: `http_status` as answered (499: the client went away).
void record_span(http_server::impl* s, request_trace& t, const completion_group& out, int http_status) {
  request_facts& f = t.facts;
  f.http_status = http_status;
  if (const auto* e = out.embeddings()) {
    f.operation = "embeddings";
    f.id = e->id();
    f.model = e->model();
    f.prompt_tokens = static_cast<int64_t>(e->prompt_tokens());
    f.sequences = static_cast<int64_t>(e->size());
  } else {
    f.operation = out.setup().chat ? "chat" : "text_completion";
    f.id = out.id();
    f.model = out.setup().model;
    f.n = static_cast<int64_t>(out.setup().n);
    const usage_counts u = out.usage();
    f.prompt_tokens = static_cast<int64_t>(u.prompt_tokens);
    f.completion_tokens = static_cast<int64_t>(u.completion_tokens);
    f.sequences = static_cast<int64_t>(out.size());
  }
  // A failure is the span's error when it is the server's (5xx) or came after the answer began
  // (the stream's 200); a 4xx is the client's (OpenTelemetry's HTTP server rule).
  if (out.failure() && (http_status >= 500 || http_status == 200)) f.error = out.failure()->message;
  s->opt.tracer->record(t.finish(out.times(), s->trace_ids));
}

/// Runs one generation job (every choice of a response) on this connection. Returns false when
/// the connection must close. `trace`: its span's start (null: not traced).
template <class Stream>
awaitable<bool> run_job(http_server::impl* s, Stream& stream, generation_job& job, unsigned version,
                        bool keep, const header_list& extra, request_trace* trace = nullptr) {
  auto ex = stream.get_executor();
  auto st = std::make_shared<job_state>(ex);
  const finish_guard over{*st};
  std::vector<uint64_t> ids;
  if (trace && !job.requests.empty()) {
    const auto& r = job.requests.front();
    trace->facts.max_tokens = static_cast<int64_t>(r.max_tokens);
    trace->facts.temperature = r.sampling.temperature;
    trace->facts.top_p = r.sampling.top_p;
  }
  // Every choice's messages join one queue (each carries its request id; the group routes them).
  // A beam search's step requests are many (width × steps): the group names its running ones.
  auto submit = [&](actors::replica_request req, bool beam_step = false) {
    if (!beam_step) ids.push_back(req.id);
    s->api->mesh().submit(std::move(req), [st, ex](const actors::token_msg& t) {
      net::post(ex, [st, t] {
        st->queue.push_back(t);
        st->timer.cancel();
      });
    });
  };
  for (auto& req : job.requests) submit(std::move(req));
  for (auto& req : job.output->take_submissions()) submit(std::move(req), true);  // a beam search's first step
  net::co_spawn(ex, watch(st, tcp_of(stream).socket()), net::detached);

  const bool chunked = version >= 11;
  if (!chunked) keep = false;
  auto head = sse_head(version, keep, extra);
  http::response_serializer<http::empty_body> head_writer{head};
  bool head_sent = false;
  error_code ec;
  auto& out = *job.output;
  while (!out.done() && !st->gone) {
    while (st->queue.empty() && !st->gone) {
      st->timer.expires_at(net::steady_timer::time_point::max());
      error_code woken;  // cancelled by a post or the watch: not an error
      co_await st->timer.async_wait(net::redirect_error(use_awaitable, woken));
    }
    std::string bytes;
    while (!st->queue.empty() && !out.done()) {
      if (trace && st->queue.front().token >= 0 && !st->queue.front().failed) trace->saw_token();
      bytes += out.on_message(st->queue.front());
      st->queue.pop_front();
    }
    // A choice ended by a stop string, or every other choice after a failure: free them now.
    for (uint64_t id : out.take_cancellations()) s->api->mesh().cancel(id);
    for (auto& req : out.take_submissions()) submit(std::move(req), true);  // a beam search's next step
    if (st->gone || bytes.empty()) continue;
    tcp_of(stream).expires_after(s->opt.write_timeout);
    if (!head_sent) {
      co_await http::async_write_header(stream, head_writer, net::redirect_error(use_awaitable, ec));
      head_sent = true;
      if (ec) break;
    }
    co_await write_sse(s, stream, bytes, chunked, ec);
    if (ec) break;
  }
  st->finished = true;
  error_code ignored;
  tcp_of(stream).socket().cancel(ignored);  // ends the watch
  // Unfinished (client gone, write failed, another choice failed) or ended by a stop string:
  // free them in the mesh. For a generation that ended on its own this is a no-op.
  for (uint64_t id : ids) s->api->mesh().cancel(id);
  for (uint64_t id : out.running_searches()) s->api->mesh().cancel(id);
  if (st->gone || ec) {
    count_request(s, 499);  // nginx's "client closed request"
    if (trace) record_span(s, *trace, out, 499);
    co_return false;
  }
  if (s->api->logs_outputs() && !out.failure() && out.size() > 0) s->api->log_outputs(out);
  if (!head_sent) {
    const http_reply r = out.reply();
    count_request(s, r.status);
    if (trace) record_span(s, *trace, out, r.status);
    co_return co_await write_reply(s, stream, r, version, keep, extra);
  }
  if (trace) record_span(s, *trace, out, 200);
  co_return co_await end_sse(s, stream, chunked);
}

/// Streams a background response's events (event_tail) until its run ends or the client goes
/// away — which leaves the run running. Returns false when the connection must close.
template <class Stream>
awaitable<bool> run_tail(http_server::impl* s, Stream& stream, event_tail& tail, unsigned version, bool keep,
                         const header_list& extra) {
  auto ex = stream.get_executor();
  auto st = std::make_shared<job_state>(ex);
  const finish_guard over{*st};
  net::co_spawn(ex, watch(st, tcp_of(stream).socket()), net::detached);
  const bool chunked = version >= 11;
  if (!chunked) keep = false;
  auto head = sse_head(version, keep, extra);
  http::response_serializer<http::empty_body> head_writer{head};
  tcp_of(stream).expires_after(s->opt.write_timeout);
  error_code ec;
  co_await http::async_write_header(stream, head_writer, net::redirect_error(use_awaitable, ec));
  int64_t after = tail.after;
  // The run wakes this connection (from an actor thread) when it has more; st->woken is set
  // on this connection's executor, so a wake before the wait is not lost.
  auto wake = [st, ex] { net::post(ex, [st] { st->woken = true; st->timer.cancel(); }); };
  while (!ec && !st->gone) {
    st->woken = false;
    auto page = tail.run->read(after, wake);
    if (!page.bytes.empty()) {
      after = page.last;
      co_await write_sse(s, stream, page.bytes, chunked, ec);
      continue;  // more may have come meanwhile
    }
    if (page.ended) break;
    while (!st->woken && !st->gone) {
      st->timer.expires_at(net::steady_timer::time_point::max());
      error_code ignored;
      co_await st->timer.async_wait(net::redirect_error(use_awaitable, ignored));
    }
  }
  st->finished = true;
  error_code ignored;
  tcp_of(stream).socket().cancel(ignored);  // ends the watch
  if (st->gone || ec) {
    count_request(s, 499);
    co_return false;
  }
  co_return co_await end_sse(s, stream, chunked);
}

/// vLLM's X-Request-Id: the client's (printable, at most 256 bytes), else 32 random hex digits.
std::string request_id(http_server::impl* s, std::string_view sent) {
  const bool usable = !sent.empty() && sent.size() <= 256 &&
                      std::all_of(sent.begin(), sent.end(), [](char c) { return c > 0x20 && c < 0x7f; });
  if (usable) return std::string(sent);
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(s->ids()),
                static_cast<unsigned long long>(s->ids()));
  return buf;
}

/// Adds X-Request-Id to an answer's headers when --enable-request-id-headers is on.
void add_request_id(http_server::impl* s, header_list& headers, std::string_view sent) {
  if (s->opt.request_id_headers) headers.emplace_back("X-Request-Id", request_id(s, sent));
}

/// The request's API key as api_service::handle takes it ("Bearer KEY"): the Authorization
/// field, or, when that is not a bearer token, Anthropic's x-api-key field (its SDKs and
/// proxies send the key there).
template <class Request>
std::string credentials(const Request& req) {
  const std::string_view authorization = sv(req[http::field::authorization]);
  const std::string_view x_api_key = sv(req["x-api-key"]);
  if (authorization.starts_with("Bearer ") || x_api_key.empty()) return std::string(authorization);
  return "Bearer " + std::string(x_api_key);
}

bool quiet_close(const error_code& ec) {
  return ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::eof ||
         ec == net::error::connection_reset || ec == net::error::operation_aborted || ec == net::error::broken_pipe ||
         ec == net::ssl::error::stream_truncated ||  // a TLS client gone without close_notify
         ec.category() == net::error::get_ssl_category();  // a TLS session broken mid-connection: nothing can answer it
}

/// Serves one connection's requests, one after another, until it closes or must close.
template <class Stream>
awaitable<void> serve_requests(http_server::impl* s, Stream& stream) {
  error_code ec;
  beast::flat_buffer buf;
  try {
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(s->opt.max_body_bytes);
      parser.header_limit(static_cast<std::uint32_t>(s->opt.max_header_bytes));
      tcp_of(stream).expires_after(s->opt.idle_timeout);
      co_await http::async_read(stream, buf, parser, net::redirect_error(use_awaitable, ec));
      if (ec) {
        if (quiet_close(ec)) break;
        http_reply r;
        if (ec == http::error::body_limit) {
          r = error_reply(make_error(errc::invalid_request, "the request body is larger than " +
                                                                std::to_string(s->opt.max_body_bytes) + " bytes"));
          r.status = 413;
        } else if (ec == http::error::header_limit) {
          r = error_reply(make_error(errc::invalid_request, "the request headers are larger than " +
                                                                std::to_string(s->opt.max_header_bytes) + " bytes"));
          r.status = 431;
        } else {
          r = error_reply(make_error(errc::invalid_request, "malformed HTTP request: " + ec.message()));
        }
        // Anthropic's routes answer in their API's shape, this answer too (their path is known
        // once the request line was read).
        std::string_view path = sv(parser.get().target());
        path = path.substr(0, path.find('?'));
        if (path.ends_with("/v1/messages") || path.ends_with("/v1/messages/count_tokens")) r.body = messages_error_body(r.body, r.status);
        count_request(s, r.status);
        // The fields read so far (a body over the limit came after whole headers): the page may
        // read the 413 when its Origin is allowed (CORS).
        header_list extra = cors_headers(s->opt.cors, sv(parser.get()[http::field::origin]));
        add_request_id(s, extra, sv(parser.get()["X-Request-Id"]));
        co_await write_reply(s, stream, r, 11, false, extra);
        break;
      }
      auto& req = parser.get();
      const bool keep = req.keep_alive() && !s->stopping;
      // CORS (cors.hpp): a browser's preflight is answered here; other answers carry the headers.
      const std::string_view origin = sv(req[http::field::origin]);
      if (auto pre = cors_preflight(s->opt.cors, sv(req.method_string()), origin, sv(req[http::field::access_control_request_method]),
                                    sv(req[http::field::access_control_request_headers]))) {
        count_request(s, pre->status);
        header_list ids;
        add_request_id(s, ids, sv(req["X-Request-Id"]));
        const bool sent = co_await write_reply(s, stream, *pre, req.version(), keep, ids);
        if (!sent || !keep) break;
        continue;
      }
      header_list extra = cors_headers(s->opt.cors, origin);
      add_request_id(s, extra, sv(req["X-Request-Id"]));
      std::unique_ptr<request_trace> trace = trace_of(s, req);
      const std::string key = credentials(req);
      auto handle = [s, &req, &key]() -> awaitable<api_outcome> {
        co_return s->api->handle(sv(req.method_string()), sv(req.target()), key, req.body());
      };
      // GETs are cheap (health, metrics, models); a POST's work goes to the pool. (No co_await
      // inside a conditional expression: g++ 12 destroys such a temporary twice.)
      api_outcome outcome;
      if (!s->api) {
        outcome = metrics_endpoint(s->metrics, sv(req.method_string()), sv(req.target()));
      } else if (req.method() == http::verb::post || waits_on_the_mesh(sv(req.target()))) {
        ++s->handling;
        struct done_guard {
          size_t& n;
          ~done_guard() { --n; }
        } done{s->handling};
        outcome = co_await net::co_spawn(s->workers, handle, use_awaitable);
      } else {
        outcome = s->api->handle(sv(req.method_string()), sv(req.target()), key, req.body());
      }
      bool ok = false;
      if (auto* reply = std::get_if<http_reply>(&outcome)) {
        count_request(s, reply->status);
        ok = co_await write_reply(s, stream, *reply, req.version(), keep, extra);
      } else if (auto* job = std::get_if<generation_job>(&outcome)) {
        ok = co_await run_job(s, stream, *job, req.version(), keep, extra, trace.get());
      } else {
        ok = co_await run_tail(s, stream, std::get<event_tail>(outcome), req.version(), keep, extra);
      }
      if (!ok || !keep) break;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llmesh: connection dropped after an internal error: %s\n", e.what());
  }
}

awaitable<void> session(http_server::impl* s, tcp::socket sock, net::ip::address client) {
  ++s->connections;
  ++s->per_client[client];
  struct count_guard {
    http_server::impl* s;
    net::ip::address client;
    ~count_guard() {
      --s->connections;
      if (auto it = s->per_client.find(client); it != s->per_client.end() && --it->second == 0) s->per_client.erase(it);
    }
  } guard{s, client};
  error_code ec;
  sock.set_option(tcp::no_delay(true), ec);
  if (!s->tls) {
    beast::tcp_stream stream(std::move(sock));
    co_await serve_requests(s, stream);
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream.close();
    co_return;
  }
  // HTTPS: the handshake within the idle timeout (a client that never completes one holds a slot
  // no longer than an idle connection); a failed one (plain HTTP, an unknown CA, no client
  // certificate where one is required) closes the connection without a word, as uvicorn does.
  const std::shared_ptr<ssl_context> ctx = s->tls->current();  // kept for the connection's life
  tls_stream stream(std::move(sock), *ctx);
  tcp_of(stream).expires_after(s->opt.idle_timeout);
  co_await stream.async_handshake(net::ssl::stream_base::server, net::redirect_error(use_awaitable, ec));
  if (!ec) {
    co_await serve_requests(s, stream);
    // close_notify, so the client can tell the end of a reply from a cut (HTTP/1.0 streams end so).
    tcp_of(stream).expires_after(std::chrono::seconds(2));
    co_await stream.async_shutdown(net::redirect_error(use_awaitable, ec));
  }
  tcp_of(stream).close();
}

/// A reply as the bytes on the wire ("Connection: close").
std::string wire_bytes(const http_reply& r) {
  http::response<http::string_body> res{static_cast<http::status>(r.status), 11};
  res.set(http::field::server, "llmesh");
  res.set(http::field::content_type, r.content_type);
  for (const auto& [k, v] : r.headers) res.set(k, v);
  res.keep_alive(false);
  res.body() = r.body;
  res.prepare_payload();
  std::ostringstream out;
  out << res;
  return out.str();
}

/// Refuses a connection over a limit with a 429 (DESIGN.md §6: overload answers fast) on the
/// accept loop itself: one non-blocking send of the prepared reply and a close, without
/// reading the request (a client sending the request first still finds the reply already in
/// its receive buffer). Should a brand-new connection's send buffer not take these few hundred
/// bytes (not seen in practice), the connection closes with what went out.
void refuse(http_server::impl* s, tcp::socket& sock, const std::string& reply) {
  const int fd = sock.native_handle();
  // Over HTTPS the reply would need a handshake, the very work the limit refuses: closed bare.
  if (!s->tls) (void)::send(fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  count_request(s, 429);
  // FIN after the reply; then what the client already sent is dropped, so that the close does
  // not turn into a reset for that reason (at most a few reads, never a wait).
  ::shutdown(fd, SHUT_WR);
  char sink[4096];
  for (int i = 0; i < 4 && ::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
  }
  error_code ec;
  sock.close(ec);
}

awaitable<void> accept_loop(http_server::impl* s) {
  net::steady_timer backoff(s->ioc);
  for (;;) {
    error_code ec;
    tcp::socket sock = co_await s->acceptor.async_accept(net::redirect_error(use_awaitable, ec));
    if (!s->acceptor.is_open()) co_return;
    if (ec) {  // out of descriptors or similar: do not spin
      backoff.expires_after(std::chrono::milliseconds(50));
      co_await backoff.async_wait(net::redirect_error(use_awaitable, ec));
      continue;
    }
    const auto peer = sock.remote_endpoint(ec);
    if (ec) {  // already gone
      sock.close(ec);
      continue;
    }
    if (s->connections >= s->opt.max_connections) {
      refuse(s, sock, s->full_reply);
      continue;
    }
    // One client (address) cannot take every slot: beyond its share, its new connections get 429.
    if (auto it = s->per_client.find(peer.address());
        it != s->per_client.end() && it->second >= s->opt.max_connections_per_client) {
      refuse(s, sock, s->client_full_reply);
      continue;
    }
    net::co_spawn(s->ioc, session(s, std::move(sock), peer.address()), net::detached);
  }
}

awaitable<void> drain(http_server::impl* s, std::chrono::steady_clock::time_point deadline) {
  net::steady_timer t(s->ioc);
  while (((s->api && s->api->inflight() > 0) || s->handling > 0) && std::chrono::steady_clock::now() < deadline) {
    t.expires_after(std::chrono::milliseconds(20));
    error_code ec;
    co_await t.async_wait(net::redirect_error(use_awaitable, ec));
  }
  s->ioc.stop();
}

}  // namespace

http_server::http_server(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
http_server::~http_server() = default;

result<std::unique_ptr<http_server>> http_server::listen(api_service& api, http_options opt) {
  return start(std::make_unique<impl>(api, opt));
}

result<std::unique_ptr<http_server>> http_server::listen_metrics(actors::metrics_registry& metrics, http_options opt) {
  return start(std::make_unique<impl>(metrics, opt));
}

result<std::unique_ptr<http_server>> http_server::start(std::unique_ptr<impl> p) {
  const http_options& opt = p->opt;
  p->full_reply = wire_bytes(error_reply(make_error(
      errc::overloaded, "the server is at its limit of " + std::to_string(opt.max_connections) +
                            " open connections; retry shortly")));
  p->client_full_reply = wire_bytes(error_reply(make_error(
      errc::overloaded, "this client address holds its limit of " + std::to_string(opt.max_connections_per_client) +
                            " open connections; close one or retry shortly")));
  if (opt.tls.enabled()) {
    auto tls = tls_contexts::open(opt.tls);
    if (!tls) return tls.take_error();
    p->tls = std::move(*tls);
  }
  const std::string where = opt.host + ":" + std::to_string(opt.port);
  error_code ec;
  tcp::endpoint ep;
  auto addr = net::ip::make_address(opt.host, ec);
  if (!ec) {
    ep = tcp::endpoint(addr, opt.port);
  } else {
    tcp::resolver resolver(p->ioc);
    auto found = resolver.resolve(opt.host, std::to_string(opt.port), ec);
    if (ec || found.empty()) return make_error(errc::invalid_request, "cannot resolve the HTTP host '" + opt.host + "'");
    ep = found.begin()->endpoint();
  }
  p->acceptor.open(ep.protocol(), ec);
  if (!ec) p->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) p->acceptor.bind(ep, ec);
  if (!ec) p->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return make_error(errc::io_error, "cannot listen on " + where + ": " + ec.message());
  p->port = p->acceptor.local_endpoint().port();
  net::co_spawn(p->ioc, accept_loop(p.get()), net::detached);
  return std::unique_ptr<http_server>(new http_server(std::move(p)));
}

void http_server::run() { impl_->ioc.run(); }

void http_server::stop(std::chrono::milliseconds drain_for) {
  impl* s = impl_.get();
  net::post(s->ioc, [s, drain_for] {
    if (s->stopping) return;
    s->stopping = true;
    error_code ec;
    s->acceptor.close(ec);
    net::co_spawn(s->ioc, drain(s, std::chrono::steady_clock::now() + drain_for), net::detached);
  });
}

uint16_t http_server::port() const { return impl_->port; }

}  // namespace llmesh::gateway
