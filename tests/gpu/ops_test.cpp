// Parity of every CUDA op with its CPU oracle, on fresh random inputs at several sizes, with
// poisoned outputs (every element must be written). Stated tolerances: bit-identical for
// rmsnorm, the fused residual norm, SwiGLU, RoPE + cache write, embedding and argmax (the
// device code performs the CPU's operations in the CPU's order); ‖gpu − cpu‖/‖cpu‖ < 1e-5 for
// the CUDA-core projections and attention (float32, another summation order); < 1e-2 for
// cuBLASLt (activations rounded to 16 bits). Batch invariance is checked bit for bit.
// Skipped without a device (label gpu).
#include <algorithm>
#include <limits>
#include <numeric>

#include "gpu_test_util.hpp"
#include "llmesh/kernels/attention.hpp"
#include "llmesh/kernels/cuda_ops.hpp"
#include "llmesh/kernels/dtype.hpp"
#include "llmesh/kernels/elementwise.hpp"
#include "llmesh/kernels/matmul.hpp"
#include "llmesh/kernels/rope.hpp"
#include "llmesh/kernels/sampling.hpp"

namespace llmesh::gpu_testing {
namespace {

using kernels::dtype;

/// Weights of `type` as raw bytes, and their float32 values.
struct weights {
  std::vector<uint16_t> half;
  std::vector<float> f32;
  const void* host(dtype t) const { return t == dtype::f32 ? static_cast<const void*>(f32.data()) : half.data(); }
};

weights make_weights(size_t n, dtype t, uint32_t salt) {
  weights w;
  w.f32 = random_floats(n, salt);
  if (t != dtype::f32) {
    w.half.resize(n);
    for (size_t i = 0; i < n; ++i) {
      w.half[i] = t == dtype::f16 ? kernels::f32_to_f16(w.f32[i]) : kernels::f32_to_bf16(w.f32[i]);
      w.f32[i] = kernels::load_as_f32(w.half.data(), t, i);
    }
  }
  return w;
}

cuda::buffer upload(const weights& w, dtype t) {
  return t == dtype::f32 ? to_device(w.f32) : to_device(w.half);
}

struct dense_case {
  size_t m, n, k, ldw;
  bool bias;
};

std::vector<float> cpu_matmul(const std::vector<float>& x, size_t m, size_t k, const weights& w, dtype t, size_t n,
                              size_t ldw, const std::vector<float>& bias) {
  kernels::thread_pool pool(1);
  std::vector<float> y(m * n);
  kernels::matmul_args a;
  a.x = x.data();
  a.ldx = k;
  a.w = w.host(t);
  a.ldw = ldw;
  a.w_type = t;
  a.bias = bias.empty() ? nullptr : bias.data();
  a.y = y.data();
  a.ldy = n;
  a.m = m;
  a.n = n;
  a.k = k;
  EXPECT_TRUE(kernels::matmul(a, pool).ok());
  return y;
}

std::vector<float> gpu_dense(const std::vector<float>& x, size_t m, size_t k, const cuda::buffer& w, dtype t, size_t n,
                             size_t ldw, const std::vector<float>& bias) {
  auto dx = to_device(x);
  auto db = to_device(bias);
  auto dy = poisoned(m * n * 4);
  cuda::dense_job j;
  j.x = dx.as<float>();
  j.ldx = k;
  j.w = w.get();
  j.ldw = ldw;
  j.w_type = t;
  j.bias = bias.empty() ? nullptr : db.as<float>();
  j.y = dy.as<float>();
  j.ldy = n;
  j.n = n;
  j.k = k;
  const cuda::dense_job jobs[1] = {j};
  EXPECT_TRUE(cuda::dense(jobs, m, nullptr).ok());
  return to_host<float>(dy, m * n);
}

TEST(CudaDense, MatchesCpuForEveryDtypeAndShape) {
  LLMESH_REQUIRE_GPU();
  const dense_case cases[] = {{1, 67, 200, 200, false}, {3, 128, 2048, 2048, true}, {8, 300, 1000, 1000, false},
                              {13, 96, 520, 520, true}, {2, 64, 96, 200, false},     {1, 2048, 8192, 8192, false}};
  uint32_t salt = 1;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    for (const auto& c : cases) {
      auto w = make_weights(c.n * c.ldw, t, salt++);
      auto x = random_floats(c.m * c.k, salt++);
      auto bias = c.bias ? random_floats(c.n, salt++) : std::vector<float>{};
      auto dw = upload(w, t);
      auto want = cpu_matmul(x, c.m, c.k, w, t, c.n, c.ldw, bias);
      auto got = gpu_dense(x, c.m, c.k, dw, t, c.n, c.ldw, bias);
      EXPECT_LT(rel_error(got, want), 1e-5) << kernels::dtype_name(t) << " m=" << c.m << " n=" << c.n << " k=" << c.k;
    }
  }
}

TEST(CudaDense, RowsAreBatchInvariant) {
  LLMESH_REQUIRE_GPU();
  for (size_t k : {1000, 4100, 8200}) {  // one, two and four split-K segments, with a tail
    const size_t n = 160, m = 19;
    auto w = make_weights(n * k, dtype::bf16, 101 + static_cast<uint32_t>(k));
    auto dw = upload(w, dtype::bf16);
    auto x = random_floats(m * k, 102);
    auto all = gpu_dense(x, m, k, dw, dtype::bf16, n, k, {});
    for (size_t sub : {1, 2, 3, 5, 8}) {  // every template width and the sliced m > 8 path
      std::vector<float> part(x.begin(), x.begin() + static_cast<ptrdiff_t>(sub * k));
      auto got = gpu_dense(part, sub, k, dw, dtype::bf16, n, k, {});
      EXPECT_TRUE(same_bits(got, std::vector<float>(all.begin(), all.begin() + static_cast<ptrdiff_t>(sub * n))))
          << "k=" << k << " m=" << sub;
    }
  }
}

TEST(CudaGemm, CublasLtMatchesCpuWithinBf16Rounding) {
  LLMESH_REQUIRE_GPU();
  auto b = cuda::blas::create();
  ASSERT_TRUE(b.ok()) << b.err().message;
  for (dtype t : {dtype::bf16, dtype::f16}) {
    const size_t m = 64, n = 256, k = 512;
    auto w = make_weights(n * k, t, 201);
    auto dw = upload(w, t);
    auto x = random_floats(m * k, 202);
    auto bias = random_floats(n, 203);
    auto want = cpu_matmul(x, m, k, w, t, n, k, bias);
    auto dx = to_device(x);
    auto dbias = to_device(bias);
    auto dy = poisoned(m * n * 4);
    auto scratch = poisoned(m * k * 2);
    cuda::dense_job j;
    j.x = dx.as<float>();
    j.ldx = k;
    j.w = dw.get();
    j.ldw = k;
    j.w_type = t;
    j.bias = dbias.as<float>();
    j.y = dy.as<float>();
    j.ldy = n;
    j.n = n;
    j.k = k;
    ASSERT_TRUE((*b)->gemm(j, m, scratch.get(), nullptr).ok());
    auto got = to_host<float>(dy, m * n);
    EXPECT_LT(rel_error(got, want), 1e-2) << kernels::dtype_name(t);
  }
}

TEST(CudaNorm, RmsnormAndResidualNormAreBitIdenticalToCpu) {
  LLMESH_REQUIRE_GPU();
  for (size_t n : {64, 200, 2048, 4096}) {
    const size_t rows = 7;
    auto x = random_floats(rows * n, 300 + static_cast<uint32_t>(n), -3, 3);
    auto delta = random_floats(rows * n, 400 + static_cast<uint32_t>(n));
    auto w = random_floats(n, 500 + static_cast<uint32_t>(n), 0.5f, 1.5f);
    std::vector<float> want(rows * n), want_h = x, want2(rows * n);
    for (size_t r = 0; r < rows; ++r) kernels::rmsnorm(&x[r * n], w.data(), &want[r * n], n, 1e-5f);
    for (size_t r = 0; r < rows; ++r) {
      kernels::add_inplace(&want_h[r * n], &delta[r * n], n);
      kernels::rmsnorm(&want_h[r * n], w.data(), &want2[r * n], n, 1e-5f);
    }
    auto dx = to_device(x), dd = to_device(delta), dw = to_device(w);
    auto out = poisoned(rows * n * 4);
    ASSERT_TRUE(cuda::rmsnorm(dx.as<float>(), dw.as<float>(), out.as<float>(), rows, n, 1e-5f, nullptr).ok());
    EXPECT_TRUE(same_bits(to_host<float>(out, rows * n), want)) << "n=" << n;
    auto out2 = poisoned(rows * n * 4);
    ASSERT_TRUE(cuda::add_rmsnorm(dx.as<float>(), dd.as<float>(), dw.as<float>(), out2.as<float>(), rows, n, 1e-5f,
                                  nullptr).ok());
    EXPECT_TRUE(same_bits(to_host<float>(dx, rows * n), want_h)) << "n=" << n;
    EXPECT_TRUE(same_bits(to_host<float>(out2, rows * n), want2)) << "n=" << n;
  }
}

TEST(CudaSwiglu, BitIdenticalToCpu) {
  LLMESH_REQUIRE_GPU();
  const size_t n = 100003;
  auto g = random_floats(n, 600, -20, 20), u = random_floats(n, 601, -2, 2);
  std::vector<float> want(n);
  kernels::swiglu(g.data(), u.data(), want.data(), n);
  auto dg = to_device(g), du = to_device(u);
  auto out = poisoned(n * 4);
  ASSERT_TRUE(cuda::swiglu(dg.as<float>(), du.as<float>(), out.as<float>(), n, nullptr).ok());
  EXPECT_TRUE(same_bits(to_host<float>(out, n), want));
}

TEST(CudaEmbed, GathersRowsExactly) {
  LLMESH_REQUIRE_GPU();
  const size_t vocab = 517, hidden = 200;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    auto w = make_weights(vocab * hidden, t, 700);
    auto dw = upload(w, t);
    std::vector<int32_t> ids = {0, 516, 3, 3, 250};
    auto did = to_device(ids);
    auto out = poisoned(ids.size() * hidden * 4);
    ASSERT_TRUE(cuda::embed(dw.get(), t, hidden, did.as<int32_t>(), ids.size(), out.as<float>(), nullptr).ok());
    std::vector<float> want;
    for (int32_t id : ids) want.insert(want.end(), w.f32.begin() + id * hidden, w.f32.begin() + (id + 1) * hidden);
    EXPECT_TRUE(same_bits(to_host<float>(out, want.size()), want)) << kernels::dtype_name(t);
  }
}

