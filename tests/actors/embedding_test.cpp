// Embedding requests in the replica's work loop (replica_request::pool): each one's vector is
// exactly what its prompt's final hidden rows give alone (the last row; the mean over the rows
// summed in order in double; the first row; every row, in order) — beside generations, in
// chunks of a small token budget, under a KV pool that forces preemption, with prefix-cache
// hits, and at --tp 2 within 1e-5 — and the generations beside them keep their tokens. A
// classifier's token rows are its head on each row. Bad embedding requests are refused; a
// cancelled one says nothing more.
#include <cstring>
#include <map>
#include <numeric>
#include <set>

#include "llmesh/transport/wire.hpp"
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

class Embeddings : public testing::replica_test_base {
 protected:
  /// The prompt's final hidden rows, [n][hidden], from one step of it alone on a fresh engine.
  std::vector<float> rows_alone(const std::vector<int32_t>& prompt, int tp = 1) {
    auto e = engine(tp, 512);
    std::vector<int32_t> table((prompt.size() + e->kv_block_size() - 1) / e->kv_block_size());
    std::iota(table.begin(), table.end(), 0);
    model::step_sequence s;
    s.tokens = prompt;
    s.block_table = table;
    s.want_logits = false;
    s.hidden = model::hidden_rows::all;
    std::vector<int32_t> tokens;
    model::step_logprobs out;
    EXPECT_TRUE(e->forward_sample(std::span(&s, 1), {}, tokens, &out).ok());
    return out.hidden;
  }

  /// What a replica should answer for `r`.
  std::vector<float> expected(const replica_request& r, int tp = 1) {
    const auto rows = rows_alone(r.prompt, tp);
    const size_t H = model_->config().hidden, n = r.prompt.size();
    if (r.pool == pooling::last) return {rows.end() - static_cast<std::ptrdiff_t>(H), rows.end()};
    if (r.pool == pooling::cls) return {rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(H)};
    if (r.pool == pooling::all) return rows;
    std::vector<double> sum(H, 0.0);
    for (size_t i = 0; i < n; ++i) {
      for (size_t d = 0; d < H; ++d) sum[d] += rows[i * H + d];
    }
    std::vector<float> out(H);
    for (size_t d = 0; d < H; ++d) out[d] = static_cast<float>(sum[d] / static_cast<double>(n));
    return out;
  }

  /// Embedding requests 100.., the four poolings in turn; prompts of 1 to 60 tokens, every
  /// third starting with the fixture's shared system prompt (a prefix-cache hit for last).
  std::vector<replica_request> embedding_requests(size_t n) {
    auto shared = requests(1).front().prompt;
    std::vector<replica_request> out;
    for (size_t i = 0; i < n; ++i) {
      replica_request r;
      r.id = 100 + i;
      r.max_tokens = 1;
      const pooling kinds[] = {pooling::last, pooling::mean, pooling::cls, pooling::all};
      r.pool = kinds[i % 4];
      if (i % 3 == 0) r.prompt = shared;
      const size_t extra = 1 + (i * 17) % 60;
      for (size_t k = 0; k < extra; ++k) r.prompt.push_back(static_cast<int32_t>((i * 31 + k * 7) % 297 + 2));
      out.push_back(r);
    }
    return out;
  }

  struct served {
    std::map<uint64_t, std::vector<int32_t>> tokens;
    std::map<uint64_t, std::vector<float>> vectors;
    std::map<uint64_t, int32_t> cached;
  };
  static served serve(replica_core& rc, const std::vector<replica_request>& reqs) {
    served out;
    for (const auto& r : reqs) EXPECT_TRUE(rc.submit(r).ok());
    for (int guard = 0; !rc.idle() && guard < 10000; ++guard) {
      auto ev = rc.step();
      EXPECT_TRUE(ev.ok()) << (ev.ok() ? "" : ev.err().message);
      if (!ev.ok()) break;
      for (auto& e : *ev) {
        if (!e.embedding.empty()) {
          EXPECT_EQ(e.token, -1);
          EXPECT_EQ(e.finish, finish_reason::length);
          EXPECT_FALSE(out.vectors.contains(e.id)) << "two ends for " << e.id;
          out.vectors[e.id] = std::move(e.embedding);
          out.cached[e.id] = e.cached_tokens;
        } else {
          out.tokens[e.id].push_back(e.token);
        }
      }
    }
    EXPECT_TRUE(rc.idle());
    return out;
  }

  static bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }
};

