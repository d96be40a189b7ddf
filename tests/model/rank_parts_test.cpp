// Models held for some ranks (load_options::ranks, a spread replica's node): load writes only
// the parts of the matrices it rewrites that those ranks read, keeps the ranks' columns of the
// row-parallel matrices as copies of their own, and the engine parts over such models give the
// bits one whole engine gives — int8, --dtype, packed AWQ/GPTQ, GGUF blocks, mixtures of
// experts with and without expert parallelism, several ranks in one part — while holding
// about their share of the weights, and one rank's load writes about its share (its columns
// unpacked or repacked directly). A model held for some ranks runs no others.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gguf_test_util.hpp"
#include "llmesh/kernels/communicator.hpp"
#include "llmesh/kernels/dtype.hpp"
#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/gguf.hpp"
#include "llmesh/model/random_model.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

random_model_spec llama_spec() {
  random_model_spec s;
  s.hidden = 128;
  s.intermediate = 256;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.vocab = 300;
  s.dtype = kernels::dtype::bf16;
  s.seed = 31;
  return s;
}

/// A Llama whose MLP dominates its bytes (hidden 256, intermediate 4096, 4 heads, vocabulary
/// 512): what a rank holds is then mostly its share of the split matrices.
random_model_spec wide_llama_spec() {
  random_model_spec s = llama_spec();
  s.hidden = 256;
  s.intermediate = 4096;
  s.n_heads = 4;
  s.n_kv_heads = 4;
  s.vocab = 512;
  return s;
}

random_model_spec moe_spec(const std::string& arch) {
  random_model_spec s = llama_spec();
  s.arch = arch;
  s.intermediate = 64;
  s.n_experts = 6;
  s.experts_per_token = 2;
  if (arch == "qwen2_moe") s.shared_intermediate = 128;
  return s;
}

load_options held_as(quantization q, std::optional<kernels::dtype> dtype = std::nullopt, std::optional<rank_set> ranks = std::nullopt) {
  load_options o;
  o.quant = q;
  o.dtype = dtype;
  o.ranks = std::move(ranks);
  return o;
}

engine_options options(int tp, bool ep, int threads) {
  engine_options o;
  o.tp = tp;
  o.expert_parallel = ep;
  o.threads = threads;
  o.kv_tokens = 256;
  o.block_size = 4;
  return o;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {
    if (!s.empty()) s += ',';
    s += std::to_string(r);
  }
  return s;
}

/// Five steps (a prompt, then greedy tokens) of one whole engine over the model loaded whole,
/// and of engine parts, each over the model loaded for its ranks only: the parts' logits (rank
/// 0's) equal the whole engine's, bit for bit.
void expect_parts_give_whole_bits(const std::string& dir, const load_options& opt, int tp, bool ep,
                                  const std::vector<std::vector<int>>& parts) {
  auto whole_model = model::load(dir, opt);
  ASSERT_TRUE(whole_model.ok()) << whole_model.err().message;
  auto whole = engine::create(*whole_model, options(tp, ep, 2));
  ASSERT_TRUE(whole.ok()) << whole.err().message;
  auto group = kernels::make_local_communicators(tp);
  std::vector<std::unique_ptr<engine>> engines;
  for (const auto& ranks : parts) {
    SCOPED_TRACE("ranks " + ranks_text(ranks));
    load_options o = opt;
    o.ranks = rank_set{tp, ep, ranks};
    auto m = model::load(dir, o);
    ASSERT_TRUE(m.ok()) << m.err().message;
    ASSERT_TRUE((*m)->held_ranks().has_value());
    std::vector<std::unique_ptr<kernels::communicator>> comms;
    for (int r : ranks) comms.push_back(std::move(group[static_cast<size_t>(r)]));
    auto e = engine::create_part(*m, options(tp, ep, 1), std::move(comms));
    ASSERT_TRUE(e.ok()) << e.err().message;
    engines.push_back(std::move(*e));
  }
  std::vector<int32_t> tokens{5, 17, 200, 42, 8, 99, 1};
  const std::vector<int32_t> table{3, 0, 7};
  size_t pos = 0;
  const size_t v = (*whole_model)->config().vocab;
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<step_sequence> batch{{tokens, pos, table, true}};
    std::vector<float> want;
    ASSERT_TRUE((*whole)->forward(batch, want).ok());
    std::vector<std::vector<float>> got(static_cast<size_t>(tp));
    std::vector<status> st(static_cast<size_t>(tp), ok_status());
    std::vector<std::thread> threads;
    for (size_t p = 0; p < parts.size(); ++p) {
      for (int r : parts[p]) {
        threads.emplace_back([&, p, r] { st[static_cast<size_t>(r)] = engines[p]->forward_rank(r, batch, got[static_cast<size_t>(r)]); });
      }
    }
    for (auto& t : threads) t.join();
    for (auto& s : st) ASSERT_TRUE(s.ok()) << s.err().message;
    ASSERT_EQ(got[0].size(), v);
    ASSERT_EQ(want.size(), v);
    EXPECT_EQ(std::memcmp(got[0].data(), want.data(), v * sizeof(float)), 0);
    pos += tokens.size();
    tokens = {kernels::argmax(want)};
  }
}