TEST(CudaArgmax, MatchesCpuIncludingTies) {
  LLMESH_REQUIRE_GPU();
  const size_t rows = 5, vocab = 128256;
  auto logits = random_floats(rows * vocab, 800, -10, 10);
  logits[1 * vocab + 77] = 50.0f;  // a tie: the lower index must win
  logits[1 * vocab + 99000] = 50.0f;
  logits[3 * vocab + vocab - 1] = 60.0f;
  auto dl = to_device(logits);
  auto out = poisoned(rows * 4);
  ASSERT_TRUE(cuda::argmax(dl.as<float>(), rows, vocab, out.as<int32_t>(), nullptr).ok());
  auto got = to_host<int32_t>(out, rows);
  for (size_t r = 0; r < rows; ++r) {
    EXPECT_EQ(got[r], kernels::argmax(std::span<const float>(logits.data() + r * vocab, vocab))) << "row " << r;
  }
}

TEST(CudaArgmax, ANaNAtIndexZeroWinsAsOnTheCpu) {
  LLMESH_REQUIRE_GPU();
  const size_t vocab = 3000;
  std::vector<float> logits = random_floats(2 * vocab, 801, -5, 5);
  logits[0] = std::numeric_limits<float>::quiet_NaN();           // row 0: the CPU keeps index 0
  logits[vocab + 10] = std::numeric_limits<float>::quiet_NaN();  // row 1: other NaNs never win
  auto dl = to_device(logits);
  auto out = poisoned(2 * 4);
  ASSERT_TRUE(cuda::argmax(dl.as<float>(), 2, vocab, out.as<int32_t>(), nullptr).ok());
  auto got = to_host<int32_t>(out, 2);
  for (size_t r = 0; r < 2; ++r) EXPECT_EQ(got[r], kernels::argmax(std::span<const float>(logits.data() + r * vocab, vocab))) << r;
}

