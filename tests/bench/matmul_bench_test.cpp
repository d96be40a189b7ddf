// `llmesh bench matmul` end to end: a row per weight type asked for, int8 at 1.00x of itself,
// bytes per weight as the block layouts give them; bad flags fail with one line.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "cli/subprocess.hpp"

namespace llmesh::testing {
namespace {

const std::string llmesh_bin = LLMESH_BINARY;

TEST(MatmulBench, PrintsARowPerTypeWithItsBytesPerWeight) {
  auto r = run_command(llmesh_bin + " bench matmul --rows 512 --cols 512 --reps 2 --m 1,3 --types int8,fp8,int4,q4_k,iq4_xs,q2_k");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  for (const char* m : {"m = 1\n", "m = 3\n"}) EXPECT_NE(r.out.find(m), std::string::npos) << r.out;
  struct want {
    std::string type;
    double bytes;
  };
  for (const want& w : {want{"int8", 1.125}, want{"fp8", 1.125}, want{"int4", 0.75}, want{"q4_k", 0.5625}, want{"iq4_xs", 0.53125}, want{"q2_k", 0.328125}}) {
    const auto at = r.out.find("\n  " + w.type + " ");
    ASSERT_NE(at, std::string::npos) << w.type << "\n" << r.out;
    std::istringstream line(r.out.substr(at + 3));
    std::string name, of_bw, x_int8;
    double bytes = 0, weights_s = 0, gb_s = 0;
    line >> name >> bytes >> weights_s >> gb_s >> of_bw >> x_int8;
    EXPECT_NEAR(bytes, w.bytes, 0.001) << w.type;
    EXPECT_GT(weights_s, 0.0) << w.type;
    EXPECT_GT(gb_s, 0.0) << w.type;
    if (w.type == "int8") EXPECT_EQ(x_int8, "1.00x");
  }
}

TEST(MatmulBench, BadFlagsFailWithOneLine) {
  auto r = run_command(llmesh_bin + " bench matmul --cols 300");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--cols must be a positive multiple of 256"), std::string::npos) << r.err;
  r = run_command(llmesh_bin + " bench matmul --types q4_k,q9");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("unknown type 'q9' (known: f32, f16, bf16, int8, fp8, int4, mxfp4, q2_k"), std::string::npos) << r.err;
  r = run_command(llmesh_bin + " bench matmul --rows 16777216 --cols 4096");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("at most 2^31 weights"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace llmesh::testing
