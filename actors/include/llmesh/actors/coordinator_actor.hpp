// The coordinator's CAF shell (coordinator.hpp holds the logic): frames from the bridge and
// lost connections in, the coordinator's actions out — frames to node agents through the
// bridge (or straight to the agent in this process), and replicas added to, drained from and
// dropped by the router in this process.
#pragma once

#include <map>
#include <memory>

#include <caf/all.hpp>

#include "llmesh/actors/coordinator.hpp"

namespace llmesh::actors {

struct coordinator_state {
  std::shared_ptr<coordinator> core;
  caf::actor bridge, router, local_agent;
  std::string node;
  std::map<uint64_t, std::pair<caf::actor, bool>> replicas;  ///< replica id → (actor or proxy, is a proxy)
  static inline const char* name = "coordinator";
};

/// Ticks every `tick` (failure detection). `(agent_atom, caf::actor)`: this process's node
/// agent (peer 0). `router` may be invalid (a coordinator without a router role).
caf::behavior coordinator_actor(caf::stateful_actor<coordinator_state>* self, std::shared_ptr<coordinator> core,
                                caf::actor bridge, caf::actor router, std::string node, std::chrono::milliseconds tick);

}  // namespace llmesh::actors
