// The UCX transport on 127.0.0.1 (ports chosen at run time): connect and accept, 1000 frames
// each way in order, an 8 MiB rendezvous frame intact and in line, many rendezvous frames among
// small ones in order both ways, oversized frames dropped, close and destruction seen as
// on_peer_down on both sides, refused and unanswered connects timing out, an idle pair using no
// CPU, a ping-pong round trip (printed, not asserted), and a child process SIGKILLed
// mid-stream reported down without hanging anyone.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "../free_port.hpp"
#include "llmesh/transport/ucx_transport.hpp"

extern char** environ;

namespace llmesh::transport {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

/// Polls `pred` until it holds or `limit` passes (these bounds are hang guards, not timings).
template <class P>
bool eventually(P pred, std::chrono::milliseconds limit = 10s) {
  auto end = clock_type::now() + limit;
  while (!pred()) {
    if (clock_type::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

/// Records what a transport's handlers saw; `echo` (if set) runs on every frame.
struct recorder {
  std::mutex mu;
  std::vector<std::pair<peer_id, std::vector<uint8_t>>> frames;
  std::vector<peer_id> accepted;
  std::vector<std::pair<peer_id, error>> down;
  clock_type::time_point first_down{};
  std::function<void(peer_id, std::span<const uint8_t>)> echo;

  transport_handlers handlers() {
    return {[this](peer_id p, std::span<const uint8_t> f) {
              if (echo) return echo(p, f);
              std::lock_guard l(mu);
              frames.emplace_back(p, std::vector<uint8_t>(f.begin(), f.end()));
            },
            [this](peer_id p, const std::string&) {
              std::lock_guard l(mu);
              accepted.push_back(p);
            },
            [this](peer_id p, const error& e) {
              std::lock_guard l(mu);
              if (down.empty()) first_down = clock_type::now();
              down.emplace_back(p, e);
            }};
  }
  size_t n_frames() { std::lock_guard l(mu); return frames.size(); }
  size_t n_accepted() { std::lock_guard l(mu); return accepted.size(); }
  size_t n_down() { std::lock_guard l(mu); return down.size(); }
};

std::vector<uint8_t> frame_of(uint32_t i, size_t size = 16) {
  std::vector<uint8_t> f(size);
  for (size_t k = 0; k < size; ++k) f[k] = uint8_t(i * 31 + k * 7);
  std::memcpy(f.data(), &i, std::min(size, sizeof i));
  return f;
}

std::unique_ptr<ucx_transport> make(recorder& r, ucx_options o = {}) {
  auto t = ucx_transport::create(o);
  if (!t.ok()) ADD_FAILURE() << t.err().message;
  if (!t.ok()) return nullptr;
  (*t)->set_handlers(r.handlers());
  return std::move(t.value());
}

/// A listener and a client connected to it; `server_peer` is the client as the server sees it.
struct pair_fixture {
  recorder rs, rc;
  std::unique_ptr<ucx_transport> server, client;
  peer_id client_peer = 0, server_peer = 0;

  explicit pair_fixture(ucx_options o = {}, std::function<void(pair_fixture&)> before_connect = {}) {
    init(o, before_connect);
    if (::testing::Test::HasFatalFailure()) server.reset(), client.reset();
  }
  void init(ucx_options o, const std::function<void(pair_fixture&)>& before_connect) {
    server = make(rs, o);
    client = make(rc, o);
    if (!server || !client) return;
    if (before_connect) before_connect(*this);
    auto addr = server->listen("127.0.0.1:0");
    ASSERT_TRUE(addr.ok()) << addr.err().message;
    auto p = client->connect(*addr);
    ASSERT_TRUE(p.ok()) << p.err().message;
    client_peer = *p;
    ASSERT_TRUE(eventually([&] { return rs.n_accepted() == 1; }));
    server_peer = rs.accepted[0];
  }
};

TEST(UcxTransport, ExchangesAThousandFramesEachWayInOrder) {
  pair_fixture f;
  ASSERT_TRUE(f.server && f.client);
  for (uint32_t i = 0; i < 1000; ++i) {
    ASSERT_TRUE(f.client->send(f.client_peer, frame_of(i, 16 + i % 200)).ok());
    ASSERT_TRUE(f.server->send(f.server_peer, frame_of(i + 5000, 16 + i % 300)).ok());
  }
  ASSERT_TRUE(eventually([&] { return f.rs.n_frames() == 1000 && f.rc.n_frames() == 1000; }));
  for (uint32_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(f.rs.frames[i].first, f.server_peer);
    EXPECT_EQ(f.rs.frames[i].second, frame_of(i, 16 + i % 200)) << i;
    EXPECT_EQ(f.rc.frames[i].first, f.client_peer);
    EXPECT_EQ(f.rc.frames[i].second, frame_of(i + 5000, 16 + i % 300)) << i;
  }
  ASSERT_TRUE(eventually([&] { return f.client->stats().frames_sent == 1000 && f.server->stats().frames_sent == 1000; }));
  auto cs = f.client->stats(), ss = f.server->stats();
  EXPECT_EQ(cs.frames_received, 1000u);
  EXPECT_EQ(ss.frames_received, 1000u);
  EXPECT_EQ(cs.bytes_sent, ss.bytes_received);
  EXPECT_EQ(ss.bytes_sent, cs.bytes_received);
  EXPECT_EQ(cs.send_errors + cs.frames_dropped + cs.peers_lost, 0u);
  EXPECT_EQ(f.rs.n_down() + f.rc.n_down(), 0u);
}

TEST(UcxTransport, AnEightMebibyteFrameArrivesIntactByRendezvousAndInLine) {
  pair_fixture f;
  ASSERT_TRUE(f.server && f.client);
  auto big = frame_of(77, size_t{8} << 20);
  ASSERT_TRUE(f.client->send(f.client_peer, frame_of(0)).ok());
  ASSERT_TRUE(f.client->send(f.client_peer, big).ok());
  for (uint32_t i = 1; i <= 50; ++i) ASSERT_TRUE(f.client->send(f.client_peer, frame_of(i)).ok());
  ASSERT_TRUE(eventually([&] { return f.rs.n_frames() == 52; }));
  EXPECT_EQ(f.rs.frames[0].second, frame_of(0));
  EXPECT_TRUE(f.rs.frames[1].second == big) << "size " << f.rs.frames[1].second.size();
  for (uint32_t i = 1; i <= 50; ++i) EXPECT_EQ(f.rs.frames[i + 1].second, frame_of(i)) << i;
  EXPECT_GE(f.server->rndv_frames_received(), 1u);
  // And back: the listener's side sends by rendezvous too.
  auto t0 = clock_type::now();
  ASSERT_TRUE(f.server->send(f.server_peer, big).ok());
  ASSERT_TRUE(eventually([&] { return f.rc.n_frames() == 1; }));
  std::printf("[ ucx ] 8 MiB frame by rendezvous: %.2f ms\n", ms_since(t0));
  EXPECT_TRUE(f.rc.frames[0].second == big);
  EXPECT_EQ(f.client->rndv_frames_received(), 1u);
}

TEST(UcxTransport, ManyRendezvousFramesAmongSmallOnesKeepTheirOrderBothWays) {
  ucx_options o;
  o.rndv_threshold = 64 << 10;  // every 5th frame (256 KiB) goes by rendezvous
  pair_fixture f(o);
  ASSERT_TRUE(f.server && f.client);
  auto size_of = [](uint32_t i) { return i % 5 == 4 ? size_t{256} << 10 : 100 + i % 1000; };
  for (uint32_t i = 0; i < 400; ++i) {
    ASSERT_TRUE(f.client->send(f.client_peer, frame_of(i, size_of(i))).ok());
    ASSERT_TRUE(f.server->send(f.server_peer, frame_of(i + 7, size_of(i))).ok());
  }
  ASSERT_TRUE(eventually([&] { return f.rs.n_frames() == 400 && f.rc.n_frames() == 400; }));
  for (uint32_t i = 0; i < 400; ++i) {
    ASSERT_EQ(f.rs.frames[i].second, frame_of(i, size_of(i))) << i;
    ASSERT_EQ(f.rc.frames[i].second, frame_of(i + 7, size_of(i))) << i;
  }
  EXPECT_EQ(f.server->rndv_frames_received(), 80u);
  EXPECT_EQ(f.client->rndv_frames_received(), 80u);
}

TEST(UcxTransport, OversizedFramesAreRefusedAndDroppedButTheConnectionStays) {
  ucx_options o;
  o.max_frame_bytes = 64 << 10;
  pair_fixture f(o);
  ASSERT_TRUE(f.server && f.client);
  auto refused = f.client->send(f.client_peer, frame_of(1, (64 << 10) + 1));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.err().code, errc::invalid_request);
  EXPECT_EQ(f.client->stats().frames_dropped, 1u);

  // A sender with a larger limit: the receiver drops what exceeds its own, eager or rendezvous.
  recorder rbig;
  ucx_options big_limit;
  big_limit.rndv_threshold = 256 << 10;
  auto sender = make(rbig, big_limit);
  ASSERT_TRUE(sender);
  auto addr = f.server->listen("127.0.0.1:0");
  EXPECT_FALSE(addr.ok());  // one listener per transport
  ucx_options listener_opts = o;
  recorder rl;
  auto listener = make(rl, listener_opts);
  auto laddr = listener->listen("127.0.0.1:0");
  ASSERT_TRUE(laddr.ok());
  auto p = sender->connect(*laddr);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(sender->send(*p, frame_of(1, 100 << 10)).ok());  // eager, over the limit
  ASSERT_TRUE(sender->send(*p, frame_of(2, 1 << 20)).ok());    // rendezvous, over the limit
  ASSERT_TRUE(sender->send(*p, frame_of(3)).ok());
  ASSERT_TRUE(eventually([&] { return rl.n_frames() == 1; }));
  EXPECT_EQ(rl.frames[0].second, frame_of(3));
  EXPECT_EQ(listener->stats().frames_dropped, 2u);
  ASSERT_TRUE(eventually([&] { return sender->stats().frames_sent == 3; }));  // no sender hangs
  EXPECT_EQ(rl.n_down() + rbig.n_down(), 0u);
}

TEST(UcxTransport, CloseIsSeenAsPeerDownOnBothSides) {
  pair_fixture f;
  ASSERT_TRUE(f.server && f.client);
  for (uint32_t i = 0; i < 100; ++i) ASSERT_TRUE(f.client->send(f.client_peer, frame_of(i)).ok());
  auto t0 = clock_type::now();
  f.client->close(f.client_peer);
  f.client->close(f.client_peer);  // twice: still one report
  ASSERT_TRUE(eventually([&] { return f.rc.n_down() == 1 && f.rs.n_down() == 1; }));
  std::printf("[ ucx ] close: local on_peer_down after %.2f ms, remote after %.2f ms\n",
              std::chrono::duration<double, std::milli>(f.rc.first_down - t0).count(),
              std::chrono::duration<double, std::milli>(f.rs.first_down - t0).count());
  EXPECT_EQ(f.rc.down[0].first, f.client_peer);
  EXPECT_EQ(f.rs.down[0].first, f.server_peer);
  EXPECT_EQ(f.rs.n_frames(), 100u);  // close flushes what was sent before it
  auto after = f.client->send(f.client_peer, frame_of(1));
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.err().code, errc::transport_disconnected);
  EXPECT_FALSE(f.server->send(f.server_peer, frame_of(1)).ok());
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(f.rc.n_down() + f.rs.n_down(), 2u);
}

TEST(UcxTransport, ConnectingToAPortNobodyListensOnReportsPeerDownWithinTheTimeout) {
  recorder r;
  ucx_options o;
  o.connect_timeout = 1000ms;
  auto t = make(r, o);
  ASSERT_TRUE(t);
  auto t0 = clock_type::now();
  auto p = t->connect("127.0.0.1:" + std::to_string(llmesh::testing::free_local_port())  /* nobody listens there */);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(eventually([&] { return r.n_down() == 1; }));
  double ms = std::chrono::duration<double, std::milli>(r.first_down - t0).count();
  std::printf("[ ucx ] refused connect: on_peer_down after %.2f ms (%s)\n", ms, r.down[0].second.message.c_str());
  EXPECT_EQ(r.down[0].first, *p);
  EXPECT_LE(ms, 1000 + 1000);  // connect_timeout plus scheduling slack
  EXPECT_FALSE(t->send(*p, frame_of(1)).ok());
}

TEST(UcxTransport, AConnectNobodyAnswersTimesOut) {
  // A plain socket that listens but never speaks UCX: the TCP handshake succeeds, UCX's does not.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  recorder r;
  ucx_options o;
  o.connect_timeout = 500ms;
  auto t = make(r, o);
  ASSERT_TRUE(t);
  auto t0 = clock_type::now();
  auto p = t->connect("127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(eventually([&] { return r.n_down() == 1; }));
  double ms = std::chrono::duration<double, std::milli>(r.first_down - t0).count();
  std::printf("[ ucx ] unanswered connect: on_peer_down after %.2f ms (%s)\n", ms, r.down[0].second.message.c_str());
  EXPECT_GE(ms, 400);
  EXPECT_LE(ms, 500 + 1000);
  t.reset();  // the destructor must not hang on the half-open endpoint
  ::close(fd);
}

TEST(UcxTransport, ADestroyedPeerIsReportedDown) {
  pair_fixture f;
  ASSERT_TRUE(f.server && f.client);
  ASSERT_TRUE(f.client->send(f.client_peer, frame_of(1)).ok());
  ASSERT_TRUE(eventually([&] { return f.rs.n_frames() == 1; }));
  auto t0 = clock_type::now();
  f.server.reset();
  double destroy_ms = ms_since(t0);
  ASSERT_TRUE(eventually([&] { return f.rc.n_down() == 1; }));
  std::printf("[ ucx ] destroyed peer: destructor %.2f ms, remote on_peer_down after %.2f ms (%s)\n", destroy_ms,
              std::chrono::duration<double, std::milli>(f.rc.first_down - t0).count(),
              f.rc.down[0].second.message.c_str());
  EXPECT_EQ(f.rc.down[0].first, f.client_peer);
  EXPECT_EQ(f.client->stats().peers_lost, 1u);
  EXPECT_EQ(f.rs.n_down(), 0u);  // no handler runs once the destructor has started
}

TEST(UcxTransport, SendingToAnUnknownPeerIsAnError) {
  recorder r;
  auto t = make(r);
  ASSERT_TRUE(t);
  auto s = t->send(12345, frame_of(1));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::transport_disconnected);
  EXPECT_EQ(t->stats().send_errors, 1u);
  EXPECT_FALSE(t->connect("no-port-here").ok());
  EXPECT_FALSE(t->connect("127.0.0.1:99999").ok());
  EXPECT_FALSE(t->listen("[::1").ok());
}

TEST(UcxTransport, AnIdleConnectedPairUsesNoCpu) {
  pair_fixture f;
  ASSERT_TRUE(f.server && f.client);
  ASSERT_TRUE(f.client->send(f.client_peer, frame_of(1)).ok());
  ASSERT_TRUE(eventually([&] { return f.rs.n_frames() == 1; }));
  std::this_thread::sleep_for(200ms);
  auto cpu = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
  };
  double c0 = cpu();
  auto t0 = clock_type::now();
  std::this_thread::sleep_for(3s);
  double used = cpu() - c0, wall = ms_since(t0);
  std::printf("[ ucx ] idle connected pair: %.2f ms CPU over %.0f ms wall (%.3f%% of one core)\n", used, wall,
              100 * used / wall);
  EXPECT_LT(used, 0.05 * wall);  // busy polling would cost ~100% per progress thread
}

TEST(UcxTransport, PingPongRoundTripIsPrinted) {
  constexpr int rounds = 1000;
  std::atomic<int> done{0};
  clock_type::time_point t0, t_end;
  std::atomic<bool> finished{false};
  pair_fixture f({}, [&](pair_fixture& pf) {
    pf.rs.echo = [&pf](peer_id p, std::span<const uint8_t> fr) {
      (void)pf.server->send(p, std::vector<uint8_t>(fr.begin(), fr.end()));
    };
    pf.rc.echo = [&](peer_id p, std::span<const uint8_t> fr) {
      if (++done == rounds) {
        t_end = clock_type::now();
        finished = true;
      } else {
        (void)pf.client->send(p, std::vector<uint8_t>(fr.begin(), fr.end()));
      }
    };
  });
  ASSERT_TRUE(f.server && f.client);
  std::this_thread::sleep_for(50ms);  // let wire-up settle; then time 1000 round trips
  t0 = clock_type::now();
  ASSERT_TRUE(f.client->send(f.client_peer, frame_of(1, 64)).ok());
  ASSERT_TRUE(eventually([&] { return finished.load(); }, 30s));
  double us = std::chrono::duration<double, std::micro>(t_end - t0).count() / rounds;
  std::printf("[ ucx ] ping-pong: %d round trips of 64-byte frames, %.1f us per round trip\n", rounds, us);
}

// ---- two processes --------------------------------------------------------------------------

constexpr const char* echo_child_env = "LLMESH_UCX_ECHO_CHILD";

// The child: connects to the parent's listener and echoes every frame until it is killed.
int run_echo_child(const char* address) {
  ucx_options o;
  o.rndv_threshold = 256 << 10;
  auto t = ucx_transport::create(o);
  if (!t.ok()) return 3;
  ucx_transport* raw = t->get();
  raw->set_handlers({[raw](peer_id p, std::span<const uint8_t> fr) {
                       (void)raw->send(p, std::vector<uint8_t>(fr.begin(), fr.end()));
                     },
                     {},
                     [](peer_id, const error& e) {
                       std::fprintf(stderr, "[ ucx echo child ] peer down: %s\n", e.message.c_str());
                       std::_Exit(0);
                     }});
  if (!raw->connect(address).ok()) return 4;
  while (true) pause();
}

// When this binary is started as the echo child, it runs the child and exits before gtest.
[[maybe_unused]] const bool echo_child_hook = [] {
  if (const char* addr = std::getenv(echo_child_env)) std::_Exit(run_echo_child(addr));
  return false;
}();

TEST(UcxTransportTwoProcesses, AChildKilledMidStreamIsReportedDownWithoutHanging) {
  recorder r;
  ucx_options o;
  o.rndv_threshold = 256 << 10;  // the 1 MiB frames go by rendezvous, both ways
  auto t = make(r, o);
  ASSERT_TRUE(t);
  auto addr = t->listen("127.0.0.1:0");
  ASSERT_TRUE(addr.ok());

  // The child execs this binary afresh: a plain fork() would inherit UCX's global state (whose
  // async thread does not survive fork). Everything exec needs is prepared before fork.
  std::string env_entry = std::string(echo_child_env) + "=" + *addr;
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) envp.push_back(*e);
  envp.push_back(env_entry.data());
  envp.push_back(nullptr);
  char arg0[] = "ucx_echo_child";
  char* argv[] = {arg0, nullptr};
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  struct reaper {
    pid_t pid;
    ~reaper() { kill(pid, SIGKILL), waitpid(pid, nullptr, 0); }
  } reap{child};

