// How vLLM's prompt fields shape the tokens a request runs, through api_service against a fake
// mesh: add_special_tokens (completions: BOS unless false; chat: none unless true),
// chat_template_kwargs (variables the template reads), truncate_prompt_tokens (the last k),
// allowed_token_ids (into the request, checked against the vocabulary) and bad_words (their ids).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/api_service.hpp"

namespace llmesh::gateway {
namespace {

struct quiet_mesh : actors::mesh_client {
  void submit(actors::replica_request, actors::token_sink) override {}
  void cancel(uint64_t) override {}
  size_t ready_replicas() const override { return 1; }
  size_t ready_replicas(std::string_view) const override { return 1; }
};

/// Llama 3.1's tokenizer (BOS 128000 with special tokens) and a template that reads a kwarg.
class PromptFields : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = model::tokenizer::load(LLMESH_TEST_DATA "/tokenizers/llama3_1");
    ASSERT_TRUE(t.ok()) << t.err().message;
    tok_ = *t;
    auto chat = model::chat_template::parse(
        "{% for m in messages %}{{ m.content }}{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}");
    ASSERT_TRUE(chat.ok()) << chat.err().message;
    model::model_config cfg;
    cfg.vocab = 128256;
    cfg.max_positions = 4096;
    api_options o;
    o.model_name = "m";
    api_ = std::make_unique<api_service>(o, tok_, *chat, cfg, mesh_, metrics_);
  }
  /// The prompt the request's first choice runs ({} when refused; `status` gets the reply's).
  std::vector<int32_t> prompt_of(const std::string& path, const std::string& body, int* status = nullptr) {
    auto o = api_->handle("POST", path, "", body);
    if (auto* r = std::get_if<http_reply>(&o)) {
      if (status) *status = r->status;
      last_error_ = r->body;
      return {};
    }
    if (status) *status = 200;
    auto& job = std::get<generation_job>(o);
    allowed_ = job.requests.at(0).allowed_ids;
    bad_words_ = job.requests.at(0).bad_words;
    constraint_after_ = job.requests.at(0).constraint_after;
    return job.requests.at(0).prompt;
  }
  std::vector<int32_t> encode(const std::string& text, bool special) const { return tok_->encode(text, special); }

  quiet_mesh mesh_;
  actors::metrics_registry metrics_;
  std::shared_ptr<const model::tokenizer> tok_;
  std::unique_ptr<api_service> api_;
  std::string last_error_;
  std::vector<int32_t> allowed_;
  std::vector<std::vector<int32_t>> bad_words_;
  std::vector<int32_t> constraint_after_;
};

TEST_F(PromptFields, AddSpecialTokensFollowsVllmsDefaultsPerEndpoint) {
  ASSERT_NE(encode("Hello there", true), encode("Hello there", false)) << "the tokenizer adds BOS";
  EXPECT_EQ(prompt_of("/v1/completions", R"({"model":"m","prompt":"Hello there","max_tokens":2})"), encode("Hello there", true));
  EXPECT_EQ(prompt_of("/v1/completions", R"({"model":"m","prompt":"Hello there","max_tokens":2,"add_special_tokens":false})"),
            encode("Hello there", false));
  const std::string chat = R"({"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":2)";
  EXPECT_EQ(prompt_of("/v1/chat/completions", chat + "}"), encode("Hi", false));
  EXPECT_EQ(prompt_of("/v1/chat/completions", chat + R"(,"add_special_tokens":true})"), encode("Hi", true));
}