/// The device's penalties and bans equal kernels::apply_adjust bit for bit, row by row.
TEST(CudaAdjust, PenaltiesAndBansEqualTheCpus) {
  LLMESH_REQUIRE_GPU();
  const size_t vocab = 5000, rows = 4;
  std::vector<float> logits = random_floats(rows * vocab, 820, -6, 6);
  std::mt19937 rng(821);
  std::vector<float> want = logits;
  std::vector<cuda::device_adjust> pen, ban, bias_entries;
  const float params[rows][3] = {{0.0f, 0.0f, 1.3f}, {0.7f, 0.3f, 1.0f}, {-0.5f, 1.1f, 0.9f}, {0.0f, 0.0f, 1.0f}};
  for (uint32_t r = 0; r < rows; ++r) {
    kernels::sampling_params p;
    p.presence_penalty = params[r][0];
    p.frequency_penalty = params[r][1];
    p.repetition_penalty = params[r][2];
    std::vector<kernels::seen_token> seen;
    std::set<int32_t> ids;
    while (ids.size() < 300) ids.insert(static_cast<int32_t>(rng() % vocab));
    for (int32_t id : ids) seen.push_back({id, static_cast<int32_t>(rng() % 4)});
    std::vector<int32_t> banned{seen[0].id, seen[1].id, static_cast<int32_t>(vocab - 1)};
    std::vector<kernels::token_bias> bias{{seen[2].id, 3.5f}, {static_cast<int32_t>(vocab - 2), -100.0f}};
    kernels::apply_adjust(std::span(want).subspan(r * vocab, vocab), p, {seen, banned, bias});
    for (const auto& b : bias) bias_entries.push_back({r, b.id, 0, 2, b.bias, 0.0f, 1.0f, 0});
    if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || p.repetition_penalty != 1.0f) {
      for (const auto& x : seen) pen.push_back({r, x.id, x.count, 0, p.presence_penalty, p.frequency_penalty, p.repetition_penalty, 0});
    }
    for (int32_t id : banned) ban.push_back({r, id, 0, 1, 0.0f, 0.0f, 1.0f, 0});
  }
  auto dl = to_device(logits);
  auto dp = to_device(pen);
  auto db = to_device(ban);
  auto dbias = to_device(bias_entries);
  ASSERT_TRUE(cuda::adjust_logits(dl.as<float>(), vocab, dbias.as<cuda::device_adjust>(), bias_entries.size(), nullptr).ok());
  ASSERT_TRUE(cuda::adjust_logits(dl.as<float>(), vocab, dp.as<cuda::device_adjust>(), pen.size(), nullptr).ok());
  ASSERT_TRUE(cuda::adjust_logits(dl.as<float>(), vocab, db.as<cuda::device_adjust>(), ban.size(), nullptr).ok());
  auto got = to_host<float>(dl, rows * vocab);
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u);
}

