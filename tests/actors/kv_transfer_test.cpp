// KV transfer between replicas (disaggregated prefill; replica_core::export_prefix /
// import_prefix, model::engine::export_kv / import_kv): a prompt computed on one replica, its
// whole blocks copied into another replica's prefix cache, gives there exactly the tokens the
// request gets computed alone — across tensor-parallel sizes (the transfer layout holds every
// head), with a bfloat16 or an fp8 cache, with LoRA adapters — and the blocks are hits. Corrupted bytes
// change the tokens (the imported KV is what runs), and bad prefixes are refused changing nothing.
#include "llmesh/model/random_model.hpp"
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

class KvTransfer : public testing::replica_test_base {
 protected:
  std::unique_ptr<model::engine> engine_with(int tp, size_t block_size, kernels::dtype kv_type, size_t kv_tokens = 1024) {
    model::engine_options o;
    o.tp = tp;
    o.threads = std::max(2, tp);
    o.kv_tokens = kv_tokens;
    o.block_size = block_size;
    o.kv_type = kv_type;
    auto e = model::engine::create(model_, o);
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
    return std::move(*e);
  }

  /// Runs `r`'s prompt on `from` (a request of one token, as a prefill replica does) and
  /// exports its cached whole blocks.
  kv_prefix prefill(replica_core& from, const replica_request& r) {
    replica_request p;
    p.id = r.id + 100000;
    p.prompt = r.prompt;
    p.max_tokens = 1;
    p.cache_salt = r.cache_salt;
    p.lora = r.lora;
    testing::serve_tokens(from, {p});
    auto out = from.export_prefix(r.prompt, r.cache_salt, r.lora);
    EXPECT_TRUE(out.ok()) << (out.ok() ? "" : out.err().message);
    return out.ok() ? std::move(*out) : kv_prefix{};
  }

  /// Serves `r` on `rc`: its tokens and its first token's cached_tokens.
  static std::pair<std::vector<int32_t>, int32_t> run(replica_core& rc, const replica_request& r) {
    std::pair<std::vector<int32_t>, int32_t> out{{}, -2};
    EXPECT_TRUE(rc.submit(r).ok());
    for (int guard = 0; !rc.idle() && guard < 10000; ++guard) {
      auto ev = rc.step();
      EXPECT_TRUE(ev.ok());
      if (!ev.ok()) break;
      for (const auto& e : *ev) {
        if (out.first.empty()) out.second = e.cached_tokens;
        out.first.push_back(e.token);
      }
    }
    return out;
  }

  /// Every request prefilled on a tp `from_tp` replica and decoded on a tp `to_tp` one after the
  /// import: the tokens generate() gives alone, each first token a hit of the imported blocks.
  void transfer_all(const std::vector<replica_request>& reqs, int from_tp, int to_tp, kernels::dtype kv_type) {
    auto want = kv_type == kernels::dtype::f32 ? alone(reqs, 1) : std::map<uint64_t, std::vector<int32_t>>{};
    auto ea = engine_with(from_tp, 8, kv_type), eb = engine_with(to_tp, 8, kv_type), ec = engine_with(1, 8, kv_type);
    replica_core a(*ea, scheduler_config{}), b(*eb, scheduler_config{}), c(*ec, scheduler_config{});
    size_t moved = 0;
    for (const auto& r : reqs) {
      auto p = prefill(a, r);
      EXPECT_EQ(p.tokens.size(), (r.prompt.size() - 1) / 8 * 8) << "request " << r.id;
      EXPECT_EQ(p.block_bytes, eb->kv_block_bytes());
      auto written = b.import_prefix(p);
      ASSERT_TRUE(written.ok()) << written.err().message;
      moved += *written;
      auto [tokens, cached] = run(b, r);
      EXPECT_EQ(cached, static_cast<int32_t>(p.tokens.size())) << "request " << r.id;
      if (!want.empty()) {
        EXPECT_EQ(tokens, want[r.id]) << "request " << r.id;
      }
      EXPECT_EQ(tokens, run(c, r).first) << "request " << r.id;  // computed there, same cache type
    }
    EXPECT_GT(moved, 0u);
    EXPECT_TRUE(b.blocks().check_invariants().ok());
    EXPECT_EQ(b.blocks().free_blocks(), b.blocks().total_blocks());
  }

  /// A prompt of `n` tokens.
  static replica_request long_request(uint64_t id, size_t n, uint64_t seed = 3) {
    replica_request r;
    r.id = id;
    std::mt19937 rng(static_cast<unsigned>(seed));
    for (size_t i = 0; i < n; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % 300));
    r.max_tokens = 12;
    r.sampling.seed = id;
    return r;
  }
};

TEST_F(KvTransfer, ImportedBlocksGiveTheTokensOfARequestAlone) { transfer_all(requests(10), 1, 1, kernels::dtype::f32); }

