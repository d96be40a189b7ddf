// What a request actor remembers so that a replica's death never shows to the client: the
// original request, every token already streamed, and how often it has moved. failover()
// builds the request to send to another replica — the prompt plus the streamed tokens, the
// remaining budget, the same seed — and, because sampling is keyed by (seed, position) and the
// kernels are batch-invariant, the new replica continues with exactly the tokens the dead one
// would have produced. A plain class; the request actor is its shell.
#pragma once

#include <span>
#include <vector>

#include "llmesh/actors/replica_core.hpp"

namespace llmesh::actors {

/// Thread affinity: the request actor's.
class request_tracker {
 public:
  request_tracker(replica_request original, size_t max_migrations)
      : original_(std::move(original)), max_migrations_(max_migrations) {}

  /// Records a streamed token and whether it ended the request.
  void on_token(int32_t token, bool final);

  /// The request that continues this one on another replica; replica_unavailable once
  /// max_migrations moves have been spent, invalid_request when it already finished.
  [[nodiscard]] result<replica_request> failover();

  bool finished() const { return finished_; }
  size_t migrations() const { return migrations_; }
  std::span<const int32_t> generated() const { return generated_; }
  const replica_request& original() const { return original_; }

 private:
  replica_request original_;
  size_t max_migrations_;
  size_t migrations_ = 0;
  std::vector<int32_t> generated_;
  bool finished_ = false;
};

}  // namespace llmesh::actors
