// Runtime LoRA updates through the coordinator (coordinator_lora.cpp), frame by frame: a
// `load-lora` / `unload-lora` command goes to every node of the model's replicas as a "lora"
// command and is answered once all have answered; the gateways then hear the model's adapters
// ("lora-news"), and a replica started later loads them. A node's refusal or silence undoes
// the update everywhere; a lost node is not waited for; bad commands are refused at once and
// change nothing.
#include "coordinator_fixture.hpp"

namespace llmesh::actors {
namespace {

using namespace coordinator_testing;

model_spec lora_model(int replicas = 2) {
  model_spec m = tiny(replicas);  // tp 2: one replica per node
  m.enable_lora = true;
  return m;
}

/// "lora load tiny psalms /a/psalms -> 1:1" for a control command among `as` (its update id
/// kept apart), "news tiny [psalms=/a/psalms] -> 3:1" for a gateway's news, describe() otherwise.
struct lora_view {
  strings lines;
  std::vector<uint64_t> ids;  ///< the "lora" commands' update ids, in order
};
lora_view view(const coordinator::actions& as) {
  lora_view out;
  for (const auto& a : as) {
    const auto* c = std::get_if<transport::control_msg>(&a.msg);
    if (!c || a.k != coordinator_action::send) {
      out.lines.push_back(describe(a));
      continue;
    }
    const std::string to = " -> " + std::to_string(a.peer) + ":" + std::to_string(a.remote);
    if (c->command == "lora" && c->args.size() == 5) {
      out.ids.push_back(std::stoull(c->args[0]));
      out.lines.push_back("lora " + c->args[1] + " " + c->args[2] + " " + c->args[3] + " " + c->args[4] + to);
    } else if (c->command == "lora-news" && !c->args.empty()) {
      std::string list;
      for (size_t i = 1; i + 1 < c->args.size(); i += 2) list += (list.empty() ? "" : " ") + c->args[i] + "=" + c->args[i + 1];
      out.lines.push_back("news " + c->args[0] + " [" + list + "]" + to);
    } else {
      out.lines.push_back("control " + c->command + to);
    }
  }
  return out;
}

/// A node's answer to update `id`.
coordinator::actions answer(coordinator& c, peer_id peer, uint64_t id, bool ok, const std::string& why = {},
                            mesh_clock::time_point now = t0) {
  json j{{"lora_update", id}};
  if (!ok) j["code"] = static_cast<int>(errc::invalid_request);
  return c.on_message(peer, frame(transport::control_reply_msg{ok, ok ? "applied" : why, j.dump()}), now, wall0);
}

std::string hex(const std::string& bytes) {
  std::string out;
  char buf[3];
  for (unsigned char b : bytes) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    out += buf;
  }
  return out;
}

/// Nodes a (peer 1) and b (peer 2) each run a ready replica of the model; gw (peer 3) is a
/// gateway. Returns what gw's join answered.
coordinator::actions mesh_of_two(coordinator& c) {
  join(c, 1, "a");
  join(c, 2, "b");
  ready(c, 1, 1);
  ready(c, 2, 2);
  return join(c, 3, hello("gw", 3, {transport::role::gateway, transport::role::router}));
}

transport::control_reply_msg reply_of(const coordinator::actions& as) {
  if (as.empty() || !std::holds_alternative<transport::control_reply_msg>(as.back().msg)) {
    ADD_FAILURE() << "no reply last: " << testing::PrintToString(view(as).lines);
    return {};
  }
  return std::get<transport::control_reply_msg>(as.back().msg);
}

TEST(CoordinatorLora, ALoadReachesEveryNodeOfTheModelAndIsAnsweredOnceAllApplied) {
  auto c = make({lora_model()});
  // A gateway joining hears the model's adapters: none yet.
  auto gw = view(mesh_of_two(c));
  EXPECT_NE(std::find(gw.lines.begin(), gw.lines.end(), "news tiny [] -> 3:1"), gw.lines.end()) << testing::PrintToString(gw.lines);

  const auto cmd = command("load-lora", {"tiny", "psalms", "/a/psalms"});
  auto sent = view(c.on_message(ctl_peer, frame(cmd, ctl_actor), t0, wall0));
  EXPECT_EQ(sent.lines, (strings{"lora load tiny psalms /a/psalms -> 1:1", "lora load tiny psalms /a/psalms -> 2:1"}))
      << "no reply yet: the nodes have not answered";
  ASSERT_EQ(sent.ids.size(), 2u);
  EXPECT_EQ(sent.ids[0], sent.ids[1]);
  // Recorded at once: a replica assigned meanwhile would load it.
  ASSERT_EQ(c.runtime_loras().at("tiny").size(), 1u);
  EXPECT_EQ(c.runtime_loras().at("tiny")[0].path, "/a/psalms");

  EXPECT_TRUE(answer(c, 1, sent.ids[0], true).empty()) << "b has not answered";
  EXPECT_TRUE(answer(c, 1, sent.ids[0], true).empty()) << "a second answer from a changes nothing";
  auto done = answer(c, 2, sent.ids[0], true);
  EXPECT_EQ(view(done).lines, (strings{"news tiny [psalms=/a/psalms] -> 3:1", "reply -> 50:9"}));
  const auto r = reply_of(done);
  EXPECT_TRUE(r.ok) << r.text;
  EXPECT_EQ(r.text, "Success: LoRA adapter 'psalms' added successfully.");
  EXPECT_EQ(json::parse(r.json)["request"], hex(cmd.nonce)) << "the requester matches the reply by its nonce";

  // A replica started later loads the config's adapters and this one, LoRA on.
  auto scaled = ctl(c, "scale", {"tiny", "3"});
  ASSERT_TRUE(scaled.reply.ok) << scaled.reply.text;
  auto starts = assigns(join(c, 4, "c"));
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_TRUE(starts[0].enable_lora);
  EXPECT_EQ(starts[0].loras, (std::vector<transport::assign_msg::lora_module>{{"psalms", "/a/psalms"}}));
  EXPECT_EQ(json::parse(ctl(c, "loras").reply.json)["tiny"],
            (json::array({{{"name", "psalms"}, {"path", "/a/psalms"}, {"runtime", true}}})));

  // The unload goes to every node with a replica of it, the loading one included.
  auto unload = view(c.on_message(ctl_peer, frame(command("unload-lora", {"tiny", "psalms"}), ctl_actor), t0, wall0));
  EXPECT_EQ(unload.lines, (strings{"lora unload tiny psalms /a/psalms -> 1:1", "lora unload tiny psalms /a/psalms -> 2:1",
                                   "lora unload tiny psalms /a/psalms -> 4:1"}));
  answer(c, 1, unload.ids[0], true);
  answer(c, 4, unload.ids[0], true);
  auto gone = answer(c, 2, unload.ids[0], true);
  EXPECT_EQ(view(gone).lines, (strings{"news tiny [] -> 3:1", "reply -> 50:9"}));
  EXPECT_EQ(reply_of(gone).text, "Success: LoRA adapter 'psalms' removed successfully.");
  EXPECT_TRUE(c.runtime_loras().at("tiny").empty());
}

TEST(CoordinatorLora, ANodesRefusalUndoesTheUpdateEverywhere) {
  auto c = make({lora_model()});
  mesh_of_two(c);
  auto sent = view(c.on_message(ctl_peer, frame(command("load-lora", {"tiny", "bad", "/nowhere"}), ctl_actor), t0, wall0));
  ASSERT_EQ(sent.ids.size(), 2u);
  answer(c, 1, sent.ids[0], true);
  auto failed = answer(c, 2, sent.ids[0], false, "LoRA adapter 'bad' (/nowhere): adapter_config.json: not found");
  EXPECT_EQ(view(failed).lines, (strings{"lora unload tiny bad /nowhere -> 1:1", "lora unload tiny bad /nowhere -> 2:1",
                                         "reply -> 50:9"}))
      << "both nodes undo it (b finds nothing to undo); the gateways hear nothing";
  const auto r = reply_of(failed);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.text, "node b: LoRA adapter 'bad' (/nowhere): adapter_config.json: not found");
  EXPECT_EQ(json::parse(r.json)["code"], static_cast<int>(errc::invalid_request));
  EXPECT_TRUE(c.runtime_loras().at("tiny").empty());
  // The undo's answers (update 0) are nobody's.
  EXPECT_TRUE(answer(c, 1, 0, true).empty());
  // The model takes another update now.
  EXPECT_EQ(view(c.on_message(ctl_peer, frame(command("load-lora", {"tiny", "good", "/a/good"}), ctl_actor), t0, wall0)).ids.size(), 2u);
}

