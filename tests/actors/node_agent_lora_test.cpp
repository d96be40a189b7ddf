// A node agent's side of runtime LoRA updates (node_agent_lora.cpp), in one process: the agent
// is told its coordinator is a recording actor, gets Assign and "lora" frames as the bridge
// would deliver them, and its answers are read back. Covered: an update that comes while a
// replica is still loading is applied once it has loaded and answered before the replica is
// ready; one the loading replica cannot apply fails its start (unless undone meanwhile); a load of a name loaded from another directory is refused; the
// commands of one model are answered in the order they came. And an assignment's own engine
// setting: expert_parallel reaches the replica's engine.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>

#include <caf/all.hpp>

#include "../model/temp_dir.hpp"
#include "llmesh/actors/bridge_actor.hpp"
#include "llmesh/actors/coordinator.hpp"
#include "llmesh/actors/node_agent.hpp"
#include "llmesh/model/random_model.hpp"

namespace llmesh::actors {
namespace {

/// An Assign that starts replica `replica` of `model` from `path` at tp `tp` (16 MiB of KV cache).
transport::assign_msg start_msg(uint64_t replica, const std::string& model, const std::string& path, uint32_t tp) {
  transport::assign_msg a;
  a.replica = replica;
  a.model = model;
  a.path = path;
  a.tp = tp;
  a.kv_cache_mb = 16;
  a.op = transport::assign_op::start;
  return a;
}

using json = nlohmann::json;

/// What the agent sends its coordinator, one line each: "reply ok 7 applied 1" (the running
/// copies it went to), "reply no 7: why",
/// "ready 1", "dead 1: why".
struct recorder {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> lines;
  void add(std::string l) {
    std::lock_guard lock(mu);
    lines.push_back(std::move(l));
    cv.notify_all();
  }
  /// The next line (within 30 s), or "" on a timeout.
  std::string next() {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return !lines.empty(); })) return "";
    auto l = std::move(lines.front());
    lines.pop_front();
    return l;
  }
};

caf::behavior fake_coordinator(caf::event_based_actor*, std::shared_ptr<recorder> rec) {
  return {
      [rec](wire_atom, transport::peer_id, const std::shared_ptr<transport::envelope>& e) {
        if (const auto* r = std::get_if<transport::control_reply_msg>(&e->msg)) {
          auto j = json::parse(r->json);
          rec->add(std::string("reply ") + (r->ok ? "ok " : "no ") + std::to_string(j["lora_update"].get<uint64_t>()) +
                   (r->ok ? " applied " + std::to_string(j.value("applied", -1)) : ": " + r->text));
        } else if (const auto* s = std::get_if<transport::replica_state_msg>(&e->msg)) {
          if (s->phase == transport::replica_phase::ready) rec->add("ready " + std::to_string(s->replica));
          if (s->phase == transport::replica_phase::dead) rec->add("dead " + std::to_string(s->replica) + ": " + s->reason);
        }
      },
  };
}

caf::behavior dummy_bridge(caf::event_based_actor*) {
  return {[](export_atom, const caf::actor&, uint64_t) {}};
}

class NodeAgentLora : public ::testing::Test {
 protected:
  void SetUp() override {
    model::random_model_spec spec;
    spec.vocab = 300;
    ASSERT_TRUE(model::write_random_model(spec, base()).ok());
    model::random_lora_spec a, b;
    b.seed = 7;
    ASSERT_TRUE(model::write_random_lora(a, base(), dir_.path() + "/a").ok());
    ASSERT_TRUE(model::write_random_lora(b, base(), dir_.path() + "/b").ok());
    cfg_.set("scheduler.max-threads", 2);
    cfg_.set("scheduler.policy", caf::atom("sharing"));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    rec_ = std::make_shared<recorder>();
    coord_ = sys_->spawn(fake_coordinator, rec_);
    node_agent_options o;
    o.node = "n";
    o.roles = {transport::role::replica};
    o.engine.threads = 1;
    agent_ = sys_->spawn(node_agent, o, sys_->spawn(dummy_bridge));
    caf::anon_send(agent_, agent_atom::value, coord_);
  }
  void TearDown() override {
    caf::scoped_actor self{*sys_};
    self->send(agent_, stop_atom::value);
    self->wait_for(agent_);
    caf::anon_send_exit(coord_, caf::exit_reason::user_shutdown);
  }
  std::string base() const { return dir_.path() + "/base"; }
  void frame(transport::body b) {
    auto e = std::make_shared<transport::envelope>();
    e->source = {"n", coordinator_actor_id};
    e->destination = {"n", agent_actor_id};
    e->msg = std::move(b);
    caf::anon_send(agent_, wire_atom::value, transport::peer_id{0}, std::move(e));
  }
  void assign(uint64_t replica) {
    transport::assign_msg a = start_msg(replica, "tiny", base(), 1);
    a.enable_lora = true;
    frame(a);
  }
  void lora(uint64_t update, const std::string& op, const std::string& name, const std::string& path) {
    frame(transport::control_msg{"lora", {std::to_string(update), op, "tiny", name, path}, "", 0, ""});
  }

