// The tensor plane between processes (tensor_communicator), over the in-process loopback
// network: after join, collectives give every rank the same bits as the in-process
// communicator; a wrong key, an impostor or a stranger's bytes are refused; abort(), a dead
// peer and a peer that never arrives fail the group within bounded time; create() checks its
// options; and two engine parts (engine::create_part), one per rank, each over its own
// communicator, compute the same logits, bit for bit, as one tp=2 engine.
// Every rank runs on its own std::thread under a watchdog, so a hang fails instead of stalling.
#include "llmesh/actors/tensor_communicator.hpp"

#include <gtest/gtest.h>

#include <atomic>
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

#include "../model/temp_dir.hpp"
#include "llmesh/kernels/communicator.hpp"
#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/random_model.hpp"
#include "llmesh/transport/loopback.hpp"

namespace llmesh::actors {
namespace {

using namespace std::chrono_literals;
using transport::loopback_network;
using transport::loopback_transport;

const std::string group_key = "0123456789abcdef-the-group-key";

/// Runs fn(rank) on one thread per rank and joins them. If they have not all finished within
/// `limit`, a rank hung: the threads cannot be joined, so the process reports and aborts.
template <class Fn>
void run_ranks(int n, Fn fn, std::chrono::milliseconds limit = 20s) {
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      fn(r);
      std::lock_guard lock(mu);
      ++done;
      cv.notify_all();
    });
  }
  {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, limit, [&] { return done == n; })) {
      std::fprintf(stderr, "tensor_communicator test: ranks still blocked after %lld ms (hang)\n",
                   static_cast<long long>(limit.count()));
      std::abort();
    }
  }
  for (auto& t : threads) t.join();
}

/// One rank's communicator on its own loopback transport.
std::unique_ptr<tensor_communicator> make_rank(const std::shared_ptr<loopback_network>& net, int rank, int size,
                                               std::chrono::milliseconds timeout, const std::string& key = group_key) {
  auto c = tensor_communicator::create(std::make_shared<loopback_transport>(net), "rank" + std::to_string(rank) + ":0",
                                       {rank, size, key, timeout});
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.err().message);
  return c.ok() ? std::move(*c) : nullptr;
}

std::vector<std::string> addresses_of(const std::vector<std::unique_ptr<tensor_communicator>>& comms) {
  std::vector<std::string> out;
  for (const auto& c : comms) out.push_back(c->address());
  return out;
}

/// Every rank's join(), concurrently; returns their statuses by rank.
std::vector<status> join_all(const std::vector<std::unique_ptr<tensor_communicator>>& comms) {
  const auto addrs = addresses_of(comms);
  std::vector<status> st(comms.size());
  run_ranks(static_cast<int>(comms.size()), [&](int r) { st[static_cast<size_t>(r)] = comms[static_cast<size_t>(r)]->join(addrs); });
  return st;
}

/// A joined group of `n` ranks (the network outlives the communicators: declared first).
struct group {
  std::shared_ptr<loopback_network> net = std::make_shared<loopback_network>();
  std::vector<std::unique_ptr<tensor_communicator>> comms;

  group(int n, std::chrono::milliseconds timeout) {
    for (int r = 0; r < n; ++r) comms.push_back(make_rank(net, r, n, timeout));
    for (auto& c : comms) {
      if (!c) return;
    }
    for (const auto& s : join_all(comms)) EXPECT_TRUE(s.ok()) << s.err().message;
  }
  bool ok() const {
    for (const auto& c : comms) {
      if (!c) return false;
    }
    return true;
  }
};

/// Random values over 16 orders of magnitude, both signs: float sums of them depend on the order.
std::vector<float> awkward(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-8, 8);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(mant(rng), exp(rng) * 3);
  return v;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

/// EXPECT that two float vectors hold the same bits; reports the first difference.
void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (bits_of(a[i]) != bits_of(b[i])) {
      ADD_FAILURE() << what << ": element " << i << " differs: " << a[i] << " vs " << b[i];
      return;
    }
  }
}

// One round of the script below: all-reduce (len > 0 or 0) or all-gather (per-rank sizes).
struct round {
  bool gather = false;
  size_t len = 0;                 ///< all-reduce length
  std::vector<size_t> gather_of;  ///< all-gather: floats per rank
};

