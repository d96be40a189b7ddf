// `llmesh bench allreduce`: the tensor plane's collectives (actors::tensor_communicator over UCX,
// what a replica spread over processes pays at every layer) next to the in-process
// shared-memory communicator measured in the same run, for a model's shapes: one all-reduce of
// a token's hidden state (two per layer) and the LM head's all-gather (one per step), and the
// per-token cost those add up to. Two ranks, each with its own UCX transport over TCP loopback
// (UCX's peer error mode drops shared memory: two processes on one host pay the same).
#pragma once

#include <cstddef>
#include <string>

#include "llmesh/common/error.hpp"

namespace llmesh::bench {

struct allreduce_bench_options {
  std::string model_dir;  ///< its config gives the shapes; empty: --hidden, --vocab, --layers
  size_t hidden = 2048, vocab = 32000, layers = 16;
  size_t iters = 2000;    ///< collectives timed per shape (after 100 warm-up ones)
  int spin_us = 0;        ///< ucx_options::spin of both ranks' transports
};

[[nodiscard]] status run_allreduce_bench(const allreduce_bench_options& opt);

}  // namespace llmesh::bench
