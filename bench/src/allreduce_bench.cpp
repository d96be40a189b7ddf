// `llmesh bench allreduce` (allreduce_bench.hpp).
#include "llmesh/bench/allreduce_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "llmesh/actors/tensor_communicator.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/transport/ucx_transport.hpp"

namespace llmesh::bench {
namespace {

using clock_type = std::chrono::steady_clock;

struct timing {
  double median_us = 0, mean_us = 0;
};

/// Runs `op(rank)` `iters` times on two threads at once (each rank its own thread, as shard
/// actors do) and times rank 0's calls.
result<timing> time_pair(size_t iters, const std::function<status(int)>& op) {
  std::vector<double> us;
  us.reserve(iters);
  status s0, s1;
  std::thread peer([&] {
    for (size_t i = 0; i < iters + 100 && s1; ++i) s1 = op(1);
  });
  for (size_t i = 0; i < iters + 100 && s0; ++i) {
    const auto t0 = clock_type::now();
    s0 = op(0);
    if (i >= 100) us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
  }
  peer.join();
  LLMESH_TRY(s0);
  LLMESH_TRY(s1);
  std::sort(us.begin(), us.end());
  timing t;
  t.median_us = us[us.size() / 2];
  for (double v : us) t.mean_us += v / static_cast<double>(us.size());
  return t;
}

}  // namespace

status run_allreduce_bench(const allreduce_bench_options& opt) {
  size_t hidden = opt.hidden, vocab = opt.vocab, layers = opt.layers;
  if (!opt.model_dir.empty()) {
    auto c = model::load_config(opt.model_dir);
    if (!c) return c.take_error();
    hidden = c->hidden;
    vocab = c->vocab;
    layers = c->n_layers;
  }
  if (opt.iters == 0 || hidden == 0 || vocab < 2 || layers == 0) {
    return make_error(errc::invalid_request, "need --iters, --hidden, --layers > 0 and --vocab > 1");
  }
  // Two ranks over UCX, each with its own transport (its own worker and progress thread).
  transport::ucx_options uo;
  uo.spin = std::chrono::microseconds(opt.spin_us);
  std::vector<std::unique_ptr<actors::tensor_communicator>> ucx;
  std::vector<std::string> addresses;
  for (int r = 0; r < 2; ++r) {
    auto t = transport::ucx_transport::create(uo);
    if (!t) return t.take_error();
    auto c = actors::tensor_communicator::create(std::move(*t), "127.0.0.1:0", {r, 2, "allreduce-bench-key-0123456789", std::chrono::seconds(30)});
    if (!c) return c.take_error();
    addresses.push_back((*c)->address());
    ucx.push_back(std::move(*c));
  }
  status j1;
  std::thread joiner([&] { j1 = ucx[1]->join(addresses); });
  auto j0 = ucx[0]->join(addresses);
  joiner.join();
  LLMESH_TRY(j0);
  LLMESH_TRY(j1);
  auto local = kernels::make_local_communicators(2);

  // Decode's shapes for one token: the hidden state all-reduced, the LM head's halves gathered.
  std::vector<std::vector<float>> data(2, std::vector<float>(hidden, 0.5f));
  const size_t half = vocab / 2;
  std::vector<std::vector<float>> part{std::vector<float>(half, 1.0f), std::vector<float>(vocab - half, 2.0f)};
  std::vector<std::vector<float>> whole(2, std::vector<float>(vocab));
  // A greedy step gathers each slice's argmax instead: (value, id) per rank.
  std::vector<std::vector<float>> pair(2, std::vector<float>(2, 1.0f)), pairs(2, std::vector<float>(4));
  auto reduce = [&](auto& comms) {
    return time_pair(opt.iters, [&](int r) { return comms[static_cast<size_t>(r)]->all_reduce_sum(data[static_cast<size_t>(r)]); });
  };
  auto gather = [&](auto& comms) {
    return time_pair(opt.iters, [&](int r) {
      return comms[static_cast<size_t>(r)]->all_gather(part[static_cast<size_t>(r)], whole[static_cast<size_t>(r)]);
    });
  };
  auto ucx_reduce = reduce(ucx);
  if (!ucx_reduce) return ucx_reduce.take_error();
  auto ucx_gather = gather(ucx);
  if (!ucx_gather) return ucx_gather.take_error();
  auto mem_reduce = reduce(local);
  if (!mem_reduce) return mem_reduce.take_error();
  auto mem_gather = gather(local);
  if (!mem_gather) return mem_gather.take_error();
  auto argmax_gather = [&](auto& comms) {
    return time_pair(opt.iters, [&](int r) {
      return comms[static_cast<size_t>(r)]->all_gather(pair[static_cast<size_t>(r)], pairs[static_cast<size_t>(r)]);
    });
  };
  auto ucx_pairs = argmax_gather(ucx);
  if (!ucx_pairs) return ucx_pairs.take_error();
  auto mem_pairs = argmax_gather(local);
  if (!mem_pairs) return mem_pairs.take_error();
  const double greedy_ucx = 2.0 * static_cast<double>(layers) * ucx_reduce->median_us + ucx_pairs->median_us;

  const double per_token_ucx = 2.0 * static_cast<double>(layers) * ucx_reduce->median_us + ucx_gather->median_us;
  const double per_token_mem = 2.0 * static_cast<double>(layers) * mem_reduce->median_us + mem_gather->median_us;
  std::printf("tensor plane, 2 ranks, %zu iterations per shape (UCX spin %d us)\n", opt.iters, opt.spin_us);
  std::printf("%-34s %12s %12s %12s %12s\n", "collective", "UCX med us", "UCX mean us", "shm med us", "UCX / shm");
  std::printf("%-34s %12.1f %12.1f %12.1f %11.1fx\n", ("all_reduce " + std::to_string(hidden) + " floats").c_str(),
              ucx_reduce->median_us, ucx_reduce->mean_us, mem_reduce->median_us, ucx_reduce->median_us / mem_reduce->median_us);
  std::printf("%-34s %12.1f %12.1f %12.1f %11.1fx\n", ("all_gather " + std::to_string(vocab) + " floats").c_str(),
              ucx_gather->median_us, ucx_gather->mean_us, mem_gather->median_us, ucx_gather->median_us / mem_gather->median_us);
  std::printf("%-34s %12.1f %12.1f %12.1f %11.1fx\n", "all_gather of argmax pairs (greedy)", ucx_pairs->median_us,
              ucx_pairs->mean_us, mem_pairs->median_us, ucx_pairs->median_us / mem_pairs->median_us);
  std::printf("per decode step (%zu layers: %zu all-reduces + 1 all-gather): UCX %.0f us, shared memory %.0f us; "
              "the split costs %.0f us a step; a greedy step (argmax pairs): UCX %.0f us\n",
              layers, 2 * layers, per_token_ucx, per_token_mem, per_token_ucx - per_token_mem, greedy_ucx);
  std::printf("{\"allreduce_ucx_us\":%.3f,\"allreduce_shm_us\":%.3f,\"gather_ucx_us\":%.3f,\"gather_shm_us\":%.3f,"
              "\"step_ucx_us\":%.3f,\"step_shm_us\":%.3f,\"argmax_gather_ucx_us\":%.3f,\"greedy_step_ucx_us\":%.3f}\n",
              ucx_reduce->median_us, mem_reduce->median_us, ucx_gather->median_us, mem_gather->median_us, per_token_ucx,
              per_token_mem, ucx_pairs->median_us, greedy_ucx);
  return ok_status();
}

}  // namespace llmesh::bench
