// Tests of the thread pool: every thread index runs once per region, split() partitions
// exactly, many back-to-back regions complete, and a pool of one runs on the caller.
#include "llmesh/kernels/thread_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace llmesh::kernels {
namespace {

TEST(ThreadPool, RunCallsEveryThreadIndexExactlyOnce) {
  for (int size : {1, 2, 3, 4}) {
    thread_pool pool(size);
    ASSERT_EQ(pool.size(), size);
    for (int region = 0; region < 100; ++region) {
      std::vector<std::atomic<int>> calls(size);
      std::atomic<int> wrong_count{0};
      pool.run([&](int t, int n) {
        if (n != size || t < 0 || t >= size) {
          ++wrong_count;
          return;
        }
        ++calls[t];
      });
      ASSERT_EQ(wrong_count.load(), 0) << "size " << size;
      for (int t = 0; t < size; ++t) ASSERT_EQ(calls[t].load(), 1) << "size " << size << " thread " << t;
    }
  }
}

TEST(ThreadPool, RunWithSplitCoversEveryItemExactlyOnce) {
  for (int size : {1, 2, 3}) {
    thread_pool pool(size);
    for (size_t items : {0, 1, 2, 3, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(items);
      pool.run([&](int t, int n) {
        auto [begin, end] = thread_pool::split(items, t, n);
        for (size_t i = begin; i < end; ++i) ++hits[i];
      });
      for (size_t i = 0; i < items; ++i) ASSERT_EQ(hits[i].load(), 1) << "size " << size << " item " << i;
    }
  }
}

TEST(ThreadPool, SplitPartitionsTheRangeExactly) {
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 300; ++n) lengths.push_back(n);
  for (size_t n : {size_t{1000}, size_t{4096}, size_t{65537}, size_t{1} << 30}) lengths.push_back(n);
  lengths.push_back(size_t{1} << 40);
  for (size_t n : lengths) {
    for (int parts = 1; parts <= 33; ++parts) {
      size_t expect_begin = 0;
      for (int i = 0; i < parts; ++i) {
        auto [begin, end] = thread_pool::split(n, i, parts);
        ASSERT_EQ(begin, expect_begin) << "n " << n << " parts " << parts << " part " << i;
        ASSERT_LE(begin, end) << "n " << n << " parts " << parts << " part " << i;
        // Balanced: every part holds floor(n / parts) or one more.
        ASSERT_GE(end - begin, n / parts) << "n " << n << " parts " << parts << " part " << i;
        ASSERT_LE(end - begin, n / parts + 1) << "n " << n << " parts " << parts << " part " << i;
        expect_begin = end;
      }
      ASSERT_EQ(expect_begin, n) << "n " << n << " parts " << parts;
    }
  }
}

TEST(ThreadPool, CompletesManyQuickRegions) {
  for (int size : {2, 3}) {
    thread_pool pool(size);
    std::atomic<int64_t> sum{0};
    const int regions = 10000;
    for (int region = 0; region < regions; ++region) {
      pool.run([&](int t, int) { sum.fetch_add(t + 1, std::memory_order_relaxed); });
    }
    EXPECT_EQ(sum.load(), static_cast<int64_t>(regions) * size * (size + 1) / 2) << "size " << size;
  }
}

TEST(ThreadPool, RunReturnsOnlyAfterEveryThreadFinished) {
  thread_pool pool(3);
  for (int region = 0; region < 20; ++region) {
    std::vector<int> done(3, 0);  // plain ints: run() must publish the workers' writes
    pool.run([&](int t, int) {
      if (t != 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      done[t] = region + 1;
    });
    for (int t = 0; t < 3; ++t) ASSERT_EQ(done[t], region + 1) << "region " << region << " thread " << t;
  }
}

TEST(ThreadPool, SizeOneRunsInlineOnTheCaller) {
  thread_pool pool(1);
  ASSERT_EQ(pool.size(), 1);
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  int calls = 0;
  pool.run([&](int t, int n) {
    ran_on = std::this_thread::get_id();
    EXPECT_EQ(t, 0);
    EXPECT_EQ(n, 1);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ran_on, caller);
}

TEST(ThreadPool, CallerIsThreadZeroAndWorkersAreOtherThreads) {
  thread_pool pool(3);
  std::vector<std::thread::id> ids(3);
  pool.run([&](int t, int) { ids[t] = std::this_thread::get_id(); });
  EXPECT_EQ(ids[0], std::this_thread::get_id());
  EXPECT_NE(ids[1], ids[0]);
  EXPECT_NE(ids[2], ids[0]);
  EXPECT_NE(ids[1], ids[2]);
}

TEST(ThreadPool, ZeroThreadsMeansOnePerHardwareThread) {
  thread_pool pool(0);
  EXPECT_EQ(pool.size(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::atomic<int> calls{0};
  pool.run([&](int, int) { ++calls; });
  EXPECT_EQ(calls.load(), pool.size());
}

TEST(ThreadPool, ConstructsAndDestroysWithoutRunning) {
  // Workers that never saw a region must still notice the stop and exit (no hang in join).
  for (int i = 0; i < 50; ++i) {
    thread_pool pool(3);
    if (i % 2 == 0) pool.run([](int, int) {});
  }
  SUCCEED();
}

}  // namespace
}  // namespace llmesh::kernels
