// The loopback network and the fault hooks: connect/accept, ordered frames, close and a
// transport's death reported as on_peer_down; drop, duplicate, delay and partition rules
// switched at run time; fault rule parsing.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "llmesh/transport/fault_injector.hpp"
#include "llmesh/transport/loopback.hpp"

namespace llmesh::transport {
namespace {

/// Records what a transport's handlers saw.
struct recorder {
  std::mutex mu;
  std::vector<std::pair<peer_id, std::vector<uint8_t>>> frames;
  std::vector<peer_id> accepted, down;

  transport_handlers handlers() {
    return {[this](peer_id p, std::span<const uint8_t> f) {
              std::lock_guard l(mu);
              frames.emplace_back(p, std::vector<uint8_t>(f.begin(), f.end()));
            },
            [this](peer_id p, const std::string&) {
              std::lock_guard l(mu);
              accepted.push_back(p);
            },
            [this](peer_id p, const error&) {
              std::lock_guard l(mu);
              down.push_back(p);
            }};
  }
};

std::vector<uint8_t> frame_of(uint32_t i) { return {uint8_t(i), uint8_t(i >> 8), uint8_t(i >> 16), 7}; }

TEST(Loopback, ConnectsDeliversInOrderAndReportsDownOnce) {
  auto net = std::make_shared<loopback_network>();
  recorder rs, rc;
  loopback_transport server(net), client(net);
  server.set_handlers(rs.handlers());
  client.set_handlers(rc.handlers());
  auto addr = server.listen("127.0.0.1:0");
  ASSERT_TRUE(addr.ok());
  auto p = client.connect(*addr);
  ASSERT_TRUE(p.ok());
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_TRUE(client.send(*p, frame_of(i)).ok());
  net->drain();
  ASSERT_EQ(rs.accepted.size(), 1u);
  ASSERT_EQ(rs.frames.size(), 1000u);
  for (uint32_t i = 0; i < 1000; ++i) EXPECT_EQ(rs.frames[i].second, frame_of(i));
  EXPECT_EQ(rs.frames[0].first, rs.accepted[0]);
  ASSERT_TRUE(server.send(rs.accepted[0], frame_of(5)).ok());  // and back
  net->drain();
  ASSERT_EQ(rc.frames.size(), 1u);
  EXPECT_EQ(rc.frames[0].first, *p);
  client.close(*p);
  client.close(*p);  // twice: still one report each
  net->drain();
  EXPECT_EQ(rc.down, std::vector<peer_id>{*p});
  EXPECT_EQ(rs.down, rs.accepted);
  EXPECT_FALSE(client.send(*p, frame_of(1)).ok());
  EXPECT_EQ(client.stats().frames_sent, 1000u);
  EXPECT_EQ(server.stats().frames_received, 1000u);
}

TEST(Loopback, ADeadTransportAndAMissingListenerShowAsPeerDown) {
  auto net = std::make_shared<loopback_network>();
  recorder rs, rc;
  loopback_transport client(net);
  client.set_handlers(rc.handlers());
  auto nobody = client.connect("127.0.0.1:9");
  ASSERT_TRUE(nobody.ok());
  {
    loopback_transport server(net);
    server.set_handlers(rs.handlers());
    auto addr = server.listen("node-a:7100");
    ASSERT_TRUE(addr.ok());
    EXPECT_FALSE(loopback_transport(net).listen("node-a:7100").ok());  // in use
    auto p = client.connect(*addr);
    ASSERT_TRUE(p.ok());
    net->drain();
  }  // the server's process dies
  net->drain();
  ASSERT_EQ(rc.down.size(), 2u);
  EXPECT_EQ(rc.down[0], *nobody);
}

TEST(FaultInjector, RulesDropDuplicateDelayAndPartition) {
  auto net = std::make_shared<loopback_network>();
  recorder rs, rc;
  loopback_transport server(net);
  server.set_handlers(rs.handlers());
  auto addr = server.listen("s:1");
  ASSERT_TRUE(addr.ok());
  fault_injector client(std::make_unique<loopback_transport>(net), 42);
  client.set_handlers(rc.handlers());
  auto p = client.connect(*addr);
  ASSERT_TRUE(p.ok());
  net->drain();

  client.set_rule(*p, fault_rule{0.5, 0, {}, false});
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_TRUE(client.send(*p, frame_of(i)).ok());
  net->drain();
  EXPECT_GT(rs.frames.size(), 400u);
  EXPECT_LT(rs.frames.size(), 600u);
  EXPECT_EQ(client.stats().frames_dropped, 1000u - rs.frames.size());

  rs.frames.clear();
  client.set_rule(std::nullopt, fault_rule{0, 1.0, {}, false});
  client.set_rule(*p, {});  // the peer's own rule (none) wins over the default
  ASSERT_TRUE(client.send(*p, frame_of(1)).ok());
  net->drain();
  EXPECT_EQ(rs.frames.size(), 1u);
  client.clear();
  client.set_rule(std::nullopt, fault_rule{0, 1.0, {}, false});
  ASSERT_TRUE(client.send(*p, frame_of(2)).ok());
  net->drain();
  EXPECT_EQ(rs.frames.size(), 3u);  // duplicated

  rs.frames.clear();
  client.clear();
  client.set_rule(*p, fault_rule{0, 0, std::chrono::milliseconds(30), false});
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t i = 0; i < 5; ++i) ASSERT_TRUE(client.send(*p, frame_of(i)).ok());
  for (int i = 0; i < 400 && rs.frames.size() < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    net->drain();
  }
  ASSERT_EQ(rs.frames.size(), 5u);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(30));
  for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ(rs.frames[i].second, frame_of(i));  // order kept

  // A partition cuts both ways, silently; clearing it heals.
  rs.frames.clear();
  client.clear();
  client.set_rule(*p, fault_rule{0, 0, {}, true});
  ASSERT_TRUE(client.send(*p, frame_of(9)).ok());
  ASSERT_TRUE(server.send(rs.accepted[0], frame_of(9)).ok());
  net->drain();
  EXPECT_TRUE(rs.frames.empty());
  EXPECT_TRUE(rc.frames.empty());
  EXPECT_TRUE(rc.down.empty());
  client.clear();
  ASSERT_TRUE(server.send(rs.accepted[0], frame_of(9)).ok());
  net->drain();
  EXPECT_EQ(rc.frames.size(), 1u);
}

TEST(FaultInjector, ParsesRules) {
  auto r = parse_fault_rule("drop=0.25,dup=0.1,delay=20ms");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (fault_rule{0.25, 0.1, std::chrono::milliseconds(20), false}));
  EXPECT_TRUE(parse_fault_rule("partition")->partition);
  EXPECT_EQ(parse_fault_rule("partition,for=3s")->lasts, std::chrono::milliseconds(3000));
  EXPECT_EQ(parse_fault_rule("drop=1,for=250ms")->lasts, std::chrono::milliseconds(250));
  EXPECT_EQ(parse_fault_rule("drop=1")->lasts, std::chrono::milliseconds(0));
  for (const char* bad : {"for=3", "for=0s", "for=-1s", "for=", "for=25h"}) {
    EXPECT_FALSE(parse_fault_rule(bad).ok()) << bad;
  }
  EXPECT_EQ(*parse_fault_rule("none"), fault_rule{});
  for (const char* bad : {"drop=2", "drop=", "delay=-1", "delay=5s", "jitter=1", "drop"}) {
    auto e = parse_fault_rule(bad);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.err().message.find(bad), std::string::npos);
  }
}

}  // namespace
}  // namespace llmesh::transport