  ASSERT_TRUE(eventually([&] { return r.n_accepted() == 1; }));
  peer_id p = r.accepted[0];
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> sent{0};
  std::thread sender([&] {
    for (uint32_t i = 0; !stop; ++i) {
      auto s = t->send(p, frame_of(i, i % 8 == 7 ? size_t{1} << 20 : 1024));
      if (s.ok()) ++sent;
      else if (s.err().code == errc::overloaded) std::this_thread::sleep_for(1ms);
      else break;  // transport_disconnected: the peer is gone
    }
  });
  struct joiner {
    std::atomic<bool>& stop;
    std::thread& th;
    ~joiner() {
      stop = true;
      if (th.joinable()) th.join();
    }
  } join_sender{stop, sender};
  auto explain = [&] {
    auto st = t->stats();
    return "sent " + std::to_string(sent) + ", transport sent " + std::to_string(st.frames_sent) + " received " +
           std::to_string(st.frames_received) + " send_errors " + std::to_string(st.send_errors) + ", downs " +
           std::to_string(r.n_down()) + (r.n_down() ? " (" + r.down[0].second.message + ")" : "");
  };
  ASSERT_TRUE(eventually([&] { return r.n_frames() >= 300; })) << explain();
  auto t0 = clock_type::now();
  kill(child, SIGKILL);
  bool seen = eventually([&] { return r.n_down() == 1; }, 10s);
  double ms = std::chrono::duration<double, std::milli>(r.first_down - t0).count();
  ASSERT_TRUE(seen) << "no on_peer_down within 10 s of SIGKILL; " << explain();
  std::printf("[ ucx ] SIGKILLed child: on_peer_down after %.2f ms (%s); %llu frames sent, %zu echoes back\n", ms,
              r.down[0].second.message.c_str(), static_cast<unsigned long long>(sent.load()), r.n_frames());
  EXPECT_EQ(r.down[0].first, p);
  for (size_t i = 1; i < r.n_frames(); ++i) {  // echoes came back in order
    uint32_t a, b;
    std::memcpy(&a, r.frames[i - 1].second.data(), 4);
    std::memcpy(&b, r.frames[i].second.data(), 4);
    ASSERT_EQ(a + 1, b) << i;
  }
  EXPECT_FALSE(t->send(p, frame_of(1)).ok());
  stop = true;
  sender.join();
  auto d0 = clock_type::now();
  t.reset();
  std::printf("[ ucx ] parent transport destroyed in %.2f ms\n", ms_since(d0));
}

}  // namespace
}  // namespace llmesh::transport
