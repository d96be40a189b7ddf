// Background responses (background_runs.hpp).
#include "llmesh/gateway/background_runs.hpp"

#include <algorithm>

namespace llmesh::gateway {

namespace {

/// The response id of a job whose output renders as responses.
std::string response_id(const generation_job& job) { return "resp_" + job.output->responses()->hex(); }

}  // namespace

background_run::background_run(actors::mesh_client& mesh, generation_job job, nlohmann::ordered_json input_items)
    : mesh_(mesh), id_(response_id(job)), input_items_(std::move(input_items)), job_(std::move(job)) {}

std::shared_ptr<background_run> background_run::start(actors::mesh_client& mesh, generation_job job,
                                                      nlohmann::ordered_json input_items) {
  auto run = std::make_shared<background_run>(mesh, std::move(job), std::move(input_items));
  std::lock_guard lock(run->mu_);
  run->append_locked(run->job_.output->responses()->queued());
  // Under the lock: a message that comes back at once waits until every request is out.
  auto requests = std::move(run->job_.requests);
  run->job_.requests.clear();
  for (auto& r : requests) run->submit_locked(std::move(r), false);
  for (auto& r : run->job_.output->take_submissions()) run->submit_locked(std::move(r), true);
  return run;
}

void background_run::submit_locked(actors::replica_request r, bool beam_step) {
  if (!beam_step) ids_.push_back(r.id);
  // A weak handle: a run its owner dropped takes no more messages.
  mesh_.submit(std::move(r), [w = weak_from_this()](const actors::token_msg& t) {
    if (auto run = w.lock()) run->on_message(t);
  });
}

void background_run::append_locked(const std::string& events) {
  // Each event is "event: TYPE\ndata: JSON\n\n" (compact JSON: no blank line inside), and
  // their sequence numbers count from 0, one per event.
  size_t at = 0;
  while (at < events.size()) {
    size_t end = events.find("\n\n", at);
    end = end == std::string::npos ? events.size() : end + 2;
    events_.push_back(events.substr(at, end - at));
    event_bytes_ += end - at;
    at = end;
  }
}

std::vector<std::function<void()>> background_run::take_wakers_locked() {
  std::vector<std::function<void()>> out;
  out.swap(wakers_);
  return out;
}

void background_run::on_message(const actors::token_msg& t) {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard lock(mu_);
    if (ended_ || closed_) return;
    completion_group& out = *job_.output;
    append_locked(out.on_message(t));
    for (uint64_t id : out.take_cancellations()) mesh_.cancel(id);
    for (auto& r : out.take_submissions()) submit_locked(std::move(r), true);
    if (out.done()) end_locked();
    wake = take_wakers_locked();
  }
  for (auto& w : wake) w();
}

void background_run::end_locked() {
  completion_group& out = *job_.output;
  responses_renderer& r = *out.responses();
  if (!r.ended()) {
    // A failure before anything was produced (the group's reply would be that error), or, not
    // expected, a group that ended without a final event.
    append_locked(r.fail(out.failure() ? *out.failure()
                                       : make_error(errc::internal, "the generation ended without a final response")));
  }
  final_ = r.snapshot();
  ended_ = true;
  // Unfinished requests (a stop string ended the choice, a failure): free them in the mesh.
  for (uint64_t id : ids_) mesh_.cancel(id);
  for (uint64_t id : out.running_searches()) mesh_.cancel(id);
  job_ = generation_job{};  // the group and the concurrency slot go now
}

background_run::page background_run::read(int64_t after, std::function<void()> wake) {
  std::lock_guard lock(mu_);
  page p;
  p.last = after;
  const size_t from = after < 0 ? 0 : static_cast<size_t>(after) + 1;
  for (size_t i = from; i < events_.size(); ++i) {
    p.bytes += events_[i];
    p.last = static_cast<int64_t>(i);
  }
  p.ended = ended_ || closed_;
  if (p.bytes.empty() && !p.ended && wake) wakers_.push_back(std::move(wake));
  return p;
}

nlohmann::ordered_json background_run::snapshot() const {
  std::lock_guard lock(mu_);
  return ended_ ? final_ : job_.output->responses()->snapshot();
}

std::string background_run::status() const {
  const auto s = snapshot();
  return s.is_object() ? s.value("status", std::string()) : std::string();
}

bool background_run::live() const {
  std::lock_guard lock(mu_);
  return !ended_ && !closed_;
}

size_t background_run::event_bytes() const {
  std::lock_guard lock(mu_);
  return event_bytes_;
}

std::pair<bool, nlohmann::ordered_json> background_run::cancel() {
  std::vector<std::function<void()>> wake;
  std::pair<bool, nlohmann::ordered_json> result;
  {
    std::lock_guard lock(mu_);
    if (ended_ || closed_) return {false, final_};
    final_ = job_.output->responses()->cancel(job_.output->usage());
    ended_ = true;
    for (uint64_t id : ids_) mesh_.cancel(id);
    for (uint64_t id : job_.output->running_searches()) mesh_.cancel(id);
    job_ = generation_job{};
    wake = take_wakers_locked();
    result = {true, final_};
  }
  for (auto& w : wake) w();
  return result;
}

void background_run::close() {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    if (!ended_) {
      for (uint64_t id : ids_) mesh_.cancel(id);
      for (uint64_t id : job_.output->running_searches()) mesh_.cancel(id);
      final_ = job_.output->responses()->snapshot();
    }
    job_ = generation_job{};
    wake = take_wakers_locked();
  }
  for (auto& w : wake) w();
}

background_runs::~background_runs() { close(); }

void background_runs::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  for (auto& [id, run] : by_id_) run->close();
}

bool background_runs::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

std::shared_ptr<background_run> background_runs::start(generation_job job, nlohmann::ordered_json input_items) {
  auto run = background_run::start(mesh_, std::move(job), std::move(input_items));
  std::lock_guard lock(mu_);
  if (closed_) run->close();
  by_id_[run->id()] = run;
  order_.push_back(run->id());
  prune_locked();
  return run;
}

void background_runs::prune_locked() {
  size_t ended = 0, bytes = 0;
  for (const auto& [id, run] : by_id_) {
    if (run->live()) continue;
    ++ended;
    bytes += run->event_bytes();
  }
  // Oldest first; live runs stay (the concurrency slots bound them).
  for (auto it = order_.begin(); it != order_.end() && (ended > lim_.max_ended || bytes > lim_.max_ended_bytes);) {
    auto found = by_id_.find(*it);
    if (found == by_id_.end()) {
      it = order_.erase(it);
      continue;
    }
    if (found->second->live()) {
      ++it;
      continue;
    }
    --ended;
    bytes -= found->second->event_bytes();
    by_id_.erase(found);
    it = order_.erase(it);
  }
}

std::shared_ptr<background_run> background_runs::find(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

bool background_runs::forget(const std::string& id) {
  std::shared_ptr<background_run> run;
  {
    std::lock_guard lock(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return false;
    run = std::move(it->second);
    by_id_.erase(it);
    order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
  }
  run->cancel();
  return true;
}

size_t background_runs::size() const {
  std::lock_guard lock(mu_);
  return by_id_.size();
}

}  // namespace llmesh::gateway
