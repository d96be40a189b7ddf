// The replica actor in a real CAF system: requests sent as messages stream their tokens back
// to the submitter, equal to generate() alone per request; cancellation and refused requests
// are answered.
#include <chrono>
#include <set>

#include "llmesh/actors/replica_actor.hpp"
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

class ReplicaActor : public testing::replica_test_base {
 protected:
  caf::actor_system_config cfg_ = [] {
    caf::actor_system_config c;
    c.set("scheduler.max-threads", 2);  // the machine's 2 cores; the shards run detached
    return c;
  }();
};

TEST_F(ReplicaActor, StreamsEveryRequestsTokensToItsSubmitter) {
  auto reqs = requests(12);
  auto want = alone(reqs, 1);
  auto eng = engine(1, 1024);
  caf::actor_system sys{cfg_};
  testing::actor_reaper reap;
  scheduler_config sc;
  sc.max_batch_tokens = 48;
  auto replica = reap(sys.spawn(replica_actor, eng.get(), sc));
  caf::scoped_actor self{sys};
  for (const auto& r : reqs) self->send(replica, generate_atom::value, r, caf::actor{self});
  std::map<uint64_t, std::vector<int32_t>> got;
  std::set<uint64_t> done;
  bool timed_out = false;
  while (done.size() < reqs.size() && !timed_out) {
    self->receive(
        [&](const token_msg& t) {
          ASSERT_FALSE(t.failed) << t.err.message;
          got[t.id].push_back(t.token);
          if (t.finish != finish_reason::none) done.insert(t.id);
        },
        caf::after(std::chrono::seconds(30)) >> [&] { timed_out = true; });
  }
  ASSERT_FALSE(timed_out);
  for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id;
  self->send_exit(replica, caf::exit_reason::user_shutdown);
}

