// In-process communicator: ranks publish a pointer, meet at a barrier, read each other's
// buffers, meet again, then write their own. Two barriers per collective; the barrier spins
// briefly and then sleeps on a futex, and wakes everyone with an error when aborted.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "llmesh/kernels/communicator.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace llmesh::kernels {
namespace {

class local_group {
 public:
  explicit local_group(int size) : size_(size), slots_(size) {}

  int size() const { return size_; }

  /// Returns false when the group was aborted.
  bool arrive_and_wait() {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    if (aborted_.load(std::memory_order_acquire)) return false;
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == size_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_acq_rel);
      generation_.notify_all();
      return !aborted_.load(std::memory_order_acquire);
    }
    // Why 100 µs of spinning: the peers of a tensor-parallel step arrive within microseconds
    // of each other; sleeping costs a futex round trip on every collective.
    auto start = std::chrono::steady_clock::now();
    int i = 0;
    while (generation_.load(std::memory_order_acquire) == gen) {
#if defined(__x86_64__)
      _mm_pause();
#endif
      if ((++i & 63) == 0 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(100)) {
        generation_.wait(gen, std::memory_order_acquire);
      }
    }
    return !aborted_.load(std::memory_order_acquire);
  }

  void abort() {
    aborted_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
  }

  struct slot {
    const float* data = nullptr;
    size_t n = 0;
  };
  std::vector<slot>& slots() { return slots_; }

 private:
  int size_;
  std::vector<slot> slots_;
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> aborted_{false};
};

class local_communicator final : public communicator {
 public:
  local_communicator(std::shared_ptr<local_group> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  status all_reduce_sum(std::span<float> data) override {
    auto& slots = group_->slots();
    slots[rank_] = {data.data(), data.size()};
    if (!group_->arrive_and_wait()) return failed();
    for (const auto& s : slots) {
      if (s.n != data.size()) {
        group_->abort();
        return make_error(errc::internal, "all_reduce_sum: ranks passed different lengths");
      }
    }
    scratch_.assign(slots[0].data, slots[0].data + data.size());
    for (int r = 1; r < size(); ++r) {
      const float* src = slots[r].data;
      for (size_t i = 0; i < data.size(); ++i) scratch_[i] = scratch_[i] + src[i];
    }
    if (!group_->arrive_and_wait()) return failed();
    std::copy(scratch_.begin(), scratch_.end(), data.begin());
    return ok_status();
  }

  status all_gather(std::span<const float> in, std::span<float> out) override {
    auto& slots = group_->slots();
    slots[rank_] = {in.data(), in.size()};
    if (!group_->arrive_and_wait()) return failed();
    size_t total = 0;
    for (const auto& s : slots) total += s.n;
    if (total != out.size()) {
      group_->abort();
      return make_error(errc::internal, "all_gather: output holds " + std::to_string(out.size()) +
                                            " floats, ranks sent " + std::to_string(total));
    }
    size_t at = 0;
    for (const auto& s : slots) {
      std::copy(s.data, s.data + s.n, out.begin() + static_cast<ptrdiff_t>(at));
      at += s.n;
    }
    if (!group_->arrive_and_wait()) return failed();
    return ok_status();
  }

  void abort() override { group_->abort(); }

 private:
  static error failed() { return make_error(errc::shard_failed, "collective aborted: a peer shard failed"); }

  std::shared_ptr<local_group> group_;
  int rank_;
  std::vector<float> scratch_;
};

}  // namespace

std::vector<std::unique_ptr<communicator>> make_local_communicators(int size) {
  auto group = std::make_shared<local_group>(size);
  std::vector<std::unique_ptr<communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<local_communicator>(group, r));
  return out;
}

}  // namespace llmesh::kernels
