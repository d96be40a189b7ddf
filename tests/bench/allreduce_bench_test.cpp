// `llmesh bench allreduce` end to end: two tensor-plane ranks over UCX and the in-process
// communicator on small shapes, a JSON line with their medians; bad input fails with one line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/subprocess.hpp"

namespace llmesh::testing {
namespace {

const std::string llmesh_bin = LLMESH_BINARY;

TEST(AllreduceBench, TimesBothCommunicatorsAndReportsAJsonLine) {
  auto r = run_command(llmesh_bin + " bench allreduce --hidden 64 --vocab 256 --layers 2 --iters 50");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("per decode step (2 layers: 4 all-reduces + 1 all-gather)"), std::string::npos) << r.out;
  const auto at = r.out.rfind("\n{");
  ASSERT_NE(at, std::string::npos) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(at + 1));
  for (const char* k : {"allreduce_ucx_us", "allreduce_shm_us", "gather_ucx_us", "gather_shm_us"}) EXPECT_GT(j[k].get<double>(), 0.0) << k;
  // A step is 2 all-reduces per layer and one all-gather (each printed to 3 decimals).
  EXPECT_NEAR(j["step_ucx_us"].get<double>(), 4 * j["allreduce_ucx_us"].get<double>() + j["gather_ucx_us"].get<double>(), 0.01);
  // A greedy step gathers argmax pairs instead of the logits.
  EXPECT_GT(j["argmax_gather_ucx_us"].get<double>(), 0.0);
  EXPECT_NEAR(j["greedy_step_ucx_us"].get<double>(), 4 * j["allreduce_ucx_us"].get<double>() + j["argmax_gather_ucx_us"].get<double>(), 0.01);
}

TEST(AllreduceBench, BadInputFailsWithOneLine) {
  auto r = run_command(llmesh_bin + " bench allreduce --iters 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--iters"), std::string::npos) << r.err;
  auto m = run_command(llmesh_bin + " bench allreduce --model /nonexistent/model");
  EXPECT_NE(m.exit_code, 0);
  EXPECT_NE(m.err.find("/nonexistent/model"), std::string::npos) << m.err;
}

}  // namespace
}  // namespace llmesh::testing
