// An in-process network for deterministic tests: transports attached to one loopback_network
// reach each other by name. Every callback of every attached transport runs on the network's
// single delivery thread, in the order the events happened, so a test sees one total order.
// Destroying a transport is its process dying: its peers get on_peer_down.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "llmesh/transport/transport.hpp"

namespace llmesh::transport {

class loopback_transport;

/// Thread affinity: any thread.
class loopback_network : public std::enable_shared_from_this<loopback_network> {
 public:
  loopback_network();
  ~loopback_network();
  /// Blocks until every event queued so far has been delivered.
  void drain();

 private:
  friend class loopback_transport;
  struct connection {
    uint64_t a = 0, b = 0;      ///< transport ids (a connected to b's listener)
    peer_id pa = 0, pb = 0;     ///< the peer id each side uses
    bool open = true;
  };
  void post(uint64_t target, std::function<void(loopback_transport&)> fn);
  void run();

  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::pair<uint64_t, std::function<void(loopback_transport&)>>> queue_;
  std::map<uint64_t, loopback_transport*> transports_;
  std::map<std::string, uint64_t> listeners_;
  std::map<uint64_t, connection> connections_;
  uint64_t next_id_ = 1, running_ = 0;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

class loopback_transport final : public transport {
 public:
  explicit loopback_transport(std::shared_ptr<loopback_network> net);
  ~loopback_transport() override;

  void set_handlers(transport_handlers h) override { handlers_ = std::move(h); }
  result<std::string> listen(const std::string& host_port) override;
  result<peer_id> connect(const std::string& host_port) override;
  status send(peer_id peer, std::vector<uint8_t> frame) override;
  void close(peer_id peer) override;
  transport_stats stats() const override;

 private:
  friend class loopback_network;
  /// The connection behind one of our peer ids (0 if none); `side_a`: we are its a side.
  uint64_t conn_of(peer_id p, bool& side_a) const;

  std::shared_ptr<loopback_network> net_;
  uint64_t id_ = 0;
  transport_handlers handlers_;
  std::map<peer_id, uint64_t> peers_;  ///< guarded by net_->mu_
  peer_id next_peer_ = 1;              ///< guarded by net_->mu_
  std::string address_;
  mutable std::mutex stats_mu_;
  transport_stats stats_;
};

}  // namespace llmesh::transport
