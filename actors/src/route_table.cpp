// Replicas by model (route_table.hpp).
#include "llmesh/actors/route_table.hpp"

namespace llmesh::actors {

route_table::route_table(balance_policy fallback, std::map<std::string, balance_policy, std::less<>> policies,
                         size_t block_size)
    : fallback_(fallback), policies_(std::move(policies)), block_size_(block_size) {}

result<replica_role> parse_replica_role(std::string_view name) {
  if (name == "decode") return replica_role::decode;
  if (name == "prefill") return replica_role::prefill;
  return make_error(errc::invalid_request, "unknown replica role '" + std::string(name) + "' (expected decode or prefill)");
}

std::string_view replica_role_name(replica_role r) { return r == replica_role::prefill ? "prefill" : "decode"; }

balancer& route_table::of(const std::string& model, replica_role role) {
  auto& pool = role == replica_role::prefill ? prefill_ : balancers_;
  auto it = pool.find(model);
  if (it == pool.end()) {
    auto p = policies_.find(model);
    it = pool.emplace(model, std::make_unique<balancer>(p == policies_.end() ? fallback_ : p->second, 1, block_size_)).first;
  }
  return *it->second;
}

void route_table::add(uint64_t replica, std::string model, replica_role role) {
  remove(replica);
  of(model, role).update(replica_load{replica, true, 0, 0, 0, 0});
  // Whether a prompt goes to a prefill replica depends on what its decode replica caches.
  if (role == replica_role::prefill) of(model, replica_role::decode).track_prefixes();
  ready_[replica] = true;
  model_of_[replica] = std::move(model);
  role_of_[replica] = role;
}

balancer* route_table::balancer_of(uint64_t replica) {
  auto it = model_of_.find(replica);
  return it == model_of_.end() ? nullptr : &of(it->second, role_of_.at(replica));
}

void route_table::remove(uint64_t replica) {
  auto* b = balancer_of(replica);
  if (!b) return;
  b->remove(replica);
  ready_.erase(replica);
  role_of_.erase(replica);
  model_of_.erase(replica);
}

bool route_table::update(const replica_load& load) {
  auto* b = balancer_of(load.replica);
  if (!b) return false;
  b->update(load);
  ready_[load.replica] = load.ready;
  return true;
}

void route_table::apply(const kv_events& e) {
  if (auto* b = balancer_of(e.replica)) b->apply(e);
}

bool route_table::tracks(uint64_t replica) {
  auto* b = balancer_of(replica);
  return b && b->tracking();
}

size_t route_table::reported_blocks(uint64_t replica) {
  auto* b = balancer_of(replica);
  return b ? b->reported_blocks(replica) : 0;
}

result<uint64_t> route_table::pick_in(std::map<std::string, std::unique_ptr<balancer>, std::less<>>& pool, std::string_view model,
                                      std::span<const int32_t> prompt, uint64_t salt, uint64_t key, const char* what,
                                      size_t* cached_tokens, size_t max_queue) {
  auto none = [&] {
    return make_error(errc::replica_unavailable, model.empty() ? std::string("no ready ") + what
                                                               : std::string("no ready ") + what + " of model '" + std::string(model) + "'");
  };
  auto it = pool.find(model);
  if (it == pool.end()) return none();
  const prompt_blocks blocks = it->second->blocks_of(prompt, salt);  // hashed once per pick
  auto picked = it->second->pick_blocks(blocks, key);
  if (!picked) return none();
  // The policy's pick (an affinity key's replica, a prefix's) may be over the queue limit while
  // another is not: the least busy then, unless it is full too.
  if (max_queue > 0 && it->second->load_of(*picked) >= max_queue) {
    picked = it->second->least_loaded();  // a ready one exists: the policy picked one
    if (!picked) return none();
    if (it->second->load_of(*picked) >= max_queue) {
      return make_error(errc::overloaded, "every ready " + std::string(what) + " of model '" + std::string(model) + "' has " +
                                              std::to_string(max_queue) + " or more requests");
    }
  }
  if (cached_tokens) *cached_tokens = it->second->cached_tokens_of(*picked, blocks);  // before this prompt is recorded
  it->second->assigned_blocks(*picked, blocks, key);
  return picked;
}

result<uint64_t> route_table::pick(std::string_view model, std::span<const int32_t> prompt, uint64_t salt, uint64_t key,
                                   size_t* cached_tokens) {
  return pick_in(balancers_, model, prompt, salt, key, "replica", cached_tokens);
}

result<uint64_t> route_table::pick_prefill(std::string_view model, std::span<const int32_t> prompt, uint64_t salt, uint64_t key,
                                           size_t max_queue) {
  return pick_in(prefill_, model, prompt, salt, key, "prefill replica", nullptr, max_queue);
}

void route_table::forget_prefixes() {
  for (auto* pool : {&balancers_, &prefill_}) {
    for (auto& [model, b] : *pool) b->forget_prefixes();
  }
}

bool route_table::has_prefill(std::string_view model) const {
  auto it = prefill_.find(model);
  return it != prefill_.end() && !it->second->empty();
}

void route_table::finished(uint64_t replica) {
  if (auto* b = balancer_of(replica)) b->finished(replica);
}

model_counts route_table::ready() const {
  model_counts out;
  for (const auto& [id, model] : model_of_) {
    out[model] += ready_.at(id) && role_of_.at(id) == replica_role::decode ? 1 : 0;
  }
  return out;
}

void ready_counts::set(model_counts counts) {
  std::lock_guard lock(mu_);
  counts_ = std::move(counts);
}

size_t ready_counts::total() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [m, c] : counts_) n += c;
  return n;
}

size_t ready_counts::of(std::string_view model) const {
  std::lock_guard lock(mu_);
  auto it = counts_.find(model);
  return it == counts_.end() ? 0 : it->second;
}

}  // namespace llmesh::actors
