// Actor messages survive the trip through the wire structs and a Cap'n Proto frame: every field
// of a request (sampling with logprobs, penalties, min_tokens and logit bias; output already in
// the prompt) and of a token (its logprobs), exactly.
#include <gtest/gtest.h>

#include <cstring>

#include <variant>

#include "llmesh/actors/shard_actor.hpp"
#include "llmesh/actors/wire_convert.hpp"
#include "llmesh/transport/codec.hpp"

namespace llmesh::actors {
namespace {

template <class Msg>
Msg through_a_frame(const Msg& m) {
  transport::envelope e;
  e.msg = to_wire(m);
  auto frame = transport::encode(e);
  auto back = transport::decode(frame);
  EXPECT_TRUE(back.ok()) << back.err().message;
  using wire_t = decltype(to_wire(m));
  return from_wire(std::get<wire_t>(back->msg));
}

TEST(WireConvert, ARequestKeepsEveryField) {
  replica_request r;
  r.id = 42;
  r.prompt = {1, 2, 3, 4, 5};
  r.max_tokens = 17;
  r.sampling = {0.7f, 40, 0.9f, 123456789ull, 5, 0.5f, -0.25f, 1.3f, 4, true, 0.05f, 7};
  r.eos_ids = {2, 9};
  r.generated = 2;
  r.logit_bias = {{3, -100.0f}, {4, 2.5f}};
  r.constraint = {model::constraint_spec::kind::json_schema, R"({"type": "object"})"};
  r.sampling.constrained = true;
  r.allowed_ids = {3, 4, 250};
  r.bad_words = {{5}, {6, 7, 8}};
  r.constraint_after = {151668};
  r.sampling.bad_words = true;
  r.sampling.processed_logprobs = true;
  r.model = "not on the wire";
  replica_request back = through_a_frame(r);
  EXPECT_EQ(back.id, r.id);
  EXPECT_EQ(back.prompt, r.prompt);
  EXPECT_EQ(back.max_tokens, r.max_tokens);
  EXPECT_EQ(back.sampling.temperature, r.sampling.temperature);
  EXPECT_EQ(back.sampling.top_k, r.sampling.top_k);
  EXPECT_EQ(back.sampling.top_p, r.sampling.top_p);
  EXPECT_EQ(back.sampling.seed, r.sampling.seed);
  EXPECT_EQ(back.sampling.logprobs, 5);
  EXPECT_EQ(back.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(back.sampling.frequency_penalty, -0.25f);
  EXPECT_EQ(back.sampling.repetition_penalty, 1.3f);
  EXPECT_EQ(back.sampling.min_tokens, 4);
  EXPECT_TRUE(back.sampling.logit_bias);
  EXPECT_EQ(back.sampling.min_p, 0.05f);
  EXPECT_EQ(back.sampling.prompt_logprobs, 7);
  EXPECT_EQ(back.eos_ids, r.eos_ids);
  EXPECT_EQ(back.generated, 2u);
  EXPECT_EQ(back.logit_bias, r.logit_bias);
  EXPECT_EQ(back.constraint, r.constraint);
  EXPECT_TRUE(back.sampling.constrained);
  EXPECT_EQ(back.allowed_ids, r.allowed_ids);
  EXPECT_EQ(back.bad_words, r.bad_words);
  EXPECT_EQ(back.constraint_after, r.constraint_after);
  EXPECT_TRUE(back.sampling.bad_words);
  EXPECT_TRUE(back.sampling.processed_logprobs);
  EXPECT_EQ(back.model, "");  // routing happened in the gateway's process
  EXPECT_EQ(back.pool, pooling::none);
}

TEST(WireConvert, AnEmbeddingRequestAndItsVectorCross) {
  replica_request r;
  r.id = 43;
  r.prompt = {1, 2, 3};
  r.max_tokens = 1;
  for (pooling p : {pooling::last, pooling::mean, pooling::cls, pooling::all}) {
    r.pool = p;
    EXPECT_EQ(through_a_frame(r).pool, p);
  }
  token_msg t;
  t.id = 43;
  t.finish = finish_reason::length;
  t.embedding = {0.5f, -0.125f, 1e-30f, -0.0f};
  token_msg back = through_a_frame(t);
  ASSERT_EQ(back.embedding.size(), 4u);
  EXPECT_EQ(0, std::memcmp(back.embedding.data(), t.embedding.data(), 16));
  EXPECT_EQ(back.token, -1);
  EXPECT_EQ(back.times, replica_times{});  // none sent: none come
  t.times = {250, 1000, 1000};
  EXPECT_EQ(through_a_frame(t).times, (replica_times{250, 1000, 1000}));
}

TEST(WireConvert, ATokenKeepsItsLogprobs) {
  token_msg t;
  t.id = 7;
  t.token = 11;
  t.finish = finish_reason::eos;
  t.logprobs = kernels::token_logprobs{-0.5f, {{11, -0.5f}, {3, -1.75f}}, 1};
  token_msg back = through_a_frame(t);
  EXPECT_EQ(back.id, 7u);
  EXPECT_EQ(back.token, 11);
  EXPECT_EQ(back.finish, finish_reason::eos);
  ASSERT_TRUE(back.logprobs.has_value());
  EXPECT_EQ(*back.logprobs, *t.logprobs);
  EXPECT_TRUE(back.prompt_logprobs.empty());
  t.prompt_logprobs = {{-3.0f, {{4, -0.25f}}}, {-0.5f, {}}};
  EXPECT_EQ(through_a_frame(t).prompt_logprobs, t.prompt_logprobs);
  token_msg plain;
  plain.id = 8;
  plain.token = 1;
  EXPECT_FALSE(through_a_frame(plain).logprobs.has_value());
}

TEST(WireConvert, AShardStepKeepsWhatItScores) {
  const std::vector<int32_t> tokens{5, 6, 7, 8, 9}, table{3, 4};
  std::vector<model::step_sequence> batch{{std::span(tokens).first(3), 0, std::span(table).first(1), false, 4, 8},
                                          {std::span(tokens).last(2), 16, std::span(table).last(1), true, -1, -1}};
  std::vector<sample_row> rows(1);
  rows[0].position = 18;
  rows[0].params.prompt_logprobs = 2;
  const shard_step s{9, step_data::copy(batch, rows)};
  transport::envelope e;
  e.msg = to_wire(s);
  auto back = transport::decode(transport::encode(e));
  ASSERT_TRUE(back.ok()) << back.err().message;
  auto step = from_wire(std::get<transport::shard_step_msg>(back->msg));
  ASSERT_TRUE(step.ok()) << step.err().message;
  const auto& got = step->data->batch;
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].prompt_logprobs, 4);
  EXPECT_EQ(got[0].next, 8);
  EXPECT_EQ(got[1].prompt_logprobs, -1);
  EXPECT_EQ(got[1].next, -1);
  EXPECT_EQ(std::vector<int32_t>(got[0].tokens.begin(), got[0].tokens.end()), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(model::scored_positions(got[0]), 3u);
  EXPECT_EQ(step->data->rows[0].params.prompt_logprobs, 2);
}

TEST(WireConvert, AShardStepKeepsItsDrawsAndRefusesRowsThatDoNotMatchThem) {
  const std::vector<int32_t> tokens{5, 6, 7, 8}, table{3};
  std::vector<model::step_sequence> batch{{std::span(tokens), 4, std::span(table), true}};
  batch[0].draws = 3;  // the last token's position and two drafts'
  std::vector<sample_row> rows(3);
  for (size_t i = 0; i < rows.size(); ++i) rows[i].position = 6 + i;
  const shard_step s{9, step_data::copy(batch, rows)};
  transport::envelope e;
  e.msg = to_wire(s);
  auto back = transport::decode(transport::encode(e));
  ASSERT_TRUE(back.ok()) << back.err().message;
  auto& msg = std::get<transport::shard_step_msg>(back->msg);
  auto step = from_wire(msg);
  ASSERT_TRUE(step.ok()) << step.err().message;
  EXPECT_EQ(step->data->batch[0].draws, 3u);
  EXPECT_EQ(step->data->rows.size(), 3u);
  msg.rows.pop_back();  // a row short of the drawn positions
  auto bad = from_wire(msg);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.err().code, errc::protocol_violation);
}

}  // namespace
}  // namespace llmesh::actors