/// A random model written once per test.
class RankParts : public ::testing::Test {
 protected:
  std::string write(const random_model_spec& s) {
    auto st = write_random_model(s, dir_.path());
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.err().message);
    return dir_.path();
  }
  testing::temp_dir dir_;
};

TEST_F(RankParts, Int8PartsGiveTheWholeEnginesBits) {
  expect_parts_give_whole_bits(write(llama_spec()), held_as(quantization::int8), 2, false, {{0}, {1}});
}

TEST_F(RankParts, SeveralRanksInOnePartOfFour) {
  expect_parts_give_whole_bits(write(llama_spec()), held_as(quantization::int8), 4, false, {{0}, {1, 2}, {3}});
}

TEST_F(RankParts, CastWeightsAndWeightsAsStored) {
  const std::string dir = write(llama_spec());
  expect_parts_give_whole_bits(dir, held_as(quantization::none, kernels::dtype::f16), 2, false, {{0}, {1}});
  // Cast, then quantized: the int8 columns are made from the cast ones, held apart already.
  expect_parts_give_whole_bits(dir, held_as(quantization::int8, kernels::dtype::f16), 2, false, {{0}, {1}});
  expect_parts_give_whole_bits(dir, {}, 2, false, {{1}, {0}});  // bfloat16 views; the columns copied
}

TEST_F(RankParts, TiedEmbeddingsKeepEveryRowForTheGather) {
  auto s = llama_spec();
  s.tie_embeddings = true;
  const std::string dir = write(s);
  expect_parts_give_whole_bits(dir, held_as(quantization::int8), 2, false, {{0}, {1}});
  expect_parts_give_whole_bits(dir, held_as(quantization::none, kernels::dtype::f32), 2, false, {{0}, {1}});
}

TEST_F(RankParts, PhiFusedProjections) {
  auto s = llama_spec();
  s.arch = "phi3";
  expect_parts_give_whole_bits(write(s), held_as(quantization::int8), 2, false, {{0}, {1}});
}

TEST_F(RankParts, PackedCheckpoints) {
  for (const char* packed : {"awq", "gptq-act-order", "ct-w8a16"}) {
    SCOPED_TRACE(packed);
    testing::temp_dir d;
    auto s = llama_spec();
    s.packed = packed;
    ASSERT_TRUE(write_random_model(s, d.path()).ok());
    expect_parts_give_whole_bits(d.path(), {}, 2, false, {{0}, {1}});
  }
  testing::temp_dir d;  // int4 layers made int8 after the rank's part was unpacked
  auto s = llama_spec();
  s.packed = "awq";
  ASSERT_TRUE(write_random_model(s, d.path()).ok());
  expect_parts_give_whole_bits(d.path(), held_as(quantization::int8), 2, false, {{1}, {0}});
}

TEST_F(RankParts, Fp8Checkpoints) {
  // Blocks of 96: rank 1's rows and columns start inside a scale's block.
  for (const char* packed : {"fp8-block", "ct-fp8"}) {
    SCOPED_TRACE(packed);
    testing::temp_dir d;
    auto s = llama_spec();
    s.packed = packed;
    s.group_size = 96;
    ASSERT_TRUE(write_random_model(s, d.path()).ok());
    expect_parts_give_whole_bits(d.path(), {}, 2, false, {{0}, {1}});
    expect_parts_give_whole_bits(d.path(), held_as(quantization::int8), 2, false, {{1}, {0}});
  }
  // vLLM's online FP8 of a BF16 checkpoint (a scale per whole matrix), also after --dtype.
  const std::string dir = write(llama_spec());
  expect_parts_give_whole_bits(dir, held_as(quantization::fp8), 2, false, {{0}, {1}});
  expect_parts_give_whole_bits(dir, held_as(quantization::fp8, kernels::dtype::f16), 2, false, {{1}, {0}});
}

TEST_F(RankParts, MixturesOfExpertsWithAndWithoutExpertParallelism) {
  for (const char* arch : {"qwen3_moe", "qwen2_moe", "mixtral"}) {
    SCOPED_TRACE(arch);
    testing::temp_dir d;
    ASSERT_TRUE(write_random_model(moe_spec(arch), d.path()).ok());
    expect_parts_give_whole_bits(d.path(), held_as(quantization::int8), 2, false, {{0}, {1}});
    expect_parts_give_whole_bits(d.path(), held_as(quantization::int8), 2, true, {{0}, {1}});
  }
}