TEST(CoordinatorLora, SilentNodesFailTheUpdateAtItsDeadlineALostOneIsNotWaitedFor) {
  auto c = make({lora_model()}, 600s);  // nodes stay members however long the test's clock runs
  mesh_of_two(c);
  auto sent = view(c.on_message(ctl_peer, frame(command("load-lora", {"tiny", "slow", "/a/slow"}), ctl_actor), t0, wall0));
  ASSERT_EQ(sent.ids.size(), 2u);
  answer(c, 1, sent.ids[0], true);
  EXPECT_TRUE(c.on_tick(t0 + 59s).empty());
  auto late = c.on_tick(t0 + 61s);
  EXPECT_EQ(view(late).lines, (strings{"lora unload tiny slow /a/slow -> 1:1", "lora unload tiny slow /a/slow -> 2:1", "reply -> 50:9"}));
  EXPECT_EQ(reply_of(late).text, "node(s) b did not answer within 60 s");
  EXPECT_EQ(json::parse(reply_of(late).json)["code"], static_cast<int>(errc::deadline_exceeded));
  EXPECT_TRUE(answer(c, 2, sent.ids[0], true).empty()) << "an answer past the deadline is nobody's";
  // A node's refusal says more than another's silence.
  auto refused = view(c.on_message(ctl_peer, frame(command("load-lora", {"tiny", "odd", "/a/odd"}), ctl_actor), t0, wall0));
  ASSERT_EQ(refused.ids.size(), 2u);
  EXPECT_TRUE(answer(c, 1, refused.ids[0], false, "rank 600 is above 512").empty());
  EXPECT_EQ(reply_of(c.on_tick(t0 + 61s)).text, "node a: rank 600 is above 512");

  // b's connection drops mid-update: its replica is gone (re-formed with the adapter), and
  // the update completes with a's answer.
  auto again = view(c.on_message(ctl_peer, frame(command("load-lora", {"tiny", "slow", "/a/slow"}), ctl_actor), t0, wall0));
  ASSERT_EQ(again.ids.size(), 2u);
  EXPECT_TRUE(answer(c, 1, again.ids[0], true).empty());
  auto lost = view(c.on_peer_down(2));
  EXPECT_NE(std::find(lost.lines.begin(), lost.lines.end(), "reply -> 50:9"), lost.lines.end()) << testing::PrintToString(lost.lines);
  ASSERT_EQ(c.runtime_loras().at("tiny").size(), 1u);
}