/// Grammar masks on the device (cuda::mask_logits) leave exactly apply_adjust's -inf: random
/// bits over a vocabulary that is not a multiple of 32, one mask shorter than the vocabulary
/// (its missing words allow nothing), one row left unmasked, after bans on the same row.
TEST(CudaAdjust, MasksEqualTheCpus) {
  LLMESH_REQUIRE_GPU();
  const size_t vocab = 5003, rows = 4, words = cuda::mask_words(vocab);
  std::vector<float> logits = random_floats(rows * vocab, 830, -6, 6);
  std::vector<float> want = logits;
  std::mt19937 rng(831);
  std::vector<uint32_t> masks, mask_rows;
  std::vector<cuda::device_adjust> ban;
  for (uint32_t r = 0; r < rows; ++r) {
    if (r == 2) continue;  // unmasked
    std::vector<uint32_t> allowed(r == 3 ? words / 2 : words);
    for (auto& w : allowed) w = static_cast<uint32_t>(rng()) & static_cast<uint32_t>(rng());  // ~1 in 4 allowed
    const std::vector<int32_t> banned{static_cast<int32_t>(r), 17};
    kernels::apply_adjust(std::span(want).subspan(r * vocab, vocab), kernels::sampling_params{}, {{}, banned, {}, allowed});
    for (int32_t id : banned) ban.push_back({r, id, 0, 1, 0.0f, 0.0f, 1.0f, 0});
    const size_t at = masks.size();
    masks.resize(at + words, 0u);
    std::copy(allowed.begin(), allowed.end(), masks.begin() + static_cast<std::ptrdiff_t>(at));
    mask_rows.push_back(r);
  }
  auto dl = to_device(logits);
  auto db = to_device(ban);
  auto dm = to_device(masks);
  auto dr = to_device(mask_rows);
  ASSERT_TRUE(cuda::adjust_logits(dl.as<float>(), vocab, db.as<cuda::device_adjust>(), ban.size(), nullptr).ok());
  ASSERT_TRUE(cuda::mask_logits(dl.as<float>(), vocab, dm.as<uint32_t>(), dr.as<uint32_t>(), mask_rows.size(), nullptr).ok());
  auto got = to_host<float>(dl, rows * vocab);
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u);
}

