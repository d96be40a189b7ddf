// Background responses (the Responses API's `background: true`, OpenAI's background mode), a
// plain class pair. A background_run drives one generation job without a connection: the
// mesh's messages (they arrive on actor threads) go through the job's completion_group under
// the run's mutex, and the Responses stream's events are kept, so that clients can read them
// live or later (GET /v1/responses/{id}?stream=true&starting_after=N), poll the response as it
// stands, or cancel it. The final response is stored by the renderer's on_final
// (response_store.hpp), as any stored response is.
//
// background_runs holds the runs by response id: the live ones until they end, then the newest
// ended ones (their events, for resuming a stream) within a count and a byte bound (DESIGN.md
// §6); dropping one loses only its events — its final response stays in the store.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmesh/actors/local_mesh.hpp"
#include "llmesh/actors/metrics.hpp"
#include "llmesh/gateway/api_service.hpp"

namespace llmesh::gateway {

/// Thread affinity: any thread.
class background_run : public std::enable_shared_from_this<background_run> {
 public:
  /// Starts `job` (one choice, its output rendered as a Responses stream): the queued events
  /// first, then its requests go to `mesh` (borrowed: it outlives the run's owner).
  /// REQUIRES: job.output renders as responses (completion_group::responses()).
  /// `input_items`: the request's, as they will be stored (GET .../input_items while it runs).
  static std::shared_ptr<background_run> start(actors::mesh_client& mesh, generation_job job,
                                               nlohmann::ordered_json input_items, actors::metrics_registry::gauge* running = nullptr);
  /// The response as it was queued, before any request went out (what the POST answers).
  const nlohmann::ordered_json& queued() const { return queued_; }

  /// The stream's events after sequence number `after` (-1: from the first) as SSE bytes.
  struct page {
    std::string bytes;
    int64_t last = -1;   ///< the sequence number of the last event in `bytes` (`after` when none)
    bool ended = false;  ///< no event follows these
  };
  /// When nothing follows `after` yet and the run is live, `wake` is kept and called once
  /// (from another thread, without the run's lock) when something does or the run ends.
  page read(int64_t after, std::function<void()> wake = {});
  /// The response as it stands (queued, in_progress with the output so far, or final; after
  /// close(), as it stood then).
  nlohmann::ordered_json snapshot() const;
  bool live() const;
  /// Cancels a live run (its requests in the mesh too): the response ends "cancelled" and is
  /// stored so. Returns whether it was live, and the response (final either way).
  std::pair<bool, nlohmann::ordered_json> cancel();
  /// The run's owner is going away: cancels a live run's requests, and no message is taken
  /// any more (neither the mesh nor the group is touched after this returns).
  void close();
  size_t event_bytes() const;
  const std::string& id() const { return id_; }
  const nlohmann::ordered_json& input_items() const { return input_items_; }

  /// Use start(). (Public for make_shared.)
  background_run(actors::mesh_client& mesh, generation_job job, nlohmann::ordered_json input_items,
                 actors::metrics_registry::gauge* running = nullptr);

 private:
  void on_message(const actors::token_msg& t);
  void submit_locked(actors::replica_request r, bool beam_step);
  void append_locked(const std::string& events);
  void end_locked();
  /// The run is no longer live (ended, cancelled or closed; once): the running gauge goes down,
  /// requests still running are cancelled in the mesh, the group and its slots go.
  void release_locked();
  std::vector<std::function<void()>> take_wakers_locked();

  actors::mesh_client& mesh_;
  const std::string id_;
  const nlohmann::ordered_json input_items_;
  mutable std::mutex mu_;
  generation_job job_;  ///< its output (the group) and slot, until the run ends
  std::vector<uint64_t> ids_;  ///< the choices' requests (beam steps are the group's)
  /// The events with their sequence numbers (read from each; ascending).
  std::vector<std::pair<int64_t, std::string>> events_;
  nlohmann::ordered_json queued_;
  size_t event_bytes_ = 0;
  nlohmann::ordered_json final_;  ///< once ended
  std::vector<std::function<void()>> wakers_;
  bool ended_ = false, closed_ = false;
  actors::metrics_registry::gauge* running_;  ///< live runs (null: not counted); borrowed
};

struct background_limits {
  size_t max_ended = 256;                  ///< ended runs whose events are kept
  size_t max_ended_bytes = size_t{64} << 20;  ///< and their events' bytes
};

/// Thread affinity: any thread. Destruction closes every run.
class background_runs {
 public:
  /// `running`: the gauge of live runs (borrowed; null: not counted).
  background_runs(actors::mesh_client& mesh, background_limits lim = {}, actors::metrics_registry::gauge* running = nullptr)
      : mesh_(mesh), lim_(lim), running_(running) {}
  ~background_runs();
  background_runs(const background_runs&) = delete;
  background_runs& operator=(const background_runs&) = delete;

  /// Starts `job` as a background run (background_run::start), keyed by its response id, and
  /// drops the oldest ended runs past the bounds. nullptr once closed (nothing is submitted).
  std::shared_ptr<background_run> start(generation_job job, nlohmann::ordered_json input_items);
  /// nullptr when unknown (never background, dropped, or forgotten).
  std::shared_ptr<background_run> find(const std::string& id) const;
  /// Forgets a run (DELETE), cancelling it when live. Whether there was one.
  bool forget(const std::string& id);
  /// Closes every run (background_run::close); start() refuses from then on. Before the
  /// mesh stops and before the HTTP server that reads the runs' streams goes (their readers'
  /// wakers post into its io_context).
  void close();
  size_t size() const;

 private:
  void prune_locked();

  actors::mesh_client& mesh_;
  const background_limits lim_;
  actors::metrics_registry::gauge* running_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<background_run>> by_id_;
  std::deque<std::string> order_;  ///< started, oldest first
  bool closed_ = false;
};

}  // namespace llmesh::gateway
