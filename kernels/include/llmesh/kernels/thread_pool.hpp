// A fixed-size pool of worker threads that run one parallel region at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace llmesh::kernels {

/// Runs `fn(thread_index, n_threads)` on every thread of the pool, the caller included as
/// thread 0, and returns when all have finished. Workers spin briefly after a region (the next
/// one usually follows within microseconds during a forward pass) and then sleep on a futex,
/// so an idle pool burns no core.
///
/// Thread affinity: `run` must be called from one thread at a time (the owner); the pool is not
/// reentrant. Sized to the cores: the pool is the only source of kernel threads in a process.
class thread_pool {
 public:
  /// n_threads counts the caller; 0 means "one per hardware thread".
  explicit thread_pool(int n_threads);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  /// Number of threads, caller included.
  int size() const { return n_threads_; }

  /// Runs fn on all threads and waits for all of them.
  void run(const std::function<void(int thread_index, int n_threads)>& fn);

  /// Splits [0, n) into size() contiguous ranges; returns range i as {begin, end}.
  static std::pair<size_t, size_t> split(size_t n, int i, int parts) {
    return {n * static_cast<size_t>(i) / static_cast<size_t>(parts),
            n * static_cast<size_t>(i + 1) / static_cast<size_t>(parts)};
  }

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* task_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace llmesh::kernels
