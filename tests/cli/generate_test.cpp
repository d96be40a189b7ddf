// `llmesh generate` output modes: --print-ids prints the ids on one line; without it the text
// is streamed, and equals the decode of those ids.
#include <gtest/gtest.h>

#include <sstream>

#include "llmesh/model/detokenizer.hpp"
#include "subprocess.hpp"

namespace llmesh::testing {
namespace {

const std::string llmesh_bin = LLMESH_BINARY;

TEST(Generate, TextOutputIsTheDecodeOfThePrintedIds) {
  temp_dir tmp;
  const std::string model = tmp.path() + "/m";
  ASSERT_EQ(run_command(llmesh_bin + " model random --out " + model + " --vocab 300 --seed 3").exit_code, 0);
  const std::string common = llmesh_bin + " generate --device cpu --model " + model + " --prompt-ids 72,101,108 --max-tokens 24 --seed 9";
  auto ids_run = run_command(common + " --print-ids");
  ASSERT_EQ(ids_run.exit_code, 0) << ids_run.err;
  std::vector<int32_t> ids;
  std::stringstream ss(ids_run.out);
  for (int32_t id; ss >> id;) ids.push_back(id);
  ASSERT_EQ(ids.size(), 24u);

  auto text_run = run_command(common);
  ASSERT_EQ(text_run.exit_code, 0) << text_run.err;
  auto d = model::detokenizer::load(model);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(text_run.out, d->decode(ids) + "\n");
}

TEST(Generate, UndecodableTokenizerFallsBackToIds) {
  temp_dir tmp;
  const std::string model = tmp.path() + "/m";
  ASSERT_EQ(run_command(llmesh_bin + " model random --out " + model + " --vocab 300").exit_code, 0);
  std::ofstream(model + "/tokenizer.json") << R"({"model":{"type":"BPE","vocab":{}},"decoder":{"type":"WordPiece"}})";
  auto r = run_command(llmesh_bin + " generate --device cpu --model " + model + " --prompt-ids 1,2 --max-tokens 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("printing ids"), std::string::npos) << r.err;
  std::stringstream ss(r.out);
  int count = 0;
  for (int32_t id; ss >> id;) ++count;
  EXPECT_EQ(count, 3);
}

}  // namespace
}  // namespace llmesh::testing

namespace llmesh::testing {
namespace {

const std::string llama3_dir = std::string(LLMESH_TEST_DATA) + "/tokenizers/llama3";

TEST(Tokenize, EncodesAndDecodesThroughTheCli) {
  auto r = run_command(llmesh_bin + " tokenize --model " + llama3_dir + " --text 'Hello, world!'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "9906 11 1917 0\n");
  r = run_command(llmesh_bin + " tokenize --model " + llama3_dir + " --decode 9906,11,1917,0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Hello, world!\n");
  temp_dir tmp;
  std::ofstream(tmp.path() + "/in.txt") << "Hello, world!";
  r = run_command(llmesh_bin + " tokenize --model " + llama3_dir + " --file " + tmp.path() + "/in.txt");
  EXPECT_EQ(r.out, "9906 11 1917 0\n");
  r = run_command(llmesh_bin + " tokenize --model " + llama3_dir + " --text a --decode 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("exactly one"), std::string::npos) << r.err;
}

TEST(Generate, PromptTextIsTokenizedLikePromptIds) {
  temp_dir tmp;
  const std::string model = tmp.path() + "/m";
  ASSERT_EQ(run_command(llmesh_bin + " model random --out " + model + " --vocab 300 --seed 4").exit_code, 0);
  auto by_text = run_command(llmesh_bin + " generate --device cpu --model " + model + " --prompt Hi --max-tokens 6 --print-ids");
  auto by_ids = run_command(llmesh_bin + " generate --device cpu --model " + model + " --prompt-ids 72,105 --max-tokens 6 --print-ids");
  ASSERT_EQ(by_text.exit_code, 0) << by_text.err;
  EXPECT_EQ(by_text.out, by_ids.out);
  auto neither = run_command(llmesh_bin + " generate --device cpu --model " + model + " --max-tokens 2");
  EXPECT_NE(neither.exit_code, 0);
}

}  // namespace
}  // namespace llmesh::testing

namespace llmesh::testing {
namespace {

TEST(ChatTemplateCli, RendersTheModelsTemplate) {
  temp_dir tmp;
  std::ofstream(tmp.path() + "/m.json") << R"([{"role": "user", "content": "Hi"}])";
  auto r = run_command(llmesh_bin + " chat-template --model " + std::string(LLMESH_TEST_DATA) +
                       "/tokenizers/llama3_1 --messages " + tmp.path() + "/m.json --add-generation-prompt");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  r = run_command(llmesh_bin + " chat-template --model " + tmp.path() + " --messages " + tmp.path() + "/m.json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("tokenizer_config.json"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace llmesh::testing
