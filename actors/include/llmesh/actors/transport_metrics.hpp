// The transport's counts on GET /metrics: frames and bytes each way, and errors by kind, per
// plane (`mesh`: the node's actor messages; `tensor`: its shards' all-reduce traffic). A collector copies a transport's own totals into
// the registry when it renders, so sending costs nothing more.
#pragma once

#include <memory>
#include <string>

#include "llmesh/actors/metrics.hpp"
#include "llmesh/transport/transport.hpp"
#include "llmesh/transport/transport_tally.hpp"

namespace llmesh::actors {

/// Declares llmesh_transport_frames_total and llmesh_transport_bytes_total {plane, direction},
/// and llmesh_transport_errors_total {plane, kind: send, peer_lost, dropped, decode}, and
/// mirrors `net`'s stats() into them at every render (weakly held: once it is gone the series
/// keep their last values). Returns the plane's `decode` counter, which the owner of the
/// decoder (the bridge) adds to.
metrics_registry::counter* export_transport_metrics(metrics_registry& m, std::weak_ptr<const transport::transport> net,
                                                    const std::string& plane);

/// The same families for a plane of several transports (a node's tensor plane: one transport
/// per hosted rank), mirroring the tally's sums, which never go down. Its `decode` series is
/// declared and stays 0 (a malformed tensor frame fails its tensor group instead).
void export_transport_metrics(metrics_registry& m, std::shared_ptr<const transport::transport_tally> tally,
                              const std::string& plane);

}  // namespace llmesh::actors