/// Every row's device draw equals kernels::sample on the same logits and parameters, token
/// for token: random, flat, peaked and tied rows under many (temperature, top-k, top-p).
TEST(CudaSample, DrawsTheCpuTokenForEveryRowAndParameterSet) {
  LLMESH_REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t vocab : {7ul, 1000ul, 4097ul, 32000ul, 128256ul}) {
    std::vector<kernels::sampling_params> ps;
    for (float t : {0.0f, 0.3f, 1.0f, 2.5f}) {
      for (int k : {0, 1, 2, 40, 5000}) {
        for (float p : {1.0f, 0.95f, 0.5f, 0.0f}) ps.push_back({t, k, p, 0});
      }
    }
    for (float mp : {0.02f, 0.3f, 1.0f}) {  // min_p, alone and before top-k / top-p
      for (auto [k, p] : {std::pair{0, 1.0f}, std::pair{40, 0.9f}}) {
        kernels::sampling_params q{1.0f, k, p, 0};
        q.min_p = mp;
        ps.push_back(q);
      }
    }
    const size_t rows = ps.size();
    std::vector<float> logits = random_floats(rows * vocab, 810 + static_cast<uint32_t>(vocab), -8, 8);
    for (size_t r = 0; r < rows; ++r) {
      float* row = logits.data() + r * vocab;
      switch (r % 5) {
        case 1:  // flat: top-p's threshold falls among thousands of near-equal masses
          for (size_t i = 0; i < vocab; ++i) row[i] *= 0.01f;
          break;
        case 2:  // few distinct values: wide ties at every threshold
          for (size_t i = 0; i < vocab; ++i) row[i] = std::round(row[i] / 4.0f);
          break;
        case 3:  // masked tokens
          for (size_t i = 0; i < vocab; i += 3) row[i] = -inf;
          break;
        default:
          break;
      }
    }
    std::vector<cuda::device_sample_row> args(rows);
    for (size_t r = 0; r < rows; ++r) {
      args[r] = {ps[r].temperature, ps[r].top_k, ps[r].top_p, 0, 1000 + r, 17 + 3 * r};
    }
    auto dl = to_device(logits);
    auto da = to_device(args);
    for (int draw = 0; draw < 3; ++draw) {  // new positions: new draws
      if (draw > 0) {
        for (auto& a : args) a.position += 101;
        da = to_device(args);
      }
      auto out = poisoned(rows * 4);
      ASSERT_TRUE(cuda::sample(dl.as<float>(), rows, vocab, da.as<cuda::device_sample_row>(), out.as<int32_t>(), nullptr).ok());
      auto got = to_host<int32_t>(out, rows);
      for (size_t r = 0; r < rows; ++r) {
        kernels::sampling_params q = ps[r];
        q.seed = args[r].seed;
        const int32_t want = kernels::sample(std::span<const float>(logits.data() + r * vocab, vocab), q, args[r].position);
        ASSERT_EQ(got[r], want) << "vocab " << vocab << " row " << r << " (kind " << r % 5 << ") T " << q.temperature << " k "
                                << q.top_k << " p " << q.top_p << " position " << args[r].position;
      }
    }
  }
}