TEST_F(Embeddings, EachVectorIsItsPromptsAloneBesideGenerationsInChunks) {
  auto gen = requests(8);
  auto want_tokens = alone(gen, 1);
  auto emb = embedding_requests(12);
  auto e = engine(1, 1024);
  scheduler_config cfg;
  cfg.max_batch_tokens = 40;  // long prompts arrive in chunks, beside decodes
  replica_core rc(*e, cfg);
  auto all = gen;
  all.insert(all.end(), emb.begin(), emb.end());
  auto got = serve(rc, all);
  for (const auto& r : gen) EXPECT_EQ(got.tokens[r.id], want_tokens[r.id]) << "request " << r.id;
  for (const auto& r : emb) {
    ASSERT_TRUE(got.vectors.contains(r.id)) << "request " << r.id;
    EXPECT_TRUE(same_bits(got.vectors[r.id], expected(r))) << "request " << r.id << " pooling " << static_cast<int>(r.pool);
    EXPECT_FALSE(got.tokens.contains(r.id));
  }
  // Last-token pooling found the shared prompt in the cache; the others compute every position.
  EXPECT_GT(got.cached[100], 0);
  EXPECT_EQ(got.cached[103], 0);   // all
  EXPECT_EQ(got.cached[106], 0);   // cls
  EXPECT_EQ(got.cached[109], 0);   // mean
  EXPECT_EQ(got.vectors[103].size(), emb[3].prompt.size() * model_->config().hidden);
  EXPECT_EQ(rc.blocks().free_blocks(), rc.blocks().total_blocks());
}

TEST_F(Embeddings, PreemptionChangesNoVector) {
  auto gen = requests(10);
  auto want_tokens = alone(gen, 1);
  auto emb = embedding_requests(9);
  auto e = engine(1, 160);  // 20 blocks of 8
  scheduler_config cfg;
  cfg.max_batch_tokens = 64;
  replica_core rc(*e, cfg);
  auto all = gen;
  all.insert(all.end(), emb.begin(), emb.end());
  auto got = serve(rc, all);
  EXPECT_GT(rc.scheduler().preemptions(), 0u);
  for (const auto& r : gen) EXPECT_EQ(got.tokens[r.id], want_tokens[r.id]) << "request " << r.id;
  for (const auto& r : emb) EXPECT_TRUE(same_bits(got.vectors[r.id], expected(r))) << "request " << r.id;
}

TEST_F(Embeddings, TensorParallelVectorsAgreeWithinTolerance) {
  auto emb = embedding_requests(6);
  auto e = engine(2, 1024);
  replica_core rc(*e, scheduler_config{});
  auto got = serve(rc, emb);
  for (const auto& r : emb) {
    const auto want = expected(r, 1);
    const auto& v = got.vectors[r.id];
    ASSERT_EQ(v.size(), want.size());
    double diff = 0, scale = 0;
    for (size_t d = 0; d < v.size(); ++d) {
      diff = std::max(diff, double(std::abs(v[d] - want[d])));
      scale = std::max(scale, double(std::abs(want[d])));
    }
    EXPECT_LT(diff / scale, 1e-5) << "request " << r.id;
    EXPECT_TRUE(same_bits(v, expected(r, 2))) << "request " << r.id;  // and tp 2's own bits
  }
}

TEST_F(Embeddings, BadEmbeddingRequestsAreRefused) {
  auto e = engine(1, 256);
  replica_core rc(*e, scheduler_config{});
  replica_request r;
  r.id = 1;
  r.prompt = {5, 6, 7};
  r.max_tokens = 1;
  r.pool = pooling::mean;
  auto two = r;
  two.max_tokens = 2;
  EXPECT_FALSE(rc.submit(two).ok());
  auto logprobs = r;
  logprobs.sampling.logprobs = 1;
  EXPECT_FALSE(rc.submit(logprobs).ok());
  auto bias = r;
  bias.logit_bias = {{5, 1.0f}};
  EXPECT_FALSE(rc.submit(bias).ok());
  auto penalty = r;  // (from another node's frame: the gateway never sends it)
  penalty.sampling.presence_penalty = 0.5f;
  EXPECT_FALSE(rc.submit(penalty).ok());
  auto min_tokens = r;
  min_tokens.sampling.min_tokens = 2;
  EXPECT_FALSE(rc.submit(min_tokens).ok());
  auto long_prompt = r;
  long_prompt.prompt.assign(model_->config().max_positions + 1, 3);
  EXPECT_FALSE(rc.submit(long_prompt).ok());
  // A prompt of the whole context fits: nothing is generated after it.
  auto full = r;
  full.id = 2;
  full.prompt.assign(model_->config().max_positions, 3);
  auto e2 = engine(1, model_->config().max_positions);
  replica_core big(*e2, scheduler_config{});
  auto got = serve(big, {full});
  EXPECT_EQ(got.vectors[2].size(), model_->config().hidden);
  EXPECT_TRUE(rc.idle());
}

TEST_F(Embeddings, ACancelledOneEndsSilently) {
  auto e = engine(1, 512);
  scheduler_config cfg;
  cfg.max_batch_tokens = 8;
  replica_core rc(*e, cfg);
  auto emb = embedding_requests(3);
  for (auto& r : emb) ASSERT_TRUE(rc.submit(r).ok());
  auto ev = rc.step();
  ASSERT_TRUE(ev.ok());
  EXPECT_TRUE(rc.cancel(101));
  std::set<uint64_t> ended;
  for (int guard = 0; !rc.idle() && guard < 1000; ++guard) {
    auto s = rc.step();
    ASSERT_TRUE(s.ok());
    for (const auto& x : *s) ended.insert(x.id);
  }
  for (const auto& x : *ev) ended.insert(x.id);
  EXPECT_EQ(ended, (std::set<uint64_t>{100, 102}));
  EXPECT_EQ(rc.blocks().free_blocks(), rc.blocks().total_blocks());
}

