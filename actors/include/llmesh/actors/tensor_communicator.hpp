// The tensor plane between processes (DESIGN.md §1): a kernels::communicator whose ranks live in
// different processes and meet over a transport::transport (UCX in `llmesh node`, the loopback
// network in tests). One object per rank, each with its own transport and listener; a plain
// class (no CAF).
//
// Forming a group: every rank creates its communicator (it listens at once, address()), the
// addresses are exchanged over the mesh, then every rank calls join(): rank i connects to every
// rank above it and the ranks greet each other with the group's key; join returns when every
// peer has greeted (or fails at the deadline). A connection that greets with a wrong key, a bad
// rank or a malformed frame is closed.
//
// Collectives: each rank sends its data to every peer (one round, (size-1) × the data per rank;
// tensor-parallel groups on CPUs are small) and sums in rank order 0, 1, ..., size-1 from rank
// 0's values, exactly as the in-process communicator does, so every rank holds the same bits
// and a split replica's numbers equal an unsplit one's. Failure is bounded: a lost peer, a
// malformed frame or a collective waiting longer than the timeout aborts the group, and an
// aborted group closes its connections, so the peers' collectives fail too (shard_failed).
//
// Frames: a 24-byte header (magic, type, sender rank, collective number) and a payload (the key,
// or float32 values), in the host's byte order: the ranks of a group run on hosts of one kind.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/communicator.hpp"
#include "llmesh/transport/transport.hpp"

namespace llmesh::actors {

struct tensor_group_options {
  int rank = 0, size = 1;
  std::string key;  ///< the group's secret (from the coordinator); peers must greet with it
  /// How long join() and one collective may wait for the peers. A collective waits for the
  /// slowest rank to reach it (at most a layer's work), so a minute means a peer is gone.
  std::chrono::milliseconds timeout{60000};
};

/// Thread affinity: collectives and join() from one thread at a time (the rank's); abort() and
/// address() from any thread; the transport's handlers run on its thread.
/// Ownership: owns its transport; the destructor closes it first, so no handler outlives it.
class tensor_communicator final : public kernels::communicator {
 public:
  /// Listens on `listen` ("HOST:PORT", port 0: any) through `net` (its handlers are set here).
  [[nodiscard]] static result<std::unique_ptr<tensor_communicator>> create(std::shared_ptr<transport::transport> net,
                                                                           const std::string& listen,
                                                                           tensor_group_options opt);
  ~tensor_communicator() override;

  /// Where peers reach this rank ("HOST:PORT").
  const std::string& address() const { return address_; }
  /// Connects to the ranks above this one (`addresses` by rank; entries of lower ranks are
  /// not used) and waits until every peer has greeted. deadline_exceeded, shard_failed (a peer
  /// lost or the group aborted) or invalid_request (wrong number of addresses).
  [[nodiscard]] status join(const std::vector<std::string>& addresses);
  /// Called once (on the transport's thread, or abort()'s caller) when the group fails.
  void set_on_failed(std::function<void(const error&)> fn);

  int rank() const override { return opt_.rank; }
  int size() const override { return opt_.size; }
  [[nodiscard]] status all_reduce_sum(std::span<float> data) override;
  [[nodiscard]] status all_gather(std::span<const float> in, std::span<float> out) override;
  void abort() override { fail(make_error(errc::shard_failed, "collective aborted: a peer shard failed")); }

  /// Frames and bytes this rank sent in collectives (for benchmarks).
  uint64_t bytes_sent() const;

 private:
  struct received {
    uint64_t seq = 0;
    std::vector<float> values;
  };
  tensor_communicator(std::shared_ptr<transport::transport> net, tensor_group_options opt);
  void on_frame(transport::peer_id peer, std::span<const uint8_t> frame);
  void on_peer_down(transport::peer_id peer, const error& why);
  void fail(const error& why);
  [[nodiscard]] status send_to(int rank, uint8_t type, std::span<const uint8_t> payload);
  /// Sends `in` to every peer and waits for every peer's values of collective `seq`.
  [[nodiscard]] status exchange(std::span<const float> in, std::vector<std::vector<float>>& from);

  std::shared_ptr<transport::transport> net_;
  /// net_'s transport, for the handlers: net_ is already null while the destructor's reset()
  /// destroys the transport, and a handler may still be running then (the transport's
  /// destructor waits for it).
  transport::transport* tx_ = nullptr;
  tensor_group_options opt_;
  std::string address_;
  uint64_t seq_ = 0;  ///< collectives done (the rank's thread only)
  std::vector<float> scratch_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<transport::peer_id, int> rank_of_;  ///< greeted peers (and our own connects)
  std::vector<transport::peer_id> peer_of_;    ///< by rank; 0 = none yet
  std::vector<bool> greeted_;                  ///< by rank: its hello arrived
  std::vector<std::deque<received>> inbox_;    ///< by rank
  bool failed_ = false;
  error why_;
  std::function<void(const error&)> on_failed_;
  uint64_t bytes_sent_ = 0;
};

}  // namespace llmesh::actors
