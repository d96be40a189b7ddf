// ucx_transport: frames as UCX 1.13 active messages over TCP, one progress thread per object.
//
// Threads. The progress thread creates, drives and destroys the worker (thread mode
// SERIALIZED), the listener and the endpoints, holding `work_mu` whenever it touches them; it
// lets go only to sleep in epoll. Public calls become commands on a mutex-protected queue; one
// put on an empty queue writes the wake eventfd. The exception is the hot path: a send() that
// finds the progress thread asleep (work_mu free) and the queue empty sends on the caller's
// thread (options.direct_send); what would call a handler (a failed send) is deferred to the
// progress thread, so handlers still run there only. The thread progresses until UCX has no work,
// arms the worker and sleeps in epoll on the worker's event fd and the eventfd (with a timeout
// only while a connect or close deadline runs). Work that would re-enter UCX from a UCX
// callback (accepting, answering hellos, closing failed endpoints) is deferred until
// ucp_worker_progress has returned.
//
// Identity. Every active message is sent with UCP_AM_SEND_FLAG_REPLY: the receiver gets
// param->reply_ep, its own endpoint to the sender, and maps it to the peer_id.
//
// Messages. AM id am_frame: a frame, with its sequence number on the connection as the user
// header (8 bytes, host order). AM id am_control: a one-byte header, hello (connector to
// listener) or hello_ack; a connect counts as done when its hello_ack arrives.
//
// Order. UCX does not keep active messages in order: a multi-fragment eager message can be
// overtaken by later ones (seen in the oversized-frame test), and a rendezvous message's
// handler runs before its data arrives. The receiver delivers by sequence number: the next
// frame at once (without a copy when eager), others from a bounded per-peer reorder map
// (max_reorder_bytes). Rendezvous receives run one at a time per peer, in order. A hole that
// can never close (a failed send or rendezvous receive) fails the peer: frames arrive in order
// and without gaps, or the peer is reported down.
#include "llmesh/transport/ucx_transport.hpp"

#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <future>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace llmesh::transport {
namespace {

using clock_type = std::chrono::steady_clock;

constexpr unsigned am_frame = 1;
constexpr unsigned am_control = 2;
constexpr uint8_t control_hello = 1;
constexpr uint8_t control_hello_ack = 2;
// Why 64: progress calls before serving the command queue again, so a flood of incoming
// messages cannot starve local sends.
constexpr int max_progress_calls = 64;
// Why 2 s: the destructor waits this long for force-closed endpoints to cancel their requests
// (normally microseconds); past it, the requests' buffers are leaked rather than freed early.
constexpr auto shutdown_grace = std::chrono::seconds(2);
// Why 256 bytes: what a frame waiting in a reorder map costs beyond its own bytes (map node,
// slot); charged against max_reorder_bytes so that empty frames cannot grow the map either.
constexpr size_t slot_overhead = 256;
// Why 8 KiB: a rendezvous frame waiting for its turn pins a UCX receive descriptor of about one
// TCP segment (UCX_TCP_TX_SEG_SIZE); charged until its receive starts.
constexpr size_t rndv_desc_bytes = size_t{8} << 10;

struct sock_address {
  sockaddr_storage storage{};
  socklen_t len = 0;
  std::string text;  // "HOST:PORT" as given, for messages
};

// "HOST:PORT" or "[V6HOST]:PORT" into a socket address.
result<sock_address> resolve(const std::string& host_port, bool passive) {
  bool v6 = !host_port.empty() && host_port.front() == '[';
  auto colon = v6 ? host_port.find("]:") + 1 : host_port.rfind(':');  // npos + 1 == 0: no colon
  std::string host = colon == 0 || colon == std::string::npos ? "" : host_port.substr(v6, colon - 2 * v6);
  std::string port = host.empty() ? "" : host_port.substr(colon + 1);
  if (host.empty() || port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) > 65535)
    return make_error(errc::invalid_request, "bad address '" + host_port + "' (want HOST:PORT, port 0-65535)");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0 || found == nullptr)
    return make_error(errc::invalid_request, "cannot resolve '" + host + "': " + gai_strerror(rc));
  sock_address out;
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  out.len = found->ai_addrlen;
  out.text = host_port;
  freeaddrinfo(found);
  return out;
}

std::string format_address(const sockaddr_storage& sa) {
  char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
  socklen_t len = sa.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  getnameinfo(reinterpret_cast<const sockaddr*>(&sa), len, host, sizeof host, port, sizeof port,
              NI_NUMERICHOST | NI_NUMERICSERV);
  std::string out;  // appended piecewise: g++ 12 misreports "[" + host + "]" (-Wrestrict)
  if (sa.ss_family == AF_INET6) out.append("[").append(host).append("]");
  else out.append(host);
  return out.append(":").append(port);
}