/// Bytes of the pages over [p, p + n) resident in memory (mincore).
size_t resident_bytes(const void* p, size_t n) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n + page - 1) / page * page;
  std::vector<unsigned char> in((end - begin) / page);
  if (::mincore(reinterpret_cast<void*>(begin), end - begin, in.data()) != 0) return 0;
  size_t pages = 0;
  for (unsigned char c : in) pages += c & 1u;
  return pages * page;
}

// GPT-OSS's MXFP4 experts are written where the held ranks read them: parts give the whole
// engine's bits with the intermediate split and with whole experts per rank, and a rank of two
// expert-parallel ones holds about half of the experts' bytes.
TEST_F(RankParts, GptOssMxfp4Experts) {
  random_model_spec s;
  s.arch = "gpt_oss";
  s.hidden = 64;
  s.intermediate = 512;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 16;
  s.vocab = 300;
  s.n_experts = 8;
  s.experts_per_token = 2;
  s.sliding_window = 4;
  s.dtype = kernels::dtype::bf16;
  s.packed = "mxfp4";
  const std::string dir = write(s);
  expect_parts_give_whole_bits(dir, {}, 2, false, {{0}, {1}});
  expect_parts_give_whole_bits(dir, {}, 2, true, {{1}, {0}});
  ASSERT_EQ(::prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0), 0);
  auto whole = model::load(dir, {});
  ASSERT_TRUE(whole.ok()) << whole.err().message;
  auto experts_resident = [](const model& m) {
    size_t n = 0;
    for (const auto& l : m.weights().layers) {
      for (const auto& x : l.experts) n += resident_bytes(x.gate.data, x.gate.bytes()) + resident_bytes(x.up.data, x.up.bytes()) +
                                           resident_bytes(x.down.data, x.down.bytes());
    }
    return n;
  };
  const size_t all = experts_resident(**whole);
  auto part = model::load(dir, held_as(quantization::none, std::nullopt, rank_set{2, true, {0}}));
  ASSERT_TRUE(part.ok()) << part.err().message;
  const size_t held = experts_resident(**part);
  std::printf("rank 0 of 2 (expert parallel) holds %zu of %zu bytes of MXFP4 experts\n", held, all);
  EXPECT_LT(held, all * 65 / 100);
  EXPECT_GT(held, all * 35 / 100);
}

TEST_F(RankParts, GgufBlocks) {
  for (const char* name : {"llama_blocks_mixed", "llama_q8_0", "llama_q4_k_m"}) {
    SCOPED_TRACE(name);
    const std::string file = std::string(LLMESH_TEST_DATA) + "/gguf/" + name + "/model.gguf";
    expect_parts_give_whole_bits(file, {}, 2, false, {{0}, {1}});
  }
}

TEST_F(RankParts, AModelHeldForSomeRanksRunsNoOthers) {
  const std::string dir = write(llama_spec());
  auto m = model::load(dir, held_as(quantization::int8, std::nullopt, rank_set{2, false, {1}}));
  ASSERT_TRUE(m.ok()) << m.err().message;
  auto whole = engine::create(*m, options(2, false, 1));
  ASSERT_FALSE(whole.ok());
  EXPECT_EQ(whole.err().code, errc::invalid_request);
  EXPECT_NE(whole.err().message.find("loaded for rank 1 of tp 2 only"), std::string::npos) << whole.err().message;
  for (auto [tp, rank] : {std::pair{2, 0}, {4, 1}}) {
    auto group = kernels::make_local_communicators(tp);
    std::vector<std::unique_ptr<kernels::communicator>> comms;
    comms.push_back(std::move(group[static_cast<size_t>(rank)]));
    auto part = engine::create_part(*m, options(tp, false, 1), std::move(comms));
    ASSERT_FALSE(part.ok());
    EXPECT_EQ(part.err().code, errc::invalid_request) << part.err().message;
  }
  // Naming every rank is a whole model; a rank outside tp is refused.
  auto all = model::load(dir, held_as(quantization::none, std::nullopt, rank_set{2, false, {1, 0}}));
  ASSERT_TRUE(all.ok()) << all.err().message;
  EXPECT_FALSE((*all)->held_ranks().has_value());
  for (const auto& bad : {rank_set{2, false, {2}}, rank_set{2, false, {}}, rank_set{0, false, {0}}, rank_set{2, false, {-1}}}) {
    auto r = model::load(dir, held_as(quantization::none, std::nullopt, bad));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, errc::invalid_request) << r.err().message;
  }
}