/// A paged cache with shuffled block ids, filled with random keys and values.
struct paged_cache {
  size_t n_blocks, bs = 16, n_kv, hd;
  std::vector<float> keys, values;
  paged_cache(size_t blocks, size_t kv_heads, size_t head_dim, uint32_t salt)
      : n_blocks(blocks), n_kv(kv_heads), hd(head_dim) {
    keys = random_floats(blocks * bs * kv_heads * head_dim, salt);
    values = random_floats(blocks * bs * kv_heads * head_dim, salt + 1);
  }
};

// Full rotary with llama3 scaling, and Phi-4-mini's shape: 96 of 128 dims rotating with yarn
// frequencies and a scale on cos and sin (the dims after 96 pass to q, k and the cache as they are);
// with Ministral 3's query temperature (beta 0.1 over 16 positions) on top; and a SmolLM3 NoPE
// layer (rotate false: q and k unchanged, the cache written).
TEST(CudaRopeKv, BitIdenticalToCpuRopeAndCacheWrite) {
  LLMESH_REQUIRE_GPU();
  for (const size_t case_rot : {size_t{128}, size_t{96}, size_t{0}}) {
    SCOPED_TRACE("rotary_dim " + std::to_string(case_rot) + (case_rot == 0 ? " (NoPE)" : ""));
    const bool nope = case_rot == 0;
    const size_t rot = nope ? 128 : case_rot;
    const size_t n_heads = 8, n_kv = 2, hd = 128, T = 5, half = rot / 2, positions = 4096;
    kernels::rope_config rc;
    rc.head_dim = rot;
    rc.theta = 500000;
    rc.llama3 = rot == hd;
    if (rot != hd) {
      rc.yarn = true;
      rc.factor = 4.0;
      rc.original_max_position = 1024;
      rc.attention_factor = 1.1386;
    }
    auto inv = kernels::rope_inv_freq(rc);
    std::vector<float> cs(positions * half), sn(positions * half);
    for (size_t p = 0; p < positions; ++p) kernels::rope_angles(inv, p, &cs[p * half], &sn[p * half], kernels::rope_scale(rc));
    auto q = random_floats(T * n_heads * hd, 900), k = random_floats(T * n_kv * hd, 901), v = random_floats(T * n_kv * hd, 902);
    std::vector<int32_t> pos = {0, 1, 17, 4000, 4095}, slot = {3, 40, -1, 7, 0};
    const size_t slots = 64;
    auto dq = to_device(q), dk = to_device(k), dv = to_device(v), dcos = to_device(cs), dsin = to_device(sn);
    auto dpos = to_device(pos), dslot = to_device(slot);
    std::vector<float> qs(positions);
    for (size_t p = 0; p < positions; ++p) qs[p] = kernels::llama4_query_scale(p, 0.1, 16.0);
    auto dqs = to_device(qs);
    const bool tempered = rot == 96;
    std::vector<float> zeros(slots * n_kv * hd, 0.0f);
    auto kc = to_device(zeros), vc = to_device(zeros);
    cuda::rope_kv_args a;
    a.q = dq.as<float>();
    a.k = dk.as<float>();
    a.v = dv.as<float>();
    a.n_tokens = T;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv;
    a.head_dim = hd;
    a.rotary_dim = rot;
    a.rotate = !nope;
    a.q_scale = tempered ? dqs.as<float>() : nullptr;
    a.pos = dpos.as<int32_t>();
    a.slot = dslot.as<int32_t>();
    a.cos = dcos.as<float>();
    a.sin = dsin.as<float>();
    a.k_cache = kc.as<float>();
    a.v_cache = vc.as<float>();
    ASSERT_TRUE(cuda::rope_kv(a, nullptr).ok());
    auto want_q = q, want_k = k;
    std::vector<float> want_kc = zeros, want_vc = zeros;
    for (size_t t = 0; t < T; ++t) {
      if (slot[t] < 0) continue;  // padding rows are left alone
      if (!nope) {
        kernels::rope_apply(&want_q[t * n_heads * hd], n_heads, hd, rot, &cs[pos[t] * half], &sn[pos[t] * half]);
        kernels::rope_apply(&want_k[t * n_kv * hd], n_kv, hd, rot, &cs[pos[t] * half], &sn[pos[t] * half]);
      }
      if (tempered) {
        for (size_t d = 0; d < n_heads * hd; ++d) want_q[t * n_heads * hd + d] *= qs[pos[t]];
      }
      std::copy_n(&want_k[t * n_kv * hd], n_kv * hd, &want_kc[slot[t] * n_kv * hd]);
      std::copy_n(&v[t * n_kv * hd], n_kv * hd, &want_vc[slot[t] * n_kv * hd]);
    }
    EXPECT_TRUE(same_bits(to_host<float>(dq, q.size()), want_q));
    EXPECT_TRUE(same_bits(to_host<float>(dk, k.size()), want_k));
    EXPECT_TRUE(same_bits(to_host<float>(kc, zeros.size()), want_kc));
    EXPECT_TRUE(same_bits(to_host<float>(vc, zeros.size()), want_vc));
  }
}