  model::testing::temp_dir dir_;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::shared_ptr<recorder> rec_;
  caf::actor coord_, agent_;
};

TEST_F(NodeAgentLora, AnUpdateWhileAReplicaLoadsIsAppliedBeforeItIsReady) {
  assign(1);
  lora(7, "load", "a", dir_.path() + "/a");  // queued: the model is still loading on a helper
  EXPECT_EQ(rec_->next(), "reply ok 7 applied 0");
  EXPECT_EQ(rec_->next(), "ready 1") << "answered at once; the replica applies it before it is ready";
  // Now hosted: loading it again from the same directory changes nothing; from another is refused.
  lora(8, "load", "a", dir_.path() + "/a");
  EXPECT_EQ(rec_->next(), "reply ok 8 applied 1");
  lora(9, "load", "a", dir_.path() + "/b");
  EXPECT_EQ(rec_->next(), "reply no 9: LoRA adapter 'a' is loaded here from " + dir_.path() + "/a, not " + dir_.path() + "/b");
  // One model's commands are answered in order, loads (on a helper) and unloads alike.
  lora(10, "load", "b", dir_.path() + "/b");
  lora(11, "unload", "b", "");
  lora(12, "unload", "a", "");
  EXPECT_EQ(rec_->next(), "reply ok 10 applied 1");
  EXPECT_EQ(rec_->next(), "reply ok 11 applied 1");
  EXPECT_EQ(rec_->next(), "reply ok 12 applied 1");
  // Undos (update 0) are answered to nobody.
  lora(0, "unload", "a", "");
  lora(13, "load", "a", dir_.path() + "/a");
  EXPECT_EQ(rec_->next(), "reply ok 13 applied 1");
}

TEST_F(NodeAgentLora, AnUpdateTheLoadingReplicaCannotApplyFailsItsStart) {
  assign(2);
  lora(5, "load", "gone", dir_.path() + "/missing");
  EXPECT_EQ(rec_->next(), "reply ok 5 applied 0") << "answered at once: no running copy here (applied 0)";
  const std::string dead = rec_->next();
  EXPECT_EQ(dead.rfind("dead 2: LoRA adapter 'gone', loaded while the replica started: ", 0), 0u) << dead;
  EXPECT_NE(dead.find("missing"), std::string::npos) << dead;
}

// Refused and undone while it loaded (the coordinator's undo came after a refusal elsewhere):
// the replica starts without it.
TEST_F(NodeAgentLora, ARefusedUpdateUndoneWhileLoadingLeavesTheStartAlone) {
  assign(3);
  lora(6, "load", "gone", dir_.path() + "/missing");
  lora(0, "unload", "gone", "");
  EXPECT_EQ(rec_->next(), "reply ok 6 applied 0");
  EXPECT_EQ(rec_->next(), "ready 3");
  lora(7, "load", "a", dir_.path() + "/a");
  EXPECT_EQ(rec_->next(), "reply ok 7 applied 1");
}

// The same agent, told to run a mixture of experts at --tp 2 whose experts' intermediate (33)
// no two ranks can split: refused as sliced, served when the assignment says expert_parallel.
using NodeAgentAssign = NodeAgentLora;

TEST_F(NodeAgentAssign, ExpertParallelReachesTheReplicasEngine) {
  model::random_model_spec spec;
  spec.arch = "qwen3_moe";
  spec.vocab = 300;
  spec.intermediate = 33;
  spec.n_experts = 4;
  const std::string dir = dir_.path() + "/moe";
  ASSERT_TRUE(model::write_random_model(spec, dir).ok());
  transport::assign_msg a = start_msg(4, "moe", dir, 2);
  frame(a);
  const std::string sliced = rec_->next();
  EXPECT_EQ(sliced.rfind("dead 4: ", 0), 0u) << sliced;
  EXPECT_NE(sliced.find("cannot split intermediate_size (33)"), std::string::npos) << sliced;
  a.replica = 5;
  a.expert_parallel = true;
  frame(a);
  EXPECT_EQ(rec_->next(), "ready 5");
}

}  // namespace
}  // namespace llmesh::actors
