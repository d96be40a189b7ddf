// What the coordinator's tests share: a token, clocks the test controls, tiny models (packed
// and spread), frames from node agents and ctl, the join handshake, and readable views of the
// coordinator's actions.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "llmesh/actors/coordinator.hpp"
#include "llmesh/actors/join_auth.hpp"

namespace llmesh::actors::coordinator_testing {

using namespace std::chrono_literals;
using transport::peer_id;
using transport::replica_phase;
using json = nlohmann::json;
using strings = std::vector<std::string>;

inline const std::string token = "local-cluster-token-0123456789";
inline const mesh_clock::time_point t0 = mesh_clock::time_point{} + std::chrono::seconds(100);
constexpr uint64_t wall0 = 1'700'000'000'000;  // the coordinator's wall clock, ms
constexpr peer_id ctl_peer = 50;                // `llmesh ctl`'s connection
constexpr uint64_t ctl_actor = 9;               // and its actor there

/// One model: a tp-2 packed replica fills a node's two default shard slots.
inline model_spec tiny(int replicas = 1) {
  model_spec m;
  m.name = "tiny";
  m.path = "/models/tiny";
  m.tp = 2;
  m.replicas = replicas;
  m.kv_cache_mb = 256;
  return m;
}

/// tiny() spread: each of a replica's two tp shards on a node of its own (one slot each).
inline model_spec split(int replicas = 1) {
  model_spec m = tiny(replicas);
  m.name = "split";
  m.place = placement::spread;
  return m;
}

/// The mesh address hello() gives the node on connection `peer`.
inline std::string addr(peer_id peer) { return "127.0.0.1:" + std::to_string(7100 + peer); }

inline coordinator make(std::vector<model_spec> models = {tiny()}, std::chrono::milliseconds failure_timeout = 3000ms) {
  auto c = coordinator::create({token, failure_timeout, std::move(models)});
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.err().message);
  return std::move(c).value();
}

/// A frame from actor `from` (a node agent unless told).
inline transport::envelope frame(transport::body b, uint64_t from = agent_actor_id) {
  transport::envelope e;
  e.source = {"sender", from};
  e.destination = {"seed", coordinator_actor_id};
  e.msg = std::move(b);
  return e;
}

/// One line per action, so that a test can compare a whole list (order included) at once:
/// "start r1 -> 1:1" (assign start to peer 1, actor 1), "stop r1 -> 1:1", "welcome -> 1:1",
/// "refused -> 1:1", "challenge -> 1:1", "reply -> 50:9", "ready r1 at 1:1001 (a/1)",
/// "drain r1", "gone r1".
inline std::string describe(const coordinator_action& a) {
  const std::string r = "r" + std::to_string(a.replica);
  switch (a.k) {
    case coordinator_action::send: {
      const std::string to = " -> " + std::to_string(a.peer) + ":" + std::to_string(a.remote);
      return std::visit(
          [&](const auto& m) -> std::string {
            using T = std::decay_t<decltype(m)>;
            if constexpr (std::is_same_v<T, transport::assign_msg>) {
              return std::string(m.op == transport::assign_op::start ? "start" : "stop") + " r" +
                     std::to_string(m.replica) + to;
            } else if constexpr (std::is_same_v<T, transport::welcome_msg>) {
              return (m.accepted ? "welcome" : "refused") + to;
            } else if constexpr (std::is_same_v<T, transport::challenge_msg>) {
              return "challenge" + to;
            } else if constexpr (std::is_same_v<T, transport::control_reply_msg>) {
              return "reply" + to;
            } else if constexpr (std::is_same_v<T, transport::replica_state_msg>) {
              static constexpr const char* phases[] = {"loading", "ready", "draining", "dead"};
              return std::string("news r") + std::to_string(m.replica) + " " + phases[static_cast<int>(m.phase)] +
                     (m.listen.empty() ? "" : " " + m.node + "@" + m.listen + ":" + std::to_string(m.actor)) + to;
            } else {
              return "other" + to;
            }
          },
          a.msg);
    }
    case coordinator_action::replica_ready:
      return "ready " + r + " at " + std::to_string(a.peer) + ":" + std::to_string(a.remote) + " (" + a.name + ")";
    case coordinator_action::replica_drain: return "drain " + r;
    case coordinator_action::replica_gone: return "gone " + r;
  }
  return "?";
}

inline strings describe(const coordinator::actions& as) {
  strings out;
  for (const auto& a : as) out.push_back(describe(a));
  return out;
}

