// `llmesh bench transport` (transport_bench.hpp). The peer process is this binary again, run
// with the hidden --echo flag (a fresh process: no UCX state is shared across fork).
#include "llmesh/bench/transport_bench.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "llmesh/transport/ucx_transport.hpp"

namespace llmesh::bench {
namespace {

using clock_type = std::chrono::steady_clock;
using transport::peer_id;

/// The echo peer: small frames come back whole, large ones are acknowledged with 8 bytes.
status run_echo(const std::string& where, int spin_us, bool queued_sends) {
  transport::ucx_options uo;
  uo.spin = std::chrono::microseconds(spin_us);
  uo.direct_send = !queued_sends;
  auto t = transport::ucx_transport::create(uo);
  if (!t) return t.take_error();
  std::mutex mu;
  std::condition_variable cv;
  bool down = false;
  transport::transport* net = t->get();
  transport::transport_handlers h;
  h.on_frame = [net](peer_id p, std::span<const uint8_t> f) {
    if (f.size() <= 4096) {
      (void)net->send(p, std::vector<uint8_t>(f.begin(), f.end()));
    } else {
      (void)net->send(p, std::vector<uint8_t>(8, 1));
    }
  };
  h.on_peer_down = [&](peer_id, const error&) {
    std::lock_guard l(mu);
    down = true;
    cv.notify_all();
  };
  (*t)->set_handlers(std::move(h));
  auto p = (*t)->connect(where);
  if (!p) return p.take_error();
  std::unique_lock l(mu);
  cv.wait(l, [&] { return down; });
  return ok_status();
}

/// Runs a command, returns its stdout.
std::string capture(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

/// Ends a child process: SIGTERM, then SIGKILL when it has not exited within `patience`.
void stop_process(pid_t pid, std::chrono::milliseconds patience = std::chrono::seconds(5)) {
  kill(pid, SIGTERM);
  const auto deadline = clock_type::now() + patience;
  while (waitpid(pid, nullptr, WNOHANG) == 0) {
    if (clock_type::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

/// ucx_perftest's "Final:" numbers: {p50 overhead us, average overhead us, overall MB/s}.
/// Both ucx_perftest processes run under coreutils' `timeout`: a server that never sees its
/// client, or a client whose server went away, must not hold the benchmark (or a test) forever.
std::optional<std::array<double, 3>> perftest(const std::string& test, size_t bytes, size_t iters, int port) {
  const std::string common = "ucx_perftest -e -p " + std::to_string(port);
  const pid_t server = fork();
  if (server == 0) {
    execl("/bin/sh", "sh", "-c", ("exec timeout -k 2 30 " + common + " > /dev/null 2>&1 < /dev/null").c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string out;
  for (int attempt = 0; attempt < 3 && out.find("Final:") == std::string::npos; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the server's start-up
    out = capture("timeout -k 2 20 " + common + " -t " + test + " -s " + std::to_string(bytes) + " -n " +
                  std::to_string(iters) + " -w " + std::to_string(std::max<size_t>(iters / 10, 10)) +
                  " 127.0.0.1 2>/dev/null < /dev/null");
  }
  stop_process(server);
  const auto at = out.find("Final:");
  if (at == std::string::npos) return std::nullopt;
  std::stringstream ss(out.substr(at + 6));
  double it = 0, p50 = 0, avg = 0, overall = 0, bw_avg = 0, bw_overall = 0;
  if (!(ss >> it >> p50 >> avg >> overall >> bw_avg >> bw_overall)) return std::nullopt;
  return std::array<double, 3>{p50, avg, bw_overall};
}

}  // namespace

status run_transport_bench(const transport_bench_options& opt) {
  if (!opt.echo.empty()) return run_echo(opt.echo, opt.spin_us, opt.queued_sends);
  if (opt.iters == 0 || opt.frames == 0 || opt.small_bytes == 0 || opt.small_bytes > 4096 || opt.large_bytes <= 4096) {
    return make_error(errc::invalid_request, "need --iters, --frames > 0, --small-bytes in 1..4096, --large-bytes > 4096");
  }
  transport::ucx_options uo;
  uo.spin = std::chrono::microseconds(opt.spin_us);
  uo.direct_send = !opt.queued_sends;
  auto t = transport::ucx_transport::create(uo);
  if (!t) return t.take_error();
  std::mutex mu;
  std::condition_variable cv;
  std::optional<peer_id> peer;
  size_t replies = 0;
  bool down = false;
  transport::transport_handlers h;
  h.on_accept = [&](peer_id p, const std::string&) {
    std::lock_guard l(mu);
    peer = p;
    cv.notify_all();
  };
  h.on_frame = [&](peer_id, std::span<const uint8_t>) {
    std::lock_guard l(mu);
    ++replies;
    cv.notify_all();
  };
  h.on_peer_down = [&](peer_id, const error&) {
    std::lock_guard l(mu);
    down = true;
    cv.notify_all();
  };
  (*t)->set_handlers(std::move(h));
  auto where = (*t)->listen("127.0.0.1:0");
  if (!where) return where.take_error();

  const pid_t child = fork();
  if (child == 0) {
    const std::string spin = std::to_string(opt.spin_us);
    execl("/proc/self/exe", "llmesh", "bench", "transport", "--spin-us", spin.c_str(), "--echo", where->c_str(),
          opt.queued_sends ? "--queued-sends" : static_cast<char*>(nullptr), static_cast<char*>(nullptr));
    _exit(127);
  }
  auto stop_child = [&] { stop_process(child); };
  {
    std::unique_lock l(mu);
    if (!cv.wait_for(l, std::chrono::seconds(10), [&] { return peer.has_value() || down; }) || down) {
      l.unlock();
      stop_child();
      return make_error(errc::transport_disconnected, "the echo process did not connect to " + *where);
    }
  }
  // Round trips: one small frame out, its echo back, one at a time.
  auto wait_replies = [&](size_t n) {
    std::unique_lock l(mu);
    return cv.wait_for(l, std::chrono::seconds(60), [&] { return replies >= n || down; }) && !down;
  };
  std::vector<double> rt;
  rt.reserve(opt.iters);
  const size_t warmup = std::max<size_t>(opt.iters / 10, 10);
  for (size_t i = 0; i < warmup + opt.iters; ++i) {
    const auto t0 = clock_type::now();
    const size_t want = replies + 1;
    if (!(*t)->send(*peer, std::vector<uint8_t>(opt.small_bytes, 7)) || !wait_replies(want)) {
      stop_child();
      return make_error(errc::transport_disconnected, "the echo peer went away during the round trips");
    }
    if (i >= warmup) rt.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
  }
  // Bandwidth: all large frames at once (within the transport's pending-send bound), one ack each.
  const size_t base = replies;
  const auto b0 = clock_type::now();
  for (size_t i = 0; i < opt.frames; ++i) {
    if (!(*t)->send(*peer, std::vector<uint8_t>(opt.large_bytes, static_cast<uint8_t>(i)))) {
      // Pending sends are bounded: wait for some acks, then retry this frame.
      if (!wait_replies(replies + 1)) break;
      --i;
    }
  }
  const bool bw_ok = wait_replies(base + opt.frames);
  const double bw_s = std::chrono::duration<double>(clock_type::now() - b0).count();
  t->reset();  // closes the connection: the echo peer exits
  stop_child();
  if (!bw_ok) return make_error(errc::transport_disconnected, "the echo peer went away during the bandwidth run");

  std::sort(rt.begin(), rt.end());
  const double rt_p50 = rt[rt.size() / 2];
  const double rt_mean = std::accumulate(rt.begin(), rt.end(), 0.0) / static_cast<double>(rt.size());
  const double bw = static_cast<double>(opt.frames * opt.large_bytes) / bw_s / 1e9;

  // The peer: ucx_perftest on the same transports (the environment ucx_transport set is inherited).
  const auto lat = perftest("ucp_am_lat", opt.small_bytes, opt.iters, 13337 + static_cast<int>(getpid() % 1000));
  const auto band = perftest("ucp_am_bw", opt.large_bytes, std::max<size_t>(opt.frames, 16), 14337 + static_cast<int>(getpid() % 1000));
  const char* tls = std::getenv("UCX_TLS");
  std::printf("llmesh bench transport: two processes on 127.0.0.1, UCX_TLS=%s, peer error mode, spin %d us, %s sends\n",
              tls ? tls : "(unset)", opt.spin_us, opt.queued_sends ? "queued" : "direct");
  std::printf("  round trip   %zu B frames: p50 %.2f us, mean %.2f us", opt.small_bytes, rt_p50, rt_mean);
  if (lat) {
    std::printf("; ucx_perftest ucp_am_lat: %.2f us (2 x one-way p50) -> %.2fx\n", 2 * (*lat)[0], rt_p50 / (2 * (*lat)[0]));
  } else {
    std::printf("; ucx_perftest not available or failed\n");
  }
  std::printf("  bandwidth    %zu x %zu B frames: %.3f GB/s", opt.frames, opt.large_bytes, bw);
  if (band) {
    const double peer_gbs = (*band)[2] * 1048576.0 / 1e9;  // ucx_perftest's MB/s are MiB/s
    std::printf("; ucx_perftest ucp_am_bw: %.3f GB/s -> %.1f%%\n", peer_gbs, 100.0 * bw / peer_gbs);
  } else {
    std::printf("; ucx_perftest not available or failed\n");
  }
  std::printf("{\"rt_p50_us\":%.3f,\"rt_mean_us\":%.3f,\"bw_gbs\":%.4f,\"perftest_rt_us\":%s,\"perftest_bw_gbs\":%s}\n", rt_p50,
              rt_mean, bw, lat ? std::to_string(2 * (*lat)[0]).c_str() : "null",
              band ? std::to_string((*band)[2] * 1048576.0 / 1e9).c_str() : "null");
  return ok_status();
}

}  // namespace llmesh::bench