TEST_F(RankParts, EachRankHoldsAboutItsShareOfTheRewrittenWeights) {
  // Without transparent huge pages: residency is then counted in 4 KiB pages, as written.
  ASSERT_EQ(::prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0), 0);
  random_model_spec s = wide_llama_spec();
  const std::string dir = write(s);
  auto whole = model::load(dir, held_as(quantization::int8));
  ASSERT_TRUE(whole.ok()) << whole.err().message;
  const size_t all = (*whole)->resident_weight_bytes();
  EXPECT_GE(all, (*whole)->weight_bytes() * 9 / 10);  // int8 matrices written, the bfloat16 embedding in the page cache
  for (int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    auto part = model::load(dir, held_as(quantization::int8, std::nullopt, rank_set{2, false, {rank}}));
    ASSERT_TRUE(part.ok()) << part.err().message;
    const size_t held = (*part)->resident_weight_bytes();
    const size_t embed = (*part)->weights().embed.bytes();
    EXPECT_LT(held - embed, (all - embed) * 55 / 100) << held << " of " << all;
    EXPECT_GT(held - embed, (all - embed) * 45 / 100) << held << " of " << all;
    std::printf("rank %d of 2 holds %zu of %zu bytes of weights (embedding %zu)\n", rank, held, all, embed);
  }
}

/// Page faults (minor and major) of this process so far, every thread's.
long page_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt + u.ru_majflt;
}

/// A one-layer Llama GGUF of hidden 256 (4 heads of 64), intermediate 4096 and vocabulary 512
/// whose matrices are random Q8_0 blocks (held as int8: written at load).
std::string q8_0_llama(const testing::temp_dir& dir) {
  gguf_testing::gguf_writer w;
  gguf_testing::llama_shape(w, 256, 1, 4096, 4, 4);
  std::mt19937 rng(7);
  auto q8_0 = [&](size_t rows, size_t cols) {
    const uint16_t d = kernels::f32_to_f16(0.01f);
    std::string b;
    for (size_t i = 0; i < rows * cols / 32; ++i) {
      b.append(reinterpret_cast<const char*>(&d), 2);
      for (int j = 0; j < 32; ++j) b.push_back(static_cast<char>(static_cast<int>(rng() % 255) - 127));
    }
    return b;
  };
  const std::vector<float> ones(256, 1.0f), embd(256 * 512, 0.01f);
  w.tensor_f32("token_embd.weight", {256, 512}, embd);
  w.tensor_f32("output_norm.weight", {256}, ones);
  w.tensor_f32("blk.0.attn_norm.weight", {256}, ones);
  w.tensor_f32("blk.0.ffn_norm.weight", {256}, ones);
  for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output"}) w.tensor(std::string("blk.0.") + m + ".weight", ggml::q8_0, {256, 256}, q8_0(256, 256));
  w.tensor("blk.0.ffn_gate.weight", ggml::q8_0, {256, 4096}, q8_0(4096, 256));
  w.tensor("blk.0.ffn_up.weight", ggml::q8_0, {256, 4096}, q8_0(4096, 256));
  w.tensor("blk.0.ffn_down.weight", ggml::q8_0, {4096, 256}, q8_0(256, 4096));
  return gguf_testing::write(w, dir);
}

TEST_F(RankParts, LoadingOneRankWritesAboutItsShareOfTheRepackedWeights) {
  // A rank's columns of o_proj and down_proj are written as their own matrices, the full
  // matrices never touched: loading rank 0 of 2 faults in about half the pages loading the
  // whole model does (writing every row's columns in the full matrix and copying them out
  // after would fault in ~0.8 of them). Counted in 4 KiB pages, without transparent huge pages.
  ASSERT_EQ(::prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0), 0);
  random_model_spec s = wide_llama_spec();
  s.packed = "awq";
  s.group_size = 128;
  testing::temp_dir awq, gguf;
  ASSERT_TRUE(write_random_model(s, awq.path()).ok());
  for (const std::string& path : {awq.path(), q8_0_llama(gguf)}) {
    SCOPED_TRACE(path);
    for (int pass = 0; pass < 2; ++pass) {  // the first pass reads the files into the page cache
      long before = page_faults();
      auto whole = model::load(path, {});
      ASSERT_TRUE(whole.ok()) << whole.err().message;
      const long all = page_faults() - before;
      before = page_faults();
      auto part = model::load(path, held_as(quantization::none, std::nullopt, rank_set{2, false, {0}}));
      ASSERT_TRUE(part.ok()) << part.err().message;
      const long held = page_faults() - before;
      if (pass == 0) continue;
      std::printf("%s: loading rank 0 of 2 faults in %ld pages, the whole model %ld\n", path.c_str(), held, all);
      EXPECT_LT(held, all * 65 / 100);
    }
  }
}

}  // namespace
}  // namespace llmesh::model
