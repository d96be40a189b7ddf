// The bundled demo model (models/kjv-tiny, trained by tools/train/): `llmesh generate` greedy
// continues the committed prompts exactly as the training script's own PyTorch generation did
// (tests/data/kjv_tiny/expected.txt), whether the prompt is given as ids or as text.
#include <gtest/gtest.h>

#include <sstream>

#include "subprocess.hpp"

namespace llmesh::testing {
namespace {

const std::string llmesh_bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";

struct expected_case {
  std::string prompt_ids, generated_ids, text;
};

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<expected_case> cases() {
  std::vector<expected_case> out;
  std::stringstream in(read_file(std::string(LLMESH_TEST_DATA) + "/kjv_tiny/expected.txt"));
  std::string line;
  while (std::getline(in, line)) {
    size_t a = line.find(" | "), b = line.find(" | ", a + 3);
    if (a == std::string::npos || b == std::string::npos) continue;
    out.push_back({trim(line.substr(0, a)), trim(line.substr(a + 3, b - a - 3)), line.substr(b + 3)});
  }
  return out;
}

std::string commas(std::string ids) {
  for (char& c : ids) c = c == ' ' ? ',' : c;
  return ids;
}

TEST(KjvTiny, GreedyMatchesTheTrainingScriptsPyTorch) {
  auto all = cases();
  ASSERT_EQ(all.size(), 3u);
  for (const auto& c : all) {
    SCOPED_TRACE(c.prompt_ids);
    auto r = run_command(llmesh_bin + " generate --device cpu --model " + model_dir + " --prompt-ids " + commas(c.prompt_ids) +
                         " --max-tokens 32 --print-ids");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(trim(r.out.substr(0, r.out.size() - 1)), c.generated_ids);
    auto text = run_command(llmesh_bin + " generate --device cpu --model " + model_dir + " --prompt-ids " + commas(c.prompt_ids) +
                            " --max-tokens 32");
    std::string flat = text.out.substr(0, text.out.size() - 1);  // expected.txt keeps one line a case:
    for (char& ch : flat) ch = ch == '\n' ? ' ' : ch;             // its text has newlines as spaces
    EXPECT_EQ(flat, c.text);
  }
}

TEST(KjvTiny, TextPromptTokenizesLikeTheTrainingTokenizer) {
  auto r = run_command(llmesh_bin + " tokenize --model " + model_dir + " --text 'In the beginning God created'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, cases().at(0).prompt_ids + "\n");
  temp_dir tmp;
  std::ofstream(tmp.path() + "/m.json") << R"([{"role": "user", "content": "Hi"}])";
  auto chat = run_command(llmesh_bin + " chat-template --model " + model_dir + " --messages " + tmp.path() +
                          "/m.json --add-generation-prompt");
  EXPECT_EQ(chat.out, "user: Hi\nassistant:");
}

}  // namespace
}  // namespace llmesh::testing
