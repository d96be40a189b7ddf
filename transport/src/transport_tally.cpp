#include "llmesh/transport/transport_tally.hpp"

namespace llmesh::transport {

void add_stats(transport_stats& a, const transport_stats& b) {
  a.frames_sent += b.frames_sent;
  a.frames_received += b.frames_received;
  a.bytes_sent += b.bytes_sent;
  a.bytes_received += b.bytes_received;
  a.send_errors += b.send_errors;
  a.peers_lost += b.peers_lost;
  a.frames_dropped += b.frames_dropped;
}

std::shared_ptr<transport> transport_tally::track(std::unique_ptr<transport> t) {
  transport* raw = t.release();
  {
    std::lock_guard lock(mu_);
    live_.insert(raw);
  }
  // The deleter moves the transport's last counts into retired_ under the lock that stats()
  // holds, before the transport goes: no read sees it neither live nor retired.
  std::weak_ptr<transport_tally> tally = weak_from_this();
  return std::shared_ptr<transport>(raw, [tally](transport* p) {
    if (auto self = tally.lock()) self->retire(p);
    delete p;
  });
}

void transport_tally::retire(transport* t) {
  std::lock_guard lock(mu_);
  add_stats(retired_, t->stats());
  live_.erase(t);
}

transport_stats transport_tally::stats() const {
  std::lock_guard lock(mu_);
  transport_stats sum = retired_;
  for (const transport* t : live_) add_stats(sum, t->stats());
  return sum;
}

size_t transport_tally::live() const {
  std::lock_guard lock(mu_);
  return live_.size();
}

}  // namespace llmesh::transport