/// The assign messages among `as`, in order.
inline std::vector<transport::assign_msg> assigns(const coordinator::actions& as) {
  std::vector<transport::assign_msg> out;
  for (const auto& a : as) {
    if (const auto* m = std::get_if<transport::assign_msg>(&a.msg); m && a.k == coordinator_action::send) {
      out.push_back(*m);
    }
  }
  return out;
}

inline transport::hello_msg hello(const std::string& name, peer_id peer,
                           std::vector<transport::role> roles = {transport::role::replica}) {
  return {name, std::move(roles), "127.0.0.1:" + std::to_string(7100 + peer), {2, 1ull << 30, 0, 0},
          *join_auth::make_nonce()};
}

/// The joiner's side of the handshake on connection `peer`: hello, then the proof for the
/// challenge. Returns the coordinator's answer to the proof (the welcome, then any assigns).
inline coordinator::actions join(coordinator& c, peer_id peer, const transport::hello_msg& h,
                          mesh_clock::time_point now = t0, const std::string& key = token) {
  auto answer = c.on_message(peer, frame(h), now, wall0);
  if (answer.size() != 1 || !std::holds_alternative<transport::challenge_msg>(answer[0].msg)) {
    ADD_FAILURE() << "no challenge for " << h.node << ": " << testing::PrintToString(describe(answer));
    return answer;
  }
  EXPECT_EQ(describe(answer[0]), "challenge -> " + std::to_string(peer) + ":1");
  const auto& nonce = std::get<transport::challenge_msg>(answer[0].msg).nonce;
  return c.on_message(peer, frame(transport::proof_msg{join_auth::proof(key, nonce, h.nonce, h.node)}), now, wall0);
}

inline coordinator::actions join(coordinator& c, peer_id peer, const std::string& name, mesh_clock::time_point now = t0) {
  return join(c, peer, hello(name, peer), now);
}

inline coordinator::actions report(coordinator& c, peer_id peer, uint64_t replica, replica_phase phase, uint64_t actor = 0,
                            std::string reason = {}) {
  transport::replica_state_msg m{replica, "node", "tiny", phase, actor, std::move(reason)};
  return c.on_message(peer, frame(m), t0, wall0);
}

inline coordinator::actions ready(coordinator& c, peer_id peer, uint64_t replica) {
  return report(c, peer, replica, replica_phase::ready, replica_actor_base + replica);
}

/// A ctl command signed with `key` at `timestamp_ms` under a fresh nonce.
inline transport::control_msg command(const std::string& cmd, strings args = {}, uint64_t timestamp_ms = wall0,
                               const std::string& key = token) {
  transport::control_msg m{cmd, std::move(args), *join_auth::make_nonce(), timestamp_ms, {}};
  m.mac = join_auth::control_mac(key, m.nonce, m.timestamp_ms, m.command, m.args);
  return m;
}

/// The coordinator's answer to a ctl command: the reply (always the last action) and what
/// the command did before it.
struct ctl_answer {
  transport::control_reply_msg reply;
  coordinator::actions effects;
};

inline ctl_answer send_ctl(coordinator& c, const transport::control_msg& m, uint64_t wall_ms = wall0) {
  ctl_answer out;
  out.effects = c.on_message(ctl_peer, frame(m, ctl_actor), t0, wall_ms);
  if (out.effects.empty()) {
    ADD_FAILURE() << "no reply to '" << m.command << "'";
    return out;
  }
  EXPECT_EQ(describe(out.effects.back()), "reply -> 50:9");
  if (const auto* r = std::get_if<transport::control_reply_msg>(&out.effects.back().msg)) out.reply = *r;
  out.effects.pop_back();
  return out;
}

inline ctl_answer ctl(coordinator& c, const std::string& cmd, strings args = {}) { return send_ctl(c, command(cmd, std::move(args))); }

/// The `replicas` view as id → phase.
inline std::map<uint64_t, std::string> phases(coordinator& c) {
  auto a = ctl(c, "replicas");
  EXPECT_TRUE(a.reply.ok) << a.reply.text;
  std::map<uint64_t, std::string> out;
  for (const auto& r : json::parse(a.reply.json)) out[r.at("id").get<uint64_t>()] = r.at("phase").get<std::string>();
  return out;
}

/// The `nodes` view's entry for `name` (null when it is not listed).
inline json node_view(coordinator& c, const std::string& name) {
  auto a = ctl(c, "nodes");
  EXPECT_TRUE(a.reply.ok) << a.reply.text;
  for (const auto& n : json::parse(a.reply.json))
    if (n.at("name") == name) return n;
  return nullptr;
}

}  // namespace llmesh::actors::coordinator_testing
