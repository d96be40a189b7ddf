// `llmesh bench serve` (serve_bench.hpp): the HTTP side. One io_context on the calling thread;
// a dispatcher coroutine releases requests at their arrival times, each request is a coroutine
// with its own connection that stamps every piece of the SSE body as it arrives and hands it
// to an sse_recorder (serve_stats.hpp), which owns the metric definitions.
//
// Beast lives in gateway/ and here: this is a client of the public HTTP API, measured from
// outside like any other client would be, so it must not reach into the gateway.
#include <utility>  // before Asio: asio/awaitable.hpp needs std::exchange (g++ 12)

#include "llmesh/bench/serve_bench.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/beast/ssl.hpp>
#include <optional>
#include <type_traits>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <random>

#include "llmesh/bench/serve_stats.hpp"
#include "llmesh/model/config.hpp"

namespace llmesh::bench {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using net::awaitable;
using net::use_awaitable;
using error_code = boost::system::error_code;
using bench_clock = std::chrono::steady_clock;

result<base_url> parse_base_url(const std::string& url) {
  auto bad = [&](const std::string& why) { return make_error(errc::invalid_request, "--url '" + url + "': " + why); };
  const bool tls = url.starts_with("https://");
  if (!tls && !url.starts_with("http://")) return bad("must start with http:// or https://");
  std::string rest = url.substr(tls ? 8 : 7);
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  base_url u;
  u.tls = tls;
  u.port = tls ? "443" : "80";
  if (slash != std::string::npos) u.prefix = rest.substr(slash);
  while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  if (u.prefix.find_first_of("?# ") != std::string::npos) return bad("a query, fragment or space in the path");
  std::string port;
  if (authority.starts_with('[')) {
    const size_t close = authority.find(']');
    if (close == std::string::npos) return bad("unclosed '[' in the host");
    u.host = authority.substr(1, close - 1);
    const std::string after = authority.substr(close + 1);
    if (!after.empty() && !after.starts_with(':')) return bad("junk after the IPv6 host");
    if (!after.empty()) port = after.substr(1);
    if (after == ":") return bad("empty port");
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) return bad("empty port");
    }
  }
  if (u.host.empty()) return bad("no host");
  if (u.host.find_first_of("@ ") != std::string::npos) return bad("user info or spaces in the host");
  if (!port.empty()) {
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (*end != '\0' || p < 1 || p > 65535) return bad("bad port '" + port + "'");
    u.port = std::to_string(p);
  }
  return u;
}

std::vector<double> poisson_arrivals(size_t n, double rate, uint64_t seed) {
  std::vector<double> at(n, 0.0);
  if (std::isinf(rate)) return at;
  // Its own stream (seed mixed with a constant) so a different rate keeps the same prompts.
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::exponential_distribution<double> gap(rate);
  for (size_t i = 1; i < n; ++i) at[i] = at[i - 1] + gap(rng);
  return at;
}

std::vector<std::vector<int32_t>> random_prompts(size_t n, size_t len, size_t vocab, uint64_t seed, size_t prefix_len,
                                                 size_t num_prefixes) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  // Never more prefixes than prompts (those would never be used).
  std::vector<std::vector<int32_t>> prefixes(std::clamp<size_t>(num_prefixes, 1, std::max<size_t>(n, 1)),
                                             std::vector<int32_t>(prefix_len));
  for (auto& prefix : prefixes) {
    for (auto& t : prefix) t = id(rng);
  }
  std::vector<std::vector<int32_t>> out(n, std::vector<int32_t>(prefix_len + len));
  for (size_t k = 0; k < n; ++k) {
    auto& p = out[k];
    const auto& prefix = prefixes[k % prefixes.size()];
    std::copy(prefix.begin(), prefix.end(), p.begin());
    for (size_t i = prefix_len; i < p.size(); ++i) p[i] = id(rng);
  }
  return out;
}