/// Runs the script on `comms` (one thread per rank); returns out[rank][round].
template <class Comm>
std::vector<std::vector<std::vector<float>>> run_script(const std::vector<Comm*>& comms, const std::vector<round>& script) {
  const int n = static_cast<int>(comms.size());
  std::vector<std::vector<std::vector<float>>> out(static_cast<size_t>(n));
  run_ranks(n, [&](int r) {
    for (size_t i = 0; i < script.size(); ++i) {
      const auto& rd = script[i];
      const uint32_t seed = static_cast<uint32_t>(1000 * i + 17 * r + 3);
      if (rd.gather) {
        auto in = awkward(rd.gather_of[static_cast<size_t>(r)], seed);
        size_t total = 0;
        for (size_t s : rd.gather_of) total += s;
        std::vector<float> o(total, -1.0f);
        auto s = comms[static_cast<size_t>(r)]->all_gather(in, o);
        EXPECT_TRUE(s.ok()) << "rank " << r << " round " << i << ": " << s.err().message;
        out[static_cast<size_t>(r)].push_back(std::move(o));
      } else {
        auto data = awkward(rd.len, seed);
        auto s = comms[static_cast<size_t>(r)]->all_reduce_sum(data);
        EXPECT_TRUE(s.ok()) << "rank " << r << " round " << i << ": " << s.err().message;
        out[static_cast<size_t>(r)].push_back(std::move(data));
      }
    }
  });
  return out;
}

std::vector<round> script_for(int n) {
  std::vector<size_t> uneven;
  for (int r = 0; r < n; ++r) uneven.push_back(r == 1 ? 0 : static_cast<size_t>(3 + 5 * r));  // rank 1 sends nothing
  return {
      {false, 1000, {}},
      {false, 1, {}},
      {true, 0, uneven},
      {false, 0, {}},  // an empty all-reduce is still a round
      {false, 70000, {}},
      {true, 0, std::vector<size_t>(static_cast<size_t>(n), 64)},
      {false, 333, {}},
  };
}

TEST(TensorCommunicator, CollectivesGiveEveryRankTheInProcessBits) {
  for (int n : {2, 3}) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    group g(n, 30s);
    ASSERT_TRUE(g.ok());
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(g.comms[static_cast<size_t>(r)]->rank(), r);
      EXPECT_EQ(g.comms[static_cast<size_t>(r)]->size(), n);
    }
    const auto script = script_for(n);
    std::vector<tensor_communicator*> remote;
    for (auto& c : g.comms) remote.push_back(c.get());
    auto local_owned = kernels::make_local_communicators(n);
    std::vector<kernels::communicator*> local;
    for (auto& c : local_owned) local.push_back(c.get());
    const auto got = run_script(remote, script);
    const auto want = run_script(local, script);

    for (size_t i = 0; i < script.size(); ++i) {
      for (int r = 0; r < n; ++r) {
        expect_same_bits(got[static_cast<size_t>(r)][i], want[0][i],
                         "round " + std::to_string(i) + " rank " + std::to_string(r) + " vs the in-process communicator");
        expect_same_bits(got[static_cast<size_t>(r)][i], got[0][i], "round " + std::to_string(i) + " rank " + std::to_string(r) + " vs rank 0");
      }
    }
    // The all-reduce is the rank-ordered sum, and the inputs are awkward enough that another
    // order gives other bits (so bit equality above means the same order; with two ranks
    // there is only one sum: a + b == b + a in floats).
    const size_t len = script[0].len;
    std::vector<std::vector<float>> in;
    for (int r = 0; r < n; ++r) in.push_back(awkward(len, static_cast<uint32_t>(17 * r + 3)));
    size_t order_matters = 0;
    for (size_t k = 0; k < len; ++k) {
      float fwd = in[0][k], rev = in[static_cast<size_t>(n - 1)][k];
      for (int r = 1; r < n; ++r) fwd = fwd + in[static_cast<size_t>(r)][k];
      for (int r = n - 2; r >= 0; --r) rev = rev + in[static_cast<size_t>(r)][k];
      EXPECT_EQ(bits_of(got[0][0][k]), bits_of(fwd)) << "element " << k;
      if (bits_of(fwd) != bits_of(rev)) ++order_matters;
    }
    if (n >= 3) {
      EXPECT_GT(order_matters, 10u);
    }
    // The all-gather is the concatenation in rank order.
    const auto& uneven = script[2].gather_of;
    std::vector<float> cat;
    for (int r = 0; r < n; ++r) {
      auto part = awkward(uneven[static_cast<size_t>(r)], static_cast<uint32_t>(1000 * 2 + 17 * r + 3));
      cat.insert(cat.end(), part.begin(), part.end());
    }
    for (int r = 0; r < n; ++r) expect_same_bits(got[static_cast<size_t>(r)][2], cat, "all_gather rank " + std::to_string(r));
    EXPECT_GT(g.comms[0]->bytes_sent(), 70000u * 4 * static_cast<unsigned>(n - 1));
  }
}