// UCX settings this transport needs, put into the process environment unless the user has set
// them (setenv's last argument 0) before ucp_config_read reads them. Not ucp_config_modify:
// UCX 1.13 ignores transport keys (TCP_*) given that way, and child processes should agree.
void set_environment_defaults() {
  // Loopback TCP needs "lo" here (eth0 is tried otherwise and times out); a mesh spanning hosts
  // must set UCX_NET_DEVICES. The listener flow needs tcp; peer error mode drops shared memory.
  setenv("UCX_NET_DEVICES", "lo", 0);
  setenv("UCX_TLS", "tcp", 0);
  // No zero-copy on TCP: UCX 1.13 aborts the whole process when a peer dies with zero-copy
  // sends in flight (AM zcopy: uct_iface.h:884 `comp->count > 0`; PUT rendezvous: tcp_ep.c:939
  // `ep->flags & UCT_TCP_EP_FLAG_PUT_TX_WAITING_ACK`). Peers SIGKILLed mid-stream: UCX's
  // defaults 3 aborts in ~140; PUT off, AM zero-copy on: 3 in ~25; both off: none in 1000+.
  // The price: rendezvous bandwidth halves here (~0.5 to ~0.25 GB/s; UCX_TCP_PUT_ENABLE=y
  // brings it back, at the risk above).
  setenv("UCX_ZCOPY_THRESH", "inf", 0);
  setenv("UCX_TCP_PUT_ENABLE", "n", 0);
  // SO_REUSEADDR on listeners, as servers do: a node restarted within TIME_WAIT (a minute)
  // could not bind its mesh address again ("Device is busy").
  setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
}

error ucx_error(errc code, const std::string& what, ucs_status_t st) {
  return make_error(code, what + ": " + ucs_status_string(st));
}

}  // namespace

struct ucx_transport::impl {
  // A frame on its way out: owns the bytes until UCX completes the send.
  struct send_op {
    impl* self;
    peer_id peer;
    std::vector<uint8_t> frame;
    uint8_t control = 0;  // nonzero: a control message (header only)
    uint64_t seq = 0;     // the AM header of a frame: it must live until the send completes
  };
  // One frame's place in a peer's delivery order.
  struct rx_slot {
    std::unique_ptr<uint8_t[]> data;
    size_t size = 0;
    bool ready = false;  // complete and waiting for its turn
    bool skip = false;   // dropped (oversized): its number is consumed without a delivery
  };
  struct recv_op {
    impl* self;
    peer_id peer;
    std::shared_ptr<rx_slot> slot;
  };
  struct peer_state {
    peer_id id = 0;
    ucp_ep_h ep = nullptr;
    bool connected = false;  // hello_ack seen (connector) or accepted (listener)
    clock_type::time_point connect_deadline{};
    std::string address;
    uint64_t next_send_seq = 0, next_recv_seq = 0;
    std::map<uint64_t, std::shared_ptr<rx_slot>> rx;  // frames waiting for an earlier one
    size_t rx_bytes = 0;
    // Rendezvous receives run one at a time per peer, in order, so none can starve behind later
    // ones and a sender cannot make us buffer more than one large frame ahead: the rest wait
    // as UCX descriptors (kept by returning UCS_INPROGRESS) and their senders wait too.
    std::deque<std::pair<std::shared_ptr<rx_slot>, void*>> rndv_waiting;
    bool rndv_busy = false;
  };
  // An endpoint closed by close(): flushed first, force-closed after or at its deadline.
  struct retiring_ep {
    impl* self;
    ucp_ep_h ep;
    clock_type::time_point deadline;
    bool flushed = false, closed = false;
  };
  // Work for the progress thread: a frame to send (the hot path, kept free of allocations
  // beyond the op), or any other call.
  struct command {
    send_op* op = nullptr;
    std::function<void()> fn{};
  };

  ucx_options options;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;  // progress thread only (created and destroyed there)
  ucp_listener_h listener = nullptr;
  int wake_fd = -1, epoll_fd = -1, worker_fd = -1;
  std::thread thread;
  std::thread::id thread_id;

  std::mutex work_mu;  // held by whoever drives the worker: the progress thread, or a direct send
  std::mutex mu;  // guards queue and live
  std::vector<command> queue;
  std::unordered_set<peer_id> live;  // peers send() may address
  std::atomic<peer_id> next_peer{1};
  std::atomic<size_t> pending_send_bytes{0};