// The native API (rpc_server): a text prompt with BOS unless add_special_tokens is false, and
// truncate_prompt_tokens among its other fields, as over HTTP.
TEST_F(PromptFields, TheNativeApiTokenizesWithOrWithoutBosAndTruncates) {
  auto native = [&](const nlohmann::ordered_json& extra, bool special) -> std::vector<int32_t> {
    auto job = api_->native_generate("", "m", std::string("Hello there, friend"), {}, sampling_input{}, generation_fields{},
                                     extra, special);
    if (!job) {
      last_error_ = job.err().message;
      return {};
    }
    return job->requests.at(0).prompt;
  };
  const auto with_bos = encode("Hello there, friend", true), without = encode("Hello there, friend", false);
  ASSERT_GE(without.size(), 3u);
  EXPECT_EQ(native(nlohmann::ordered_json(), true), with_bos);
  EXPECT_EQ(native(nlohmann::ordered_json(), false), without);
  EXPECT_EQ(native({{"truncate_prompt_tokens", 2}}, true), std::vector<int32_t>(with_bos.end() - 2, with_bos.end()));
  EXPECT_EQ(native({{"truncate_prompt_tokens", -1}}, false), without);
  EXPECT_TRUE(native({{"truncate_prompt_tokens", 5000}}, true).empty());
  EXPECT_NE(last_error_.find("more than this model's context"), std::string::npos) << last_error_;
  EXPECT_TRUE(native({{"truncate_prompt_tokens", 0}}, true).empty());
  EXPECT_NE(last_error_.find("'truncate_prompt_tokens' must be -1"), std::string::npos) << last_error_;
}

