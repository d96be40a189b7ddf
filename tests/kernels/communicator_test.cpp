// Tests of the in-process communicator: rank-ordered, identical all-reduce sums; rank-ordered
// all-gather with uneven sizes; size mismatches; and abort() waking a blocked peer.
// Each rank runs on its own std::thread under a watchdog, so a hang fails instead of stalling.
#include "llmesh/kernels/communicator.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace llmesh::kernels {
namespace {

using namespace std::chrono_literals;

/// Runs fn(rank) on one thread per rank and joins them. If they have not all finished within
/// `limit`, a collective hung: the process cannot join those threads, so it reports and aborts.
template <class Fn>
void run_ranks(int n, Fn fn, std::chrono::milliseconds limit = 10s) {
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      fn(r);
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, limit, [&] { return done == n; })) {
      std::fprintf(stderr, "communicator test: ranks still blocked after %lld ms (hang)\n",
                   static_cast<long long>(limit.count()));
      std::abort();
    }
  }
  for (auto& t : threads) t.join();
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(LocalCommunicator, ReportsRankAndSize) {
  for (int n : {1, 2, 3}) {
    auto comms = make_local_communicators(n);
    ASSERT_EQ(comms.size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(comms[r]->rank(), r);
      EXPECT_EQ(comms[r]->size(), n);
    }
  }
}

TEST(LocalCommunicator, AllReduceSumIsTheRankOrderedSumOnEveryRank) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp2(-12, 12);
  for (int n : {1, 2, 3}) {
    auto comms = make_local_communicators(n);
    const size_t len = 1001;
    const int rounds = 50;  // back-to-back collectives reuse the barrier
    // input[round][rank][i], with magnitudes wide enough that the order of the sum shows.
    std::vector<std::vector<std::vector<float>>> input(rounds, std::vector<std::vector<float>>(n));
    for (auto& round : input) {
      for (auto& rank : round) {
        rank.resize(len);
        for (float& x : rank) x = std::ldexp(val(rng), exp2(rng));
      }
      if (n == 3) {  // element 0: (1 + 1e8) - 1e8 = 0 in rank order, 1 in reverse order
        round[0][0] = 1.0f;
        round[1][0] = 1e8f;
        round[2][0] = -1e8f;
      }
    }
    std::vector<std::vector<std::vector<float>>> result = input;
    std::vector<int> failures(n, 0);
    run_ranks(n, [&](int r) {
      for (int round = 0; round < rounds; ++round) failures[r] += !comms[r]->all_reduce_sum(result[round][r]).ok();
    });
    for (int r = 0; r < n; ++r) ASSERT_EQ(failures[r], 0) << "n " << n << " rank " << r;
    for (int round = 0; round < rounds; ++round) {
      for (size_t i = 0; i < len; ++i) {
        float want = input[round][0][i];
        for (int r = 1; r < n; ++r) want = want + input[round][r][i];
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(bits_of(result[round][r][i]), bits_of(want))
              << "n " << n << " round " << round << " rank " << r << " element " << i;
        }
      }
      if (n == 3) {
        EXPECT_EQ(result[round][0][0], 0.0f);
      }
    }
  }
}

TEST(LocalCommunicator, AllGatherConcatenatesInRankOrder) {
  const std::vector<std::vector<size_t>> size_sets = {{4}, {2, 7}, {3, 0, 5}, {1, 6, 2}};
  for (const auto& sizes : size_sets) {
    const int n = static_cast<int>(sizes.size());
    auto comms = make_local_communicators(n);
    size_t total = 0;
    std::vector<std::vector<float>> in(n);
    std::vector<float> want;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < sizes[r]; ++i) in[r].push_back(static_cast<float>(100 * r + i));
      want.insert(want.end(), in[r].begin(), in[r].end());
      total += sizes[r];
    }
    std::vector<std::vector<float>> out(n, std::vector<float>(total, -1.0f));
    std::vector<int> failures(n, 0);
    run_ranks(n, [&](int r) {
      for (int round = 0; round < 20; ++round) failures[r] += !comms[r]->all_gather(in[r], out[r]).ok();
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(failures[r], 0) << "n " << n << " rank " << r;
      EXPECT_EQ(out[r], want) << "n " << n << " rank " << r;
    }
  }
}

TEST(LocalCommunicator, AllReduceSizeMismatchFailsOnEveryRank) {
  for (const std::vector<size_t>& sizes : {std::vector<size_t>{4, 5}, std::vector<size_t>{4, 4, 5}}) {
    const int n = static_cast<int>(sizes.size());
    auto comms = make_local_communicators(n);
    std::vector<std::vector<float>> data(n);
    for (int r = 0; r < n; ++r) data[r].assign(sizes[r], 1.0f);
    std::vector<int> ok(n, -1);
    run_ranks(n, [&](int r) { ok[r] = comms[r]->all_reduce_sum(data[r]).ok(); });
    for (int r = 0; r < n; ++r) EXPECT_EQ(ok[r], 0) << "n " << n << " rank " << r;
  }
}

TEST(LocalCommunicator, AllGatherWrongOutputSizeFailsOnEveryRank) {
  auto comms = make_local_communicators(3);
  std::vector<std::vector<float>> in = {{1, 2}, {3}, {4, 5, 6}};
  std::vector<std::vector<float>> out = {std::vector<float>(6), std::vector<float>(5), std::vector<float>(6)};
  std::vector<int> ok(3, -1);
  run_ranks(3, [&](int r) { ok[r] = comms[r]->all_gather(in[r], out[r]).ok(); });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(ok[r], 0) << "rank " << r;
}

TEST(LocalCommunicator, AbortWakesAPeerBlockedInAllReduce) {
  for (int n : {2, 3}) {
    auto comms = make_local_communicators(n);
    std::vector<std::vector<float>> data(n, std::vector<float>(16, 1.0f));
    std::vector<errc> code(n, errc::internal);
    std::vector<int> ok(n, -1);
    run_ranks(
        n,
        [&](int r) {
          if (r == n - 1) {
            // The failing rank: never joins; the others are already waiting for it.
            std::this_thread::sleep_for(50ms);
            comms[r]->abort();
            return;
          }
          status s = comms[r]->all_reduce_sum(data[r]);
          ok[r] = s.ok();
          if (!s.ok()) code[r] = s.err().code;
        },
        5s);
    for (int r = 0; r + 1 < n; ++r) {
      EXPECT_EQ(ok[r], 0) << "n " << n << " rank " << r;
      EXPECT_EQ(code[r], errc::shard_failed) << "n " << n << " rank " << r;
    }
  }
}

TEST(LocalCommunicator, CollectivesFailAfterAbort) {
  for (int n : {1, 2, 3}) {
    auto comms = make_local_communicators(n);
    comms[0]->abort();
    std::vector<errc> reduce_code(n, errc::internal), gather_code(n, errc::internal);
    run_ranks(
        n,
        [&](int r) {
          std::vector<float> data(4, 1.0f), out(4 * n);
          status s = comms[r]->all_reduce_sum(data);
          if (!s.ok()) reduce_code[r] = s.err().code;
          status g = comms[r]->all_gather(data, out);
          if (!g.ok()) gather_code[r] = g.err().code;
        },
        5s);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(reduce_code[r], errc::shard_failed) << "n " << n << " rank " << r;
      EXPECT_EQ(gather_code[r], errc::shard_failed) << "n " << n << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace llmesh::kernels
