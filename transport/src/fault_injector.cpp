// Fault hooks (fault_injector.hpp).
#include "llmesh/transport/fault_injector.hpp"

#include <cstdlib>
#include <sstream>

namespace llmesh::transport {

result<fault_rule> parse_fault_rule(const std::string& spec) {
  fault_rule r;
  std::stringstream ss(spec);
  std::string item;
  auto bad = [&](const std::string& why) { return make_error(errc::invalid_request, "fault rule '" + spec + "': " + why); };
  while (std::getline(ss, item, ',')) {
    if (item.empty() || item == "none") continue;
    if (item == "partition") {
      r.partition = true;
      continue;
    }
    const auto eq = item.find('=');
    if (eq == std::string::npos) return bad("'" + item + "' is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    char* end = nullptr;
    if (key == "drop" || key == "dup") {
      const double p = std::strtod(value.c_str(), &end);
      if (*end != '\0' || value.empty() || !(p >= 0.0 && p <= 1.0)) return bad(key + " must be a probability in [0, 1]");
      (key == "drop" ? r.drop : r.duplicate) = p;
    } else if (key == "delay") {
      const long ms = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || ms < 0 || ms > 600000 || (std::string(end) != "ms" && std::string(end) != "")) {
        return bad("delay must be milliseconds, e.g. delay=20ms");
      }
      r.delay = std::chrono::milliseconds(ms);
    } else if (key == "for") {
      const long ms = std::strtol(value.c_str(), &end, 10);
      const std::string unit(end);
      if (value.empty() || ms <= 0 || (unit != "ms" && unit != "s")) return bad("for must be a duration, e.g. for=3s or for=500ms");
      r.lasts = std::chrono::milliseconds(unit == "s" ? ms * 1000 : ms);
      if (r.lasts > std::chrono::hours(24)) return bad("for is at most 24 hours");
    } else {
      return bad("unknown key '" + key + "' (drop, dup, delay, partition, for)");
    }
  }
  return r;
}

fault_injector::fault_injector(std::unique_ptr<transport> inner, uint64_t seed)
    : inner_(std::move(inner)), rng_(seed), delayer_([this] { delay_loop(); }) {}

fault_injector::~fault_injector() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  delayer_.join();
}

void fault_injector::set_rule(std::optional<peer_id> peer, fault_rule rule) {
  std::lock_guard lock(mu_);
  if (peer) {
    rules_[*peer] = rule;
  } else {
    all_ = rule;
  }
}

void fault_injector::clear() {
  std::lock_guard lock(mu_);
  rules_.clear();
  all_ = {};
}

fault_rule fault_injector::rule_for(peer_id p) const {
  auto it = rules_.find(p);
  return it == rules_.end() ? all_ : it->second;
}

void fault_injector::set_handlers(transport_handlers h) {
  auto on_frame = std::move(h.on_frame);
  h.on_frame = [this, on_frame](peer_id p, std::span<const uint8_t> frame) {
    {
      std::lock_guard lock(mu_);
      if (rule_for(p).partition) {
        ++dropped_;
        return;
      }
    }
    if (on_frame) on_frame(p, frame);
  };
  inner_->set_handlers(std::move(h));
}

status fault_injector::send(peer_id peer, std::vector<uint8_t> frame) {
  int copies = 1;
  std::chrono::milliseconds delay{0};
  {
    std::lock_guard lock(mu_);
    const fault_rule r = rule_for(peer);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    if (r.partition || (r.drop > 0 && u(rng_) < r.drop)) {
      ++dropped_;
      return ok_status();  // lost on the way: the sender cannot tell
    }
    if (r.duplicate > 0 && u(rng_) < r.duplicate) copies = 2;
    delay = r.delay;
    if (delay.count() > 0) {
      const auto due = std::chrono::steady_clock::now() + delay;
      for (int i = 0; i < copies; ++i) delayed_.emplace(due, std::make_pair(peer, frame));
      cv_.notify_all();
      return ok_status();
    }
  }
  if (copies == 2) LLMESH_TRY(inner_->send(peer, frame));
  return inner_->send(peer, std::move(frame));
}

void fault_injector::delay_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (stop_) return;
    if (delayed_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const auto due = delayed_.begin()->first;
    if (std::chrono::steady_clock::now() < due) {
      cv_.wait_until(lock, due);
      continue;
    }
    auto node = delayed_.extract(delayed_.begin());
    lock.unlock();
    (void)inner_->send(node.mapped().first, std::move(node.mapped().second));  // a lost peer reports itself
    lock.lock();
  }
}

transport_stats fault_injector::stats() const {
  auto s = inner_->stats();
  std::lock_guard lock(mu_);
  s.frames_dropped += dropped_;
  return s;
}

}  // namespace llmesh::transport