namespace {

/// The run, shared by the dispatcher and the request coroutines (all on one thread).
struct run_state {
  run_state(net::io_context& io, const serve_bench_options& o, base_url u) : ioc(io), opt(o), where(std::move(u)) {}
  net::io_context& ioc;
  const serve_bench_options& opt;
  base_url where;
  std::optional<net::ssl::context> ssl;  ///< https: the client context
  tcp::resolver::results_type endpoints;
  std::string model;
  size_t max_model_len = 0;           ///< from /v1/models; 0: not given
  status outcome = ok_status();       ///< set by the preflight
  size_t in_flight = 0;
  net::steady_timer* wake = nullptr;  ///< cancelled when a request ends
  std::vector<request_record> records;
  double duration_s = 0;
};

/// "0.5", "600", "inf": a number as a person would write it.
std::string short_num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::chrono::nanoseconds timeout_of(const serve_bench_options& o) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(o.timeout_s));
}

template <class Body>
void set_common_headers(http::request<Body>& req, const run_state& st) {
  const bool v6 = st.where.host.find(':') != std::string::npos;
  std::string host = v6 ? "[" + st.where.host + "]" : st.where.host;
  if (st.where.port != (st.where.tls ? "443" : "80")) host += ":" + st.where.port;
  req.set(http::field::host, host);
  req.set(http::field::user_agent, "llmesh-bench-serve");
  if (!st.opt.api_key.empty()) req.set(http::field::authorization, "Bearer " + st.opt.api_key);
  req.keep_alive(false);  // one connection per request
}

/// The server's error message from a JSON error body ({"error":{"message":...}}), else the body.
std::string error_text(unsigned status, const std::string& body) {
  std::string msg = body.substr(0, 200);
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string()) {
    msg = j["error"]["message"].get<std::string>();
  }
  return "HTTP " + std::to_string(status) + (msg.empty() ? "" : ": " + msg);
}

using tls_stream = beast::ssl_stream<beast::tcp_stream>;

/// "http[s]://HOST:PORT", for messages.
std::string origin(const run_state& st) {
  return (st.where.tls ? "https://" : "http://") + st.where.host + ":" + st.where.port;
}

/// Connects `stream` (and, over TLS, completes the handshake: the server's name for SNI and, unless
/// --insecure, its certificate checked for that name), within `limit`.
template <class Stream>
awaitable<void> open(run_state& st, Stream& stream, std::chrono::nanoseconds limit, error_code& ec) {
  auto& tcp_layer = beast::get_lowest_layer(stream);
  tcp_layer.expires_after(limit);
  co_await tcp_layer.async_connect(st.endpoints, net::redirect_error(use_awaitable, ec));
  if constexpr (std::is_same_v<Stream, tls_stream>) {
    if (ec) co_return;
    error_code not_ip;
    net::ip::make_address(st.where.host, not_ip);
    if (not_ip) SSL_set_tlsext_host_name(stream.native_handle(), st.where.host.c_str());  // SNI names hosts, never addresses
    if (!st.opt.insecure) stream.set_verify_callback(net::ssl::host_name_verification(st.where.host));
    tcp_layer.expires_after(limit);
    co_await stream.async_handshake(net::ssl::stream_base::client, net::redirect_error(use_awaitable, ec));
  }
}

template <class Stream>
awaitable<void> read_models(run_state& st, Stream& stream);

/// Resolves the host and reads GET /v1/models: the model name (first id) and max_model_len.
awaitable<void> preflight(run_state& st) {
  const std::string where = origin(st);
  error_code ec;
  tcp::resolver resolver(st.ioc);
  st.endpoints = co_await resolver.async_resolve(st.where.host, st.where.port, net::redirect_error(use_awaitable, ec));
  if (ec) {
    st.outcome = make_error(errc::transport_disconnected, "cannot resolve '" + st.where.host + "': " + ec.message());
    co_return;
  }
  // Why 10 s: a server that does not answer /v1/models that fast is not ready to be measured.
  const auto limit = std::chrono::nanoseconds(std::chrono::seconds(10));
  if (st.where.tls) {
    tls_stream stream(st.ioc, *st.ssl);
    co_await open(st, stream, limit, ec);
    if (!ec) co_await read_models(st, stream);
  } else {
    beast::tcp_stream stream(st.ioc);
    co_await open(st, stream, limit, ec);
    if (!ec) co_await read_models(st, stream);
  }
  if (ec) st.outcome = make_error(errc::transport_disconnected, "cannot connect to " + where + ": " + ec.message());
}

