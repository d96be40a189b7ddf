// The frame codec: every message kind survives a round trip (aligned or not), the shard
// messages field by field; an older peer's assign reads as "all ranks here"; a frame from a
// newer peer (an unknown kind) is refused by name; and no byte sequence — truncated, flipped,
// oversized, with a forged segment table or lists beyond the limits — crashes the decoder or
// gets past it unchecked.
#include <gtest/gtest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <random>

#include <limits>

#include "llmesh/transport/codec.hpp"
#include "mesh_v2.capnp.h"

namespace llmesh::transport {
namespace {

/// KV blocks' bytes (kv_blocks_msg::data) from a string's.
std::shared_ptr<const std::vector<std::byte>> kv_bytes(const std::string& s) {
  const auto* first = reinterpret_cast<const std::byte*>(s.data());
  return std::make_shared<const std::vector<std::byte>>(first, first + s.size());
}

std::vector<envelope> samples() {
  std::vector<body> bodies = {
      generate_msg{7, {1, 2, 3, 40000}, 64, {0.8f, 0.95f, 40, 1234567890123ull, -1, 0.0f, 0.0f, 1.0f, 0, false, 0.0f}, {2, 3}, 0, {}},
      generate_msg{8, {5}, 4, {0.0f, 1.0f, 0, 3, 20, 0.0f, 0.0f, 1.0f, 0, false, 0.0f}, {}, 0, {}},  // logprobs: 20 alternatives
      // Penalties, min_tokens and biases; a continued request whose last 2 prompt tokens are output.
      generate_msg{9, {5, 6, 7}, 4, {0.7f, 1.0f, 0, 3, -1, 0.5f, -1.25f, 1.2f, 3, true, 0.05f}, {2}, 2, {{4, -100.0f}, {9, 2.5f}}},
      // Prompt scoring with 3 alternatives.
      generate_msg{10, {5, 6, 7}, 1, {0.0f, 1.0f, 0, 3, 0, 0.0f, 0.0f, 1.0f, 0, false, 0.0f, 3}, {}, 0, {}},
      // structured outputs: a regex the output must match
      generate_msg{11, {5, 6}, 8, {0.0f, 1.0f, 0, 3, -1, 0.0f, 0.0f, 1.0f, 0, false, 0.0f, -1, true}, {2}, 0, {}, 3, "[a-z]+"},
      generate_msg{12, {5, 6}, 8, {0.0f, 1.0f, 0, 3, -1, 0.0f, 0.0f, 1.0f, 0, false, 0.0f, -1, true}, {}, 0, {}, 0, "", {7, 3, 9}},
      // vLLM's bad_words: lists of ids, and the flag every rank reads.
      generate_msg{13, {5, 6}, 8, {0.0f, 1.0f, 0, 3, -1, 0.0f, 0.0f, 1.0f, 0, false, 0.0f, -1, false, true}, {}, 0, {}, 0, "", {},
                   {{4}, {7, 3, 9}}},
      // A constraint that holds after the model's "</think>".
      generate_msg{14, {5, 6}, 8, {0.0f, 1.0f, 0, 3, -1, 0.0f, 0.0f, 1.0f, 0, false, 0.0f, -1, true}, {}, 0, {}, 3, "[a-z]+", {},
                   {}, {151668}},
      // vLLM's priority (lower first), negative too.
      generate_msg{15, {5, 6}, 8, {0.0f, 1.0f, 0, 3}, {}, 0, {}, 0, "", {}, {}, {}, -7},
      // An embedding request (mean pooling).
      generate_msg{16, {5, 6}, 1, {0.0f, 1.0f, 0, 3}, {}, 0, {}, 0, "", {}, {}, {}, 0, 0, 2},
      // A request with a LoRA adapter (by name) and a cache salt.
      generate_msg{17, {5, 6}, 8, {0.0f, 1.0f, 0, 3}, {}, 0, {}, 0, "", {}, {}, {}, 0, 99, 0, "sql-lora"},
      // Disaggregated prefill: a prompt for a prefill replica.
      generate_msg{18, {5, 6, 7}, 1, {0.0f, 1.0f, 0, 3}, {}, 0, {}, 0, "", {}, {}, {}, 2, 99, 0, "sql-lora", true},
      token_body{7, 42, finish_kind::length, false, errc::internal, "", std::nullopt},
      token_body{7, -1, finish_kind::none, true, errc::shard_failed, "shard 1 is gone", std::nullopt},
      token_body{8, 9, finish_kind::none, false, errc::internal, "", token_body::logprobs_t{-0.25f, {9, 3}, {-0.25f, -2.5f}, 2}},
      token_body{8, 3, finish_kind::eos, false, errc::internal, "", token_body::logprobs_t{-1.5f, {}, {}}},
      // A first token with its prompt's scores.
      token_body{10, 3, finish_kind::length, false, errc::internal, "", token_body::logprobs_t{-0.5f, {}, {}},
                 {{-2.0f, {6, 1}, {-0.125f, -3.0f}}, {-7.5f, {2, 0}, {-1.0f, -1.5f}}}},
      // A first token with its prefix-cache hit.
      token_body{11, 4, finish_kind::none, false, errc::internal, "", std::nullopt, {}, 48},
      // An embedding's end.
      token_body{16, -1, finish_kind::length, false, errc::internal, "", std::nullopt, {}, 0, {0.25f, -1.5f, 3e-8f, 0.0f}},
      // A last token with its time on the replica (queued, prefill, inference; microseconds).
      token_body{18, 5, finish_kind::eos, false, errc::internal, "", std::nullopt, {}, -1, {}, 1500, 0, int64_t{1} << 40},
      cancel_msg{9},
      status_request{},
      reset_prefix_cache_msg{},
      // KV events: a router's cursor, a replica's changes, its whole cache.
      kv_events_request{0},
      kv_events_request{~0ull - 1},
      kv_events_msg{false, 17, {3, 0xfedcba9876543210ull}, {9}, 16},
      kv_events_msg{true, 4096, {1, 2, 3}, {}, 32},
      kv_events_msg{},
      load_msg{5, true, 3, 4, 100, 4096},
      load_msg{6, true, 1, 0, 10, 64, 1ull << 40, 12345},
      load_msg{7, true, 2, 9, 60, 64, 0, 0, 31},  // a replica short of blocks: its preemptions
      load_msg{8, true, 1, 0, 12, 64, 0, 0, 0, 4200, 3},  // a replica that took prefilled blocks (and refused 3 imports)
      hello_msg{"replica-a", {role::replica, role::router}, "127.0.0.1:7101", {2, 24ull << 30, 0, 6}, std::string("\x00\x01\xff", 3)},
      challenge_msg{std::string(32, '\x7f')},
      proof_msg{std::string(32, '\x01')},
      welcome_msg{true, "", {{"seed", {role::coordinator, role::gateway}, "127.0.0.1:7100"}, {"replica-a", {role::replica}, "127.0.0.1:7101"}}},
      heartbeat_msg{"replica-b", 99},
      replica_state_msg{11, "replica-a", "kjv-tiny", replica_phase::draining, 0, "", ""},
      replica_state_msg{12, "replica-b", "kjv-tiny", replica_phase::ready, 1012, "", "127.0.0.1:7102"},
      replica_state_msg{13, "replica-b", "kjv-tiny", replica_phase::dead, 0, "config.json: not found", ""},
      replica_state_msg{14, "replica-b", "kjv-tiny-prefill", replica_phase::ready, 1014, "", "127.0.0.1:7102", "kjv-tiny", 256, 3},
      // A prefill replica's two blocks of 2 positions (8 bytes each; zeros too), to the request's owner or to import.
      kv_blocks_msg{18, true, errc::internal, "", {5, 6, 7, 8}, 99, "sql-lora", 2, 1, 8, kv_bytes(std::string("\x00\x01\x02\x03\x04\x05\x06\x07\xff\xfe\xfd\xfc\x00\x00\x00\x01", 16)), false},
      kv_blocks_msg{18, true, errc::internal, "", {5, 6}, 0, "", 2, 0, 8, kv_bytes(std::string(8, '\x7f')), true},
      // Blocks whose bytes are not a whole number of words (copied into the frame, not referenced).
      kv_blocks_msg{20, true, errc::internal, "", {5, 6}, 0, "", 2, 0, 5, kv_bytes("abcde"), true},
      kv_blocks_msg{19, false, errc::overloaded, "KV cache full", {}, 0, "", 0, 0, 0, nullptr, false},
      collective_id_msg{11, 2, std::string(128, '\x05')},
      assign_msg{14, "kjv-tiny", "models/kjv-tiny", 2, 256, assign_op::start, {}, {}, {}},
      assign_msg{14, "kjv-tiny", "models/kjv-tiny", 2, 256, assign_op::stop, {}, {}, {}},
      assign_msg{16, "kjv-tiny", "models/kjv-tiny", 1, 64, assign_op::start, {}, {}, {}, "int8"},
      // Two LoRA adapters served beside the model.
      assign_msg{17, "kjv-tiny", "models/kjv-tiny", 1, 64, assign_op::start, {}, {}, {}, "",
                 {{"psalms", "/adapters/psalms"}, {"org/chat:v2", "adapters/chat"}}},
      // A bfloat16 KV cache.
      assign_msg{18, "kjv-tiny", "models/kjv-tiny", 2, 64, assign_op::start, {}, {}, {}, "", {}, "bfloat16"},
      // A granted context below the model's.
      assign_msg{19, "kjv-tiny", "models/kjv-tiny", 1, 64, assign_op::start, {}, {}, {}, "", {}, "", 4096},
      // The weights held as float32 (--dtype).
      assign_msg{20, "kjv-tiny", "models/kjv-tiny", 1, 64, assign_op::start, {}, {}, {}, "", {}, "", 0, "float32"},
      // A model that takes LoRA adapters while it serves (enable_lora), none yet.
      assign_msg{21, "kjv-tiny", "models/kjv-tiny", 1, 64, assign_op::start, {}, {}, {}, "", {}, "", 0, "", true},
      // At most 8 adapters at once.
      assign_msg{22, "kjv-tiny", "models/kjv-tiny", 1, 64, assign_op::start, {}, {}, {}, "", {}, "", 0, "", true, 8},
      // A mixture of experts whose two ranks run whole experts.
      assign_msg{23, "qwen3-moe", "models/qwen3-moe", 2, 64, assign_op::start, {}, {}, {}, "", {}, "", 0, "", false, 0, true},
      // Its replicas speculate with a draft model (the cluster config's speculative_config).
      assign_msg{24, "kjv-tiny", "models/kjv-tiny", 1, 64, assign_op::start, {}, {}, {}, "", {}, "", 0, "", false, 0, false,
                 R"({"model":"models/kjv-draft","num_speculative_tokens":3})"},
      // Its replicas' scheduler limits (the cluster config's max_num_batched_tokens and the rest).
      assign_msg{25, "kjv-tiny", "models/kjv-tiny", 1, 64, assign_op::start, {}, {}, {}, "", {}, "", 0, "", false, 0, false, "",
                 512, 64, 128, 4, 2},
      // Spread placement: this node runs ranks 1 and 2 of 3; the key is bytes (zeros too).
      assign_msg{15, "kjv-tiny", "models/kjv-tiny", 3, 128, assign_op::start, {1, 2},
                 {"127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7102"}, std::string("\x00key\xff\x01-of-the-group", 19)},
      shard_step_msg{41, {5, 6, 7, -1, 299}, {3, 0, 9}, {{4, 0, 2, false}, {1, 17, 1, true}}, {{{0.7f, 0.9f, 40, 1ull << 63}, 18}}},
      // A prompt chunk scored, its successor known; the last chunk of another scored.
      shard_step_msg{42, {5, 6, 7, 8}, {3, 4}, {{2, 0, 1, false, 5, 7}, {2, 16, 1, true, 0, -1}}, {{{}, 18}}},
      // A speculating decode: its last token and two drafts, drawn from all three positions.
      shard_step_msg{43, {5, 6, 7}, {3, 4}, {{3, 16, 2, true, -1, -1, 3}}, {{{}, 17}, {{}, 18}, {{}, 19}}},
      // Sequences with LoRA adapters 1 and 0 beside one without.
      shard_step_msg{44, {5, 6, 7}, {3, 4, 5}, {{1, 16, 1, true, -1, -1, 1, 1}, {1, 4, 1, true, -1, -1, 1, -1}, {1, 9, 1, true, -1, -1, 1, 0}},
                     {{{}, 17}, {{}, 5}, {{}, 10}}},
      shard_step_msg{},
      shard_result_msg{41, 1, true, errc::internal, ""},
      shard_result_msg{42, 2, false, errc::shard_failed, "rank 2: out of memory"},
      shard_ready_msg{15, 1, "127.0.0.1:39001", 77, std::string(32, '\x09'), true, "", 4096, "int8"},
      shard_ready_msg{15, 1, "127.0.0.1:39001", 77, std::string(32, '\x09'), true, "", 4096, "none", "psalms\norg/chat:v2\n"},
      shard_ready_msg{15, 1, "127.0.0.1:39001", 77, std::string(32, '\x09'), true, "", 8192, "none", "", "bfloat16"},
      shard_ready_msg{15, 1, "127.0.0.1:39001", 77, std::string(32, '\x09'), true, "", 8192, "none", "", "float32", "bfloat16"},
      shard_ready_msg{15, 2, "", 0, std::string(32, '\x09'), false, "config.json: not found"},
      shard_group_msg{15, std::string("\x00\x01group-key-bytes", 17), {"127.0.0.1:39000", "127.0.0.1:39001", "127.0.0.1:39002"}},
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
  EXPECT_STREQ(kind_name(body{shard_step_msg{}}), "shard_step");
  EXPECT_STREQ(kind_name(body{shard_result_msg{}}), "shard_result");
  EXPECT_STREQ(kind_name(body{shard_ready_msg{}}), "shard_ready");
  EXPECT_STREQ(kind_name(body{shard_group_msg{}}), "shard_group");
  EXPECT_STREQ(kind_name(body{kv_blocks_msg{}}), "kv_blocks");
}

// A KvBlocks frame whose bytes do not add up to its blocks, of an unknown type, or beyond
// max_kv_bytes is refused by name; nothing of it reaches a replica.
TEST(Codec, KvBlocksThatDoNotAddUpAreRefused) {
  auto refused = [](kv_blocks_msg m, const char* what) {
    auto r = decode(encode({{}, {}, 0, 0, m}));
    EXPECT_FALSE(r.ok()) << what;
    return r.ok() ? std::string() : r.err().message;
  };
  const kv_blocks_msg good{1, true, errc::internal, "", {5, 6, 7, 8}, 0, "", 2, 0, 4, kv_bytes(std::string(8, 'x')), true};
  ASSERT_TRUE(decode(encode({{}, {}, 0, 0, good})).ok());
  auto m = good;
  m.data = kv_bytes(std::string(7, 'x'));
  EXPECT_NE(refused(m, "a byte short").find("data holds 7 bytes for 4 tokens"), std::string::npos);
  m = good;
  m.tokens.pop_back();
  EXPECT_NE(refused(m, "not whole blocks").find("for 3 tokens in blocks of 2"), std::string::npos);
  m = good;
  m.block_size = 0;
  refused(m, "no block size");
  m = good;
  m.block_bytes = uint64_t{1} << 62;  // a count that would overflow
  refused(m, "huge blocks");
  for (uint8_t t = 1; t <= 3; ++t) {  // bfloat16, fp8_e4m3, fp8_e5m2
    m = good;
    m.kv_dtype = t;
    EXPECT_TRUE(decode(encode({{}, {}, 0, 0, m})).ok()) << int(t);
  }
  m = good;
  m.kv_dtype = 4;
  EXPECT_NE(refused(m, "an unknown dtype").find("unknown kvDtype 4"), std::string::npos);
  m = good;
  m.ok = false;
  m.code = static_cast<errc>(static_cast<uint16_t>(errc::internal) + 1);
  EXPECT_NE(refused(m, "an unknown code").find("unknown error code"), std::string::npos);
  m = good;
  m.block_size = 1;
  m.block_bytes = (max_kv_bytes + 8) / 4;
  m.data = std::make_shared<const std::vector<std::byte>>(4 * m.block_bytes);
  EXPECT_NE(refused(m, "over max_kv_bytes").find("at most"), std::string::npos);
}

TEST(Codec, AssignSchedulerLimitsOutOfRangeAreRefused) {
  const assign_msg good{25, "m", "p", 1, 64, assign_op::start, {}, {}, {}, "", {}, "", 0, "", false, 0, false, "", 16, 1 << 16, 1 << 30, 1 << 16, 1 << 16};
  ASSERT_TRUE(decode(encode({{}, {}, 0, 0, good})).ok());
  for (int field = 0; field < 5; ++field) {
    auto m = good;
    if (field == 0) m.max_batch_tokens = 15;
    if (field == 1) m.max_seqs = (1 << 16) + 1;
    if (field == 2) m.long_prefill_threshold = (uint64_t{1} << 30) + 1;
    if (field == 3) m.max_partial_prefills = (1 << 16) - 1;  // below the long limit
    if (field == 4) m.max_batch_tokens = (1 << 20) + 1;
    auto r = decode(encode({{}, {}, 0, 0, m}));
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_NE(r.err().message.find("scheduler limits out of range"), std::string::npos) << r.err().message;
  }
}

TEST(Codec, EveryKindHasASample) {
  std::vector<bool> seen(std::variant_size_v<body>, false);
  for (const auto& e : samples()) seen[e.msg.index()] = true;
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_TRUE(seen[i]) << "no sample of kind " << i;
}

TEST(Codec, ShardMessagesKeepEveryField) {
  // Field by field, so that a field the codec forgets shows by name (not only as a != above).
  shard_step_msg st{9, {1, 2, 3}, {4, 5}, {{2, 7, 1, false}, {1, 8, 1, true}}};
  auto back = decode(encode({{"a", 1}, {"b", 2}, 3, 4, st}));
  ASSERT_TRUE(back.ok()) << back.err().message;
  const auto& s = std::get<shard_step_msg>(back->msg);
  EXPECT_EQ(s.step, 9u);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(s.tables, (std::vector<int32_t>{4, 5}));
  ASSERT_EQ(s.seqs.size(), 2u);
  EXPECT_EQ(s.seqs[0].n_tokens, 2u);
  EXPECT_EQ(s.seqs[0].pos0, 7u);
  EXPECT_EQ(s.seqs[0].n_blocks, 1u);
  EXPECT_FALSE(s.seqs[0].want_logits);
  EXPECT_TRUE(s.seqs[1].want_logits);

  back = decode(encode({{}, {}, 0, 0, shard_result_msg{5, 3, false, errc::deadline_exceeded, "slow"}}));
  ASSERT_TRUE(back.ok()) << back.err().message;
  const auto& r = std::get<shard_result_msg>(back->msg);
  EXPECT_EQ(r.step, 5u);
  EXPECT_EQ(r.rank, 3u);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.code, errc::deadline_exceeded);
  EXPECT_EQ(r.message, "slow");

  back = decode(encode({{}, {}, 0, 0, shard_ready_msg{6, 1, "h:1", 8, "k", false, "why"}}));
  ASSERT_TRUE(back.ok()) << back.err().message;
  const auto& rd = std::get<shard_ready_msg>(back->msg);
  EXPECT_EQ(rd.replica, 6u);
  EXPECT_EQ(rd.rank, 1u);
  EXPECT_EQ(rd.tensor, "h:1");
  EXPECT_EQ(rd.actor, 8u);
  EXPECT_EQ(rd.key, "k");
  EXPECT_FALSE(rd.ok);
  EXPECT_EQ(rd.reason, "why");

  back = decode(encode({{}, {}, 0, 0, shard_group_msg{7, "kk", {"a:1", "b:2"}}}));
  ASSERT_TRUE(back.ok()) << back.err().message;
  const auto& g = std::get<shard_group_msg>(back->msg);
  EXPECT_EQ(g.replica, 7u);
  EXPECT_EQ(g.key, "kk");
  EXPECT_EQ(g.tensors, (std::vector<std::string>{"a:1", "b:2"}));

  assign_msg a{1, "m", "p", 2, 3, assign_op::start, {1}, {"n0:1", "n1:2"}, std::string(16, '\0')};
  back = decode(encode({{}, {}, 0, 0, a}));
  ASSERT_TRUE(back.ok()) << back.err().message;
  const auto& ab = std::get<assign_msg>(back->msg);
  EXPECT_EQ(ab.ranks, std::vector<uint32_t>{1});
  EXPECT_EQ(ab.shard_nodes, (std::vector<std::string>{"n0:1", "n1:2"}));
  EXPECT_EQ(ab.group_key, std::string(16, '\0'));
}

TEST(Codec, AnOlderPeersAssignHasNoShardFields) {
  // A peer from before spread placement never sets ranks/shardNodes/groupKey: all on this node.
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<schemas_v2::Envelope>();
  auto a = root.getBody().initAssign();
  a.setReplica(3);
  a.setModel("kjv-tiny");
  a.setPath("models/kjv-tiny");
  a.setTp(2);
  auto words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  auto r = decode(std::span<const uint8_t>(bytes.begin(), bytes.size()));
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(std::get<assign_msg>(r->msg), (assign_msg{3, "kjv-tiny", "models/kjv-tiny", 2, 0, assign_op::start, {}, {}, {}}));
}

TEST(Codec, AShardResultWithAnUnknownErrorCodeIsRefused) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<schemas_v2::Envelope>();
  auto res = root.getBody().initShardResult();
  res.setStep(1);
  res.setOk(false);
  res.initError().setCode(static_cast<uint16_t>(errc::internal) + 1);
  auto words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  auto r = decode(std::span<const uint8_t>(bytes.begin(), bytes.size()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::protocol_violation);
  EXPECT_NE(r.err().message.find("unknown error code"), std::string::npos) << r.err().message;
  // The same code in a result that succeeded is not read at all.
  res.setOk(true);
  words = capnp::messageToFlatArray(mb);
  bytes = words.asBytes();
  r = decode(std::span<const uint8_t>(bytes.begin(), bytes.size()));
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_TRUE(std::get<shard_result_msg>(r->msg).ok);
}

TEST(Codec, LogprobsOutOfBoundsAreRefused) {
  auto decoded = [](capnp::MallocMessageBuilder& mb) {
    auto words = capnp::messageToFlatArray(mb);
    auto bytes = words.asBytes();
    return decode(std::span<const uint8_t>(bytes.begin(), bytes.size()));
  };
  {  // a request asking for more alternatives than any token may carry
    capnp::MallocMessageBuilder mb;
    auto g = mb.initRoot<schemas_v2::Envelope>().getBody().initGenerate();
    g.initPrompt(1).set(0, 5);
    g.initSampling().setLogprobs(max_logprobs + 1);
    auto r = decoded(mb);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("sampling.logprobs is 21"), std::string::npos) << r.err().message;
    g.getSampling().setLogprobs(-2);
    EXPECT_FALSE(decoded(mb).ok());
    g.getSampling().setLogprobs(max_logprobs);
    EXPECT_TRUE(decoded(mb).ok());
    g.getSampling().setPromptLogprobs(max_logprobs + 1);
    r = decoded(mb);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("sampling.promptLogprobs is 21"), std::string::npos) << r.err().message;
    g.getSampling().setPromptLogprobs(max_logprobs);
    EXPECT_TRUE(decoded(mb).ok());
  }
  {  // an unknown pooling; an embedding longer than max_embedding (4 Mi values)
    capnp::MallocMessageBuilder mb;
    auto g = mb.initRoot<schemas_v2::Envelope>().getBody().initGenerate();
    g.initPrompt(1).set(0, 5);
    g.setPooling(5);
    auto r = decoded(mb);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("unknown pooling 5"), std::string::npos) << r.err().message;
    g.setPooling(4);  // all
    EXPECT_TRUE(decoded(mb).ok());
    capnp::MallocMessageBuilder tb;
    auto t = tb.initRoot<schemas_v2::Envelope>().getBody().initToken();
    t.initEmbedding(static_cast<unsigned>(max_embedding + 1));
    r = decoded(tb);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("embedding holds 4194305 values"), std::string::npos) << r.err().message;
    t.initEmbedding(static_cast<unsigned>(max_embedding));
    EXPECT_TRUE(decoded(tb).ok());
  }
  {  // a first token's cache hit below -1 (its "none")
    capnp::MallocMessageBuilder mb;
    auto t = mb.initRoot<schemas_v2::Envelope>().getBody().initToken();
    t.setCachedTokens(-2);
    auto r = decoded(mb);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("cachedTokens -2 is below -1"), std::string::npos) << r.err().message;
    t.setCachedTokens(-1);
    EXPECT_TRUE(decoded(mb).ok());
    t.setInferenceUs(-7);  // a replica time below -1 (its "none")
    r = decoded(mb);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("inferenceUs -7 is below -1"), std::string::npos) << r.err().message;
  }
  {  // a constraint of an unknown kind, or longer than any spec may be
    capnp::MallocMessageBuilder mb;
    auto g = mb.initRoot<schemas_v2::Envelope>().getBody().initGenerate();
    g.initPrompt(1).set(0, 5);
    auto c = g.initConstraint();
    c.setKind(static_cast<schemas_v2::ConstraintKind>(6));
    auto r = decoded(mb);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("unknown constraint kind 6"), std::string::npos) << r.err().message;
    c.setKind(schemas_v2::ConstraintKind::REGEX);
    c.setText(std::string(max_constraint_text + 1, 'a'));
    r = decoded(mb);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("constraint.text holds"), std::string::npos) << r.err().message;
    c.setText(std::string(max_constraint_text, 'a'));
    EXPECT_TRUE(decoded(mb).ok());
  }
  {  // a step asking to score with too many alternatives
    capnp::MallocMessageBuilder mb;
    auto st = mb.initRoot<schemas_v2::Envelope>().getBody().initShardStep();
    st.initTokens(1);
    auto seq = st.initSeqs(1)[0];
    seq.setNTokens(1);
    seq.setPromptLogprobs(-2);
    auto r = decoded(mb);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("seqs.promptLogprobs is -2"), std::string::npos) << r.err().message;
    seq.setPromptLogprobs(2);
    EXPECT_TRUE(decoded(mb).ok());
  }
  {  // penalties that are not numbers, a repetition penalty of 0, more output than prompt
    capnp::MallocMessageBuilder mb;
    auto g = mb.initRoot<schemas_v2::Envelope>().getBody().initGenerate();
    g.initPrompt(2);
    auto sp = g.initSampling();
    sp.setPresencePenalty(std::numeric_limits<float>::quiet_NaN());
    EXPECT_FALSE(decoded(mb).ok());
    sp.setPresencePenalty(0.5f);
    sp.setRepetitionPenalty(0.0f);
    EXPECT_FALSE(decoded(mb).ok());
    sp.setRepetitionPenalty(1.5f);
    ASSERT_TRUE(decoded(mb).ok());
    sp.setMinP(1.5f);
    EXPECT_FALSE(decoded(mb).ok());
    sp.setMinP(0.1f);
    ASSERT_TRUE(decoded(mb).ok());
    g.setGenerated(3);
    auto r = decoded(mb);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("generated (3) exceeds the prompt"), std::string::npos) << r.err().message;
  }
  {  // a token whose alternatives and values do not pair up, or are too many
    capnp::MallocMessageBuilder mb;
    auto t = mb.initRoot<schemas_v2::Envelope>().getBody().initToken();
    t.setToken(4);
    auto l = t.initLogprobs();
    l.initTopIds(2);
    l.initTopLogprobs(1);
    auto r = decoded(mb);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("token logprobs hold 2 ids and 1 values"), std::string::npos) << r.err().message;
    l.initTopIds(max_logprobs + 1);
    l.initTopLogprobs(max_logprobs + 1);
    EXPECT_FALSE(decoded(mb).ok());
    l.initTopIds(1);
    l.initTopLogprobs(1);
    auto ok = decoded(mb);
    ASSERT_TRUE(ok.ok()) << ok.err().message;
    EXPECT_TRUE(std::get<token_body>(ok->msg).logprobs.has_value());
    auto prompt = t.initPromptLogprobs(2);  // the prompt's entries are held to the same bounds
    prompt[1].initTopIds(max_logprobs + 1);
    prompt[1].initTopLogprobs(max_logprobs + 1);
    EXPECT_FALSE(decoded(mb).ok());
    prompt[1].initTopIds(2);
    prompt[1].initTopLogprobs(2);
    ok = decoded(mb);
    ASSERT_TRUE(ok.ok()) << ok.err().message;
    EXPECT_EQ(std::get<token_body>(ok->msg).prompt_logprobs.size(), 2u);
  }
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
  // The discriminant counts union members, 0-based: fromTheFuture follows the last one we know.
  const auto future = static_cast<unsigned>(schemas_v2::Envelope::Body::FROM_THE_FUTURE);
  EXPECT_EQ(future, std::variant_size_v<body>);
  EXPECT_NE(r.err().message.find("unknown message kind " + std::to_string(future)), std::string::npos) << r.err().message;
  // And the newer peer reads our frames: old kinds keep their ordinals.
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
  lim.max_list = 4;
  r = decode(encode({{}, {}, 0, 0, shard_step_msg{1, {1, 2, 3, 4, 5}, {}, {}}}), lim);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("tokens holds 5"), std::string::npos) << r.err().message;
  r = decode(encode({{}, {}, 0, 0, shard_group_msg{1, "k", {"a", "b", "c", "d", "e"}}}), lim);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("tensors holds 5"), std::string::npos) << r.err().message;
  r = decode(encode({{}, {}, 0, 0, assign_msg{1, "m", "p", 5, 0, assign_op::start, {0, 1, 2, 3, 4}, {}, ""}}), lim);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("ranks holds 5"), std::string::npos) << r.err().message;
  lim = {};
  lim.max_text = 10;
  r = decode(encode({{}, {}, 0, 0, shard_ready_msg{1, 0, "h:1", 0, std::string(11, 'k'), true, ""}}), lim);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("key holds 11"), std::string::npos) << r.err().message;
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

TEST(Codec, AStepSequenceDrawsFromOneToAllOfItsTokens) {
  {  // an adapter index below -1
    auto r = decode(encode({{}, {}, 0, 0, shard_step_msg{1, {1}, {0}, {{1, 0, 1, true, -1, -1, 1, -2}}, {{{}, 1}}}}));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("seqs.lora is -2"), std::string::npos) << r.err().message;
  }
  for (uint32_t draws : {0u, 4u}) {
    auto r = decode(encode({{}, {}, 0, 0, shard_step_msg{1, {1, 2, 3}, {0}, {{3, 0, 1, true, -1, -1, draws}}, {}}}));
    ASSERT_FALSE(r.ok()) << draws;
    EXPECT_NE(r.err().message.find("draws is " + std::to_string(draws)), std::string::npos) << r.err().message;
  }
}

}  // namespace
}  // namespace llmesh::transport
