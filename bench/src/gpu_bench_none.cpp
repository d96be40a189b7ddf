// Builds without CUDA: no GPU benchmark.
#include "llmesh/bench/gpu_bench.hpp"

namespace llmesh::bench {

status run_gpu_bench(const gpu_bench_options&) {
  return make_error(errc::invalid_request, "this llmesh was built without CUDA");
}

}  // namespace llmesh::bench
