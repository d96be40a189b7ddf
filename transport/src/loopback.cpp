// The in-process network (loopback.hpp).
#include "llmesh/transport/loopback.hpp"

namespace llmesh::transport {

loopback_network::loopback_network() : thread_([this] { run(); }) {}

loopback_network::~loopback_network() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void loopback_network::post(uint64_t target, std::function<void(loopback_transport&)> fn) {
  queue_.emplace_back(target, std::move(fn));  // REQUIRES: mu_ held
  cv_.notify_all();
}

void loopback_network::drain() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void loopback_network::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    auto [target, fn] = std::move(queue_.front());
    queue_.pop_front();
    auto it = transports_.find(target);
    if (it == transports_.end()) {  // its transport is gone: the event dies with it
      if (queue_.empty()) idle_cv_.notify_all();
      continue;
    }
    busy_ = true;
    running_ = target;
    loopback_transport* t = it->second;
    lock.unlock();
    fn(*t);
    lock.lock();
    busy_ = false;
    running_ = 0;
    idle_cv_.notify_all();  // also wakes a transport's destructor waiting for its callback to end
  }
}

loopback_transport::loopback_transport(std::shared_ptr<loopback_network> net) : net_(std::move(net)) {
  std::lock_guard lock(net_->mu_);
  id_ = net_->next_id_++;
  net_->transports_[id_] = this;
}

loopback_transport::~loopback_transport() {
  std::unique_lock lock(net_->mu_);
  // Not while one of our callbacks runs (unless it is that callback destroying us).
  if (std::this_thread::get_id() != net_->thread_.get_id()) {
    net_->idle_cv_.wait(lock, [&] { return net_->running_ != id_; });
  }
  net_->transports_.erase(id_);
  if (!address_.empty()) net_->listeners_.erase(address_);
  // Our death is every peer's on_peer_down.
  for (auto& [cid, c] : net_->connections_) {
    if (!c.open || (c.a != id_ && c.b != id_)) continue;
    c.open = false;
    const uint64_t other = c.a == id_ ? c.b : c.a;
    const peer_id p = c.a == id_ ? c.pb : c.pa;
    net_->post(other, [p](loopback_transport& t) {
      if (t.handlers_.on_peer_down) t.handlers_.on_peer_down(p, make_error(errc::transport_disconnected, "peer process is gone"));
    });
  }
}

result<std::string> loopback_transport::listen(const std::string& host_port) {
  std::lock_guard lock(net_->mu_);
  std::string addr = host_port;
  if (addr.ends_with(":0")) addr = addr.substr(0, addr.size() - 1) + std::to_string(10000 + id_);
  if (net_->listeners_.count(addr)) return make_error(errc::io_error, "cannot listen on " + addr + ": address in use");
  net_->listeners_[addr] = id_;
  address_ = addr;
  return addr;
}

result<peer_id> loopback_transport::connect(const std::string& host_port) {
  std::lock_guard lock(net_->mu_);
  const peer_id mine = next_peer_++;
  const uint64_t cid = net_->next_id_++;
  peers_[mine] = cid;
  auto it = net_->listeners_.find(host_port);
  if (it == net_->listeners_.end()) {  // nobody listens: the connect fails, asynchronously
    net_->connections_[cid] = {id_, 0, mine, 0, false};
    net_->post(id_, [mine, host_port](loopback_transport& t) {
      if (t.handlers_.on_peer_down) t.handlers_.on_peer_down(mine, make_error(errc::transport_disconnected, "nothing listens on " + host_port));
    });
    return mine;
  }
  loopback_transport* server = net_->transports_.at(it->second);
  const peer_id theirs = server->next_peer_++;
  server->peers_[theirs] = cid;
  net_->connections_[cid] = {id_, server->id_, mine, theirs, true};
  const std::string from = "loopback#" + std::to_string(id_);
  net_->post(server->id_, [theirs, from](loopback_transport& t) {
    if (t.handlers_.on_accept) t.handlers_.on_accept(theirs, from);
  });
  return mine;
}

uint64_t loopback_transport::conn_of(peer_id p, bool& side_a) const {
  auto it = peers_.find(p);
  if (it == peers_.end()) return 0;
  const auto& c = net_->connections_.at(it->second);
  side_a = c.a == id_ && c.pa == p;
  return it->second;
}

status loopback_transport::send(peer_id peer, std::vector<uint8_t> frame) {
  std::lock_guard lock(net_->mu_);
  bool side_a = false;
  const uint64_t cid = conn_of(peer, side_a);
  if (cid == 0 || !net_->connections_.at(cid).open) {
    std::lock_guard s(stats_mu_);
    ++stats_.send_errors;
    return make_error(errc::transport_disconnected, "no connection to peer " + std::to_string(peer));
  }
  const auto& c = net_->connections_.at(cid);
  const uint64_t other = side_a ? c.b : c.a;
  const peer_id as_seen = side_a ? c.pb : c.pa;
  {
    std::lock_guard s(stats_mu_);
    ++stats_.frames_sent;
    stats_.bytes_sent += frame.size();
  }
  net_->post(other, [as_seen, frame = std::move(frame)](loopback_transport& t) {
    {
      std::lock_guard s(t.stats_mu_);
      ++t.stats_.frames_received;
      t.stats_.bytes_received += frame.size();
    }
    if (t.handlers_.on_frame) t.handlers_.on_frame(as_seen, frame);
  });
  return ok_status();
}

void loopback_transport::close(peer_id peer) {
  std::lock_guard lock(net_->mu_);
  bool side_a = false;
  const uint64_t cid = conn_of(peer, side_a);
  if (cid == 0) return;
  auto& c = net_->connections_.at(cid);
  if (!c.open) return;
  c.open = false;
  const auto why = make_error(errc::transport_disconnected, "connection closed");
  net_->post(id_, [peer, why](loopback_transport& t) {
    if (t.handlers_.on_peer_down) t.handlers_.on_peer_down(peer, why);
  });
  const uint64_t other = side_a ? c.b : c.a;
  const peer_id theirs = side_a ? c.pb : c.pa;
  net_->post(other, [theirs, why](loopback_transport& t) {
    if (t.handlers_.on_peer_down) t.handlers_.on_peer_down(theirs, why);
  });
}

transport_stats loopback_transport::stats() const {
  std::lock_guard s(stats_mu_);
  return stats_;
}

}  // namespace llmesh::transport