namespace llmesh::actors {
namespace {

/// `blocks` blocks of 4 positions, `block_bytes` each, byte i of the data = i mod 251.
kv_prefix prefix_of(size_t blocks, uint64_t block_bytes) {
  kv_prefix p;
  for (size_t i = 0; i < blocks * 4; ++i) p.tokens.push_back(static_cast<int32_t>(i + 3));
  p.cache_salt = 42;
  p.lora = "sql";
  p.block_size = 4;
  p.kv_type = kernels::dtype::bf16;
  p.block_bytes = block_bytes;
  std::vector<std::byte> data(blocks * block_bytes);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i % 251);
  p.data = std::make_shared<const std::vector<std::byte>>(std::move(data));
  return p;
}

void expect_same(const kv_prefix& a, const kv_prefix& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.cache_salt, b.cache_salt);
  EXPECT_EQ(a.lora, b.lora);
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.kv_type, b.kv_type);
  EXPECT_EQ(a.block_bytes, b.block_bytes);
  ASSERT_TRUE(a.data && b.data);
  EXPECT_EQ(*a.data, *b.data);
}

kv_prefix through_frame(const kv_prefix& p, bool import) {
  transport::envelope e;
  e.msg = to_wire(p, import);
  auto back = transport::decode(transport::encode(e));
  EXPECT_TRUE(back.ok()) << back.err().message;
  const auto& m = std::get<transport::kv_blocks_msg>(back->msg);
  EXPECT_EQ(m.import, import);
  return prefix_from_wire(m);
}