// A load is checked where it loads: when no node applied it to a running copy (their nodes left,
// or a node had only a replica still loading, which takes it before it is ready), it is undone.
TEST(CoordinatorLora, ALoadNoRunningCopyTookIsUndone) {
  auto c = make({lora_model()}, 600s);
  mesh_of_two(c);
  auto sent = view(c.on_message(ctl_peer, frame(command("load-lora", {"tiny", "x", "/x"}), ctl_actor), t0, wall0));
  ASSERT_EQ(sent.ids.size(), 2u);
  json none{{"lora_update", sent.ids[0]}, {"applied", 0}};
  EXPECT_TRUE(c.on_message(1, frame(transport::control_reply_msg{true, "applied", none.dump()}), t0, wall0).empty());
  auto lost = view(c.on_peer_down(2));
  EXPECT_NE(std::find(lost.lines.begin(), lost.lines.end(), "lora unload tiny x /x -> 1:1"), lost.lines.end())
      << testing::PrintToString(lost.lines);
  EXPECT_NE(std::find(lost.lines.begin(), lost.lines.end(), "reply -> 50:9"), lost.lines.end()) << testing::PrintToString(lost.lines);
  EXPECT_TRUE(c.runtime_loras().at("tiny").empty()) << "undone";
  // Both nodes gone before answering: undone too.
  auto c2 = make({lora_model()}, 600s);
  mesh_of_two(c2);
  auto again = view(c2.on_message(ctl_peer, frame(command("load-lora", {"tiny", "x", "/x"}), ctl_actor), t0, wall0));
  ASSERT_EQ(again.ids.size(), 2u);
  c2.on_peer_down(1);
  coordinator::actions last = c2.on_peer_down(2);
  const transport::control_reply_msg* failed = nullptr;
  for (const auto& a : last) {
    if (const auto* r = std::get_if<transport::control_reply_msg>(&a.msg)) failed = r;
  }
  ASSERT_NE(failed, nullptr) << testing::PrintToString(view(last).lines);
  EXPECT_FALSE(failed->ok);
  EXPECT_EQ(failed->text, "no replica of 'tiny' loaded the adapter: the nodes hosting them left or stopped them meanwhile; retry");
  EXPECT_EQ(json::parse(failed->json)["code"], static_cast<int>(errc::replica_unavailable));
  EXPECT_TRUE(c2.runtime_loras().at("tiny").empty());
}