// A classifier's token rows (pooling all) are its head on each position's state, whatever the
// chunks: prompts in steps of 8 tokens beside each other give every row the one-step logits (a
// sequence classifier's linear head; a reward model's two layers, a chunk's rows at once).
class ClassifierRows : public ::testing::TestWithParam<bool> {};

TEST_P(ClassifierRows, EachPositionsLogitsInChunks) {
  model::testing::temp_dir dir;
  model::random_model_spec spec;
  spec.vocab = 300;
  spec.classifier_labels = GetParam() ? 2 : 3;
  spec.reward = GetParam();
  if (spec.reward) spec.arch = "qwen2";
  const size_t labels = spec.classifier_labels;
  ASSERT_TRUE(model::write_random_model(spec, dir.path()).ok());
  auto m = model::model::load(dir.path());
  ASSERT_TRUE(m.ok()) << m.err().message;
  model::engine_options o;
  o.threads = 2;
  o.kv_tokens = 512;
  const std::vector<std::vector<int32_t>> prompts{{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}, {40, 41, 42}};
  std::map<uint64_t, std::vector<float>> want;
  for (size_t p = 0; p < prompts.size(); ++p) {  // each prompt's rows from one step alone, then the head on each
    auto e = model::engine::create(*m, o);
    ASSERT_TRUE(e.ok());
    std::vector<int32_t> table(4);
    std::iota(table.begin(), table.end(), 0);
    model::step_sequence s;
    s.tokens = prompts[p];
    s.block_table = table;
    s.want_logits = false;
    s.hidden = model::hidden_rows::all;
    std::vector<int32_t> tokens;
    model::step_logprobs out;
    ASSERT_TRUE((*e)->forward_sample(std::span(&s, 1), {}, tokens, &out).ok());
    const size_t H = (*m)->config().hidden;
    for (size_t i = 0; i < prompts[p].size(); ++i) {
      const auto l = (*m)->classify(std::span<const float>(out.hidden).subspan(i * H, H));
      want[p + 1].insert(want[p + 1].end(), l.begin(), l.end());
    }
  }
  auto e = model::engine::create(*m, o);
  ASSERT_TRUE(e.ok());
  scheduler_config cfg;
  cfg.max_batch_tokens = 8;
  replica_core rc(**e, cfg);
  for (size_t p = 0; p < prompts.size(); ++p) {
    replica_request r;
    r.id = p + 1;
    r.prompt = prompts[p];
    r.max_tokens = 1;
    r.pool = pooling::all;
    ASSERT_TRUE(rc.submit(r).ok());
  }
  std::map<uint64_t, std::vector<float>> got;
  for (int guard = 0; !rc.idle() && guard < 100; ++guard) {
    auto ev = rc.step();
    ASSERT_TRUE(ev.ok());
    for (auto& x : *ev) got[x.id] = x.embedding;
  }
  ASSERT_EQ(got[1].size(), prompts[0].size() * labels);
  EXPECT_EQ(got, want);
  // Past one message's values: refused at submit.
  replica_request huge;
  huge.id = 9;
  huge.prompt.assign(transport::max_embedding / labels + 1, 5);
  huge.max_tokens = 1;
  huge.pool = pooling::all;
  auto refused = rc.submit(huge);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.err().message.find("exceed one message's"), std::string::npos) << refused.err().message;
}

INSTANTIATE_TEST_SUITE_P(Heads, ClassifierRows, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? std::string("Reward") : std::string("Linear"); });

TEST(EmbeddingsOnly, ABareCheckpointEmbedsAndRefusesGenerations) {
  model::testing::temp_dir dir;
  model::random_model_spec spec;
  spec.base_model = true;
  spec.vocab = 300;
  ASSERT_TRUE(model::write_random_model(spec, dir.path()).ok());
  auto m = model::model::load(dir.path());
  ASSERT_TRUE(m.ok()) << m.err().message;
  model::engine_options o;
  o.threads = 2;
  o.kv_tokens = 256;
  auto e = model::engine::create(*m, o);
  ASSERT_TRUE(e.ok());
  replica_core rc(**e, scheduler_config{});
  replica_request gen;
  gen.id = 1;
  gen.prompt = {5, 6, 7};
  gen.max_tokens = 4;
  auto refused = rc.submit(gen);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.err().message.find("no LM head"), std::string::npos) << refused.err().message;
  replica_request emb = gen;
  emb.max_tokens = 1;
  emb.pool = pooling::last;
  ASSERT_TRUE(rc.submit(emb).ok());
  std::vector<float> v;
  for (int guard = 0; !rc.idle() && guard < 100; ++guard) {
    auto ev = rc.step();
    ASSERT_TRUE(ev.ok());
    for (auto& x : *ev) v = x.embedding;
  }
  EXPECT_EQ(v.size(), spec.hidden);
}

}  // namespace
}  // namespace llmesh::actors
