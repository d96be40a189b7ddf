#include "llmesh/bench/matmul_bench.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "llmesh/bench/engine_bench.hpp"
#include "llmesh/kernels/cpu_features.hpp"
#include "llmesh/kernels/matmul.hpp"
#include "llmesh/kernels/quantize.hpp"
#include "llmesh/kernels/thread_pool.hpp"

namespace llmesh::bench {
namespace {

namespace k = kernels;

constexpr k::dtype all_types[] = {k::dtype::f32,  k::dtype::f16,  k::dtype::bf16, k::dtype::q8,   k::dtype::fp8,  k::dtype::q4,
                                  k::dtype::mxfp4, k::dtype::q2_k, k::dtype::q3_k, k::dtype::q4_k, k::dtype::q5_k, k::dtype::q6_k,
                                  k::dtype::iq4_xs};

/// The bench's name of a type: bf16, int8, int4, q4_k, ... (lower-case dtype_name; q8 is int8,
/// q4 int4).
std::string type_name(k::dtype t) {
  if (t == k::dtype::q8) return "int8";
  if (t == k::dtype::q4) return "int4";
  std::string s(k::dtype_name(t));
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

struct weights {
  k::dtype type;
  std::vector<uint8_t> bytes;
  size_t ldw = 0;  ///< elements per row (cols, or q8's padded row)
};

result<weights> make_weights(k::dtype t, size_t rows, size_t cols, std::mt19937& rng) {
  weights w{t, {}, cols};
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  if (t == k::dtype::q8) {
    std::vector<float> f(rows * cols);
    for (auto& x : f) x = value(rng);
    w.ldw = k::q8_row_elements(cols);
    w.bytes.resize(k::dtype_bytes(t, rows * w.ldw));
    LLMESH_TRY(k::quantize_q8(f.data(), k::dtype::f32, rows, cols, w.bytes.data()));
    return w;
  }
  w.bytes.resize(k::dtype_bytes(t, rows * cols));
  if (t == k::dtype::fp8) {  // every code but NaN's, scale 0.002 (an FP8 checkpoint's layers)
    w.ldw = k::q8_row_elements(cols);
    w.bytes.resize(k::dtype_bytes(t, rows * w.ldw));
    std::uniform_int_distribution<int> code(0, 253);
    for (auto& b : w.bytes) {
      const int c = code(rng);
      b = static_cast<uint8_t>(c < 127 ? c : c + 1);
    }
    const float s = 0.002f;
    for (size_t b = 0; b < w.bytes.size() / k::q8_block_bytes; ++b) std::memcpy(w.bytes.data() + b * k::q8_block_bytes, &s, 4);
    return w;
  }
  if (t == k::dtype::q4) {  // random nibbles, factor 0.001 and offset 8 × 0.001 (as Q4_0's)
    w.ldw = k::q8_row_elements(cols);
    w.bytes.resize(k::dtype_bytes(t, rows * w.ldw));
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : w.bytes) b = static_cast<uint8_t>(byte(rng));
    const float f = 0.001f, m = 8.0f * f;
    for (size_t b = 0; b < w.bytes.size() / k::q4_block_bytes; ++b) {
      std::memcpy(w.bytes.data() + b * k::q4_block_bytes, &f, 4);
      std::memcpy(w.bytes.data() + b * k::q4_block_bytes + 4, &m, 4);
    }
    return w;
  }
  if (t == k::dtype::mxfp4) {  // random nibbles, scale 2^-8 (exponent byte 119: GPT-OSS's experts' range)
    w.ldw = k::q8_row_elements(cols);
    w.bytes.resize(k::dtype_bytes(t, rows * w.ldw));
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : w.bytes) b = static_cast<uint8_t>(byte(rng));
    const float s = std::ldexp(1.0f, -9);  // 2^(119 - 128)
    for (size_t b = 0; b < w.bytes.size() / k::mxfp4_block_bytes; ++b) std::memcpy(w.bytes.data() + b * k::mxfp4_block_bytes, &s, 4);
    return w;
  }
  if (!k::is_k_quant(t)) {
    std::vector<float> f(rows * cols);
    for (auto& x : f) x = value(rng);
    if (t == k::dtype::f32) {
      std::memcpy(w.bytes.data(), f.data(), w.bytes.size());
      return w;
    }
    LLMESH_TRY(k::convert_rows(f.data(), k::dtype::f32, rows, cols, w.bytes.data(), t));
    return w;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : w.bytes) b = static_cast<uint8_t>(byte(rng));
  const uint16_t d = k::f32_to_f16(0.001f);
  const size_t bb = k::dtype_block_bytes(t);
  for (size_t b = 0; b < w.bytes.size() / bb; ++b) {
    for (size_t at : k::k_quant_halves(t)) std::memcpy(w.bytes.data() + b * bb + at, &d, 2);
  }
  return w;
}

}  // namespace