TEST_F(KvTransfer, TheLayoutDoesNotDependOnTensorParallelism) {
  transfer_all(requests(6), 1, 2, kernels::dtype::f32);
  transfer_all(requests(6), 2, 1, kernels::dtype::f32);
}

// Four ranks over the model's two KV heads: each head is replicated on two ranks, whose copies
// hold the same values (exported by either, imported into both).
TEST_F(KvTransfer, ReplicatedKvHeadsMoveToo) {
  transfer_all(requests(4), 4, 1, kernels::dtype::f32);
  transfer_all(requests(4), 1, 4, kernels::dtype::f32);
}

TEST_F(KvTransfer, ABfloat16CacheMovesAsIs) { transfer_all(requests(6), 2, 1, kernels::dtype::bf16); }

TEST_F(KvTransfer, AnFp8CacheMovesAsIs) {
  transfer_all(requests(4), 2, 1, kernels::dtype::f8_e4m3);
  transfer_all(requests(4), 1, 2, kernels::dtype::f8_e5m2);
}

TEST_F(KvTransfer, CorruptedBytesChangeTheTokens) {
  auto ea = engine_with(1, 8, kernels::dtype::f32), eb = engine_with(1, 8, kernels::dtype::f32);
  replica_core a(*ea, scheduler_config{}), b(*eb, scheduler_config{});
  auto r = long_request(1, 60);
  auto p = prefill(a, r);
  ASSERT_EQ(p.tokens.size(), 56u);
  auto want = alone({r}, 1)[r.id];
  auto bytes = *p.data;
  for (size_t i = 0; i < bytes.size(); i += 4) bytes[i + 3] = std::byte{0x40};  // every float's top byte
  p.data = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  ASSERT_TRUE(b.import_prefix(p).ok());
  auto [tokens, cached] = run(b, r);
  EXPECT_EQ(cached, 56);
  EXPECT_NE(tokens, want);  // what runs is the imported KV, not a recomputation
}

TEST_F(KvTransfer, BlocksAlreadyCachedAreKeptAndNotWrittenAgain) {
  auto ea = engine_with(1, 8, kernels::dtype::f32), eb = engine_with(1, 8, kernels::dtype::f32);
  replica_core a(*ea, scheduler_config{}), b(*eb, scheduler_config{});
  auto r = long_request(1, 41);
  auto p = prefill(a, r);
  ASSERT_EQ(p.tokens.size(), 40u);
  EXPECT_EQ(*b.import_prefix(p), 5u);
  EXPECT_EQ(*b.import_prefix(p), 0u);
  EXPECT_EQ(b.blocks().cached_blocks(), 5u);
  EXPECT_EQ(b.blocks().hit_tokens(), 0u);  // imports are not lookups
  EXPECT_EQ(b.blocks().queried_tokens(), 0u);
  // A longer prompt over the same start: only its new blocks are written.
  auto longer = r;
  for (int i = 0; i < 17; ++i) longer.prompt.push_back(i);
  auto q = prefill(a, longer);
  ASSERT_EQ(q.tokens.size(), 56u);
  EXPECT_EQ(*b.import_prefix(q), 2u);
  EXPECT_EQ(run(b, longer).first, alone({longer}, 1)[longer.id]);
}

TEST_F(KvTransfer, SaltsAndAdaptersKeepTheirBlocksApart) {
  auto r = long_request(1, 33);
  r.cache_salt = 77;
  auto ea = engine_with(1, 8, kernels::dtype::f32), eb = engine_with(1, 8, kernels::dtype::f32);
  replica_core a(*ea, scheduler_config{}), b(*eb, scheduler_config{});
  auto p = prefill(a, r);
  ASSERT_EQ(p.tokens.size(), 32u);
  EXPECT_EQ(p.cache_salt, 77u);
  ASSERT_TRUE(b.import_prefix(p).ok());
  auto unsalted = r;
  unsalted.cache_salt = 0;
  unsalted.id = 2;
  EXPECT_EQ(run(b, unsalted).second, 0);  // another tenant's blocks
  EXPECT_EQ(run(b, r).second, 32);
  p.lora = "nowhere";
  auto refused = b.import_prefix(p);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.err().code, errc::not_found);
  EXPECT_EQ(a.export_prefix(r.prompt, 77, "nowhere").err().code, errc::not_found);
}