template <class Stream>
awaitable<void> read_models(run_state& st, Stream& stream) {
  const std::string where = origin(st);
  error_code ec;
  http::request<http::empty_body> req{http::verb::get, st.where.prefix + "/v1/models", 11};
  set_common_headers(req, st);
  co_await http::async_write(stream, req, net::redirect_error(use_awaitable, ec));
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  if (!ec) co_await http::async_read(stream, buf, res, net::redirect_error(use_awaitable, ec));
  error_code ignored;
  beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_both, ignored);
  if (ec) {
    st.outcome = make_error(errc::transport_disconnected, "GET " + where + st.where.prefix + "/v1/models: " + ec.message());
    co_return;
  }
  const auto j = nlohmann::json::parse(res.body(), nullptr, false);
  const nlohmann::json* first = nullptr;
  if (res.result_int() == 200 && j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
      j["data"][0].is_object() && j["data"][0].contains("id") && j["data"][0]["id"].is_string()) {
    first = &j["data"][0];
  }
  if (st.opt.model.empty()) {
    if (res.result_int() != 200) {
      st.outcome = make_error(errc::protocol_violation, "GET /v1/models: " + error_text(res.result_int(), res.body()));
      co_return;
    }
    if (!first) {
      st.outcome = make_error(errc::protocol_violation, "GET /v1/models lists no model id; give --model");
      co_return;
    }
    st.model = (*first)["id"].get<std::string>();
  } else {
    st.model = st.opt.model;
  }
  if (first && (*first)["id"] == st.model && first->contains("max_model_len") &&
      (*first)["max_model_len"].is_number_unsigned()) {
    st.max_model_len = (*first)["max_model_len"].get<size_t>();
  }
}

template <class Stream>
awaitable<request_record> completion_over(run_state& st, Stream& stream, const std::string& body, size_t n_prompt);

request_record failed_request(size_t n_prompt, std::string why) {
  request_record r;
  r.n_tokens_prompt = n_prompt;
  r.error = std::move(why);
  return r;
}

/// One streamed completion on its own connection. Times run from just before the request is
/// written (after connecting: loopback connects take microseconds, and vLLM's client reuses
/// pooled connections, so connect time is not part of its TTFT either).
awaitable<request_record> stream_completion(run_state& st, const std::string& body, size_t n_prompt) {
  auto failed = [n_prompt](std::string why) { return failed_request(n_prompt, std::move(why)); };
  const auto timeout = timeout_of(st.opt);
  error_code ec;
  if (st.where.tls) {
    tls_stream stream(st.ioc, *st.ssl);
    co_await open(st, stream, timeout, ec);
    if (ec) co_return failed("connect: " + ec.message());
    co_return co_await completion_over(st, stream, body, n_prompt);
  }
  beast::tcp_stream stream(st.ioc);
  co_await open(st, stream, timeout, ec);
  if (ec) co_return failed("connect: " + ec.message());
  co_return co_await completion_over(st, stream, body, n_prompt);
}

/// The request and its stream on a connection `open` made.
template <class Stream>
awaitable<request_record> completion_over(run_state& st, Stream& stream, const std::string& body, size_t n_prompt) {
  auto failed = [n_prompt](std::string why) { return failed_request(n_prompt, std::move(why)); };
  const auto timeout = timeout_of(st.opt);
  error_code ec;
  http::request<http::string_body> req{http::verb::post, st.where.prefix + "/v1/completions", 11};
  set_common_headers(req, st);
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "text/event-stream");
  req.body() = body;
  req.prepare_payload();
  const auto t0 = bench_clock::now();
  beast::get_lowest_layer(stream).expires_after(timeout);
  co_await http::async_write(stream, req, net::redirect_error(use_awaitable, ec));
  if (ec) co_return failed("send: " + ec.message());

  beast::flat_buffer buf;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);  // a stream is as long as the generation
  beast::get_lowest_layer(stream).expires_after(timeout);
  co_await http::async_read_header(stream, buf, parser, net::redirect_error(use_awaitable, ec));
  if (ec) co_return failed("response: " + ec.message());
  const unsigned status = parser.get().result_int();

  sse_recorder rec;
  std::string error_body;
  char piece[16384];
  while (!parser.is_done()) {
    parser.get().body().data = piece;
    parser.get().body().size = sizeof piece;
    beast::get_lowest_layer(stream).expires_after(timeout);
    co_await http::async_read_some(stream, buf, parser, net::redirect_error(use_awaitable, ec));
    if (ec == http::error::need_buffer) ec = {};  // the piece is full: not an error
    const size_t n = sizeof piece - parser.get().body().size;
    if (status != 200) {
      if (error_body.size() < 4096) error_body.append(piece, n);
    } else if (n > 0) {
      rec.feed(std::string_view(piece, n), std::chrono::duration<double>(bench_clock::now() - t0).count());
    }
    if (ec) break;
  }
  error_code ignored;
  beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_both, ignored);
  if (status != 200) co_return failed(error_text(status, error_body));
  request_record r = rec.finish(n_prompt);
  if (ec && !rec.done()) {
    r.ok = false;
    r.error = (ec == beast::error::timeout ? "no data for " + short_num(st.opt.timeout_s) + " s"
                                           : "stream: " + ec.message());
  }
  co_return r;
}