TEST(TensorCommunicator, EachRanksFirstCollectiveMayFollowItsJoinAtOnce) {
  // As on the nodes: every rank joins and starts collecting at once, on its own thread. A
  // rank whose join returns must not have its first values overtake its greeting to a peer
  // still waiting in join. Many fresh groups, of two and three ranks.
  for (int iter = 0; iter < 200; ++iter) {
    const int n = 2 + iter % 2;
    auto net = std::make_shared<loopback_network>();
    std::vector<std::unique_ptr<tensor_communicator>> comms;
    for (int r = 0; r < n; ++r) comms.push_back(make_rank(net, r, n, 30s));
    ASSERT_TRUE(comms.back());
    const auto addrs = addresses_of(comms);
    std::vector<status> st(static_cast<size_t>(n));
    run_ranks(n, [&](int r) {
      auto& c = *comms[static_cast<size_t>(r)];
      auto& s = st[static_cast<size_t>(r)];
      s = c.join(addrs);
      std::vector<float> v{static_cast<float>(r + 1)};
      if (s.ok()) s = c.all_reduce_sum(v);
      if (s.ok() && v[0] != (n == 2 ? 3.0f : 6.0f)) s = make_error(errc::internal, "wrong sum " + std::to_string(v[0]));
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[static_cast<size_t>(r)].ok()) << "iteration " << iter << " rank " << r << ": " << st[static_cast<size_t>(r)].err().message;
    }
  }
}

TEST(TensorCommunicator, AWrongKeyIsRefused) {
  auto net = std::make_shared<loopback_network>();
  std::vector<std::unique_ptr<tensor_communicator>> comms;
  comms.push_back(make_rank(net, 0, 2, 300ms));
  comms.push_back(make_rank(net, 1, 2, 300ms, "another-key-of-at-least-16-bytes"));
  ASSERT_TRUE(comms[0] && comms[1]);
  auto st = join_all(comms);
  // Rank 1 closes rank 0's connection (its greeting has the wrong key): rank 0 learns at once;
  // rank 1 never hears a good greeting and gives up at its deadline.
  ASSERT_FALSE(st[0].ok());
  EXPECT_EQ(st[0].err().code, errc::shard_failed) << st[0].err().message;
  ASSERT_FALSE(st[1].ok());
  EXPECT_EQ(st[1].err().code, errc::deadline_exceeded) << st[1].err().message;
  // Neither can run a collective afterwards.
  run_ranks(2, [&](int r) {
    std::vector<float> v{1.0f};
    auto s = comms[static_cast<size_t>(r)]->all_reduce_sum(v);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.err().code, errc::shard_failed) << s.err().message;
  });
}