  // Progress thread only.
  transport_handlers handlers;
  std::unordered_map<peer_id, peer_state> peers;
  std::unordered_map<ucp_ep_h, peer_id> by_ep;
  std::list<retiring_ep> retiring;
  std::vector<std::function<void()>> deferred;
  int inflight = 0;  // UCX requests whose callbacks are still due
  bool stopping = false;

  struct counters {
    std::atomic<uint64_t> frames_sent{0}, frames_received{0}, bytes_sent{0}, bytes_received{0};
    std::atomic<uint64_t> send_errors{0}, peers_lost{0}, frames_dropped{0}, rndv_received{0};
  } stat;

  ~impl() {
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (wake_fd >= 0) ::close(wake_fd);
    if (context) ucp_cleanup(context);
  }

  bool on_thread() const { return std::this_thread::get_id() == thread_id; }
  void admit(peer_id id) { std::lock_guard lock(mu); live.insert(id); }
  void forget(peer_id id) { std::lock_guard lock(mu); live.erase(id); }

  void post(command c) {
    bool wake;
    {
      std::lock_guard lock(mu);
      wake = queue.empty() && !on_thread();  // the thread drains the queue before it sleeps
      queue.push_back(std::move(c));
    }
    if (wake) {
      uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof one);
    }
  }

  // Runs f on the progress thread and returns its result (inline when already there).
  template <class F>
  auto call(F f) -> decltype(f()) {
    if (on_thread()) return f();
    std::promise<decltype(f())> done;
    auto fut = done.get_future();
    post({.fn = [&] { done.set_value(f()); }});
    return fut.get();
  }

  void log_drop(const char* direction, peer_id peer, size_t size) {
    uint64_t n = ++stat.frames_dropped;
    // Why powers of two: one line per drop would let a misbehaving peer flood stderr.
    if ((n & (n - 1)) == 0)
      std::fprintf(stderr, "llmesh transport: dropped a %zu-byte frame %s peer %llu (max_frame_bytes %zu; %llu so far)\n",
                   size, direction, (unsigned long long)peer, options.max_frame_bytes, (unsigned long long)n);
  }

  // ---- startup and the loop -------------------------------------------------------------

  status start_worker() {
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // a direct send drives it from the caller's thread
    if (auto st = ucp_worker_create(context, &wp, &worker); st != UCS_OK)
      return ucx_error(errc::internal, "ucp_worker_create", st);
    if (auto st = ucp_worker_get_efd(worker, &worker_fd); st != UCS_OK)
      return ucx_error(errc::internal, "ucp_worker_get_efd", st);
    for (unsigned id : {am_frame, am_control}) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
      hp.id = id;
      hp.flags = UCP_AM_FLAG_WHOLE_MSG;
      hp.cb = id == am_frame ? &impl::on_am_frame : &impl::on_am_control;
      hp.arg = this;
      if (auto st = ucp_worker_set_am_recv_handler(worker, &hp); st != UCS_OK)
        return ucx_error(errc::internal, "ucp_worker_set_am_recv_handler", st);
    }
    return watch(worker_fd);
  }

  status watch(int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0)
      return make_error(errc::io_error, std::string("epoll_ctl: ") + std::strerror(errno));
    return ok_status();
  }

  void run(std::promise<status>* started) {
    thread_id = std::this_thread::get_id();
    std::unique_lock work(work_mu);  // let go only while asleep in epoll
    status st = start_worker();
    bool ok = st.ok();
    started->set_value(std::move(st));
    if (!ok) return worker ? ucp_worker_destroy(worker) : void();
    auto last_activity = clock_type::now();
    while (true) {
      bool ran = false;
      if (!run_commands(&ran)) break;
      bool progressed = ran;
      for (int i = 0; i < max_progress_calls && ucp_worker_progress(worker) != 0; ++i) progressed = true;
      progressed |= run_deferred();
      int timeout_ms = check_deadlines();
      if (progressed || !deferred.empty()) {
        last_activity = clock_type::now();
        continue;
      }
      if (std::lock_guard lock(mu); !queue.empty()) continue;
      // A bounded spin after activity: a reply due within microseconds is caught without the
      // epoll wake-up it would otherwise cost.
      if (options.spin.count() > 0 && clock_type::now() - last_activity < options.spin) continue;
      ucs_status_t armed = ucp_worker_arm(worker);
      if (armed == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress again
      if (armed != UCS_OK) timeout_ms = 1;  // cannot arm (never seen): poll slowly rather than spin
      epoll_event events[2];
      work.unlock();
      const int n = epoll_wait(epoll_fd, events, 2, timeout_ms);
      work.lock();
      if (n > 0) drain_wake();
    }
    shutdown();
  }

  void wake() {
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof one);
  }

  void drain_wake() {
    uint64_t v;
    [[maybe_unused]] auto n = ::read(wake_fd, &v, sizeof v);  // nonblocking: fine when not signalled
  }

  // Returns false once the destructor's stop has been seen.
  bool run_commands(bool* ran = nullptr) {
    std::vector<command> batch;
    {
      std::lock_guard lock(mu);
      batch.swap(queue);
    }
    if (ran) *ran = !batch.empty();
    for (auto& c : batch) c.op ? do_send(c.op) : c.fn();
    return !stopping;
  }

  bool run_deferred() {
    bool any = false;
    while (!deferred.empty()) {
      auto batch = std::move(deferred);
      deferred.clear();
      for (auto& f : batch) f();
      any = true;
    }
    return any;
  }

  // Fails connections whose hello_ack is late, force-closes retiring endpoints whose flush is
  // done or late; returns epoll's timeout (ms) until the next deadline, -1 for none.
  int check_deadlines() {
    auto now = clock_type::now();
    auto next = clock_type::time_point::max();
    std::vector<std::pair<peer_id, std::string>> late;
    for (auto& [id, p] : peers)
      if (!p.connected) {
        if (p.connect_deadline <= now) late.emplace_back(id, p.address);
        else next = std::min(next, p.connect_deadline);
      }
    for (auto& [id, address] : late)
      fail_peer(id, make_error(errc::deadline_exceeded, "connect to " + address + " not answered within " +
                                                            std::to_string(options.connect_timeout.count()) + " ms"));
    for (auto it = retiring.begin(); it != retiring.end();) {
      if (!it->closed && (it->flushed || it->deadline <= now)) {
        force_close(it->ep);
        it->closed = true;
      }
      if (!it->closed) next = std::min(next, it->deadline);
      it = it->closed && it->flushed ? retiring.erase(it) : std::next(it);
    }
    if (next == clock_type::time_point::max()) return -1;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
    return static_cast<int>(std::max<int64_t>(ms, 0));
  }

  void shutdown() {
    {
      std::lock_guard lock(mu);
      for (auto& c : queue)
        if (c.op) pending_send_bytes -= c.op->frame.size(), delete c.op;
      queue.clear();
      live.clear();
    }
    drain_wake();    // so that the naps below do sleep
    run_deferred();  // pending accepts are rejected (stopping), failed endpoints closed
    if (listener) ucp_listener_destroy(listener), listener = nullptr;
    // Force-closing completes requests at once, and their callbacks look peers up: empty the
    // maps first.
    auto doomed = std::move(peers);
    peers.clear(), by_ep.clear();
    for (auto& [id, p] : doomed) {
      for (auto& [slot, desc] : p.rndv_waiting) ucp_am_data_release(worker, desc);
      force_close(p.ep);
    }
    for (auto& r : retiring)
      if (!r.closed) force_close(r.ep), r.closed = true;
    auto give_up = clock_type::now() + shutdown_grace;
    while (inflight > 0 && clock_type::now() < give_up) {
      if (ucp_worker_progress(worker) != 0 || run_deferred()) continue;
      if (ucp_worker_arm(worker) == UCS_OK) {
        epoll_event ev;
        epoll_wait(epoll_fd, &ev, 1, 10);  // 10 ms: a bounded nap between progress rounds
      }
    }
    if (inflight > 0)
      std::fprintf(stderr, "llmesh transport: %d UCX requests still pending at shutdown; their buffers are leaked\n",
                   inflight);
    ucp_worker_destroy(worker);
    worker = nullptr;
  }

  // ---- peers ------------------------------------------------------------------------------

  // Reports a peer down exactly once: removes it, drops its undelivered frames and closes its
  // endpoint (flushing first when `flush`, that is for a local close()).
  void fail_peer(peer_id id, const error& why, bool lost = true, bool flush = false) {
    auto it = peers.find(id);
    if (it == peers.end()) return;
    ucp_ep_h ep = it->second.ep;
    for (auto& [seq, slot] : it->second.rx)
      if (slot->ready) ++stat.frames_dropped;
    for (auto& [slot, desc] : it->second.rndv_waiting)  // before the endpoint closes: UCX answers the sender
      deferred.push_back([this, desc = desc] { ucp_am_data_release(worker, desc); });
    peers.erase(it);
    if (ep) by_ep.erase(ep);
    forget(id);
    if (lost) ++stat.peers_lost;
    if (ep && flush) retire(ep);
    else if (ep) deferred.push_back([this, ep] { force_close(ep); });  // never close inside a UCX callback
    if (!stopping && handlers.on_peer_down) invoke([&] { handlers.on_peer_down(id, why); });
  }

  template <class F>
  void invoke(F&& f) {  // a throwing handler must not take the progress thread down
    try {
      f();
    } catch (...) {
      std::fprintf(stderr, "llmesh transport: a handler threw; ignored\n");
    }
  }

  void retire(ucp_ep_h ep) {
    auto& r = retiring.emplace_back(retiring_ep{this, ep, clock_type::now() + options.connect_timeout});
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &impl::on_flushed;
    p.user_data = &r;
    void* req = ucp_ep_flush_nbx(ep, &p);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) r.flushed = true;  // done (or failed) at once
    else ++inflight;
  }

  void force_close(ucp_ep_h ep) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    p.cb.send = &impl::on_closed;
    p.user_data = this;
    void* req = ucp_ep_close_nbx(ep, &p);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) ++inflight;
  }

  ucp_ep_params_t ep_params() {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &impl::on_ep_error;
    ep.err_handler.arg = this;
    return ep;
  }

  void do_connect(peer_id id, const sock_address& to) {
    auto params = ep_params();
    params.field_mask |= UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&to.storage);
    params.sockaddr.addrlen = to.len;
    peer_state& p = peers[id];
    p.id = id;
    p.address = to.text;
    p.connect_deadline = clock_type::now() + options.connect_timeout;
    if (auto st = ucp_ep_create(worker, &params, &p.ep); st != UCS_OK) {
      p.ep = nullptr;
      fail_peer(id, ucx_error(errc::transport_disconnected, "connect to " + to.text, st));
      return;
    }
    by_ep[p.ep] = id;
    send_control(id, control_hello);
  }

  static void on_conn_request(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<impl*>(arg);
    self->deferred.push_back([self, request] { self->accept(request); });
  }

  void accept(ucp_conn_request_h request) {
    // While stopping, shutdown() runs this before it destroys the listener.
    if (stopping) return (void)ucp_listener_reject(listener, request);
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    std::string from = ucp_conn_request_query(request, &attr) == UCS_OK ? format_address(attr.client_address) : "?";
    auto params = ep_params();
    params.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = request;
    ucp_ep_h ep = nullptr;
    if (auto st = ucp_ep_create(worker, &params, &ep); st != UCS_OK) {
      std::fprintf(stderr, "llmesh transport: cannot accept %s: %s\n", from.c_str(), ucs_status_string(st));
      return;
    }
    peer_id id = next_peer++;
    peer_state& p = peers[id];
    p.id = id, p.ep = ep, p.connected = true, p.address = from;
    by_ep[ep] = id;
    admit(id);
    if (handlers.on_accept) invoke([&] { handlers.on_accept(id, from); });
  }

  void do_close(peer_id id) {
    fail_peer(id, make_error(errc::transport_disconnected, "closed locally"), /*lost=*/false, /*flush=*/true);
  }

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t st) {
    auto* self = static_cast<impl*>(arg);
    auto it = self->by_ep.find(ep);
    if (it == self->by_ep.end()) return;  // already retiring or failed
    peer_id id = it->second;
    auto& p = self->peers.at(id);
    std::string what = (p.connected ? "peer " + std::to_string(id) + " (" + p.address + ") failed"
                                    : "connect to " + p.address + " failed");
    self->fail_peer(id, ucx_error(errc::transport_disconnected, what, st));
  }

  // ---- sending ----------------------------------------------------------------------------

  void send_control(peer_id id, uint8_t kind) { do_send(new send_op{this, id, {}, kind}); }

  // `direct`: on a caller's thread (holding work_mu while the progress thread sleeps): a
  // failure is handed to the progress thread (it may call handlers), and so is a send that
  // UCX could not finish at once (it needs progress).
  void do_send(send_op* op, bool direct = false) {
    auto it = peers.find(op->peer);
    if (it == peers.end() || stopping) return finish_send(op, UCS_ERR_NOT_CONNECTED);  // calls no handler
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    p.cb.send = &impl::on_sent;
    p.user_data = op;
    if (!op->control) op->seq = it->second.next_send_seq++;
    void* req = op->control ? ucp_am_send_nbx(it->second.ep, am_control, &op->control, 1, nullptr, 0, &p)
                            : ucp_am_send_nbx(it->second.ep, am_frame, &op->seq, sizeof op->seq, op->frame.data(),
                                              op->frame.size(), &p);
    if (req == nullptr) {
      finish_send(op, UCS_OK);  // calls no handler
    } else if (UCS_PTR_IS_ERR(req)) {
      if (!direct) return finish_send(op, UCS_PTR_STATUS(req));
      deferred.push_back([this, op, st = UCS_PTR_STATUS(req)] { finish_send(op, st); });
      wake();
    } else {
      ++inflight;
      if (direct) wake();
    }
  }

  void finish_send(send_op* op, ucs_status_t st) {
    peer_id id = op->peer;
    bool frame = !op->control;
    if (frame) {
      pending_send_bytes -= op->frame.size();
      if (st == UCS_OK) ++stat.frames_sent, stat.bytes_sent += op->frame.size();
      else ++stat.send_errors;
    }
    delete op;
    // A frame that failed leaves a hole the receiver would wait on forever: the peer is lost.
    if (frame && st != UCS_OK && st != UCS_ERR_NOT_CONNECTED)
      fail_peer(id, ucx_error(errc::transport_disconnected, "a send failed", st));
  }

  // UCX completion callbacks: each request is freed here, after UCX is done with it.
  static void on_sent(void* req, ucs_status_t st, void* user_data) {
    ucp_request_free(req);
    auto* op = static_cast<send_op*>(user_data);
    --op->self->inflight;
    op->self->finish_send(op, st);
  }
  static void on_flushed(void* req, ucs_status_t, void* user_data) {
    ucp_request_free(req);
    auto* r = static_cast<retiring_ep*>(user_data);
    --r->self->inflight;
    r->flushed = true;
  }
  static void on_closed(void* req, ucs_status_t, void* user_data) {
    ucp_request_free(req);
    --static_cast<impl*>(user_data)->inflight;
  }

  // ---- receiving --------------------------------------------------------------------------

  peer_state* sender_of(const ucp_am_recv_param_t* param) {
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return nullptr;
    auto it = by_ep.find(param->reply_ep);
    return it == by_ep.end() ? nullptr : &peers.at(it->second);
  }

  void deliver(peer_id id, const uint8_t* data, size_t size) {
    ++stat.frames_received;
    stat.bytes_received += size;
    if (!stopping && handlers.on_frame) invoke([&] { handlers.on_frame(id, {data, size}); });
  }

  // Delivers the waiting frames that are next in line.
  void deliver_ready(peer_id id) {
    while (true) {
      auto it = peers.find(id);  // handlers cannot remove peers, but stay safe
      if (it == peers.end()) return;
      peer_state& p = it->second;
      auto head = p.rx.begin();
      if (head == p.rx.end() || head->first != p.next_recv_seq || !(head->second->ready || head->second->skip)) return;
      auto slot = std::move(head->second);
      p.rx.erase(head);
      p.rx_bytes -= slot->size + slot_overhead;
      ++p.next_recv_seq;
      if (!slot->skip) deliver(id, slot->data.get(), slot->size);
    }
  }

  // Makes room in a peer's reorder map for a frame, or fails the peer. A rendezvous frame's
  // buffer (`allocate` false) is allocated and charged when its receive starts.
  std::shared_ptr<rx_slot> wait_in_line(peer_state& p, uint64_t seq, size_t size, bool allocate = true) {
    size_t cost = (allocate ? size : rndv_desc_bytes) + slot_overhead;
    if (seq < p.next_recv_seq || p.rx.count(seq) || p.rx_bytes + cost > options.max_reorder_bytes) {
      auto why = "frame #" + std::to_string(seq) + " repeated or too far ahead";
      fail_peer(p.id, make_error(errc::protocol_violation, why));
      return nullptr;
    }
    auto slot = std::make_shared<rx_slot>();
    if (allocate) slot->data = std::make_unique_for_overwrite<uint8_t[]>(size);
    slot->size = size;
    p.rx_bytes += cost;
    p.rx.emplace(seq, slot);
    return slot;
  }

  static ucs_status_t on_am_frame(void* arg, const void* header, size_t header_size, void* data, size_t size,
                                  const ucp_am_recv_param_t* param) {
    // Returning UCS_OK without receiving a rendezvous frame makes UCX tell the sender it is done.
    auto* self = static_cast<impl*>(arg);
    peer_state* p = self->sender_of(param);
    if (p == nullptr) return ++self->stat.frames_dropped, UCS_OK;
    if (header_size != sizeof(uint64_t))
      return self->fail_peer(p->id, make_error(errc::protocol_violation, "a frame without a sequence number")), UCS_OK;
    uint64_t seq;
    std::memcpy(&seq, header, sizeof seq);
    if (size > self->options.max_frame_bytes) {
      self->log_drop("from", p->id, size);
      if (auto slot = self->wait_in_line(*p, seq, 0)) slot->skip = true, self->deliver_ready(p->id);
      return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      auto slot = self->wait_in_line(*p, seq, size, /*allocate=*/false);
      if (!slot) return UCS_OK;
      p->rndv_waiting.emplace_back(std::move(slot), data);
      self->start_rndv(p->id);
      return UCS_INPROGRESS;  // UCX keeps the descriptor until ucp_am_recv_data_nbx takes it
    }
    if (seq == p->next_recv_seq && (p->rx.empty() || p->rx.begin()->first != seq)) {
      ++p->next_recv_seq;  // next in line: deliver without a copy
      peer_id id = p->id;
      self->deliver(id, static_cast<const uint8_t*>(data), size);
      self->deliver_ready(id);
    } else if (auto slot = self->wait_in_line(*p, seq, size)) {
      if (size) std::memcpy(slot->data.get(), data, size);
      slot->ready = true;
    }
    return UCS_OK;
  }

  // Starts the peer's next rendezvous receive unless one is running.
  void start_rndv(peer_id id) {
    auto it = peers.find(id);
    if (it == peers.end() || it->second.rndv_busy || it->second.rndv_waiting.empty()) return;
    peer_state& p = it->second;
    auto [slot, desc] = p.rndv_waiting.front();
    if (p.rx_bytes + slot->size - rndv_desc_bytes > options.max_reorder_bytes)
      return fail_peer(id, make_error(errc::protocol_violation, "too many frames waiting for an earlier one"));
    p.rndv_waiting.pop_front();
    slot->data = std::make_unique_for_overwrite<uint8_t[]>(slot->size);
    p.rx_bytes = p.rx_bytes + slot->size - rndv_desc_bytes;  // the descriptor's charge becomes the buffer's
    p.rndv_busy = true;
    auto* op = new recv_op{this, id, slot};
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv_am = &impl::on_rndv_received;
    rp.user_data = op;
    // The request stays ours until its callback: freeing it earlier would lose the callback.
    void* req = ucp_am_recv_data_nbx(worker, desc, slot->data.get(), slot->size, &rp);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) finish_rndv(op, req == nullptr ? UCS_OK : UCS_PTR_STATUS(req));
    else ++inflight;
  }

  void finish_rndv(recv_op* op, ucs_status_t st) {
    peer_id id = op->peer;
    if (st == UCS_OK) op->slot->ready = true, ++stat.rndv_received;
    delete op;
    auto it = peers.find(id);
    if (it == peers.end()) return;
    it->second.rndv_busy = false;
    if (st != UCS_OK) {
      ++stat.frames_dropped;
      return fail_peer(id, ucx_error(errc::transport_disconnected, "a rendezvous receive failed", st));
    }
    deliver_ready(id);
    deferred.push_back([this, id] { start_rndv(id); });  // not from inside a UCX callback
  }

  static void on_rndv_received(void* req, ucs_status_t st, size_t, void* user_data) {
    ucp_request_free(req);
    auto* op = static_cast<recv_op*>(user_data);
    --op->self->inflight;
    op->self->finish_rndv(op, st);
  }

  static ucs_status_t on_am_control(void* arg, const void* header, size_t header_size, void*, size_t,
                                    const ucp_am_recv_param_t* param) {
    auto* self = static_cast<impl*>(arg);
    peer_state* p = self->sender_of(param);
    if (p == nullptr || header_size < 1) return UCS_OK;
    uint8_t kind = *static_cast<const uint8_t*>(header);
    if (kind == control_hello_ack) p->connected = true;
    if (kind == control_hello)
      self->deferred.push_back([self, id = p->id] { self->send_control(id, control_hello_ack); });
    return UCS_OK;
  }
};

