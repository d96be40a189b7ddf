// Thread pool: generation counter + spin-then-futex wait (std::atomic::wait is a futex on Linux).
#include "llmesh/kernels/thread_pool.hpp"

#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace llmesh::kernels {
namespace {

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Why 50 µs: between two parallel regions of a forward step there are only a few µs of
// single-threaded work, so a worker that spins this long almost always catches the next
// region without a futex round trip (~10-50 µs), yet an idle pool goes to sleep quickly.
constexpr auto spin_budget = std::chrono::microseconds(50);

template <class Pred>
void spin_then_wait(const std::atomic<uint64_t>& word, uint64_t old, Pred done) {
  auto start = std::chrono::steady_clock::now();
  int i = 0;
  while (!done()) {
    cpu_relax();
    if ((++i & 63) == 0 && std::chrono::steady_clock::now() - start > spin_budget) {
      while (!done()) word.wait(old, std::memory_order_acquire);
      return;
    }
  }
}

}  // namespace

thread_pool::thread_pool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

thread_pool::~thread_pool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void thread_pool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  task_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(0, n_threads_);
  // Wait for the workers; pending_ is an int, so spin on it and park on the generation word's
  // companion: workers notify pending_ when the last one finishes.
  auto start = std::chrono::steady_clock::now();
  int i = 0;
  while (true) {
    int left = pending_.load(std::memory_order_acquire);
    if (left == 0) break;
    cpu_relax();
    if ((++i & 63) == 0 && std::chrono::steady_clock::now() - start > spin_budget) {
      pending_.wait(left, std::memory_order_acquire);
    }
  }
  task_ = nullptr;
}

void thread_pool::worker_loop(int index) {
  uint64_t seen = 0;
  while (true) {
    spin_then_wait(generation_, seen,
                   [&] { return generation_.load(std::memory_order_acquire) != seen; });
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    (*task_)(index, n_threads_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace llmesh::kernels
