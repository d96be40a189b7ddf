// Background responses (background_runs.hpp).
#include "llmesh/gateway/background_runs.hpp"

#include <algorithm>
#include <charconv>

namespace llmesh::gateway {

namespace {

/// The response id of a job whose output renders as responses.
std::string response_id(const generation_job& job) { return "resp_" + job.output->responses()->hex(); }

}  // namespace

background_run::background_run(actors::mesh_client& mesh, generation_job job, nlohmann::ordered_json input_items,
                               actors::metrics_registry::gauge* running)
    : mesh_(mesh), id_(response_id(job)), input_items_(std::move(input_items)), job_(std::move(job)), running_(running) {
  if (running_) running_->add(1);
}

void background_run::release_locked() {
  if (running_) running_->add(-1);
  running_ = nullptr;
  if (job_.output) {  // still running: its requests (a stop string, a failure, cancel, close) go
    for (uint64_t id : ids_) mesh_.cancel(id);
    for (uint64_t id : job_.output->running_searches()) mesh_.cancel(id);
  }
  job_ = generation_job{};  // the group and the concurrency slot go now
}

std::shared_ptr<background_run> background_run::start(actors::mesh_client& mesh, generation_job job,
                                                      nlohmann::ordered_json input_items, actors::metrics_registry::gauge* running) {
  auto run = std::make_shared<background_run>(mesh, std::move(job), std::move(input_items), running);
  std::lock_guard lock(run->mu_);
  run->append_locked(run->job_.output->responses()->queued());
  run->queued_ = run->job_.output->responses()->snapshot();
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
  // Each event is "event: TYPE\ndata: JSON\n\n" (compact JSON: no blank line inside), its
  // sequence number the JSON's last member (responses_renderer::event).
  constexpr std::string_view key = "\"sequence_number\":";
  size_t at = 0;
  while (at < events.size()) {
    size_t end = events.find("\n\n", at);
    end = end == std::string::npos ? events.size() : end + 2;
    const std::string_view ev(events.data() + at, end - at);
    int64_t seq = events_.empty() ? 0 : events_.back().first + 1;
    if (const size_t k = ev.rfind(key); k != std::string_view::npos) {
      std::from_chars(ev.data() + k + key.size(), ev.data() + ev.size(), seq);
    }
    events_.emplace_back(seq, std::string(ev));
    event_bytes_ += ev.size();
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
  release_locked();
}

background_run::page background_run::read(int64_t after, std::function<void()> wake) {
  std::lock_guard lock(mu_);
  page p;
  p.last = after;
  auto it = std::upper_bound(events_.begin(), events_.end(), after,
                             [](int64_t a, const std::pair<int64_t, std::string>& e) { return a < e.first; });
  for (; it != events_.end(); ++it) {
    p.bytes += it->second;
    p.last = it->first;
  }
  p.ended = ended_ || closed_;
  if (p.bytes.empty() && !p.ended && wake) wakers_.push_back(std::move(wake));
  return p;
}

nlohmann::ordered_json background_run::snapshot() const {
  std::lock_guard lock(mu_);
  return ended_ || closed_ ? final_ : job_.output->responses()->snapshot();
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
    release_locked();
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
    if (!ended_) final_ = job_.output->responses()->snapshot();
    release_locked();
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

std::shared_ptr<background_run> background_runs::start(generation_job job, nlohmann::ordered_json input_items) {
  // Under the lock: close() cannot come between the check and the requests going out.
  std::lock_guard lock(mu_);
  if (closed_) return nullptr;
  auto run = background_run::start(mesh_, std::move(job), std::move(input_items), running_);
  by_id_[run->id()] = run;
  order_.push_back(run->id());
  prune_locked();
  return run;
}

void background_runs::prune_locked() {
  // One look at each run (one may end on an actor thread meanwhile: it counts next time).
  std::map<std::string, size_t> ended;  // id → its events' bytes
  size_t bytes = 0;
  for (const auto& [id, run] : by_id_) {
    if (run->live()) continue;
    const size_t b = run->event_bytes();
    ended.emplace(id, b);
    bytes += b;
  }
  // Oldest first; live runs stay (the concurrency slots bound them).
  for (auto it = order_.begin(); it != order_.end() && (ended.size() > lim_.max_ended || bytes > lim_.max_ended_bytes);) {
    auto e = ended.find(*it);
    if (e == ended.end()) {
      it = by_id_.count(*it) ? std::next(it) : order_.erase(it);
      continue;
    }
    bytes -= e->second;
    ended.erase(e);
    by_id_.erase(*it);
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
