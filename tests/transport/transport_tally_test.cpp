// transport_tally: several transports of one plane summed, and what a dropped one counted kept,
// so that the totals a metrics collector reads never go down.
#include "llmesh/transport/transport_tally.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace llmesh::transport {
namespace {

/// A transport that only counts: its stats are what the test sets.
struct counting_transport final : transport {
  std::atomic<uint64_t> sent{0};
  uint64_t dropped = 0;
  void set_handlers(transport_handlers) override {}
  result<std::string> listen(const std::string& hp) override { return hp; }
  result<peer_id> connect(const std::string&) override { return peer_id{1}; }
  status send(peer_id, std::vector<uint8_t> frame) override {
    sent += frame.size();
    return ok_status();
  }
  void close(peer_id) override {}
  transport_stats stats() const override {
    transport_stats s;
    s.frames_sent = sent.load() > 0 ? 1 : 0;
    s.bytes_sent = sent.load();
    s.frames_dropped = dropped;
    return s;
  }
};

TEST(TransportTally, SumsLiveTransportsAndKeepsWhatDroppedOnesCounted) {
  auto tally = transport_tally::create();
  EXPECT_EQ(tally->stats().bytes_sent, 0u);
  auto a = std::make_unique<counting_transport>();
  auto* ra = a.get();
  auto b = std::make_unique<counting_transport>();
  auto* rb = b.get();
  rb->dropped = 2;
  std::shared_ptr<transport> sa = tally->track(std::move(a));
  std::shared_ptr<transport> sb = tally->track(std::move(b));
  EXPECT_EQ(tally->live(), 2u);
  ASSERT_TRUE(sa->send(1, std::vector<uint8_t>(100)).ok());
  ASSERT_TRUE(sb->send(1, std::vector<uint8_t>(30)).ok());
  EXPECT_EQ(tally->stats().bytes_sent, 130u);
  EXPECT_EQ(tally->stats().frames_sent, 2u);
  EXPECT_EQ(tally->stats().frames_dropped, 2u);
  ASSERT_TRUE(ra->send(1, std::vector<uint8_t>(5)).ok());
  EXPECT_EQ(tally->stats().bytes_sent, 135u);

  std::shared_ptr<transport> also_a = sa;  // the last owner's drop is what retires it
  sa.reset();
  EXPECT_EQ(tally->live(), 2u);
  also_a.reset();
  EXPECT_EQ(tally->live(), 1u);
  EXPECT_EQ(tally->stats().bytes_sent, 135u);  // a is gone; what it sent still counts
  sb.reset();
  EXPECT_EQ(tally->live(), 0u);
  const transport_stats end = tally->stats();
  EXPECT_EQ(end.bytes_sent, 135u);
  EXPECT_EQ(end.frames_sent, 2u);
  EXPECT_EQ(end.frames_dropped, 2u);
}

TEST(TransportTally, ATransportMayOutliveItsTally) {
  std::shared_ptr<transport> t;
  {
    auto tally = transport_tally::create();
    t = tally->track(std::make_unique<counting_transport>());
  }
  ASSERT_TRUE(t->send(1, std::vector<uint8_t>(3)).ok());
  t.reset();  // no tally to retire into: just deleted
}

TEST(TransportTally, ReadsNeverGoDownWhileTransportsComeAndGo) {
  auto tally = transport_tally::create();
  std::atomic<bool> stop{false};
  std::atomic<int> made{0};
  std::thread churn([&] {
    while (!stop) {
      auto t = tally->track(std::make_unique<counting_transport>());
      (void)t->send(1, std::vector<uint8_t>(7));
      ++made;
    }
  });
  uint64_t last = 0;
  for (int i = 0; i < 20000 || made < 2000; ++i) {
    const uint64_t now = tally->stats().bytes_sent;
    ASSERT_GE(now, last) << "read " << i;
    last = now;
  }
  stop = true;
  churn.join();
  EXPECT_EQ(tally->stats().bytes_sent % 7, 0u);
  EXPECT_GT(tally->stats().bytes_sent, 0u);
}

}  // namespace
}  // namespace llmesh::transport