struct attn_seq {
  size_t pos0, n;  // query rows at positions pos0 .. pos0 + n - 1
};

/// Runs GPU attention for `seqs` (each with its own shuffled block table over one cache) and
/// returns [T][n_heads][hd]; also the CPU oracle's answer in `want`.
std::vector<float> run_attention(const paged_cache& c, size_t n_heads, size_t window, const std::vector<attn_seq>& seqs,
                                 const std::vector<float>& q, std::vector<float>* want) {
  const size_t hd = c.hd;
  std::vector<int32_t> tables, pos, bt_off, tile0, tile_rows, tile_partial;
  std::vector<std::vector<int32_t>> per_seq;
  std::mt19937 rng(7);
  size_t t = 0, max_pos = 0, singles = 0, max_pos_single = 0;
  for (const auto& s : seqs) {
    const size_t blocks = (s.pos0 + s.n + c.bs - 1) / c.bs;
    std::vector<int32_t> ids(c.n_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(blocks);
    per_seq.push_back(ids);
    for (size_t i = 0; i < s.n; ++i, ++t) {
      pos.push_back(static_cast<int32_t>(s.pos0 + i));
      bt_off.push_back(static_cast<int32_t>(tables.size()));
      if (i % cuda::attention_tile_rows == 0) {
        const size_t rows = std::min(cuda::attention_tile_rows, s.n - i);
        tile0.push_back(static_cast<int32_t>(t));
        tile_rows.push_back(static_cast<int32_t>(rows));
        tile_partial.push_back(rows == 1 ? static_cast<int32_t>(singles++) : -1);
        if (rows == 1) max_pos_single = std::max(max_pos_single, s.pos0 + i);
      }
    }
    tables.insert(tables.end(), ids.begin(), ids.end());
    max_pos = std::max(max_pos, s.pos0 + s.n - 1);
  }
  const size_t T = t, parts = max_pos_single / cuda::attention_partition + 1;
  (void)max_pos;
  auto dq = to_device(q), dk = to_device(c.keys), dv = to_device(c.values);
  auto dpos = to_device(pos), dbt = to_device(bt_off), dtab = to_device(tables), dt0 = to_device(tile0),
       dtr = to_device(tile_rows), dtp = to_device(tile_partial);
  auto out = poisoned(T * n_heads * hd * 4);
  const size_t pf = cuda::attention_partials_floats(singles, n_heads, hd, parts);
  auto partials = poisoned(std::max<size_t>(pf, 1) * 4);
  cuda::attention_args a;
  a.q = dq.as<float>();
  a.out = out.as<float>();
  a.k_cache = dk.as<float>();
  a.v_cache = dv.as<float>();
  a.pos = dpos.as<int32_t>();
  a.bt_offset = dbt.as<int32_t>();
  a.block_tables = dtab.as<int32_t>();
  a.tile_token0 = dt0.as<int32_t>();
  a.tile_rows = dtr.as<int32_t>();
  a.tile_partial = dtp.as<int32_t>();
  a.n_tiles = tile0.size();
  a.n_tokens = T;
  a.n_heads = n_heads;
  a.n_kv_heads = c.n_kv;
  a.head_dim = hd;
  a.block_size = c.bs;
  a.sliding_window = window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.max_partitions = parts;
  a.partials = partials.as<float>();
  EXPECT_TRUE(cuda::attention(a, nullptr).ok());
  if (want) {
    kernels::kv_layer_view view{const_cast<float*>(c.keys.data()), const_cast<float*>(c.values.data()), c.n_blocks};
    kernels::attention_shape shape;
    shape.n_heads = n_heads;
    shape.n_kv_heads = c.n_kv;
    shape.head_dim = hd;
    shape.block_size = c.bs;
    shape.sliding_window = window;
    shape.scale = a.scale;
    want->assign(T * n_heads * hd, 0.0f);
    std::vector<kernels::attention_seq> cs;
    size_t at = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      cs.push_back({q.data() + at * n_heads * hd, want->data() + at * n_heads * hd, seqs[i].pos0, seqs[i].n, per_seq[i]});
      at += seqs[i].n;
    }
    kernels::thread_pool pool(2);
    EXPECT_TRUE(kernels::attention(view, shape, cs, pool).ok());
  }
  return to_host<float>(out, T * n_heads * hd);
}