awaitable<void> run_request(run_state& st, size_t i, std::string body, size_t n_prompt) {
  try {
    st.records[i] = co_await stream_completion(st, body, n_prompt);
  } catch (const std::exception& e) {  // Beast or the allocator: one failed request, not a crash
    st.records[i].n_tokens_prompt = n_prompt;
    st.records[i].error = std::string("internal: ") + e.what();
  }
  --st.in_flight;
  st.wake->cancel();
}

/// Waits until a request ends (or returns at once if one ended since the caller checked).
awaitable<void> wait_for_a_request(run_state& st) {
  st.wake->expires_at(net::steady_timer::time_point::max());
  error_code woken;  // cancelled by run_request: not an error
  co_await st.wake->async_wait(net::redirect_error(use_awaitable, woken));
}

awaitable<void> run_all(run_state& st, std::vector<std::string> bodies, std::vector<double> arrivals) {
  co_await preflight(st);
  if (!st.outcome) co_return;
  const size_t prompt_len = st.opt.random_prefix_len + st.opt.input_len;
  if (st.max_model_len && prompt_len + st.opt.output_len > st.max_model_len) {
    st.outcome = make_error(errc::invalid_request, "--random-prefix-len + --input-len + --output-len = " +
                                                       std::to_string(prompt_len + st.opt.output_len) +
                                                       " exceeds the server's max_model_len " +
                                                       std::to_string(st.max_model_len));
    co_return;
  }
  // The bodies were made before the model name was known: it goes in now.
  for (auto& b : bodies) b.replace(b.find("\"model\":\"\""), 10, "\"model\":" + nlohmann::json(st.model).dump());
  std::fprintf(stderr, "llmesh: bench serve: %zu requests to '%s' (rate %s/s, max concurrency %s)\n", bodies.size(),
               st.model.c_str(), short_num(st.opt.request_rate).c_str(),
               st.opt.max_concurrency ? std::to_string(st.opt.max_concurrency).c_str() : "none");
  std::fflush(stderr);

  net::steady_timer wake(st.ioc), pace(st.ioc);
  st.wake = &wake;
  st.records.assign(bodies.size(), request_record{});
  const auto start = bench_clock::now();
  for (size_t i = 0; i < bodies.size(); ++i) {
    const auto at = start + std::chrono::duration_cast<bench_clock::duration>(std::chrono::duration<double>(arrivals[i]));
    if (at > bench_clock::now()) {
      pace.expires_at(at);
      error_code ignored;
      co_await pace.async_wait(net::redirect_error(use_awaitable, ignored));
    }
    // Late arrivals wait here in order, as vLLM's tasks wait on its semaphore.
    while (st.opt.max_concurrency && st.in_flight >= st.opt.max_concurrency) co_await wait_for_a_request(st);
    ++st.in_flight;
    net::co_spawn(st.ioc, run_request(st, i, std::move(bodies[i]), prompt_len), net::detached);
  }
  while (st.in_flight > 0) co_await wait_for_a_request(st);
  st.duration_s = std::chrono::duration<double>(bench_clock::now() - start).count();
  st.wake = nullptr;
}

