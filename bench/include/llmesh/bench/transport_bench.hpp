// `llmesh bench transport`: our UCX transport between two processes — small-frame round trip
// and large-frame bandwidth — next to `ucx_perftest` (ucp_am_lat / ucp_am_bw with error
// handling, the same UCX environment) measured in the same run, as ratios.
#pragma once

#include <cstddef>
#include <string>

#include "llmesh/common/error.hpp"

namespace llmesh::bench {

struct transport_bench_options {
  size_t iters = 20000;             ///< round trips of small frames
  size_t small_bytes = 64;
  size_t frames = 64;               ///< large frames for the bandwidth test
  size_t large_bytes = size_t{4} << 20;
  int spin_us = 0;                  ///< both processes' progress-thread spin (ucx_options::spin)
  bool queued_sends = false;        ///< both processes: ucx_options::direct_send off
  std::string echo;                 ///< internal: run as the echo peer, connecting to this HOST:PORT
};

[[nodiscard]] status run_transport_bench(const transport_bench_options& opt);

}  // namespace llmesh::bench