TEST(WireConvert, KvBlocksCrossWholeAndAnAnswerKeepsItsRequestAndError) {
  const auto p = prefix_of(3, 64);
  expect_same(through_frame(p, true), p);
  for (auto t : {kernels::dtype::f32, kernels::dtype::f8_e4m3, kernels::dtype::f8_e5m2}) {  // every cache type by its own number
    auto q = p;
    q.kv_type = t;
    expect_same(through_frame(q, false), q);
  }
  prefill_reply ok;
  ok.id = 7;
  ok.ok = true;
  ok.prefix = p;
  transport::envelope e;
  e.msg = to_wire(ok);
  auto back = reply_from_wire(std::get<transport::kv_blocks_msg>(transport::decode(transport::encode(e))->msg));
  EXPECT_EQ(back.id, 7u);
  EXPECT_TRUE(back.ok);
  expect_same(back.prefix, p);
  prefill_reply refused{8, false, make_error(errc::overloaded, "KV cache full"), {}};
  e.msg = to_wire(refused);
  back = reply_from_wire(std::get<transport::kv_blocks_msg>(transport::decode(transport::encode(e))->msg));
  EXPECT_EQ(back.id, 8u);
  EXPECT_FALSE(back.ok);
  EXPECT_EQ(back.err.code, errc::overloaded);
  EXPECT_EQ(back.err.message, "KV cache full");
  EXPECT_EQ(back.prefix.blocks(), 0u);
}

// A prefix beyond max_kv_bytes keeps the leading blocks that fit (the rest is computed where
// the request runs): a valid, shorter chain.
TEST(WireConvert, KvBlocksOverTheFrameBudgetKeepTheirLeadingBlocks) {
  const uint64_t block_bytes = transport::max_kv_bytes / 5 - 8;  // 4 fit, not 5 (with their token ids)
  const auto p = prefix_of(6, block_bytes);
  auto cut = through_frame(p, true);
  ASSERT_EQ(cut.blocks(), 4u);
  EXPECT_EQ(cut.tokens, std::vector<int32_t>(p.tokens.begin(), p.tokens.begin() + 16));
  ASSERT_EQ(cut.data->size(), 4 * block_bytes);
  EXPECT_TRUE(std::equal(cut.data->begin(), cut.data->end(), p.data->begin()));
}

}  // namespace
}  // namespace llmesh::actors