TEST_F(ReplicaActor, RefusesBadRequestsAndCancels) {
  auto eng = engine(1, 256);
  caf::actor_system sys{cfg_};
  testing::actor_reaper reap;
  auto replica = reap(sys.spawn(replica_actor, eng.get(), scheduler_config{}));
  caf::scoped_actor self{sys};
  replica_request bad;
  bad.id = 7;
  bad.prompt = {1, 999};  // outside the vocabulary
  self->send(replica, generate_atom::value, bad, caf::actor{self});
  self->receive([&](const token_msg& t) {
    EXPECT_EQ(t.id, 7u);
    EXPECT_TRUE(t.failed);
    EXPECT_EQ(t.err.code, errc::invalid_request);
  }, caf::after(std::chrono::seconds(10)) >> [&] { ADD_FAILURE() << "no answer"; });
  // Cancel, then ask for the replica's status until it holds no request: messages between two
  // actors keep their order, so once a status says so the cancel has been handled and every
  // token the replica sent before it has arrived too — no token may follow it. (A status can
  // be answered during a step, before a cancel that arrived in that step is applied: the
  // replica defers the cancel to the step's end, and a loaded machine may start the step
  // before the cancel arrives. Then it still counts the request.)
  replica_request longer;
  longer.id = 8;
  longer.prompt = {1, 2, 3};
  longer.max_tokens = 200;
  self->send(replica, generate_atom::value, longer, caf::actor{self});
  self->send(replica, cancel_atom::value, uint64_t{8});
  self->send(replica, status_atom::value, caf::actor{self});
  size_t before = 0, after = 0;
  bool have_status = false, quiet = false;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!have_status) {
    self->receive([&](const token_msg& t) { ++before; EXPECT_EQ(t.finish, finish_reason::none); },
                  [&](const replica_load& l) {
                    EXPECT_TRUE(l.ready);
                    have_status = l.running + l.waiting == 0;
                    if (!have_status && std::chrono::steady_clock::now() < give_up) {
                      self->send(replica, status_atom::value, caf::actor{self});
                    } else if (!have_status) {
                      have_status = true;
                      ADD_FAILURE() << "the cancelled request is still held";
                    }
                  },
                  caf::after(std::chrono::seconds(10)) >> [&] { have_status = true; ADD_FAILURE() << "no status"; });
  }
  while (!quiet) {
    self->receive([&](const token_msg&) { ++after; }, caf::after(std::chrono::milliseconds(300)) >> [&] { quiet = true; });
  }
  EXPECT_EQ(after, 0u);
  EXPECT_LT(before, 200u);
  // The replica still serves after a cancel.
  longer.id = 9;
  longer.max_tokens = 3;
  self->send(replica, generate_atom::value, longer, caf::actor{self});
  size_t got = 0;
  bool finished = false;
  while (!finished) {
    self->receive([&](const token_msg& t) { ++got; finished = t.finish != finish_reason::none; },
                  caf::after(std::chrono::seconds(10)) >> [&] { finished = true; ADD_FAILURE() << "no tokens"; });
  }
  EXPECT_EQ(got, 3u);
  self->send_exit(replica, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace llmesh::actors

namespace llmesh::actors {
namespace {

class ReplicaActorPrefill : public testing::replica_test_base {
 protected:
  caf::actor_system_config cfg_ = [] {
    caf::actor_system_config c;
    c.set("scheduler.max-threads", 2);
    return c;
  }();
};

// Disaggregated prefill at the replica: a prefill answers its owner with the prompt's whole
// blocks (never tokens); a cancelled one answers nothing — once a status says the replica holds
// nothing, no answer may follow (messages between two actors keep their order).
TEST_F(ReplicaActorPrefill, APrefillAnswersWithBlocksAndACancelledOneWithNothing) {
  auto eng = engine(1, 1024);
  caf::actor_system sys{cfg_};
  testing::actor_reaper reap;
  scheduler_config sc;
  sc.max_batch_tokens = 8;  // a 200-token prompt takes 25 steps: the cancel comes long before its end
  auto replica = reap(sys.spawn(replica_actor, eng.get(), sc));
  caf::scoped_actor self{sys};
  replica_request r;
  r.id = 5;
  for (int i = 0; i < 200; ++i) r.prompt.push_back((i * 7) % 300);
  r.max_tokens = 40;
  self->send(replica, prefill_atom::value, r, caf::actor{self});
  self->send(replica, cancel_atom::value, uint64_t{5});
  self->send(replica, status_atom::value, caf::actor{self});
  size_t answers = 0;
  bool idle = false;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!idle) {
    self->receive([&](const prefill_reply&) { ++answers; }, [&](const token_msg&) { ADD_FAILURE() << "a prefill sent a token"; },
                  [&](const replica_load& l) {
                    idle = l.running + l.waiting == 0;
                    if (!idle && std::chrono::steady_clock::now() < give_up) self->send(replica, status_atom::value, caf::actor{self});
                    else if (!idle) idle = true, ADD_FAILURE() << "the cancelled prefill is still held";
                  },
                  caf::after(std::chrono::seconds(10)) >> [&] { idle = true; ADD_FAILURE() << "no status"; });
  }
  bool quiet = false;
  while (!quiet) {
    self->receive([&](const prefill_reply&) { ++answers; }, caf::after(std::chrono::milliseconds(300)) >> [&] { quiet = true; });
  }
  EXPECT_EQ(answers, 0u);
  // Not cancelled: its blocks come back (every whole block but the last token's), no token.
  r.id = 6;
  self->send(replica, prefill_atom::value, r, caf::actor{self});
  self->receive(
      [&](const prefill_reply& p) {
        EXPECT_EQ(p.id, 6u);
        ASSERT_TRUE(p.ok) << p.err.message;
        EXPECT_EQ(p.prefix.tokens, std::vector<int32_t>(r.prompt.begin(), r.prompt.begin() + 192));
        ASSERT_TRUE(p.prefix.data);
        EXPECT_EQ(p.prefix.data->size(), 24 * eng->kv_block_bytes());
      },
      [&](const token_msg&) { ADD_FAILURE() << "a prefill sent a token"; },
      caf::after(std::chrono::seconds(20)) >> [&] { ADD_FAILURE() << "no answer"; });
  // A refused one answers at once with why.
  r.id = 7;
  r.prompt = {1, 999};
  self->send(replica, prefill_atom::value, r, caf::actor{self});
  self->receive([&](const prefill_reply& p) {
    EXPECT_EQ(p.id, 7u);
    EXPECT_FALSE(p.ok);
    EXPECT_EQ(p.err.code, errc::invalid_request) << p.err.message;
  }, caf::after(std::chrono::seconds(10)) >> [&] { ADD_FAILURE() << "no answer"; });
  self->send_exit(replica, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace llmesh::actors