TEST_F(KvTransfer, BadPrefixesAreRefusedChangingNothing) {
  auto ea = engine_with(1, 8, kernels::dtype::f32), eb = engine_with(1, 8, kernels::dtype::f32, 64);
  replica_core a(*ea, scheduler_config{}), b(*eb, scheduler_config{});
  auto r = long_request(1, 100);
  const auto good = prefill(a, r);
  ASSERT_EQ(good.tokens.size(), 96u);  // 12 blocks: more than b's 8
  auto expect_refused = [&](const kv_prefix& p, errc code, const char* what) {
    auto got = b.import_prefix(p);
    ASSERT_FALSE(got.ok()) << what;
    EXPECT_EQ(got.err().code, code) << what << ": " << got.err().message;
    EXPECT_EQ(b.blocks().free_blocks(), b.blocks().total_blocks()) << what;
    EXPECT_EQ(b.blocks().cached_blocks(), 0u) << what;
    EXPECT_TRUE(b.blocks().check_invariants().ok()) << what;
  };
  expect_refused(good, errc::overloaded, "more blocks than the cache has");
  auto p = good;
  p.tokens.resize(32);
  p.data = std::make_shared<const std::vector<std::byte>>(good.data->begin(), good.data->begin() + 4 * static_cast<std::ptrdiff_t>(good.block_bytes));
  ASSERT_TRUE(eb->kv_block_bytes() == p.block_bytes);
  auto q = p;
  q.block_size = 16;
  expect_refused(q, errc::invalid_request, "another block size");
  q = p;
  q.kv_type = kernels::dtype::bf16;
  expect_refused(q, errc::invalid_request, "another KV dtype");
  q = p;
  q.kv_type = kernels::dtype::f8_e4m3;
  expect_refused(q, errc::invalid_request, "an fp8 prefix into a float32 cache");
  q = p;
  q.block_bytes /= 2;
  expect_refused(q, errc::invalid_request, "another block shape");
  q = p;
  q.data = std::make_shared<const std::vector<std::byte>>(p.data->begin(), p.data->end() - 1);
  expect_refused(q, errc::invalid_request, "a byte short");
  q = p;
  q.tokens.pop_back();
  expect_refused(q, errc::invalid_request, "not whole blocks");
  q = p;
  q.tokens[5] = 300;
  expect_refused(q, errc::invalid_request, "a token outside the vocabulary");
  q = p;
  q.data.reset();
  expect_refused(q, errc::invalid_request, "no bytes");
  ASSERT_TRUE(b.import_prefix(p).ok());  // the good part fits
  EXPECT_EQ(b.blocks().cached_blocks(), 4u);
}

TEST_F(KvTransfer, ExportNeedsPrefixCachingAndGivesOnlyWhatIsCached) {
  auto ea = engine_with(1, 8, kernels::dtype::f32);
  replica_core a(*ea, scheduler_config{});
  auto r = long_request(1, 30);
  auto none = a.export_prefix(r.prompt, 0, "");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->tokens.empty());  // never computed here
  EXPECT_TRUE(none->data->empty());
  EXPECT_TRUE(a.export_prefix({}, 0, "").ok());
  auto eo = engine_with(1, 8, kernels::dtype::f32);
  scheduler_config off;
  off.prefix_caching = false;
  replica_core o(*eo, off, false);
  EXPECT_EQ(o.export_prefix(r.prompt, 0, "").err().code, errc::unsupported);
  kv_prefix p;
  EXPECT_EQ(o.import_prefix(p).err().code, errc::unsupported);
  // The engine checks its block ids.
  const int32_t bad[] = {0, static_cast<int32_t>(ea->kv_blocks())};
  EXPECT_EQ(ea->export_kv(bad).err().code, errc::invalid_request);
  std::vector<std::byte> bytes(2 * ea->kv_block_bytes());
  EXPECT_EQ(ea->import_kv(bad, bytes).err().code, errc::invalid_request);
}

// Requests with LoRA adapters: their blocks hold the adapter's keys and values, cached under the
// adapter on both sides (the importer looks the adapter up by name).
class KvTransferLora : public KvTransfer {
 protected:
  void SetUp() override {
    KvTransfer::SetUp();
    model::random_lora_spec a, b;
    b.seed = 7, b.rank = 4, b.targets = {"q_proj", "k_proj", "v_proj", "down_proj"};
    ASSERT_TRUE(model::write_random_lora(a, dir_.path(), dir_.path() + "/lora-a").ok());
    ASSERT_TRUE(model::write_random_lora(b, dir_.path(), dir_.path() + "/lora-b").ok());
    model::load_options lo;
    lo.loras = {{"a", dir_.path() + "/lora-a"}, {"b", dir_.path() + "/lora-b"}};
    auto m = model::model::load(dir_.path(), lo);
    ASSERT_TRUE(m.ok()) << m.err().message;
    model_ = *m;
  }
};

TEST_F(KvTransferLora, AnAdaptersBlocksMoveUnderItsName) {
  auto reqs = requests(9);
  for (auto& r : reqs) r.lora = r.id % 3 == 0 ? "" : r.id % 3 == 1 ? "a" : "b";
  transfer_all(reqs, 1, 2, kernels::dtype::f32);
}

}  // namespace
}  // namespace llmesh::actors
