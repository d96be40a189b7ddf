// The frame codec: every message kind survives a round trip (aligned or not); a frame from a
// newer peer (an unknown kind) is refused by name; and no byte sequence — truncated, flipped,
// oversized, with a forged segment table or lists beyond the limits — crashes the decoder or
// gets past it unchecked.
#include <gtest/gtest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <random>

#include "llmesh/transport/codec.hpp"
#include "mesh_v2.capnp.h"

namespace llmesh::transport {
namespace {

std::vector<envelope> samples() {
  std::vector<body> bodies = {
      generate_msg{7, {1, 2, 3, 40000}, 64, {0.8f, 0.95f, 40, 1234567890123ull}, {2, 3}},
      token_body{7, 42, finish_kind::length, false, errc::internal, ""},
      token_body{7, -1, finish_kind::none, true, errc::shard_failed, "shard 1 is gone"},
      cancel_msg{9},
      status_request{},
      load_msg{5, true, 3, 4, 100, 4096},
      hello_msg{"replica-a", {role::replica, role::router}, "127.0.0.1:7101", {2, 24ull << 30, 0}, std::string("\x00\x01\xff", 3)},
      challenge_msg{std::string(32, '\x7f')},
      proof_msg{std::string(32, '\x01')},
      welcome_msg{true, "", {{"seed", {role::coordinator, role::gateway}, "127.0.0.1:7100"}, {"replica-a", {role::replica}, "127.0.0.1:7101"}}},
      heartbeat_msg{"replica-b", 99},
      replica_state_msg{11, "replica-a", "kjv-tiny", replica_phase::draining, 0, "", ""},
      replica_state_msg{12, "replica-b", "kjv-tiny", replica_phase::ready, 1012, "", "127.0.0.1:7102"},
      replica_state_msg{13, "replica-b", "kjv-tiny", replica_phase::dead, 0, "config.json: not found", ""},
      collective_id_msg{11, 2, std::string(128, '\x05')},
      assign_msg{14, "kjv-tiny", "models/kjv-tiny", 2, 256, assign_op::start},
      assign_msg{14, "kjv-tiny", "models/kjv-tiny", 2, 256, assign_op::stop},
      control_msg{"drain", {"replica-a"}, std::string(16, '\x02'), 1764000000000ull, std::string(32, '\x03')},
      control_msg{"status", {}, "", 0, ""},
      control_reply_msg{true, "2 nodes", "{\"nodes\":2}"},
      control_reply_msg{false, "unknown node 'x'", ""},
  };
  std::vector<envelope> out;
  uint64_t n = 1;
  for (auto& b : bodies) out.push_back({{"seed", n}, {"replica-a", n + 100}, n * 3, n * 7, b}), ++n;
  return out;
}

TEST(Codec, EveryKindRoundTripsAlignedOrNot) {
  for (const auto& e : samples()) {
    const auto frame = encode(e);
    auto back = decode(frame);
    ASSERT_TRUE(back.ok()) << kind_name(e.msg) << ": " << back.err().message;
    EXPECT_EQ(*back, e) << kind_name(e.msg);
    std::vector<uint8_t> shifted(frame.size() + 1);
    std::copy(frame.begin(), frame.end(), shifted.begin() + 1);
    auto unaligned = decode(std::span(shifted).subspan(1));
    ASSERT_TRUE(unaligned.ok()) << unaligned.err().message;
    EXPECT_EQ(*unaligned, e);
  }
  EXPECT_STREQ(kind_name(body{collective_id_msg{}}), "collective_id");
  EXPECT_STREQ(kind_name(body{control_reply_msg{}}), "control_reply");
}

TEST(Codec, ANewerPeersKindIsRefusedByName) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<schemas_v2::Envelope>();
  root.initSource().setNode("future");
  root.getBody().setFromTheFuture("hello");
  auto words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  auto r = decode(std::span<const uint8_t>(bytes.begin(), bytes.size()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::protocol_violation);
  EXPECT_NE(r.err().message.find("unknown message kind 15"), std::string::npos) << r.err().message;
  // (12: the discriminant counts union members, 0-based.) And the newer peer reads our frames: old kinds keep their ordinals.
  const auto ours = encode(samples()[0]);
  capnp::FlatArrayMessageReader reader(kj::arrayPtr(reinterpret_cast<const capnp::word*>(ours.data()), ours.size() / 8));
  auto v2 = reader.getRoot<schemas_v2::Envelope>();
  ASSERT_EQ(v2.getBody().which(), schemas_v2::Envelope::Body::GENERATE);
  EXPECT_EQ(v2.getBody().getGenerate().getPrompt().size(), 4u);
}

TEST(Codec, LimitsAreEnforced) {
  generate_msg big;
  big.prompt.assign(5000, 1);
  frame_limits lim;
  lim.max_list = 4096;
  auto r = decode(encode({{}, {}, 0, 0, big}), lim);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("prompt holds 5000"), std::string::npos) << r.err().message;
  lim = {};
  lim.max_text = 10;
  r = decode(encode({{"a-very-long-node-name", 1}, {}, 0, 0, status_request{}}), lim);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("source.node"), std::string::npos);
  lim = {};
  lim.max_frame_bytes = 64;
  EXPECT_FALSE(decode(encode(samples()[0]), lim).ok());
  // Forged segment tables: a huge count, sizes that overrun the frame.
  auto frame = encode(samples()[0]);
  auto forged = frame;
  forged[0] = forged[1] = forged[2] = forged[3] = 0xff;
  EXPECT_NE(decode(forged).err().message.find("segments"), std::string::npos);
  forged = frame;
  forged[4] = 0xff, forged[5] = 0xff, forged[6] = 0xff, forged[7] = 0x7f;
  EXPECT_FALSE(decode(forged).ok());
  EXPECT_FALSE(decode(std::span(frame).first(frame.size() - 8)).ok());
  EXPECT_FALSE(decode(std::span(frame).first(13)).ok());
  EXPECT_FALSE(decode({}).ok());
}

TEST(Codec, MutatedFramesNeverCrash) {
  std::mt19937 rng(2026);
  const auto all = samples();
  size_t decoded = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    auto frame = encode(all[rng() % all.size()]);
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) frame[rng() % frame.size()] = static_cast<uint8_t>(rng());
    if (rng() % 4 == 0) frame.resize((rng() % (frame.size() / 8 + 1)) * 8);
    auto r = decode(frame);
    if (r.ok()) {
      ++decoded;
    } else {
      ++refused;
      EXPECT_EQ(r.err().code, errc::protocol_violation);
    }
  }
  EXPECT_GT(refused, 1000u);
  EXPECT_GT(decoded, 100u);  // flips in payload bytes are valid frames with other values
}

}  // namespace
}  // namespace llmesh::transport