TEST_F(PromptFields, ChatTemplateKwargsReachTheTemplate) {
  const std::string chat = R"({"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":2)";
  EXPECT_EQ(prompt_of("/v1/chat/completions", chat + R"(,"chat_template_kwargs":{"enable_thinking":false}})"),
            encode("Hi/no_think", false));
  EXPECT_EQ(prompt_of("/v1/chat/completions", chat + R"(,"chat_template_kwargs":{"enable_thinking":true}})"), encode("Hi", false));
  EXPECT_EQ(prompt_of("/v1/chat/completions", chat + R"(,"chat_template_kwargs":null})"), encode("Hi", false));
  int status = 0;
  EXPECT_TRUE(prompt_of("/v1/chat/completions", chat + R"(,"chat_template_kwargs":[1]})", &status).empty());
  EXPECT_EQ(status, 400);
  EXPECT_NE(last_error_.find("'chat_template_kwargs'"), std::string::npos) << last_error_;
  prompt_of("/v1/chat/completions", chat + R"(,"echo":true})", &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(last_error_.find("'echo' is not supported"), std::string::npos) << last_error_;
  prompt_of("/v1/chat/completions", chat + R"(,"echo":"yes"})", &status);
  EXPECT_EQ(status, 400);
  // /tokenize renders chat as chat completions do, kwargs included.
  auto t = api_->handle("POST", "/tokenize", "",
                        R"({"model":"m","messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_TRUE(std::holds_alternative<http_reply>(t));
  const auto tj = nlohmann::json::parse(std::get<http_reply>(t).body);
  EXPECT_EQ(tj["tokens"].get<std::vector<int32_t>>(), encode("Hi/no_think", false)) << tj;
}

// vLLM's bad_words: each word tokenized as it starts a text and as it follows a space, where
// that is another first token and as many tokens; leading spaces do not count.
TEST_F(PromptFields, BadWordsBecomeTheIdsOfEachWordAtTheStartAndAfterASpace) {
  prompt_of("/v1/completions", R"({"model":"m","prompt":"hi","bad_words":["  hello world", "\t", "Zebra"]})");
  const auto hello = encode("hello world", false), spaced_hello = encode(" hello world", false);
  const auto zebra = encode("Zebra", false), spaced_zebra = encode(" Zebra", false);
  ASSERT_NE(hello.front(), spaced_hello.front());
  std::vector<std::vector<int32_t>> want{hello};
  if (spaced_hello.size() == hello.size()) want.push_back(spaced_hello);
  want.push_back(zebra);  // "\t" alone bans nothing
  if (spaced_zebra.size() == zebra.size() && spaced_zebra.front() != zebra.front()) want.push_back(spaced_zebra);
  EXPECT_EQ(bad_words_, want);
  EXPECT_EQ(bad_word_ids(*tok_, {"hello world"}), bad_word_ids(*tok_, {" \n hello world"}));
  // Chat too; none: an empty list.
  prompt_of("/v1/chat/completions", R"({"model":"m","messages":[{"role":"user","content":"hi"}],"bad_words":["Zebra"]})");
  EXPECT_EQ(bad_words_.front(), zebra);
  prompt_of("/v1/completions", R"({"model":"m","prompt":"hi"})");
  EXPECT_TRUE(bad_words_.empty());
  for (const std::string& bad : std::vector<std::string>{R"("x")", R"([""])", R"([5])", "[\"" + std::string(300, 'a') + "\"]"}) {
    int status = 0;
    prompt_of("/v1/completions", R"({"model":"m","prompt":"hi","bad_words":)" + bad + "}", &status);
    EXPECT_EQ(status, 400) << bad;
    EXPECT_NE(last_error_.find("bad_words"), std::string::npos) << last_error_;
  }
}

// A reasoning model's structured output holds after its thinking: the request carries the
// tokens of "</think>", unless the prompt closed the block already (enable_thinking false).
TEST_F(PromptFields, AReasoningModelsConstraintWaitsForTheEndOfThinking) {
  auto chat = model::chat_template::parse(
      "{% for m in messages %}{{ m.content }}{% endfor %}"
      "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}");
  ASSERT_TRUE(chat.ok()) << chat.err().message;
  model::model_config cfg;
  cfg.vocab = 128256;
  cfg.max_positions = 4096;
  api_options o;
  for (auto parser : {reasoning_parser::qwen3, reasoning_parser::deepseek_r1, reasoning_parser::none}) {
    SCOPED_TRACE(std::string(reasoning_parser_name(parser)));
    api_ = std::make_unique<api_service>(o, std::vector{served_model{"m", tok_, *chat, cfg, parser}}, mesh_, metrics_);
    const std::string json_out = R"("response_format":{"type":"json_object"})";
    const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
    const auto think_end = parser == reasoning_parser::none ? std::vector<int32_t>{} : encode("</think>", false);
    prompt_of("/v1/chat/completions", R"({"model":"m",)" + msgs + "," + json_out + "}");
    EXPECT_EQ(constraint_after_, think_end);
    prompt_of("/v1/chat/completions", R"({"model":"m",)" + msgs + "}");
    EXPECT_TRUE(constraint_after_.empty()) << "nothing to wait for without a constraint";
    // The prompt closed the block: the model answers (in the grammar) at once.
    prompt_of("/v1/chat/completions",
              R"({"model":"m",)" + msgs + "," + json_out + R"(,"chat_template_kwargs":{"enable_thinking":false}})");
    EXPECT_TRUE(constraint_after_.empty());
    // A continued message: only one that left a block open waits for its end.
    const std::string cont = R"(,"add_generation_prompt":false,"continue_final_message":true})";
    prompt_of("/v1/chat/completions", R"({"model":"m","messages":[{"role":"user","content":"hi"},)"
                                      R"({"role":"assistant","content":"<think>hmm"}],)" + json_out + cont);
    EXPECT_EQ(constraint_after_, think_end);
    prompt_of("/v1/chat/completions", R"({"model":"m","messages":[{"role":"user","content":"hi"},)"
                                      R"({"role":"assistant","content":"<think>hmm</think>{\"a\":"}],)" + json_out + cont);
    EXPECT_TRUE(constraint_after_.empty());
  }
}

// GPT-OSS (OpenAI's harmony format) is parsed as vLLM's harmony path parses it, asked for or
// not: a structured output holds after "<|channel|>final<|message|>", the output keeps its
// special tokens for the parser, and a forced tool call is refused (harmony calls come with
// tool_choice auto only).
TEST_F(PromptFields, GptOssOutputIsHarmony) {
  auto chat = model::chat_template::parse("{% for m in messages %}{{ m.content }}{% endfor %}<|start|>assistant");
  ASSERT_TRUE(chat.ok()) << chat.err().message;
  model::model_config cfg;
  cfg.vocab = 128256;
  cfg.max_positions = 4096;
  cfg.arch = model::architecture::gpt_oss;
  api_options o;
  for (auto parser : {reasoning_parser::none, reasoning_parser::openai_gptoss}) {
    api_ = std::make_unique<api_service>(o, std::vector{served_model{"m", tok_, *chat, cfg, parser}}, mesh_, metrics_);
    const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
    prompt_of("/v1/chat/completions", R"({"model":"m",)" + msgs + R"(,"response_format":{"type":"json_object"}})");
    EXPECT_EQ(constraint_after_, encode("<|channel|>final<|message|>", false));
    const std::string tools = R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
    int status = 0;
    prompt_of("/v1/chat/completions", R"({"model":"m",)" + msgs + tools + R"(,"tool_choice":"required"})", &status);
    EXPECT_EQ(status, 400);
    EXPECT_NE(last_error_.find("harmony"), std::string::npos) << last_error_;
    prompt_of("/v1/chat/completions", R"({"model":"m",)" + msgs + tools + R"(,"tool_choice":"auto"})", &status);
    EXPECT_EQ(status, 200);
  }
  // Another architecture served with --tool-call-parser openai is taken for harmony too (its
  // calls would otherwise be looked for by no one).
  cfg.arch = model::architecture::llama;
  api_ = std::make_unique<api_service>(
      o, std::vector{served_model{"m", tok_, *chat, cfg, reasoning_parser::none, tool_call_parser::openai}}, mesh_, metrics_);
  prompt_of("/v1/chat/completions",
            R"({"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}})");
  EXPECT_EQ(constraint_after_, encode("<|channel|>final<|message|>", false));
  // Otherwise the default parser (none) leaves its output alone.
  api_ = std::make_unique<api_service>(o, std::vector{served_model{"m", tok_, *chat, cfg}}, mesh_, metrics_);
  int status = 0;
  prompt_of("/v1/chat/completions",
            R"({"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}})", &status);
  EXPECT_EQ(status, 200);
  EXPECT_TRUE(constraint_after_.empty());
}