TEST(CudaAttention, MatchesCpuAcrossShapesWindowsAndPartitions) {
  LLMESH_REQUIRE_GPU();
  struct shape_case {
    size_t n_heads, n_kv, hd, window;
    std::vector<attn_seq> seqs;
  };
  const shape_case cases[] = {
      {8, 2, 128, 0, {{0, 37}, {100, 1}, {0, 1}}},            // prefill tiles + decode rows
      {4, 4, 40, 0, {{500, 30}, {1100, 1}, {1530, 3}}},       // rows across 128-position partitions
      {8, 1, 64, 8, {{0, 20}, {700, 2}}},                     // sliding window (Mistral)
      {32, 8, 128, 0, {{1023, 1}, {511, 2}, {0, 16}, {127, 1}, {128, 1}, {255, 17}}},  // partition edges
      {6, 2, 256, 300, {{900, 5}}},                           // hd 256, window across partitions
  };
  uint32_t salt = 1000;
  for (const auto& c : cases) {
    paged_cache cache(120, c.n_kv, c.hd, salt++);
    size_t T = 0;
    for (const auto& s : c.seqs) T += s.n;
    auto q = random_floats(T * c.n_heads * c.hd, salt++);
    std::vector<float> want;
    auto got = run_attention(cache, c.n_heads, c.window, c.seqs, q, &want);
    EXPECT_LT(rel_error(got, want), 1e-5) << "heads=" << c.n_heads << " hd=" << c.hd << " window=" << c.window;
  }
}

TEST(CudaAttention, RowsAreBatchAndChunkInvariant) {
  LLMESH_REQUIRE_GPU();
  const size_t n_heads = 8, n_kv = 2, hd = 128;
  paged_cache cache(120, n_kv, hd, 1100);
  // One sequence of 40 rows at 600..639, prefilled whole, then the same rows in chunks of 7
  // and one by one (the one-row decode path); every row's output must carry the same bits.
  // (Same block table: seed 7.)
  auto q = random_floats(40 * n_heads * hd, 1101);
  auto whole = run_attention(cache, n_heads, 0, {{600, 40}}, q, nullptr);
  const size_t row = n_heads * hd;
  for (size_t chunk : {7, 1}) {
    for (size_t start = 0; start < 40; start += chunk) {
      const size_t n = std::min(chunk, 40 - start);
      std::vector<float> qs(q.begin() + static_cast<ptrdiff_t>(start * row), q.begin() + static_cast<ptrdiff_t>((start + n) * row));
      auto got = run_attention(cache, n_heads, 0, {{600 + start, n}}, qs, nullptr);
      std::vector<float> want(whole.begin() + static_cast<ptrdiff_t>(start * row),
                              whole.begin() + static_cast<ptrdiff_t>((start + n) * row));
      EXPECT_TRUE(same_bits(got, want)) << "chunk " << chunk << " at " << start;
    }
  }
}

}  // namespace
}  // namespace llmesh::gpu_testing