status run_matmul_bench(const matmul_bench_options& opt) {
  if (opt.cols == 0 || opt.cols % k::k_block != 0) {
    return make_error(errc::invalid_request, "--cols must be a positive multiple of 256 (the K-quant super-block)");
  }
  if (opt.rows == 0 || opt.m.empty() || opt.reps < 1 || opt.threads < 1) {
    return make_error(errc::invalid_request, "--rows, --m, --reps and --threads must be positive");
  }
  const size_t max_m = *std::max_element(opt.m.begin(), opt.m.end());
  // Each type's matrix and its float32 staging copy, and x and y: refuse what cannot fit.
  if (opt.rows > (size_t{1} << 31) / opt.cols || max_m > (size_t{1} << 28) / std::max(opt.rows, opt.cols)) {
    return make_error(errc::invalid_request, "--rows x --cols is at most 2^31 weights and --m x max(--rows, --cols) at most 2^28");
  }
  std::vector<k::dtype> types;
  if (opt.types.empty()) {
    for (k::dtype t : all_types) {
      if (t != k::dtype::f32 && t != k::dtype::f16) types.push_back(t);
    }
  }
  for (const auto& name : opt.types) {
    auto it = std::find_if(std::begin(all_types), std::end(all_types), [&](k::dtype t) { return type_name(t) == name; });
    if (it == std::end(all_types)) {
      std::string known;
      for (k::dtype t : all_types) known += (known.empty() ? "" : ", ") + type_name(t);
      return make_error(errc::invalid_request, "--types: unknown type '" + name + "' (known: " + known + ")");
    }
    types.push_back(*it);
  }
  std::mt19937 rng(7);
  std::vector<weights> ws;
  for (k::dtype t : types) {
    auto w = make_weights(t, opt.rows, opt.cols, rng);
    if (!w) return w.take_error();
    ws.push_back(std::move(w.value()));
  }
  std::vector<float> x(max_m * opt.cols), y(max_m * opt.rows);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (auto& v : x) v = value(rng);
  k::thread_pool pool(opt.threads);

  const double bw = measure_read_bandwidth(opt.threads, size_t{1} << 30, 3);
  std::printf("llmesh bench matmul: %zu x %zu weights, threads %d, isa %s\n", opt.rows, opt.cols, opt.threads,
              std::string(k::isa_name(k::active_isa())).c_str());
  std::printf("  bandwidth %.1f GB/s (read, %d threads, 1 GiB, best of 3)\n", bw / 1e9, opt.threads);
  for (size_t m : opt.m) {
    std::vector<double> best(ws.size(), 1e30);
    for (int r = 0; r < opt.reps; ++r) {  // interleaved: a noisy moment costs every type alike
      for (size_t i = 0; i < ws.size(); ++i) {
        k::matmul_args a;
        a.x = x.data();
        a.ldx = opt.cols;
        a.w = ws[i].bytes.data();
        a.ldw = ws[i].ldw;
        a.w_type = ws[i].type;
        a.y = y.data();
        a.ldy = opt.rows;
        a.m = m;
        a.n = opt.rows;
        a.k = opt.cols;
        const auto t0 = std::chrono::steady_clock::now();
        LLMESH_TRY(k::matmul(a, pool));
        best[i] = std::min(best[i], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    double int8_rate = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
      if (ws[i].type == k::dtype::q8) int8_rate = static_cast<double>(opt.rows * opt.cols) / best[i];
    }
    std::printf("  m = %zu\n  %-8s %10s %12s %10s %12s %9s %10s\n", m, "type", "bytes/w", "G weights/s", "GB/s", "of bandwidth",
                "x int8", "GMAC/s");
    for (size_t i = 0; i < ws.size(); ++i) {
      const double weights_s = static_cast<double>(opt.rows * opt.cols) / best[i];
      const double bytes_s = static_cast<double>(ws[i].bytes.size()) / best[i];
      std::printf("  %-8s %10.3f %12.2f %10.1f %11.1f%% ", type_name(ws[i].type).c_str(),
                  static_cast<double>(ws[i].bytes.size()) / static_cast<double>(opt.rows * opt.cols), weights_s / 1e9,
                  bytes_s / 1e9, 100.0 * bytes_s / bw);
      if (int8_rate > 0) {
        std::printf("%8.2fx", weights_s / int8_rate);
      } else {
        std::printf("%9s", "-");
      }
      std::printf(" %10.1f\n", weights_s * static_cast<double>(m) / 1e9);
    }
  }
  return ok_status();
}

}  // namespace llmesh::bench
