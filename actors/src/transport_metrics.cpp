#include "llmesh/actors/transport_metrics.hpp"

#include <functional>
#include <optional>

namespace llmesh::actors {

namespace {

/// The families, `plane`'s series, and a collector copying `read()` into them (nullopt: keep).
metrics_registry::counter* export_stats(metrics_registry& m, const std::string& plane,
                                        std::function<std::optional<transport::transport_stats>()> read) {
  m.declare_counter("llmesh_transport_frames_total", "Frames the transport sent or received", {"plane", "direction"});
  m.declare_counter("llmesh_transport_bytes_total", "Frame bytes the transport sent or received", {"plane", "direction"});
  m.declare_counter("llmesh_transport_errors_total",
                    "Transport errors: failed sends, lost peers, frames dropped by limits or fault rules, frames that "
                    "did not decode",
                    {"plane", "kind"});
  auto* frames_out = m.get_counter("llmesh_transport_frames_total", {plane, "sent"});
  auto* frames_in = m.get_counter("llmesh_transport_frames_total", {plane, "received"});
  auto* bytes_out = m.get_counter("llmesh_transport_bytes_total", {plane, "sent"});
  auto* bytes_in = m.get_counter("llmesh_transport_bytes_total", {plane, "received"});
  auto* send = m.get_counter("llmesh_transport_errors_total", {plane, "send"});
  auto* lost = m.get_counter("llmesh_transport_errors_total", {plane, "peer_lost"});
  auto* dropped = m.get_counter("llmesh_transport_errors_total", {plane, "dropped"});
  auto* decode = m.get_counter("llmesh_transport_errors_total", {plane, "decode"});
  m.add_collector([=] {
    const std::optional<transport::transport_stats> got = read();
    if (!got) return;
    const transport::transport_stats& s = *got;
    frames_out->set_total(static_cast<double>(s.frames_sent));
    frames_in->set_total(static_cast<double>(s.frames_received));
    bytes_out->set_total(static_cast<double>(s.bytes_sent));
    bytes_in->set_total(static_cast<double>(s.bytes_received));
    send->set_total(static_cast<double>(s.send_errors));
    lost->set_total(static_cast<double>(s.peers_lost));
    dropped->set_total(static_cast<double>(s.frames_dropped));
  });
  return decode;
}

}  // namespace

metrics_registry::counter* export_transport_metrics(metrics_registry& m, std::weak_ptr<const transport::transport> net,
                                                    const std::string& plane) {
  return export_stats(m, plane, [net]() -> std::optional<transport::transport_stats> {
    auto t = net.lock();
    if (!t) return std::nullopt;
    return t->stats();
  });
}

void export_transport_metrics(metrics_registry& m, std::shared_ptr<const transport::transport_tally> tally,
                              const std::string& plane) {
  export_stats(m, plane, [tally]() -> std::optional<transport::transport_stats> { return tally->stats(); });
}

}  // namespace llmesh::actors
