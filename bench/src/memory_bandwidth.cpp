// A stream-like read kernel: threads sum disjoint slices of a large buffer as 64-bit integers
// (integer sums may be reordered, so the compiler vectorises them; nothing is written back),
// every other round with software prefetch too: the best of both is the machine's read rate.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "llmesh/bench/engine_bench.hpp"
#include "llmesh/kernels/thread_pool.hpp"

namespace llmesh::bench {

double measure_read_bandwidth(int threads, size_t bytes, int reps) {
  std::vector<uint64_t> buf(bytes / 8, 1);  // written once: pages are resident before timing
  kernels::thread_pool pool(threads);
  std::vector<uint64_t> sums(static_cast<size_t>(pool.size()) * 8);
  double best = 0.0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int t, int n) {
      auto [b, e] = kernels::thread_pool::split(buf.size(), t, n);
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      size_t i = b;
      if (r % 2 == 1) {  // odd rounds also prefetch 4 KiB ahead, as the decode kernels do
        for (; i + 8 <= e; i += 8) {
          __builtin_prefetch(&buf[std::min(i + 512, e - 1)], 0, 3);
          s0 += buf[i] + buf[i + 4];
          s1 += buf[i + 1] + buf[i + 5];
          s2 += buf[i + 2] + buf[i + 6];
          s3 += buf[i + 3] + buf[i + 7];
        }
      }
      for (; i + 4 <= e; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
      }
      for (; i < e; ++i) s0 += buf[i];
      sums[static_cast<size_t>(t) * 8] = s0 + s1 + s2 + s3;  // one cache line per thread
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) / s);
  }
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  if (total != buf.size()) return 0.0;  // keeps the sums live; never true
  return best;
}

}  // namespace llmesh::bench
