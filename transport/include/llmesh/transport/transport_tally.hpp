// Several transports of one plane counted as one: a node's tensor-plane transports, one per
// rank it hosts, made and dropped as replicas come and go. What a dropped transport counted
// stays counted, so totals read from the tally never go down (Prometheus counters).
#pragma once

#include <memory>
#include <mutex>
#include <set>

#include "llmesh/transport/transport.hpp"

namespace llmesh::transport {

/// Thread affinity: any thread.
class transport_tally : public std::enable_shared_from_this<transport_tally> {
 public:
  static std::shared_ptr<transport_tally> create() { return std::shared_ptr<transport_tally>(new transport_tally()); }

  /// `t` as a shared transport, counted while it lives and, after its last owner drops it,
  /// by what it had counted. REQUIRES: t is not null.
  std::shared_ptr<transport> track(std::unique_ptr<transport> t);
  /// The sum of every tracked transport's stats(), live or gone.
  transport_stats stats() const;
  /// Transports tracked and still alive.
  size_t live() const;

 private:
  transport_tally() = default;
  void retire(transport* t);

  mutable std::mutex mu_;
  std::set<transport*> live_;
  transport_stats retired_;
};

/// a += b, field by field.
void add_stats(transport_stats& a, const transport_stats& b);

}  // namespace llmesh::transport