// ---- the public face ------------------------------------------------------------------------

result<std::unique_ptr<ucx_transport>> ucx_transport::create(ucx_options options) {
  auto p = std::make_unique<impl>();
  p->options = options;
  set_environment_defaults();
  ucp_config_t* config = nullptr;
  if (auto st = ucp_config_read(nullptr, nullptr, &config); st != UCS_OK)
    return ucx_error(errc::internal, "ucp_config_read", st);
  if (options.rndv_threshold != 0)
    ucp_config_modify(config, "RNDV_THRESH", std::to_string(options.rndv_threshold).c_str());
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "llmesh";
  ucs_status_t st = ucp_init(&params, config, &p->context);
  ucp_config_release(config);
  if (st != UCS_OK) return ucx_error(errc::internal, "ucp_init", st);

  p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  p->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (p->wake_fd < 0 || p->epoll_fd < 0)
    return make_error(errc::io_error, std::string("eventfd/epoll_create1: ") + std::strerror(errno));
  LLMESH_TRY(p->watch(p->wake_fd));

  std::promise<status> started;
  auto started_fut = started.get_future();
  p->thread = std::thread([raw = p.get(), &started] { raw->run(&started); });
  status ok = started_fut.get();
  if (!ok.ok()) {
    p->thread.join();
    return ok.take_error();
  }
  return std::unique_ptr<ucx_transport>(new ucx_transport(std::move(p)));
}

