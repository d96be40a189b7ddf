// The NCCL device communicator on the device(s) at hand: a one-rank group works end to end;
// a missing peer ends in a bounded-time error rather than a hang; an aborted group refuses
// work; two ranks on one GPU either work or fail cleanly (NCCL refuses duplicate devices).
// Skipped without a device (label gpu).
#include <chrono>
#include <thread>

#include "gpu_test_util.hpp"
#include "llmesh/kernels/device_communicator.hpp"

namespace llmesh::gpu_testing {
namespace {

using namespace std::chrono_literals;

TEST(NcclCommunicator, OneRankGroupReducesAndGathers) {
  LLMESH_REQUIRE_GPU();
  auto id = kernels::nccl_make_id();
  ASSERT_TRUE(id.ok()) << id.err().message;
  auto c = kernels::nccl_connect(*id, 0, 1, 0, 20s);
  ASSERT_TRUE(c.ok()) << c.err().message;
  auto s = cuda::stream::create();
  ASSERT_TRUE(s.ok());
  auto x = random_floats(1000, 1);
  auto d = to_device(x);
  auto out = poisoned(1000 * 4);
  ASSERT_TRUE((*c)->all_reduce_sum(d.as<float>(), 1000, s->get()).ok());
  ASSERT_TRUE((*c)->all_gather(d.as<float>(), 1000, out.as<float>(), s->get()).ok());
  ASSERT_TRUE((*c)->wait(s->get()).ok());
  EXPECT_TRUE(same_bits(to_host<float>(d, 1000), x));
  EXPECT_TRUE(same_bits(to_host<float>(out, 1000), x));
  (*c)->abort();
  auto after = (*c)->all_reduce_sum(d.as<float>(), 1000, s->get());
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.err().code, errc::shard_failed);
}

TEST(NcclCommunicator, MissingPeerFailsWithinTheTimeout) {
  LLMESH_REQUIRE_GPU();
  auto id = kernels::nccl_make_id();
  ASSERT_TRUE(id.ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto c = kernels::nccl_connect(*id, 0, 2, 0, 3s);  // rank 1 never comes
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.err().code, errc::shard_failed) << c.err().message;
  EXPECT_LT(waited, 30s);  // bounded: the deadline plus NCCL's abort, not forever
}

TEST(NcclCommunicator, TwoRanksOnOneDeviceWorkOrFailCleanly) {
  LLMESH_REQUIRE_GPU();
  auto id = kernels::nccl_make_id();
  ASSERT_TRUE(id.ok());
  std::unique_ptr<kernels::device_communicator> comms[2];
  status st[2];
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::thread([&, r] {
      auto c = kernels::nccl_connect(*id, r, 2, 0, 15s);
      if (c.ok()) comms[r] = std::move(*c); else st[r] = c.take_error();
    });
  }
  for (auto& t : ranks) t.join();
  if (!st[0].ok() || !st[1].ok()) {
    const auto& e = !st[0].ok() ? st[0].err() : st[1].err();
    std::printf("nccl: two ranks on one GPU refused: %s\n", e.message.c_str());
    SUCCEED();
    return;
  }
  // NCCL accepted the group: the all-reduce must sum both ranks.
  std::vector<float> ones(256, 1.0f), twos(256, 2.0f);
  cuda::buffer d[2] = {to_device(ones), to_device(twos)};
  status done[2];
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::thread([&, r] {
      auto s = cuda::stream::create();
      if (!s) { done[r] = s.take_error(); return; }
      done[r] = comms[r]->all_reduce_sum(d[r].as<float>(), 256, s->get());
      if (done[r].ok()) done[r] = comms[r]->wait(s->get());
    });
  }
  for (auto& t : ranks) t.join();
  std::printf("nccl: two ranks on one GPU accepted; all-reduce %s\n", done[0].ok() && done[1].ok() ? "ok" : "failed");
  if (done[0].ok() && done[1].ok()) {
    EXPECT_TRUE(same_bits(to_host<float>(d[0], 256), std::vector<float>(256, 3.0f)));
  }
}

}  // namespace
}  // namespace llmesh::gpu_testing
