// `llmesh generate` against golden files from the independent PyTorch reference
// (tools/reference/, tests/data/golden/): greedy ids identical and first-step logits within
// 1e-4 (max-abs-diff / max-abs), at --tp 1 and --tp 2 (a mixture of experts also with
// --enable-expert-parallel); chunked prefill gives identical bits.
// Cases with --quantization int8 check the quantized weights against the reference's own int8.
// The same for GGUF files (tests/data/gguf).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "subprocess.hpp"

namespace llmesh::testing {
namespace {

const std::string llmesh_bin = LLMESH_BINARY;
const std::string golden_dir = std::string(LLMESH_TEST_DATA) + "/golden";

struct golden_case {
  std::string name, prompt, flags, run_flags;  ///< run_flags: extra `llmesh generate` flags (may be empty)
};

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<golden_case> load_cases() {
  std::vector<golden_case> cases;
  std::stringstream in(read_file(golden_dir + "/cases.txt"));
  std::string line;
  while (std::getline(in, line)) {
    if (trim(line).empty() || trim(line)[0] == '#') continue;
    size_t a = line.find('|'), b = line.find('|', a + 1), c = line.find('|', b + 1);
    cases.push_back({trim(line.substr(0, a)), trim(line.substr(a + 1, b - a - 1)),
                     trim(line.substr(b + 1, c == std::string::npos ? std::string::npos : c - b - 1)),
                     c == std::string::npos ? "" : trim(line.substr(c + 1))});
  }
  return cases;
}

std::vector<float> read_floats(const std::string& path) {
  std::string bytes = read_file(path);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

class GoldenTest : public ::testing::TestWithParam<golden_case> {};

TEST_P(GoldenTest, GenerateMatchesReference) {
  const auto& c = GetParam();
  temp_dir tmp;
  const std::string model = tmp.path() + "/model";
  auto made = run_command(llmesh_bin + " model random --out " + model + " " + c.flags);
  ASSERT_EQ(made.exit_code, 0) << made.err;
  // The model must be the one the reference saw.
  auto sums = run_command("cd " + model + " && sha256sum -c --quiet " + golden_dir + "/" + c.name + "/model.sha256");
  ASSERT_EQ(sums.exit_code, 0) << "random model bytes changed: regenerate the golden files\n" << sums.out << sums.err;

  const std::string want_ids = trim(read_file(golden_dir + "/" + c.name + "/ids.txt"));
  const auto want_logits = read_floats(golden_dir + "/" + c.name + "/logits.f32");
  float max_abs = 0;
  for (float x : want_logits) max_abs = std::max(max_abs, std::fabs(x));

  const bool splits_in_two = c.name.find("h200") == std::string::npos;  // 5 heads cannot split
  std::vector<float> tp1_logits;
  // A mixture of experts also runs expert-parallel (whole experts per rank).
  std::vector<std::string> runs = {"--tp 1", "--tp 2"};
  if (c.flags.find("--experts ") != std::string::npos) runs.push_back("--tp 2 --enable-expert-parallel");
  for (size_t run = 0; run < runs.size(); ++run) {
    SCOPED_TRACE(runs[run]);
    const std::string dump = tmp.path() + "/logits" + std::to_string(run);
    auto r = run_command(llmesh_bin + " generate --device cpu --model " + model + " --prompt-ids " + c.prompt +
                         " --max-tokens 32 --print-ids --threads 2 " + runs[run] + " --dump-logits " + dump + " " +
                         c.run_flags);
    if (run > 0 && !splits_in_two) {
      EXPECT_NE(r.exit_code, 0);
      EXPECT_NE(r.err.find("cannot split num_attention_heads"), std::string::npos) << r.err;
      continue;
    }
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(trim(r.out), want_ids);
    auto got = read_floats(dump);
    ASSERT_EQ(got.size(), want_logits.size());
    float max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::fabs(got[i] - want_logits[i]));
    EXPECT_LT(max_diff / max_abs, 1e-4f) << "max abs diff " << max_diff;
    if (run == 0) tp1_logits = got;
  }

  // Prefill in chunks of 3: the same bits as prefilling the whole prompt.
  const std::string dump = tmp.path() + "/logits_chunked";
  auto r = run_command(llmesh_bin + " generate --device cpu --model " + model + " --prompt-ids " + c.prompt +
                       " --max-tokens 32 --print-ids --prefill-chunk 3 --dump-logits " + dump + " " + c.run_flags);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(trim(r.out), want_ids);
  auto chunked = read_floats(dump);
  ASSERT_EQ(chunked.size(), tp1_logits.size());
  EXPECT_EQ(std::memcmp(chunked.data(), tp1_logits.data(), chunked.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenTest, ::testing::ValuesIn(load_cases()),
                         [](const auto& info) { return info.param.name; });

// GGUF files (tests/data/gguf: what llama.cpp's converter writes, from tools/reference/
// hf_to_gguf.py) against the reference's run over the weights each file holds: the same
// greedy ids and logits within 1e-4, at --tp 1 and 2 (a mixture of experts also
// expert-parallel), and chunked prefill bit for bit.
const std::string gguf_dir = std::string(LLMESH_TEST_DATA) + "/gguf";

std::vector<golden_case> load_gguf_cases() {
  std::vector<golden_case> cases;
  std::stringstream in(read_file(gguf_dir + "/cases.txt"));
  std::string line;
  while (std::getline(in, line)) {
    if (trim(line).empty() || trim(line)[0] == '#') continue;
    size_t a = line.find('|'), b = line.find('|', a + 1), c = line.find('|', b + 1);
    cases.push_back({trim(line.substr(0, a)), trim(line.substr(a + 1, b - a - 1)), trim(line.substr(b + 1, c - b - 1)),
                     trim(line.substr(c + 1))});
  }
  return cases;
}

class GgufGoldenTest : public ::testing::TestWithParam<golden_case> {};

TEST_P(GgufGoldenTest, GenerateMatchesReference) {
  const auto& c = GetParam();
  temp_dir tmp;
  const std::string model = gguf_dir + "/" + c.name + "/model.gguf";
  const std::string want_ids = trim(read_file(gguf_dir + "/" + c.name + "/ids.txt"));
  const auto want_logits = read_floats(gguf_dir + "/" + c.name + "/logits.f32");
  float max_abs = 0;
  for (float x : want_logits) max_abs = std::max(max_abs, std::fabs(x));
  std::vector<float> tp1_logits;
  // A mixture of experts also runs expert-parallel (whole experts per rank).
  std::vector<std::string> runs = {"--tp 1", "--tp 2"};
  if (c.flags.find("--experts ") != std::string::npos) runs.push_back("--tp 2 --enable-expert-parallel");
  for (size_t run = 0; run < runs.size(); ++run) {
    SCOPED_TRACE(runs[run]);
    const std::string dump = tmp.path() + "/logits" + std::to_string(run);
    auto r = run_command(llmesh_bin + " generate --device cpu --model " + model + " --prompt-ids " + c.prompt +
                         " --max-tokens 32 --print-ids --threads 2 " + runs[run] + " --dump-logits " + dump);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(trim(r.out), want_ids);
    auto got = read_floats(dump);
    ASSERT_EQ(got.size(), want_logits.size());
    float max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::fabs(got[i] - want_logits[i]));
    EXPECT_LT(max_diff / max_abs, 1e-4f) << "max abs diff " << max_diff;
    if (run == 0) tp1_logits = got;
  }
  const std::string dump = tmp.path() + "/logits_chunked";
  auto r = run_command(llmesh_bin + " generate --device cpu --model " + model + " --prompt-ids " + c.prompt +
                       " --max-tokens 32 --print-ids --prefill-chunk 3 --dump-logits " + dump);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(trim(r.out), want_ids);
  auto chunked = read_floats(dump);
  ASSERT_EQ(chunked.size(), tp1_logits.size());
  EXPECT_EQ(std::memcmp(chunked.data(), tp1_logits.data(), chunked.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Gguf, GgufGoldenTest, ::testing::ValuesIn(load_gguf_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace llmesh::testing
