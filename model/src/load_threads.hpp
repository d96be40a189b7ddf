// Load-time work spread over every hardware thread (private to the model library): converting,
// quantizing and unpacking weights.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::model::detail {

/// Runs item(0) .. item(n − 1) on up to 64 hardware threads (on fewer when no more can start),
/// each item once; returns the error of the lowest-numbered failing item, so that a failure
/// reads the same on every run, or ok.
inline status for_each_item(size_t n, const std::function<status(size_t)>& item) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  size_t failed_item = n;
  status failed = ok_status();
  auto work = [&] {
    for (size_t k = next.fetch_add(1); k < n; k = next.fetch_add(1)) {
      if (auto s = item(k); !s) {
        std::lock_guard lock(mu);
        if (k < failed_item) {
          failed_item = k;
          failed = std::move(s);
        }
      }
    }
  };
  const unsigned n_threads = std::max(1u, std::min(std::thread::hardware_concurrency(), 64u));
  std::vector<std::jthread> pool;
  try {
    for (unsigned i = 1; i < n_threads && n > 1; ++i) pool.emplace_back(work);
  } catch (const std::system_error&) {
    // fewer threads: those started and this one share the items
  }
  work();
  pool.clear();
  return failed;
}

}  // namespace llmesh::model::detail
