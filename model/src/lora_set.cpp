// lora_set: the adapters a model serves, by id (see lora_set.hpp).
#include "llmesh/model/lora_set.hpp"

namespace llmesh::model {

result<int32_t> lora_set::add(std::shared_ptr<const lora_adapter> a) {
  std::lock_guard lock(mu_);
  size_t loaded = 0;
  for (const auto& s : slots_) {
    if (!s) continue;
    ++loaded;
    if (s->name == a->name) return make_error(errc::invalid_request, "the LoRA adapter '" + a->name + "' is loaded already");
  }
  if (loaded >= capacity_) {
    return make_error(errc::invalid_request, "the LoRA adapter '" + a->name + "' would be one more than the " +
                                                 std::to_string(capacity_) +
                                                 " this server holds at once (--max-cpu-loras); unload one first");
  }
  slots_.push_back(std::move(a));
  return static_cast<int32_t>(slots_.size() - 1);
}

status lora_set::remove(std::string_view name) {
  std::lock_guard lock(mu_);
  for (auto& s : slots_) {
    if (s && s->name == name) {
      s.reset();
      return ok_status();
    }
  }
  return make_error(errc::not_found, "the LoRA adapter '" + std::string(name) + "' is not loaded");
}

std::shared_ptr<const lora_adapter> lora_set::get(int32_t id) const {
  std::lock_guard lock(mu_);
  return id >= 0 && static_cast<size_t>(id) < slots_.size() ? slots_[static_cast<size_t>(id)] : nullptr;
}

std::pair<int32_t, std::shared_ptr<const lora_adapter>> lora_set::find(std::string_view name) const {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i] && slots_[i]->name == name) return {static_cast<int32_t>(i), slots_[i]};
  }
  return {-1, nullptr};
}

std::vector<std::shared_ptr<const lora_adapter>> lora_set::loaded() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<const lora_adapter>> out;
  for (const auto& s : slots_) {
    if (s) out.push_back(s);
  }
  return out;
}

size_t lora_set::size() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& s : slots_) n += s ? 1 : 0;
  return n;
}

int32_t lora_set::ids() const {
  std::lock_guard lock(mu_);
  return static_cast<int32_t>(slots_.size());
}

size_t lora_set::capacity() const {
  std::lock_guard lock(mu_);
  return capacity_;
}

void lora_set::set_capacity(size_t n) {
  std::lock_guard lock(mu_);
  capacity_ = n;
}

}  // namespace llmesh::model
