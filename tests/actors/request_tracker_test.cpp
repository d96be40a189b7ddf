// Failover: a request whose replica dies after k tokens continues on another replica (its own
// engine) and the client's stream — the tokens before plus the tokens after — equals what one
// uninterrupted generate() produces, for greedy and sampled requests and every k; the number
// of moves is bounded.
#include "llmesh/actors/request_tracker.hpp"
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

class RequestTracker : public testing::replica_test_base {};

/// Runs `r` on `rc` until `stop_after` tokens arrived (or the end), feeding `t`.
void run_until(replica_core& rc, const replica_request& r, request_tracker& t, size_t stop_after) {
  ASSERT_TRUE(rc.submit(r).ok());
  size_t got = 0;
  while (!rc.idle() && got < stop_after) {
    auto ev = rc.step();
    ASSERT_TRUE(ev.ok());
    for (const auto& e : *ev) {
      if (e.id != r.id) continue;
      t.on_token(e.token, e.finish != finish_reason::none);
      ++got;
    }
  }
}

TEST_F(RequestTracker, StreamContinuesExactlyOnAnotherReplica) {
  auto reqs = requests(6);
  auto want = alone(reqs, 1);
  for (const auto& r : reqs) {
    for (size_t k = 1; k < want[r.id].size(); k += 3) {
      request_tracker t(r, 3);
      {
        auto first = engine(1, 512);
        replica_core a(*first, scheduler_config{});
        run_until(a, r, t, k);
      }  // replica A dies with its engine
      ASSERT_EQ(t.generated().size(), k);
      auto next = t.failover();
      ASSERT_TRUE(next.ok()) << next.err().message;
      auto second = engine(1, 512);
      replica_core b(*second, scheduler_config{});
      run_until(b, *next, t, SIZE_MAX);
      EXPECT_TRUE(t.finished());
      EXPECT_EQ(std::vector<int32_t>(t.generated().begin(), t.generated().end()), want[r.id])
          << "request " << r.id << " moved after " << k << " tokens";
    }
  }
}

TEST_F(RequestTracker, MovesAreBoundedAndFinishedRequestsStay) {
  replica_request r;
  r.id = 1;
  r.prompt = {1, 2};
  r.max_tokens = 10;
  request_tracker t(r, 2);
  t.on_token(5, false);
  ASSERT_TRUE(t.failover().ok());
  auto second = t.failover();
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->prompt, (std::vector<int32_t>{1, 2, 5}));
  EXPECT_EQ(second->max_tokens, 9u);
  auto third = t.failover();
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.err().code, errc::replica_unavailable);
  request_tracker done(r, 2);
  done.on_token(7, true);
  EXPECT_EQ(done.failover().err().code, errc::invalid_request);
}

}  // namespace
}  // namespace llmesh::actors