TEST(TensorCommunicator, ImpostorsAndStrangersDoNotSpoilTheGroup) {
  auto net = std::make_shared<loopback_network>();
  std::vector<std::unique_ptr<tensor_communicator>> comms;
  comms.push_back(make_rank(net, 0, 2, 10s));
  comms.push_back(make_rank(net, 1, 2, 10s));
  ASSERT_TRUE(comms[0] && comms[1]);
  const auto addrs = addresses_of(comms);

  // A stranger's garbage, and an impostor claiming rank 0 with the wrong key, reach rank 1
  // before the real rank 0: both are turned away, and the impostor's join fails.
  std::atomic<int> stranger_down{0};
  transport::loopback_transport stranger(net);
  stranger.set_handlers({nullptr, nullptr, [&](transport::peer_id, const error&) { ++stranger_down; }});
  auto sp = stranger.connect(addrs[1]);
  ASSERT_TRUE(sp.ok());
  ASSERT_TRUE(stranger.send(*sp, {1, 2, 3}).ok());
  auto impostor = make_rank(net, 0, 2, 10s, "not-the-group-key-but-long-enough");
  ASSERT_TRUE(impostor);
  std::vector<status> st(2);
  std::jthread rank1([&] { st[1] = comms[1]->join(addrs); });  // joined on every way out
  auto is = impostor->join(addrs);
  ASSERT_FALSE(is.ok());
  EXPECT_EQ(is.err().code, errc::shard_failed) << is.err().message;
  net->drain();
  EXPECT_EQ(stranger_down.load(), 1);

  // The real rank 0 joins; a second rank 0 with the right key, after it, is refused too.
  st[0] = comms[0]->join(addrs);
  rank1.join();
  ASSERT_TRUE(st[0].ok()) << st[0].err().message;
  ASSERT_TRUE(st[1].ok()) << st[1].err().message;
  auto twin = make_rank(net, 0, 2, 10s);
  ASSERT_TRUE(twin);
  auto ts = twin->join(addrs);
  ASSERT_FALSE(ts.ok());
  EXPECT_EQ(ts.err().code, errc::shard_failed) << ts.err().message;

  // The group still works, and only its members' values are summed.
  run_ranks(2, [&](int r) {
    std::vector<float> v{static_cast<float>(r + 1), 10.0f};
    auto s = comms[static_cast<size_t>(r)]->all_reduce_sum(v);
    ASSERT_TRUE(s.ok()) << s.err().message;
    EXPECT_EQ(v, (std::vector<float>{3.0f, 20.0f}));
  });
}

TEST(TensorCommunicator, AbortWakesAPeerInsideACollective) {
  group g(2, 30s);  // a hang would show as the watchdog's abort, not as a slow pass
  ASSERT_TRUE(g.ok());
  std::atomic<int> failed_calls{0};
  errc failed_code = errc::internal;
  g.comms[0]->set_on_failed([&](const error& e) {
    failed_code = e.code;
    ++failed_calls;
  });
  status s0;
  std::thread rank0([&] {
    std::vector<float> v(100, 1.0f);
    s0 = g.comms[0]->all_reduce_sum(v);
  });
  std::this_thread::sleep_for(100ms);  // rank 0 is (most likely) waiting inside by now
  g.comms[1]->abort();
  run_ranks(1, [&](int) { rank0.join(); });
  ASSERT_FALSE(s0.ok());
  EXPECT_EQ(s0.err().code, errc::shard_failed) << s0.err().message;
  g.net->drain();
  EXPECT_EQ(failed_calls.load(), 1);
  EXPECT_EQ(failed_code, errc::shard_failed);
  // The group stays failed on both ranks, for both kinds of collective.
  for (auto& c : g.comms) {
    std::vector<float> v(4, 1.0f), o(8);
    auto s = c->all_reduce_sum(v);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.err().code, errc::shard_failed);
    s = c->all_gather(v, o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.err().code, errc::shard_failed);
  }
  EXPECT_EQ(failed_calls.load(), 1);
}

TEST(TensorCommunicator, AbortFromAnotherThreadWakesItsOwnRankAndThePeers) {
  group g(3, 30s);
  ASSERT_TRUE(g.ok());
  std::vector<status> st(2);
  std::thread waiting([&] {
    run_ranks(2, [&](int r) {  // ranks 0 and 1 wait for rank 2, which never comes
      std::vector<float> v(10, 1.0f);
      st[static_cast<size_t>(r)] = g.comms[static_cast<size_t>(r)]->all_reduce_sum(v);
    });
  });
  std::this_thread::sleep_for(100ms);
  g.comms[0]->abort();  // from this thread, while rank 0's own thread waits in the collective
  waiting.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(st[static_cast<size_t>(r)].ok()) << "rank " << r;
    EXPECT_EQ(st[static_cast<size_t>(r)].err().code, errc::shard_failed) << st[static_cast<size_t>(r)].err().message;
  }
  std::vector<float> v(10, 1.0f);
  auto s = g.comms[2]->all_reduce_sum(v);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::shard_failed);
}

