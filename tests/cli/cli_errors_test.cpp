// Bad flags, unreadable models and bad configs end with one line naming the problem and a
// non-zero exit — never a crash or a stack trace.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "subprocess.hpp"

namespace llmesh::testing {
namespace {

const std::string llmesh_bin = LLMESH_BINARY;

size_t count_lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

void expect_one_line_error(const command_result& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << "killed by a signal";
  EXPECT_EQ(count_lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
}

class CliErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = tmp_.path() + "/m";
    auto r = run_command(llmesh_bin + " model random --out " + model_ + " --vocab 300");
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  command_result generate(const std::string& dir, const std::string& extra = "--prompt-ids 1,2,3") {
    return run_command(llmesh_bin + " generate --device cpu --model " + dir + " --max-tokens 4 " + extra);
  }
  void rewrite_config(const std::string& from, const std::string& to) {
    std::string cfg = read_file(model_ + "/config.json");
    size_t at = cfg.find(from);
    ASSERT_NE(at, std::string::npos);
    cfg.replace(at, from.size(), to);
    std::ofstream(model_ + "/config.json") << cfg;
  }
  temp_dir tmp_;
  std::string model_;
};

TEST_F(CliErrors, VersionPrintsTheProjectsVersion) {
  auto r = run_command(llmesh_bin + " --version");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, std::string(LLMESH_VERSION_EXPECTED) + "\n");
}

TEST_F(CliErrors, MissingModelDirectory) { expect_one_line_error(generate(tmp_.path() + "/nope"), "nope/config.json"); }

TEST_F(CliErrors, UnknownArchitecture) {
  rewrite_config("LlamaForCausalLM", "GPT2LMHeadModel");
  expect_one_line_error(generate(model_), "unknown architecture 'GPT2LMHeadModel'");
}

TEST_F(CliErrors, ShapeMismatchNamesTheTensor) {
  rewrite_config("\"intermediate_size\": 160", "\"intermediate_size\": 161");
  expect_one_line_error(generate(model_), "mlp.gate_proj.weight");
}

TEST_F(CliErrors, TruncatedWeights) {
  std::filesystem::resize_file(model_ + "/model.safetensors", std::filesystem::file_size(model_ + "/model.safetensors") / 2);
  expect_one_line_error(generate(model_), "truncated");
}

TEST_F(CliErrors, MissingWeightsFile) {
  std::filesystem::remove(model_ + "/model.safetensors");
  expect_one_line_error(generate(model_), "no model.safetensors");
}

TEST_F(CliErrors, BadPromptIds) {
  expect_one_line_error(generate(model_, "--prompt-ids 1,x,3"), "bad token id 'x'");
  expect_one_line_error(generate(model_, "--prompt-ids 1,,3"), "empty element");
  expect_one_line_error(generate(model_, "--prompt-ids 1,99999"), "outside the vocabulary");
}

TEST_F(CliErrors, TensorParallelThatCannotSplit) {
  expect_one_line_error(generate(model_, "--prompt-ids 1 --tp 3"), "cannot split");
}

TEST_F(CliErrors, BadFlagsAreRefused) {
  auto r = run_command(llmesh_bin + " generate --device cpu --model " + model_ + " --prompt-ids 1 --temperature -1");
  expect_one_line_error(r, "--temperature");
  r = run_command(llmesh_bin + " generate --prompt-ids 1");
  expect_one_line_error(r, "--model");
  r = run_command(llmesh_bin + " generate --device cpu --model " + model_ + " --prompt-ids 1 --no-such-flag");
  expect_one_line_error(r, "--no-such-flag");
  r = run_command(llmesh_bin + " frobnicate");
  expect_one_line_error(r, "frobnicate");
  r = run_command(llmesh_bin + " generate --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--prompt-ids"), std::string::npos);
  r = run_command(llmesh_bin + " model random --out " + tmp_.path() + "/x --dtype f64");
  expect_one_line_error(r, "--dtype");
  r = run_command(llmesh_bin + " model random --out " + tmp_.path() + "/x --vocab 10");
  expect_one_line_error(r, "--vocab");
  // Speculation settings: out of range, and a lookup whose shortest n-gram is above its longest
  // (refused before anything is loaded or listens).
  r = run_command(llmesh_bin + " serve --model " + model_ + " --speculative-tokens 33");
  expect_one_line_error(r, "--speculative-tokens");
  r = run_command(llmesh_bin + " serve --model " + model_ + " --http 127.0.0.1:0 --rpc none --prompt-lookup-min 5 --prompt-lookup-max 2");
  expect_one_line_error(r, "--prompt-lookup-min");
  r = run_command(llmesh_bin + " node --name x --join 127.0.0.1:1 --prompt-lookup-min 3 --prompt-lookup-max 1");
  expect_one_line_error(r, "--prompt-lookup-min");
  // --quantization: a name it does not know, and int8 where the tensor-parallel split would cut
  // a block (hidden 64, 4 heads of 16: rank 1 starts at column 32, but the intermediate size
  // 160 / 2 = 80 does not).
  r = run_command(llmesh_bin + " serve --model " + model_ + " --quantization fp4");
  expect_one_line_error(r, "--quantization must be none, int8, awq");
  r = run_command(llmesh_bin + " serve --model " + model_ + " --quantization bitsandbytes");  // vLLM's, not llmesh's
  expect_one_line_error(r, "--quantization bitsandbytes is not supported");
  r = run_command(llmesh_bin + " generate --device cpu --model " + model_ + " --prompt-ids 1 --quantization awq_marlin");
  expect_one_line_error(r, "--quantization awq does not match the checkpoint: it has no quantization_config");
  r = run_command(llmesh_bin + " generate --device cpu --model " + model_ + " --prompt-ids 1 --quantization int8 --tp 2");
  expect_one_line_error(r, "multiple of 32");
  r = run_command(llmesh_bin + " generate --device cuda --model " + model_ + " --prompt-ids 1 --quantization int8");
  expect_one_line_error(r, "CPU backend only");
  r = run_command(llmesh_bin + " generate --device cuda --model " + model_ + " --prompt-ids 1 --quantization fp8");  // before loading
  expect_one_line_error(r, "--quantization fp8 runs on the CPU backend only");
  // vLLM's --chat-template (no such file, no template inline) and --max-model-len past the model's.
  r = run_command(llmesh_bin + " serve --model " + model_ + " --http 127.0.0.1:0 --rpc none --chat-template /no/such.jinja");
  expect_one_line_error(r, "--chat-template /no/such.jinja: no such file");
  // --kv-cache-dtype: vLLM's fp8_inc (Intel Gaudi's, not served here), a name it does not know,
  // bfloat16 and fp8 on CUDA.
  r = run_command(llmesh_bin + " serve --model " + model_ + " --kv-cache-dtype fp8_inc");
  expect_one_line_error(r, "--kv-cache-dtype fp8_inc: not supported");
  r = run_command(llmesh_bin + " generate --device cpu --model " + model_ + " --prompt-ids 1 --kv-cache-dtype half");
  expect_one_line_error(r, "--kv-cache-dtype must be auto, float32, bfloat16, fp8, fp8_e4m3 or fp8_e5m2");
  r = run_command(llmesh_bin + " generate --device cuda --model " + model_ + " --prompt-ids 1 --kv-cache-dtype bfloat16");
  expect_one_line_error(r, "CPU backend only");
  r = run_command(llmesh_bin + " generate --device cuda --model " + model_ + " --prompt-ids 1 --kv-cache-dtype fp8");
  expect_one_line_error(r, "CPU backend only");
  // --dtype: a name it does not know.
  r = run_command(llmesh_bin + " serve --model " + model_ + " --dtype fp8");
  expect_one_line_error(r, "--dtype must be auto, bfloat16, float16 (half) or float32 (float), not 'fp8'");
  // Reasoning and tool-call parsers: names it does not know, a model without <think> tokens,
  // a node without the gateway role, and a mixture of experts on CUDA.
  r = run_command(llmesh_bin + " serve --model " + model_ + " --reasoning-parser granite");
  expect_one_line_error(r, "--reasoning-parser");
  r = run_command(llmesh_bin + " serve --model " + model_ + " --tool-call-parser xlam");
  expect_one_line_error(r, "--tool-call-parser");
  r = run_command(llmesh_bin + " serve --model " + model_ + " --scheduling-policy lottery");
  expect_one_line_error(r, "--scheduling-policy");
  r = run_command(llmesh_bin + " serve --model " + model_ + " --http 127.0.0.1:0 --rpc none --tool-call-parser mistral");
  expect_one_line_error(r, "has no [TOOL_CALLS] token");
  r = run_command(llmesh_bin + " serve --model " + model_ + " --http 127.0.0.1:0 --rpc none --reasoning-parser qwen3");
  expect_one_line_error(r, "has no token \"<think>\"");
  r = run_command(llmesh_bin + " node --name x --join 127.0.0.1:1 --token 0123456789abcdef0123 --listen 127.0.0.1:1 "
                                "--role replica --reasoning-parser qwen3");
  expect_one_line_error(r, "gateway");
  r = run_command(llmesh_bin + " model random --out " + tmp_.path() + "/moe --arch mixtral --experts 2 --experts-per-token 3");
  expect_one_line_error(r, "--experts-per-token");
  r = run_command(llmesh_bin + " model random --out " + tmp_.path() + "/moe --arch mixtral --experts 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_command(llmesh_bin + " generate --device cuda --model " + tmp_.path() + "/moe --prompt-ids 1");
  expect_one_line_error(r, "mixture-of-experts models run on the CPU backend only");
  // Gemma on CUDA; a --rope-scaling the writer does not know.
  r = run_command(llmesh_bin + " model random --out " + tmp_.path() + "/gemma --arch gemma2 --head-dim 16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_command(llmesh_bin + " generate --device cuda --model " + tmp_.path() + "/gemma --prompt-ids 1");
  expect_one_line_error(r, "Gemma models run on the CPU backend only");
  // LoRA: a bad --lora-modules value, an adapter on CUDA, and the node's --lora-modules rules.
  r = run_command(llmesh_bin + " serve --model " + model_ + " --lora-modules no-path");
  expect_one_line_error(r, "NAME=PATH");
  r = run_command(llmesh_bin + " model random-lora --model " + model_ + " --out " + tmp_.path() + "/lora --rank 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_command(llmesh_bin + " generate --device cuda --model " + model_ + " --prompt-ids 1 --lora " + tmp_.path() + "/lora");
  expect_one_line_error(r, "LoRA adapters run on the CPU backend only");
  r = run_command(llmesh_bin + " model random-lora --model " + model_ + " --out " + tmp_.path() + "/lora2 --targets q_proj,w_proj");
  expect_one_line_error(r, "unknown projection 'w_proj'");
  r = run_command(llmesh_bin + " node --name x --join 127.0.0.1:1 --token 0123456789abcdef0123 --listen 127.0.0.1:1 "
                                "--role replica --lora-modules a=/x");
  expect_one_line_error(r, "--lora-modules is a gateway's flag");
  r = run_command(llmesh_bin + " node --name x --join 127.0.0.1:1 --token 0123456789abcdef0123 --listen 127.0.0.1:1 "
                                "--role replica --ssl-certfile /x.pem");
  expect_one_line_error(r, "--ssl-certfile: HTTPS is a gateway's or a metrics endpoint's; this node has no gateway role and no metrics address");
  r = run_command(llmesh_bin + " node --name x --join 127.0.0.1:1 --token 0123456789abcdef0123 --listen 127.0.0.1:1 "
                                "--role replica --allowed-origins http://a.example");
  expect_one_line_error(r, "--allowed-origins: CORS is a gateway's; this node has no gateway role");
  r = run_command(llmesh_bin + " node --name x --join 127.0.0.1:1 --token 0123456789abcdef0123 --listen 127.0.0.1:1 "
                                "--role replica --no-kv-events");
  expect_one_line_error(r, "--no-kv-events is a router's flag (this node has no router role)");
  r = run_command(llmesh_bin + " node --config " + std::string(LLMESH_SOURCE_DIR) + "/cluster-configs/local.yaml --name seed --no-kv-events");
  expect_one_line_error(r, "--no-kv-events: with --config, set 'kv_events: false' in the config");
  r = run_command(llmesh_bin + " node --name x --join 127.0.0.1:1 --token 0123456789abcdef0123 --listen 127.0.0.1:1 "
                                "--role gateway,router --http 127.0.0.1:1 --model " + model_ + " --model /tmp/other --lora-modules a=/x");
  expect_one_line_error(r, "give exactly one --model");
  r = run_command(llmesh_bin + " model random --out " + tmp_.path() + "/gemma --arch gemma3 --rope-scaling ntk");
  expect_one_line_error(r, "--rope-scaling must be llama3, linear, yarn, longrope or dynamic");
}

TEST_F(CliErrors, DumpLogitsToUnwritablePath) {
  expect_one_line_error(generate(model_, "--prompt-ids 1 --dump-logits /nonexistent-dir/x.f32"), "/nonexistent-dir/x.f32");
}

}  // namespace
}  // namespace llmesh::testing