TEST_F(PromptFields, TruncationKeepsTheLastTokensAndAllowedIdsAreChecked) {
  const auto whole = encode("one two three four five six seven", true);
  ASSERT_GT(whole.size(), 4u);
  EXPECT_EQ(prompt_of("/v1/completions", R"({"model":"m","prompt":"one two three four five six seven","max_tokens":2,"truncate_prompt_tokens":3})"),
            std::vector<int32_t>(whole.end() - 3, whole.end()));
  EXPECT_EQ(prompt_of("/v1/completions", R"({"model":"m","prompt":"one two three four five six seven","max_tokens":2,"truncate_prompt_tokens":-1})"),
            whole);
  int status = 0;
  prompt_of("/v1/completions", R"({"model":"m","prompt":"x","max_tokens":2,"truncate_prompt_tokens":5000})", &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(last_error_.find("more than this model's context"), std::string::npos) << last_error_;

  prompt_of("/v1/completions", R"({"model":"m","prompt":"x","max_tokens":2,"allowed_token_ids":[5,128255]})", &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(allowed_, (std::vector<int32_t>{5, 128255}));
  prompt_of("/v1/completions", R"({"model":"m","prompt":"x","max_tokens":2,"allowed_token_ids":[128256]})", &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(last_error_.find("outside the vocabulary"), std::string::npos) << last_error_;
  prompt_of("/v1/completions", R"({"model":"m","prompt":"x","max_tokens":2,"allowed_token_ids":[5],"guided_regex":"a+"})", &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(last_error_.find("cannot be combined"), std::string::npos) << last_error_;
}

}  // namespace
}  // namespace llmesh::gateway