TEST(TensorCommunicator, APeerThatDiesFailsTheCollective) {
  {  // dies while the other rank waits inside a collective
    group g(2, 30s);
    ASSERT_TRUE(g.ok());
    status s0;
    std::thread rank0([&] {
      std::vector<float> v(100, 1.0f);
      s0 = g.comms[0]->all_reduce_sum(v);
    });
    std::this_thread::sleep_for(100ms);
    g.comms[1].reset();  // its transport goes with it: the loopback's "process died"
    run_ranks(1, [&](int) { rank0.join(); });
    ASSERT_FALSE(s0.ok());
    EXPECT_EQ(s0.err().code, errc::shard_failed) << s0.err().message;
  }
  {  // died before the collective
    group g(3, 30s);
    ASSERT_TRUE(g.ok());
    g.comms[2].reset();
    g.net->drain();
    std::vector<status> st(2);
    run_ranks(2, [&](int r) {
      std::vector<float> v(10, 1.0f);
      st[static_cast<size_t>(r)] = g.comms[static_cast<size_t>(r)]->all_reduce_sum(v);
    });
    for (int r = 0; r < 2; ++r) {
      ASSERT_FALSE(st[static_cast<size_t>(r)].ok()) << "rank " << r;
      EXPECT_EQ(st[static_cast<size_t>(r)].err().code, errc::shard_failed) << st[static_cast<size_t>(r)].err().message;
    }
  }
}

TEST(TensorCommunicator, APeerThatNeverArrivesIsADeadline) {
  group g(2, 1s);
  ASSERT_TRUE(g.ok());
  status s0;
  run_ranks(1, [&](int) {
    std::vector<float> v(10, 1.0f);
    s0 = g.comms[0]->all_reduce_sum(v);  // rank 1 never calls
  });
  ASSERT_FALSE(s0.ok());
  EXPECT_EQ(s0.err().code, errc::deadline_exceeded) << s0.err().message;
  // Rank 0 gave up on the group, so rank 1's late collective fails instead of waiting.
  std::vector<float> v(10, 1.0f);
  auto s1 = g.comms[1]->all_reduce_sum(v);
  ASSERT_FALSE(s1.ok());
  EXPECT_EQ(s1.err().code, errc::shard_failed) << s1.err().message;
  // A join whose peer never shows up is a deadline too.
  auto net = std::make_shared<loopback_network>();
  auto alone = make_rank(net, 1, 2, 300ms);
  ASSERT_TRUE(alone);
  auto js = alone->join({"rank0:nowhere", alone->address()});
  ASSERT_FALSE(js.ok());
  EXPECT_EQ(js.err().code, errc::deadline_exceeded) << js.err().message;
}

TEST(TensorCommunicator, MismatchedLengthsFailTheGroup) {
  group g(2, 30s);
  ASSERT_TRUE(g.ok());
  std::vector<status> st(2);
  run_ranks(2, [&](int r) {
    std::vector<float> v(static_cast<size_t>(4 + r), 1.0f);
    st[static_cast<size_t>(r)] = g.comms[static_cast<size_t>(r)]->all_reduce_sum(v);
  });
  // The rank that notices first fails with internal; the other may see that failure first.
  auto one_internal = [&] {
    for (const auto& s : st) {
      EXPECT_FALSE(s.ok());
      if (!s.ok()) {
        EXPECT_TRUE(s.err().code == errc::internal || s.err().code == errc::shard_failed) << s.err().message;
      }
    }
    return (!st[0].ok() && st[0].err().code == errc::internal) || (!st[1].ok() && st[1].err().code == errc::internal);
  };
  EXPECT_TRUE(one_internal());
  // An all-gather whose output does not hold every rank's values.
  group h(2, 30s);
  ASSERT_TRUE(h.ok());
  run_ranks(2, [&](int r) {
    std::vector<float> in(3, 1.0f), out(5);
    st[static_cast<size_t>(r)] = h.comms[static_cast<size_t>(r)]->all_gather(in, out);
  });
  EXPECT_TRUE(one_internal());
}

