// Failover bookkeeping (request_tracker.hpp).
#include "llmesh/actors/request_tracker.hpp"

#include <string>

namespace llmesh::actors {

void request_tracker::on_token(int32_t token, bool final) {
  generated_.push_back(token);
  finished_ = finished_ || final;
}

result<replica_request> request_tracker::failover() {
  if (finished_ || generated_.size() >= original_.max_tokens) {
    return make_error(errc::invalid_request, "request " + std::to_string(original_.id) + " has already finished");
  }
  if (migrations_ >= max_migrations_) {
    return make_error(errc::replica_unavailable, "request " + std::to_string(original_.id) + " lost its replica " +
                                                     std::to_string(migrations_ + 1) + " times; giving up");
  }
  ++migrations_;
  replica_request next = original_;
  next.prompt.insert(next.prompt.end(), generated_.begin(), generated_.end());
  next.max_tokens = original_.max_tokens - generated_.size();
  next.generated = original_.generated + generated_.size();  // output, for penalties and min_tokens
  return next;  // same id, seed and EOS ids: positions continue where the stream stopped
}

}  // namespace llmesh::actors