TEST(CoordinatorLora, BadCommandsAreRefusedAtOnceAndChangeNothing) {
  model_spec plain = tiny(0);  // declared, not running: only tiny's replicas are placed
  plain.name = "plain";
  model_spec configured = lora_model();
  configured.loras = {{"psalms", "/a/psalms"}};
  model_spec spread = split(0);
  spread.enable_lora = true;
  auto c = make({configured, plain, spread}, 600s);
  mesh_of_two(c);
  auto refused = [&](const std::string& cmd, strings args) {
    auto a = send_ctl(c, command(cmd, std::move(args)));
    EXPECT_FALSE(a.reply.ok);
    EXPECT_TRUE(a.effects.empty()) << testing::PrintToString(view(a.effects).lines);
    return a.reply.text + " [" + std::to_string(json::parse(a.reply.json)["code"].get<int>()) + "]";
  };
  const auto code = [](errc e) { return " [" + std::to_string(static_cast<int>(e)) + "]"; };
  EXPECT_EQ(refused("load-lora", {"tiny", "x"}), "load-lora: give MODEL NAME PATH" + code(errc::invalid_request));
  EXPECT_EQ(refused("unload-lora", {"tiny"}), "unload-lora: give MODEL NAME" + code(errc::invalid_request));
  EXPECT_EQ(refused("load-lora", {"nope", "x", "/x"}), "the base model 'nope' is not served here" + code(errc::not_found));
  EXPECT_EQ(refused("load-lora", {"plain", "x", "/x"}),
            "'plain' does not take LoRA adapters while serving: set 'enable_lora: true' in its cluster config entry" +
                code(errc::invalid_request));
  EXPECT_NE(refused("load-lora", {"split", "x", "/x"}).find("'split' is spread over nodes"), std::string::npos);
  EXPECT_EQ(refused("load-lora", {"tiny", "a b", "/x"}), "'lora_name' must be 1 to 128 letters, digits and -_.:/" + code(errc::invalid_request));
  EXPECT_EQ(refused("load-lora", {"tiny", "x", ""}), "Both 'lora_name' and 'lora_path' must be provided." + code(errc::invalid_request));
  EXPECT_EQ(refused("load-lora", {"tiny", "plain", "/x"}),
            "'plain' names a served model; an adapter needs a name of its own" + code(errc::invalid_request));
  EXPECT_EQ(refused("load-lora", {"tiny", "psalms", "/x"}), "The lora adapter 'psalms' has already been loaded." + code(errc::invalid_request));
  EXPECT_EQ(refused("unload-lora", {"tiny", "psalms"}),
            "'psalms' is one of 'tiny''s loras in the cluster config: it is served while the mesh runs" + code(errc::invalid_request));
  EXPECT_EQ(refused("unload-lora", {"tiny", "never"}), "The lora adapter 'never' cannot be found." + code(errc::not_found));
  // One update of a model at a time.
  auto first = view(c.on_message(ctl_peer, frame(command("load-lora", {"tiny", "x", "/x"}), ctl_actor), t0, wall0));
  ASSERT_EQ(first.ids.size(), 2u);
  EXPECT_EQ(refused("load-lora", {"tiny", "y", "/y"}), "another LoRA adapter update of 'tiny' is in progress; retry" + code(errc::overloaded));
  answer(c, 1, first.ids[0], true);
  answer(c, 2, first.ids[0], true);
  EXPECT_EQ(refused("load-lora", {"tiny", "x", "/x"}), "The lora adapter 'x' has already been loaded." + code(errc::invalid_request));
  // Refused before it is read (a wrong token, a stale clock, a replay): the reply still names
  // the command's nonce, so that a gateway waiting on it hears why at once.
  const auto forged = command("load-lora", {"tiny", "w", "/w"}, wall0, "not-the-cluster-token-at-all");
  auto bad_mac = send_ctl(c, forged);
  EXPECT_FALSE(bad_mac.reply.ok);
  EXPECT_EQ(bad_mac.reply.text, "refused: bad credentials (check the cluster token)");
  EXPECT_EQ(json::parse(bad_mac.reply.json)["request"], hex(forged.nonce));
  EXPECT_EQ(json::parse(bad_mac.reply.json)["code"], static_cast<int>(errc::unauthorized));
  // A forged answer (from a connection that is no member) changes nothing.
  auto second = view(c.on_message(ctl_peer, frame(command("load-lora", {"tiny", "z", "/z"}), ctl_actor), t0, wall0));
  ASSERT_EQ(second.ids.size(), 2u);
  EXPECT_TRUE(answer(c, ctl_peer, second.ids[0], false, "forged").empty());
  EXPECT_TRUE(c.on_message(1, frame(transport::control_reply_msg{true, "", "not json"}), t0, wall0).empty());
}

