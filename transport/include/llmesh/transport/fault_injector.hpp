// Fault hooks for any transport: a wrapper that drops, delays, duplicates or partitions frames
// by peer, switchable at run time (tests, `llmesh ctl fault`). Outgoing frames get the rule of
// the peer they go to; incoming frames of a partitioned peer are dropped too (a partition cuts
// both ways, and — like a real one — reports nothing: heartbeats must notice it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "llmesh/transport/transport.hpp"

namespace llmesh::transport {

struct fault_rule {
  double drop = 0.0;       ///< probability that a frame is lost
  double duplicate = 0.0;  ///< probability that a frame is sent twice
  std::chrono::milliseconds delay{0};  ///< every frame waits this long (order kept)
  bool partition = false;  ///< nothing passes, either way
  /// How long the rule lasts before whoever set it clears it (0: until changed). The injector
  /// itself does not time rules; `llmesh node` does (a partition cannot be lifted through itself).
  std::chrono::milliseconds lasts{0};
  bool operator==(const fault_rule&) const = default;
};

/// Parses "drop=0.1,dup=0.05,delay=20ms,partition,for=3s" (any subset; "none" clears).
[[nodiscard]] result<fault_rule> parse_fault_rule(const std::string& spec);

/// Thread affinity: any thread. Owns the wrapped transport.
class fault_injector final : public transport {
 public:
  explicit fault_injector(std::unique_ptr<transport> inner, uint64_t seed = 1);
  ~fault_injector() override;

  /// The rule for one peer, or for every peer without its own (nullopt).
  void set_rule(std::optional<peer_id> peer, fault_rule rule);
  void clear();

  void set_handlers(transport_handlers h) override;
  result<std::string> listen(const std::string& host_port) override { return inner_->listen(host_port); }
  result<peer_id> connect(const std::string& host_port) override { return inner_->connect(host_port); }
  status send(peer_id peer, std::vector<uint8_t> frame) override;
  void close(peer_id peer) override { inner_->close(peer); }
  transport_stats stats() const override;
  size_t pending_send_bytes() const override { return inner_->pending_send_bytes(); }
  size_t max_pending_send_bytes() const override { return inner_->max_pending_send_bytes(); }

 private:
  fault_rule rule_for(peer_id p) const;  // REQUIRES: mu_ held
  void delay_loop();

  std::unique_ptr<transport> inner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<peer_id, fault_rule> rules_;
  fault_rule all_;
  std::mt19937_64 rng_;
  uint64_t dropped_ = 0;
  /// Delayed frames by due time (multimap: equal times keep insertion order).
  std::multimap<std::chrono::steady_clock::time_point, std::pair<peer_id, std::vector<uint8_t>>> delayed_;
  bool stop_ = false;
  std::thread delayer_;
};

}  // namespace llmesh::transport
