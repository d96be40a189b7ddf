// The metrics registry: the exact Prometheus text for each kind (cumulative buckets, +Inf,
// _sum/_count, escaped labels and help), refusals of undeclared or mislabelled series, and
// concurrent recording that loses nothing.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "../model/temp_dir.hpp"

#include "llmesh/actors/metrics.hpp"
#include "llmesh/actors/transport_metrics.hpp"
#include "llmesh/transport/loopback.hpp"

namespace llmesh::actors {
namespace {

TEST(Metrics, RendersTheTextFormat) {
  metrics_registry r;
  r.declare_counter("llmesh_generation_tokens_total", "Tokens generated.", {"replica"});
  r.declare_gauge("llmesh_requests_running", "Requests in the running batch.");
  r.declare_histogram("llmesh_ttft_seconds", "Time to first token.", {0.1, 1}, {"replica"});
  r.get_counter("llmesh_generation_tokens_total", {"r\"1\\\n"})->add(3);
  r.get_gauge("llmesh_requests_running")->set(2);
  auto* h = r.get_histogram("llmesh_ttft_seconds", {"r1"});
  h->observe(0.05);
  h->observe(0.5);
  h->observe(7);
  EXPECT_EQ(r.render(),
            "# HELP llmesh_generation_tokens_total Tokens generated.\n"
            "# TYPE llmesh_generation_tokens_total counter\n"
            "llmesh_generation_tokens_total{replica=\"r\\\"1\\\\\\n\"} 3\n"
            "# HELP llmesh_requests_running Requests in the running batch.\n"
            "# TYPE llmesh_requests_running gauge\n"
            "llmesh_requests_running 2\n"
            "# HELP llmesh_ttft_seconds Time to first token.\n"
            "# TYPE llmesh_ttft_seconds histogram\n"
            "llmesh_ttft_seconds_bucket{replica=\"r1\",le=\"0.1\"} 1\n"
            "llmesh_ttft_seconds_bucket{replica=\"r1\",le=\"1\"} 2\n"
            "llmesh_ttft_seconds_bucket{replica=\"r1\",le=\"+Inf\"} 3\n"
            "llmesh_ttft_seconds_sum{replica=\"r1\"} 7.55\n"
            "llmesh_ttft_seconds_count{replica=\"r1\"} 3\n");
}

TEST(Metrics, RefusesUndeclaredOrMislabelledSeries) {
  metrics_registry r;
  r.declare_counter("llmesh_x_total", "x", {"replica"});
  EXPECT_EQ(r.get_counter("llmesh_y_total"), nullptr);
  EXPECT_EQ(r.get_counter("llmesh_x_total"), nullptr);          // one label expected
  EXPECT_EQ(r.get_gauge("llmesh_x_total", {"a"}), nullptr);     // another kind
  EXPECT_EQ(r.get_counter("llmesh_x_total", {"a"}), r.get_counter("llmesh_x_total", {"a"}));
  r.get_counter("llmesh_x_total", {"a"})->add(-5);  // counters never go down
  EXPECT_EQ(r.get_counter("llmesh_x_total", {"a"})->value(), 0.0);
}

TEST(Metrics, ConcurrentRecordingLosesNothing) {
  metrics_registry r;
  r.declare_counter("llmesh_c_total", "c");
  r.declare_histogram("llmesh_h_seconds", "h", metrics_registry::latency_buckets());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        r.get_counter("llmesh_c_total")->add();
        r.get_histogram("llmesh_h_seconds")->observe(0.002);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(r.get_counter("llmesh_c_total")->value(), 40000.0);
  std::vector<uint64_t> cum;
  double sum = 0;
  uint64_t count = 0;
  r.get_histogram("llmesh_h_seconds")->snapshot(cum, sum, count);
  EXPECT_EQ(count, 40000u);
  EXPECT_EQ(cum.back(), 40000u);
  EXPECT_EQ(cum[0], 0u);   // ≤ 1 ms
  EXPECT_EQ(cum[1], 40000u);  // ≤ 2.5 ms
}

/// Every family the mesh declares, with awkward label values, passes `promtool check metrics`.
TEST(Metrics, PromtoolAcceptsTheOutput) {
  metrics_registry r;
  r.declare_histogram("llmesh_time_to_first_token_seconds", "Time from request to first token.",
                      metrics_registry::latency_buckets(), {"replica"});
  r.declare_counter("llmesh_prompt_tokens_total", "Prompt tokens processed.", {"replica"});
  r.declare_gauge("llmesh_kv_cache_usage_ratio", "Fraction of KV blocks in use.", {"replica"});
  r.declare_gauge("llmesh_replicas_ready", "Replicas ready to serve.");
  r.get_histogram("llmesh_time_to_first_token_seconds", {"a\"b"})->observe(0.3);
  r.get_counter("llmesh_prompt_tokens_total", {"line\nbreak"})->add(12);
  r.get_gauge("llmesh_kv_cache_usage_ratio", {"r0"})->set(0.25);
  r.get_gauge("llmesh_replicas_ready")->set(1);
  model::testing::temp_dir tmp;
  const std::string path = tmp.path() + "/metrics.txt";
  std::ofstream(path) << r.render();
  const std::string cmd = "promtool check metrics < " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << out;
}

TEST(Metrics, CollectorsRunAtEveryRender) {
  metrics_registry r;
  r.declare_counter("llmesh_things_total", "Things.");
  auto* c = r.get_counter("llmesh_things_total");
  int calls = 0;
  r.add_collector([&] { c->set_total(++calls * 10.0); });
  const std::string first = r.render(), second = r.render();
  EXPECT_NE(first.find("llmesh_things_total 10\n"), std::string::npos) << first;
  EXPECT_NE(second.find("llmesh_things_total 20\n"), std::string::npos) << second;
  EXPECT_EQ(calls, 2);
}

/// The value of one series in rendered text ("name{labels} value"), or -1 when absent.
double series_value(const std::string& text, const std::string& series) {
  const auto at = text.find(series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 1));
}

TEST(TransportMetrics, MirrorTheTransportsCountsAndCountDecodeErrors) {
  auto net = std::make_shared<transport::loopback_network>();
  auto a = std::make_shared<transport::loopback_transport>(net);
  transport::loopback_transport b(net);
  b.set_handlers({});
  auto where = b.listen("127.0.0.1:1");
  ASSERT_TRUE(where.ok()) << where.err().message;
  metrics_registry r;
  auto* decode = export_transport_metrics(r, a, "mesh");
  ASSERT_NE(decode, nullptr);
  auto peer = a->connect(*where);
  ASSERT_TRUE(peer.ok());
  net->drain();
  for (size_t n : {10u, 20u, 30u}) ASSERT_TRUE(a->send(*peer, std::vector<uint8_t>(n, 7)).ok());
  net->drain();
  decode->add();
  const std::string text = r.render();
  EXPECT_EQ(series_value(text, "llmesh_transport_frames_total{plane=\"mesh\",direction=\"sent\"}"), 3) << text;
  EXPECT_EQ(series_value(text, "llmesh_transport_bytes_total{plane=\"mesh\",direction=\"sent\"}"), 60) << text;
  EXPECT_EQ(series_value(text, "llmesh_transport_frames_total{plane=\"mesh\",direction=\"received\"}"), 0) << text;
  EXPECT_EQ(series_value(text, "llmesh_transport_errors_total{plane=\"mesh\",kind=\"decode\"}"), 1) << text;
  EXPECT_EQ(series_value(text, "llmesh_transport_errors_total{plane=\"mesh\",kind=\"send\"}"), 0) << text;
  // A send to a closed peer is an error the transport counts.
  a->close(*peer);
  net->drain();
  EXPECT_FALSE(a->send(*peer, std::vector<uint8_t>(5, 1)).ok());
  const std::string later = r.render();
  EXPECT_GE(series_value(later, "llmesh_transport_errors_total{plane=\"mesh\",kind=\"send\"}") +
                series_value(later, "llmesh_transport_errors_total{plane=\"mesh\",kind=\"peer_lost\"}"),
            1)
      << later;
  // Once the transport is gone the series keep their last values.
  a.reset();
  EXPECT_EQ(series_value(r.render(), "llmesh_transport_bytes_total{plane=\"mesh\",direction=\"sent\"}"), 60);
}

TEST(TransportMetrics, APlaneOfSeveralTransportsCountsTheirSumAndKeepsTheGoneOnes) {
  auto net = std::make_shared<transport::loopback_network>();
  transport::loopback_transport listener(net);
  listener.set_handlers({});
  auto where = listener.listen("127.0.0.1:1");
  ASSERT_TRUE(where.ok()) << where.err().message;
  auto tally = transport::transport_tally::create();
  metrics_registry r;
  export_transport_metrics(r, tally, "tensor");
  const std::string sent = "llmesh_transport_bytes_total{plane=\"tensor\",direction=\"sent\"}";
  EXPECT_EQ(series_value(r.render(), sent), 0);
  auto rank0 = tally->track(std::make_unique<transport::loopback_transport>(net));
  auto rank1 = tally->track(std::make_unique<transport::loopback_transport>(net));
  for (auto* t : {rank0.get(), rank1.get()}) {
    t->set_handlers({});
    auto peer = t->connect(*where);
    ASSERT_TRUE(peer.ok());
    net->drain();
    ASSERT_TRUE(t->send(*peer, std::vector<uint8_t>(t == rank0.get() ? 40 : 2, 1)).ok());
  }
  net->drain();
  EXPECT_EQ(series_value(r.render(), sent), 42);
  EXPECT_EQ(series_value(r.render(), "llmesh_transport_frames_total{plane=\"tensor\",direction=\"sent\"}"), 2);
  rank0.reset();  // a replica stopped: its rank's transport is gone, its bytes stay counted
  EXPECT_EQ(series_value(r.render(), sent), 42);
  EXPECT_EQ(series_value(r.render(), "llmesh_transport_errors_total{plane=\"tensor\",kind=\"decode\"}"), 0);
}

}  // namespace
}  // namespace llmesh::actors