TEST(CoordinatorLora, ALoadWaitsForAReadyReplicaToCheckTheAdapter) {
  auto c = make({lora_model(1)}, 600s);
  join(c, 1, "a");  // its replica is still loading
  auto a = send_ctl(c, command("load-lora", {"tiny", "x", "/x"}));
  EXPECT_FALSE(a.reply.ok);
  EXPECT_EQ(a.reply.text, "no replica of 'tiny' is ready to load the adapter; retry once one is");
  EXPECT_EQ(json::parse(a.reply.json)["code"], static_cast<int>(errc::replica_unavailable));
  EXPECT_TRUE(c.runtime_loras().empty() || c.runtime_loras().at("tiny").empty());
  // Once ready, the load goes to it.
  ready(c, 1, 1);
  EXPECT_EQ(view(c.on_message(ctl_peer, frame(command("load-lora", {"tiny", "x", "/x"}), ctl_actor), t0, wall0)).lines,
            (strings{"lora load tiny x /x -> 1:1"}));
}

TEST(CoordinatorLora, MaxLorasBoundsTheAdaptersAModelHolds) {
  model_spec m = lora_model(1);
  m.loras = {{"cfg", "/a/cfg"}};
  m.max_loras = 2;
  auto c = make({m}, 600s);
  join(c, 1, "a");
  ready(c, 1, 1);
  auto sent = view(c.on_message(ctl_peer, frame(command("load-lora", {"tiny", "x", "/x"}), ctl_actor), t0, wall0));
  ASSERT_EQ(sent.ids.size(), 1u);
  answer(c, 1, sent.ids[0], true);
  auto full = send_ctl(c, command("load-lora", {"tiny", "y", "/y"}));
  EXPECT_FALSE(full.reply.ok);
  EXPECT_EQ(full.reply.text, "'tiny' holds its most LoRA adapters (2, the cluster config's max_loras); unload one first");
  EXPECT_TRUE(full.effects.empty());
  // The nodes hear the bound with each assignment.
  ASSERT_TRUE(ctl(c, "scale", {"tiny", "2"}).reply.ok);
  auto more = assigns(join(c, 2, "b"));
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].max_loras, 2u);
  EXPECT_EQ(more[0].loras.size(), 2u);
}

TEST(CoordinatorLora, AGatewayJoiningLaterHearsEveryModelsAdapters) {
  model_spec other = lora_model(0);
  other.name = "other";
  auto c = make({lora_model(1), other}, 600s);
  join(c, 1, "a");
  ready(c, 1, 1);
  auto sent = view(c.on_message(ctl_peer, frame(command("load-lora", {"tiny", "x", "/x"}), ctl_actor), t0, wall0));
  answer(c, 1, sent.ids[0], true);
  auto gw = view(join(c, 5, hello("gw2", 5, {transport::role::gateway})));
  EXPECT_EQ(gw.lines, (strings{"welcome -> 5:1", "news tiny [x=/x] -> 5:1", "news other [] -> 5:1"}));
}

}  // namespace
}  // namespace llmesh::actors
