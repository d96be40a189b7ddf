// `llmesh bench transport` end to end: two real processes over UCX, a JSON line with the round
// trip and bandwidth (and ucx_perftest's, best effort); bad flags fail
// with one line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/subprocess.hpp"

namespace llmesh::testing {
namespace {

const std::string llmesh_bin = LLMESH_BINARY;

TEST(TransportBench, MeasuresBothProcessesAndReportsAJsonLine) {
  auto r = run_command(llmesh_bin + " bench transport --iters 200 --frames 4 --large-bytes 1048576");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const auto at = r.out.rfind("\n{");
  ASSERT_NE(at, std::string::npos) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(at + 1));
  EXPECT_GT(j["rt_p50_us"].get<double>(), 0.0);
  EXPECT_GE(j["rt_mean_us"].get<double>(), 0.0);
  EXPECT_GT(j["bw_gbs"].get<double>(), 0.0);
  // ucx_perftest's numbers are best effort (null when it is missing or its server was slow).
  EXPECT_TRUE(j.contains("perftest_rt_us") && j.contains("perftest_bw_gbs"));
}

TEST(TransportBench, BadFlagsFailWithOneLine) {
  auto r = run_command(llmesh_bin + " bench transport --small-bytes 9000");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--small-bytes"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace llmesh::testing