TEST(TensorCommunicator, CreateAndJoinCheckTheirArguments) {
  auto net = std::make_shared<loopback_network>();
  auto make = [&](int rank, int size, std::string key) {
    return tensor_communicator::create(std::make_shared<loopback_transport>(net), "x:0", {rank, size, std::move(key), 1s});
  };
  auto short_key = make(0, 2, std::string(15, 'k'));
  ASSERT_FALSE(short_key.ok());
  EXPECT_EQ(short_key.err().code, errc::invalid_request);
  for (auto [rank, size] : std::vector<std::pair<int, int>>{{-1, 2}, {2, 2}, {5, 2}, {0, 0}}) {
    auto c = make(rank, size, group_key);
    ASSERT_FALSE(c.ok()) << "rank " << rank << " of " << size;
    EXPECT_EQ(c.err().code, errc::invalid_request);
  }
  auto ok16 = make(1, 2, std::string(16, 'k'));
  ASSERT_TRUE(ok16.ok()) << ok16.err().message;
  EXPECT_EQ((*ok16)->rank(), 1);
  EXPECT_EQ((*ok16)->size(), 2);
  EXPECT_FALSE((*ok16)->address().empty());
  auto wrong = (*ok16)->join({(*ok16)->address()});  // one address for two ranks
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.err().code, errc::invalid_request);
  // A listener address already taken is the transport's error.
  auto taken = tensor_communicator::create(std::make_shared<loopback_transport>(net), (*ok16)->address(), {0, 2, group_key, 1s});
  EXPECT_FALSE(taken.ok());
  // A group of one joins at once and its collectives are the identity.
  auto one = make(0, 1, group_key);
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE((*one)->join({(*one)->address()}).ok());
  std::vector<float> v{1.5f, -2.0f}, o(2);
  ASSERT_TRUE((*one)->all_reduce_sum(v).ok());
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f}));
  ASSERT_TRUE((*one)->all_gather(v, o).ok());
  EXPECT_EQ(o, v);
}

// --- engine parts over the tensor plane ---------------------------------------------------

class temp_model {
 public:
  explicit temp_model(const model::random_model_spec& spec) {
    EXPECT_TRUE(model::write_random_model(spec, dir_.path()).ok());
    auto m = model::model::load(dir_.path());
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
    if (m.ok()) model_ = m.value();
  }
  std::shared_ptr<const model::model> get() const { return model_; }

 private:
  model::testing::temp_dir dir_;
  std::shared_ptr<const model::model> model_;
};