status check_options(const serve_bench_options& o) {
  auto bad = [](const std::string& m) { return make_error(errc::invalid_request, m); };
  if (o.url.empty()) return bad("--url is required");
  if (o.num_prompts == 0) return bad("--num-prompts must be at least 1");
  if (o.input_len == 0) return bad("--input-len must be at least 1");
  if (o.output_len == 0) return bad("--output-len must be at least 1");
  if (!(o.request_rate > 0)) return bad("--request-rate must be positive (or inf)");
  if (!(o.timeout_s > 0)) return bad("--timeout must be positive");
  return ok_status();
}

}  // namespace

status run_serve_bench(const serve_bench_options& opt) {
  LLMESH_TRY(check_options(opt));
  auto where = parse_base_url(opt.url);
  if (!where) return where.take_error();
  size_t vocab = opt.vocab;
  if (vocab == 0 && !opt.tokenizer_dir.empty()) {
    auto cfg = model::load_config(opt.tokenizer_dir);
    if (!cfg) return cfg.take_error();
    vocab = cfg->vocab;
  }
  if (vocab == 0) vocab = 256;
  if (vocab > static_cast<size_t>(INT32_MAX)) return make_error(errc::invalid_request, "--vocab is too large");

  // Bodies are made before the run so that building them is not timed; "model" is filled in
  // once the preflight knows it.
  std::vector<std::string> bodies;
  bodies.reserve(opt.num_prompts);
  for (auto& ids : random_prompts(opt.num_prompts, opt.input_len, vocab, opt.seed, opt.random_prefix_len, opt.num_prefixes)) {
    nlohmann::ordered_json j;
    j["model"] = "";
    j["prompt"] = std::move(ids);
    j["max_tokens"] = opt.output_len;
    j["temperature"] = 0.0;
    j["ignore_eos"] = true;
    j["stream"] = true;
    j["stream_options"] = {{"include_usage", true}};
    bodies.push_back(j.dump());
  }

  net::io_context ioc{1};
  run_state st(ioc, opt, *where);
  if (where->tls) {
    st.ssl.emplace(net::ssl::context::tls_client);
    error_code ec;
    if (!opt.cacert.empty()) {
      st.ssl->load_verify_file(opt.cacert, ec);
      if (ec) return make_error(errc::invalid_request, "--cacert " + opt.cacert + ": " + ec.message());
    } else {
      st.ssl->set_default_verify_paths(ec);
    }
    st.ssl->set_verify_mode(opt.insecure ? net::ssl::verify_none : net::ssl::verify_peer);
  }
  std::exception_ptr crashed;
  net::co_spawn(ioc, run_all(st, std::move(bodies), poisson_arrivals(opt.num_prompts, opt.request_rate, opt.seed)),
                [&crashed](std::exception_ptr e) { crashed = e; });
  try {
    ioc.run();
    if (crashed) std::rethrow_exception(crashed);
  } catch (const std::exception& e) {
    return make_error(errc::internal, std::string("bench serve: ") + e.what());
  }
  if (!st.outcome) return st.outcome;

  const serve_metrics m = compute_serve_metrics(st.records, st.duration_s > 0 ? st.duration_s : 1e-9);
  serve_run_info info{st.model, opt.num_prompts, opt.input_len, opt.output_len, opt.request_rate, opt.max_concurrency,
                      opt.random_prefix_len, opt.random_prefix_len ? std::max<size_t>(1, opt.num_prefixes) : 0};
  std::fputs(format_serve_table(m, info).c_str(), stdout);
  std::printf("%s\n", format_serve_json(m, info).c_str());
  std::fflush(stdout);
  std::string first_error;
  for (const auto& r : st.records) {
    if (!r.ok) {
      first_error = r.error;
      break;
    }
  }
  if (m.completed == 0) {
    return make_error(errc::replica_unavailable, "all " + std::to_string(m.failed) + " requests failed; the first: " + first_error);
  }
  if (m.failed > 0) {
    std::fprintf(stderr, "llmesh: bench serve: %zu of %zu requests failed; the first: %s\n", m.failed,
                 opt.num_prompts, first_error.c_str());
  }
  return ok_status();
}

}  // namespace llmesh::bench