ucx_transport::ucx_transport(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

ucx_transport::~ucx_transport() {
  impl_->post({.fn = [s = impl_.get()] { s->stopping = true; }});
  impl_->thread.join();
}

void ucx_transport::set_handlers(transport_handlers h) {
  impl_->call([&] {
    impl_->handlers = std::move(h);
    return 0;
  });
}

result<std::string> ucx_transport::listen(const std::string& host_port) {
  auto addr = resolve(host_port, /*passive=*/true);
  if (!addr.ok()) return addr.take_error();
  return impl_->call([&]() -> result<std::string> {
    impl& s = *impl_;
    if (s.listener) return make_error(errc::invalid_request, "already listening");
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr->storage);
    lp.sockaddr.addrlen = addr->len;
    lp.conn_handler.cb = &impl::on_conn_request;
    lp.conn_handler.arg = &s;
    if (auto st = ucp_listener_create(s.worker, &lp, &s.listener); st != UCS_OK) {
      s.listener = nullptr;
      return ucx_error(errc::io_error, "listen on " + host_port, st);
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (auto st = ucp_listener_query(s.listener, &attr); st != UCS_OK)
      return ucx_error(errc::internal, "ucp_listener_query", st);
    return format_address(attr.sockaddr);
  });
}

result<peer_id> ucx_transport::connect(const std::string& host_port) {
  auto addr = resolve(host_port, /*passive=*/false);
  if (!addr.ok()) return addr.take_error();
  peer_id id = impl_->next_peer++;
  impl_->admit(id);
  impl_->post({.fn = [s = impl_.get(), id, to = std::move(addr.value())] { s->do_connect(id, to); }});
  return id;
}

status ucx_transport::send(peer_id peer, std::vector<uint8_t> frame) {
  impl& s = *impl_;
  if (frame.size() > s.options.max_frame_bytes) {
    s.log_drop("to", peer, frame.size());
    return make_error(errc::invalid_request, std::to_string(frame.size()) + "-byte frame exceeds max_frame_bytes " +
                                                 std::to_string(s.options.max_frame_bytes));
  }
  {
    std::lock_guard lock(s.mu);
    if (!s.live.count(peer)) {
      ++s.stat.send_errors;
      return make_error(errc::transport_disconnected, "peer " + std::to_string(peer) + " is unknown or gone");
    }
  }
  size_t size = frame.size();
  if (s.pending_send_bytes.fetch_add(size) + size > s.options.max_pending_send_bytes && size > 0) {
    s.pending_send_bytes -= size;
    return make_error(errc::overloaded, "more than " + std::to_string(s.options.max_pending_send_bytes) +
                                            " bytes waiting to be sent");
  }
  auto* op = new impl::send_op{&s, peer, std::move(frame)};
  if (s.options.direct_send && !s.on_thread()) {
    std::unique_lock work(s.work_mu, std::try_to_lock);  // held: the progress thread is busy, so queue it
    if (work.owns_lock() && s.worker && !s.stopping) {
      bool first;  // nothing queued before it: sending now keeps the order
      {
        std::lock_guard lock(s.mu);
        first = s.queue.empty();
      }
      if (first) {
        s.do_send(op, /*direct=*/true);
        return ok_status();
      }
    }
  }
  s.post({.op = op});
  return ok_status();
}

void ucx_transport::close(peer_id peer) {
  impl_->forget(peer);  // sends fail from now on
  impl_->post({.fn = [s = impl_.get(), peer] { s->do_close(peer); }});
}

transport_stats ucx_transport::stats() const {
  const auto& c = impl_->stat;
  transport_stats s;
  s.frames_sent = c.frames_sent, s.frames_received = c.frames_received;
  s.bytes_sent = c.bytes_sent, s.bytes_received = c.bytes_received;
  s.send_errors = c.send_errors, s.peers_lost = c.peers_lost, s.frames_dropped = c.frames_dropped;
  return s;
}

uint64_t ucx_transport::rndv_frames_received() const { return impl_->stat.rndv_received; }
size_t ucx_transport::pending_send_bytes() const { return impl_->pending_send_bytes; }
size_t ucx_transport::max_pending_send_bytes() const { return impl_->options.max_pending_send_bytes; }

}  // namespace llmesh::transport