TEST(TensorCommunicator, EnginePartsInTwoGroupsMatchOneProcess) {
  model::random_model_spec spec;
  spec.hidden = 96;
  spec.intermediate = 200;
  spec.n_layers = 2;
  spec.n_heads = 6;
  spec.n_kv_heads = 2;
  spec.vocab = 300;
  spec.dtype = kernels::dtype::bf16;
  spec.seed = 5;
  temp_model tm(spec);
  ASSERT_TRUE(tm.get());

  model::engine_options o;
  o.tp = 2;
  o.threads = 2;  // one kernel thread per rank, here and in the parts
  o.kv_tokens = 256;
  o.block_size = 4;
  auto whole = model::engine::create(tm.get(), o);
  ASSERT_TRUE(whole.ok()) << whole.err().message;

  group g(2, 30s);
  ASSERT_TRUE(g.ok());
  std::vector<std::unique_ptr<model::engine>> parts;
  for (int r = 0; r < 2; ++r) {
    model::engine_options po = o;
    po.threads = 1;
    std::vector<std::unique_ptr<kernels::communicator>> comms;
    comms.push_back(std::move(g.comms[static_cast<size_t>(r)]));
    auto e = model::engine::create_part(tm.get(), po, std::move(comms));
    ASSERT_TRUE(e.ok()) << e.err().message;
    EXPECT_EQ((*e)->local_ranks(), std::vector<int>{r});
    EXPECT_EQ((*e)->kv_blocks(), (*whole)->kv_blocks());
    parts.push_back(std::move(*e));
  }

  // Two sequences with their own, non-contiguous blocks: a 7-token prompt and a 5-token one
  // (whose logits are not wanted at first), then four decode steps of both.
  std::vector<int32_t> prompt_a{11, 48, 85, 122, 159, 196, 233}, prompt_b{7, 290, 3, 150, 42};
  const std::vector<int32_t> table_a{5, 2, 9}, table_b{7, 1, 30};
  std::vector<std::vector<int32_t>> tokens{prompt_a, prompt_b};
  std::vector<size_t> pos{0, 0};
  const size_t vocab = (*whole)->config().vocab;
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<model::step_sequence> batch{{tokens[0], pos[0], table_a, true}, {tokens[1], pos[1], table_b, step > 0}};
    const size_t rows = step > 0 ? 2 : 1;
    std::vector<float> want;
    ASSERT_TRUE((*whole)->forward(batch, want).ok());
    ASSERT_EQ(want.size(), rows * vocab);
    for (auto& p : parts) ASSERT_TRUE(p->check_batch(batch).ok());
    std::vector<std::vector<float>> got(2);
    std::vector<status> st(2);
    run_ranks(2, [&](int r) { st[static_cast<size_t>(r)] = parts[static_cast<size_t>(r)]->forward_rank(r, batch, got[static_cast<size_t>(r)]); });
    ASSERT_TRUE(st[0].ok()) << st[0].err().message;
    ASSERT_TRUE(st[1].ok()) << st[1].err().message;
    ASSERT_EQ(got[0].size(), want.size());
    EXPECT_EQ(std::memcmp(got[0].data(), want.data(), want.size() * sizeof(float)), 0) << "rank 0's logits differ";
    for (size_t i = 0; i < want.size(); ++i) {
      if (bits_of(got[0][i]) != bits_of(want[i])) {
        ADD_FAILURE() << "logit " << i << ": " << got[0][i] << " vs " << want[i];
        break;
      }
    }
    // Greedy next tokens (from the reference), one per sequence.
    for (size_t s = 0; s < 2; ++s) {
      pos[s] += tokens[s].size();
      const size_t row = step == 0 ? 0 : s;
      const int32_t next = kernels::argmax(std::span<const float>(want).subspan(row * vocab, vocab));
      tokens[s] = {step == 0 && s == 1 ? int32_t{99} : next};
    }
  }

  // A part runs only its own rank, and never a whole step.
  std::vector<int32_t> t{1};
  std::vector<model::step_sequence> batch{{t, pos[0], table_a, true}};
  std::vector<float> logits;
  auto s = parts[0]->forward_rank(1, batch, logits);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::invalid_request);
  s = parts[0]->forward(batch, logits);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::invalid_request);
}

TEST(TensorCommunicator, APartWhosePeerDiesFailsItsStep) {
  model::random_model_spec spec;
  spec.n_heads = 4;
  spec.n_kv_heads = 2;
  temp_model tm(spec);
  ASSERT_TRUE(tm.get());
  group g(2, 30s);
  ASSERT_TRUE(g.ok());
  model::engine_options o;
  o.tp = 2;
  o.threads = 1;
  o.kv_tokens = 64;
  o.block_size = 16;
  std::vector<std::unique_ptr<kernels::communicator>> comms;
  comms.push_back(std::move(g.comms[0]));
  auto part = model::engine::create_part(tm.get(), o, std::move(comms));
  ASSERT_TRUE(part.ok()) << part.err().message;
  g.comms[1].reset();  // rank 1's process dies before the step
  std::vector<int32_t> t{1, 2, 3};
  const std::vector<int32_t> table{0};
  std::vector<model::step_sequence> batch{{t, 0, table, true}};
  std::vector<float> logits;
  status s;
  run_ranks(1, [&](int) { s = (*part)->forward_rank(0, batch, logits); });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::shard_failed) << s.err().message;
  // The part is failed for good.
  auto c = (*part)->check_batch(batch);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.err().code, errc::shard_failed);
}

}  // namespace
}  // namespace llmesh::actors
