// `llmesh serve` over real HTTP: greedy and seeded output equal `llmesh generate` at any
// concurrency and at --tp 2 with several replicas, with speculative decoding and with int8
// weights; chat content
// as text parts; /tokenize and /detokenize; stop_token_ids, penalties and min_tokens, and the
// refusal of unsupported fields; n, batched prompts, echo and best_of; logprobs.
// (limits_test.cpp: error paths, connection limits, hang-ups, keep-alive, metrics, SIGTERM;
// scheduling_test.cpp: cached_tokens, cache_salt, priority.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <tuple>

#include "../cli/subprocess.hpp"
#include "reference.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";

const std::vector<std::string> prompts = {
    "In the beginning God created", "And the LORD said unto Moses", "Blessed are the",
    "The LORD is my shepherd", "And it came to pass", "Then said Jesus unto them",
    "For God so loved", "Let there be light"};

std::vector<int32_t> generate_ids(const std::string& prompt, int max_tokens, const std::string& sampling) {
  return testing::generate_ids(bin, model_dir, "--prompt '" + prompt + "'", max_tokens, sampling);
}

json completion(int port, const json& body, int* status = nullptr, const std::string& headers = "") {
  auto r = http_request(port, "POST", "/v1/completions", body.dump(), headers);
  if (status) *status = r.status;
  auto j = json::parse(r.body, nullptr, false);
  return j.is_discarded() ? json{{"raw", r.body}} : j;
}

/// Requests every prompt from `threads` client threads at once; returns token_ids per prompt.
std::vector<std::vector<int32_t>> served_ids(int port, int threads, int max_tokens, const json& sampling) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < prompts.size(); i += static_cast<size_t>(threads)) {
        json body = {{"model", "kjv-tiny"}, {"prompt", prompts[i]}, {"max_tokens", max_tokens}, {"return_token_ids", true}};
        body.update(sampling);
        auto j = completion(port, body);
        if (j.contains("choices")) out[i] = j["choices"][0]["token_ids"].get<std::vector<int32_t>>();
      }
    });
  }
  for (auto& th : pool) th.join();
  return out;
}

TEST(Serve, OutputEqualsGenerateAtAnyConcurrencyAndTp2) {
  std::vector<std::vector<int32_t>> greedy, sampled;
  for (const auto& p : prompts) {
    greedy.push_back(generate_ids(p, 24, "--temperature 0"));
    sampled.push_back(generate_ids(p, 24, "--temperature 0.8 --top-k 40 --seed 7"));
    ASSERT_EQ(greedy.back().size(), 24u);
  }
  const json greedy_params = {{"temperature", 0}};
  const json sampled_params = {{"temperature", 0.8}, {"top_k", 40}, {"seed", 7}};
  {
    server_process s(bin, {"--model", model_dir});
    ASSERT_GT(s.port(), 0) << s.log();
    for (int threads : {1, 8}) {
      EXPECT_EQ(served_ids(s.port(), threads, 24, greedy_params), greedy) << "greedy, concurrency " << threads;
      EXPECT_EQ(served_ids(s.port(), threads, 24, sampled_params), sampled) << "sampled, concurrency " << threads;
    }
  }
  server_process tp2(bin, {"--model", model_dir, "--tp", "2", "--replicas", "2"});
  ASSERT_GT(tp2.port(), 0) << tp2.log();
  EXPECT_EQ(served_ids(tp2.port(), 8, 24, greedy_params), greedy) << "greedy, tp 2, 2 replicas";
  EXPECT_EQ(served_ids(tp2.port(), 8, 24, sampled_params), sampled) << "sampled, tp 2, 2 replicas";
}

// Speculative decoding (--speculative-tokens): the served tokens are generate's, greedy and
// sampled, beside other requests and at tp 2, and drafts were kept (the replica's counters in
// /metrics), so the path ran.
TEST(Serve, SpeculativeDecodingServesGeneratesTokens) {
  std::vector<std::vector<int32_t>> greedy, sampled;
  for (const auto& p : prompts) {
    greedy.push_back(generate_ids(p, 40, "--temperature 0"));
    sampled.push_back(generate_ids(p, 40, "--temperature 0.8 --top-k 40 --seed 7"));
  }
  server_process s(bin, {"--model", model_dir, "--tp", "2", "--speculative-tokens", "4", "--prompt-lookup-min", "1"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_EQ(served_ids(s.port(), 8, 40, {{"temperature", 0}}), greedy);
  EXPECT_EQ(served_ids(s.port(), 8, 40, {{"temperature", 0.8}, {"top_k", 40}, {"seed", 7}}), sampled);
  // The counters reach /metrics with the router's next load report (every few hundred ms).
  double drafted = 0, accepted = 0;
  for (int i = 0; i < 50 && accepted == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string m = http_request(s.port(), "GET", "/metrics").body;
    auto value = [&](const std::string& name) {
      const size_t at = m.find("\n" + name + "{");
      if (at == std::string::npos) return 0.0;
      return std::stod(m.substr(m.find("} ", at) + 2));
    };
    drafted = value("llmesh_spec_decode_draft_tokens_total");
    accepted = value("llmesh_spec_decode_accepted_tokens_total");
  }
  EXPECT_GT(accepted, 0.0) << "no draft kept: speculation did not run";
  EXPECT_GE(drafted, accepted);
}

// --quantization int8: the served tokens are `llmesh generate --quantization int8`'s, greedy and
// sampled, at tp 2 with speculative decoding (int8 keeps the kernels batch- and chunk-invariant).
TEST(Serve, Int8WeightsServeGeneratesInt8Tokens) {
  std::vector<std::vector<int32_t>> greedy, sampled;
  for (const auto& p : prompts) {
    greedy.push_back(generate_ids(p, 32, "--temperature 0 --quantization int8"));
    sampled.push_back(generate_ids(p, 32, "--temperature 0.8 --top-k 40 --seed 7 --quantization int8"));
  }
  server_process s(bin, {"--model", model_dir, "--tp", "2", "--quantization", "int8", "--speculative-tokens", "3"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_NE(s.log().find("int8 weights"), std::string::npos) << s.log();
  EXPECT_EQ(served_ids(s.port(), 8, 32, {{"temperature", 0}}), greedy);
  EXPECT_EQ(served_ids(s.port(), 8, 32, {{"temperature", 0.8}, {"top_k", 40}, {"seed", 7}}), sampled);
}


// The bundled model answers a chat in scripture's words (issue 7's check of the served path):
// greedy, so the same bits on every machine.
TEST(Serve, ChatAnswersInTheCorpusVocabulary) {
  server_process s(bin, {"--model", model_dir});
  ASSERT_GT(s.port(), 0) << s.log();
  const json body = {{"model", "kjv-tiny"},
                     {"messages", {{{"role", "user"}, {"content", "Who made the heaven and the earth?"}}}},
                     {"max_tokens", 48},
                     {"temperature", 0}};
  auto r = http_request(s.port(), "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string text = json::parse(r.body)["choices"][0]["message"]["content"];
  EXPECT_GT(text.size(), 40u);
  for (unsigned char c : text) EXPECT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << "byte " << int(c) << " in " << text;
  size_t hits = 0;
  for (const char* w : {" the ", " and ", " unto ", " of ", " LORD", " said"}) hits += text.find(w) != std::string::npos;
  EXPECT_GE(hits, 3u) << text;

  // The same question as an array of text parts (OpenAI's and vLLM's other form): the same answer.
  json parts = body;
  parts["messages"][0]["content"] = {{{"type", "text"}, {"text", "Who made the heaven and the earth?"}}};
  auto p = http_request(s.port(), "POST", "/v1/chat/completions", parts.dump());
  ASSERT_EQ(p.status, 200) << p.body;
  EXPECT_EQ(json::parse(p.body)["choices"][0]["message"]["content"], text);
  // A part this text model cannot take is refused, naming its type.
  parts["messages"][0]["content"].push_back({{"type", "image_url"}, {"image_url", {{"url", "http://x/y.png"}}}});
  auto img = http_request(s.port(), "POST", "/v1/chat/completions", parts.dump());
  EXPECT_EQ(img.status, 400) << img.body;
  EXPECT_NE(img.body.find("'image_url'"), std::string::npos) << img.body;

  // vLLM's tokenizer routes: /tokenize gives `llmesh tokenize`'s ids, /detokenize the text back.
  auto cli = run_command(bin + " tokenize --model " + model_dir + " --text 'Who made the heaven and the earth?'");
  std::vector<int32_t> want;
  std::stringstream ss(cli.out);
  for (int32_t id; ss >> id;) want.push_back(id);
  ASSERT_FALSE(want.empty()) << cli.err;
  auto t = http_request(s.port(), "POST", "/tokenize", R"({"model":"kjv-tiny","prompt":"Who made the heaven and the earth?"})");
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(json::parse(t.body)["tokens"].get<std::vector<int32_t>>(), want);
  auto d = http_request(s.port(), "POST", "/detokenize", json{{"tokens", want}}.dump());
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(json::parse(d.body)["prompt"], "Who made the heaven and the earth?");
}

/// The choices[0] of each SSE event of a streamed body, merged: text, token ids, finish reason.
json merged_stream_choice(const std::string& sse) {
  json out = {{"text", ""}, {"token_ids", json::array()}, {"finish_reason", nullptr}};
  for (size_t pos = 0; (pos = sse.find("data: ", pos)) != std::string::npos;) {
    const size_t end = sse.find("\n\n", pos);
    const auto e = json::parse(sse.substr(pos + 6, end - pos - 6), nullptr, false);
    pos = end;
    if (!e.is_object() || !e.contains("choices") || e["choices"].empty()) continue;
    const auto& c = e["choices"][0];
    out["text"] = out["text"].get<std::string>() + c.value("text", "");
    for (const auto& t : c.value("token_ids", json::array())) out["token_ids"].push_back(t);
    if (!c["finish_reason"].is_null()) out["finish_reason"] = c["finish_reason"];
  }
  return out;
}

// stop_token_ids (vLLM's extension) end a generation on one of its ids as EOS does: finish_reason
// "stop", the id the last of token_ids, its text left out (vLLM's default). The penalties and
// min_tokens are served within vLLM's ranges (400 naming the field outside them; min_tokens
// holds stop strings back); include_stop_str_in_output keeps the stop's text and
// truncate_prompt_tokens cuts the prompt; fields asking for what the server does not do are
// refused over HTTP, naming the field.
TEST(Serve, StopTokenIdsEndTheGenerationPenaltiesAreServedAndUnsupportedFieldsAre400) {
  server_process s(bin, {"--model", model_dir});
  ASSERT_GT(s.port(), 0) << s.log();
  const json base = {{"model", "kjv-tiny"}, {"prompt", "In the beginning God created"}, {"temperature", 0},
                     {"return_token_ids", true}};
  json body = base;
  body["max_tokens"] = 16;
  auto free_run = completion(s.port(), body);
  ASSERT_TRUE(free_run.contains("choices")) << free_run;
  const auto ids = free_run["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 16u) << free_run;  // no EOS this early in the bundled model's greedy text
  // The stop id: the 3rd generated token, or the first one after it not generated before (a
  // repeated id would stop the generation at its earlier place).
  size_t k = 2;
  while (k < ids.size() && std::find(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids[k]) !=
                               ids.begin() + static_cast<std::ptrdiff_t>(k)) {
    ++k;
  }
  ASSERT_LT(k, ids.size());
  // The text before the stop token: the same greedy run cut after k tokens by max_tokens.
  body["max_tokens"] = k;
  auto prefix = completion(s.port(), body);
  ASSERT_EQ(prefix["choices"][0]["finish_reason"], "length") << prefix;
  const std::string want_text = prefix["choices"][0]["text"];
  const std::vector<int32_t> want_ids(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k) + 1);

  body["max_tokens"] = 16;
  body["stop_token_ids"] = {ids[k]};
  auto stopped = completion(s.port(), body);
  ASSERT_TRUE(stopped.contains("choices")) << stopped;
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop") << stopped;
  EXPECT_EQ(stopped["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want_ids) << stopped;
  EXPECT_EQ(stopped["choices"][0]["text"], want_text) << stopped;
  EXPECT_EQ(stopped["usage"]["completion_tokens"], k + 1);
  // Streamed: the same text, ids and finish reason.
  body["stream"] = true;
  auto streamed = http_request(s.port(), "POST", "/v1/completions", body.dump());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  const json merged = merged_stream_choice(streamed.body);
  EXPECT_EQ(merged["finish_reason"], "stop") << streamed.body;
  EXPECT_EQ(merged["token_ids"].get<std::vector<int32_t>>(), want_ids) << streamed.body;
  EXPECT_EQ(merged["text"], want_text) << streamed.body;
  EXPECT_NE(streamed.body.find("data: [DONE]"), std::string::npos);
  // ignore_eos keeps the stop ids the client asked for (as vLLM does).
  body.erase("stream");
  body["ignore_eos"] = true;
  auto ignoring = completion(s.port(), body);
  EXPECT_EQ(ignoring["choices"][0]["finish_reason"], "stop") << ignoring;
  EXPECT_EQ(ignoring["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want_ids) << ignoring;
  // include_stop_str_in_output: the stop token's text stays (the text of k + 1 tokens), and so
  // does a stop string.
  body.erase("ignore_eos");
  body.erase("stop_token_ids");
  body["max_tokens"] = k + 1;
  const std::string through_stop = completion(s.port(), body)["choices"][0]["text"];
  ASSERT_GT(through_stop.size(), want_text.size()) << through_stop;
  body["stop_token_ids"] = {ids[k]};
  body["max_tokens"] = 16;
  body["include_stop_str_in_output"] = true;
  auto kept = completion(s.port(), body);
  EXPECT_EQ(kept["choices"][0]["text"], through_stop) << kept;
  EXPECT_EQ(kept["choices"][0]["finish_reason"], "stop") << kept;
  const std::string full = free_run["choices"][0]["text"];
  ASSERT_GT(full.size(), want_text.size() + 3) << full;
  const std::string stop = full.substr(want_text.size(), 3);
  json by_string = base;
  by_string["max_tokens"] = 16;
  by_string["stop"] = {stop};
  EXPECT_EQ(completion(s.port(), by_string)["choices"][0]["text"], full.substr(0, full.find(stop)));
  by_string["include_stop_str_in_output"] = true;
  EXPECT_EQ(completion(s.port(), by_string)["choices"][0]["text"], full.substr(0, full.find(stop) + stop.size()));
  // truncate_prompt_tokens: the model sees the prompt's last 3 tokens only.
  const std::vector<int32_t> long_prompt{1142, 258, 2078, 386, 3345, 295, 258, 400};
  const std::vector<int32_t> tail(long_prompt.end() - 3, long_prompt.end());
  json cut = {{"model", "kjv-tiny"}, {"prompt", long_prompt}, {"temperature", 0}, {"max_tokens", 8},
              {"return_token_ids", true}, {"truncate_prompt_tokens", 3}};
  auto truncated = completion(s.port(), cut);
  EXPECT_EQ(truncated["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>(), tail) << truncated;
  EXPECT_EQ(truncated["usage"]["prompt_tokens"], 3) << truncated;
  EXPECT_EQ(truncated["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
            testing::generate_ids(bin, model_dir, "--prompt-ids " + id_list(tail), 8, "--temperature 0"));

  int status = 0;
  json bad = base;
  bad["stop_token_ids"] = {1, 1 << 20};  // outside the 4096-token vocabulary
  auto j = completion(s.port(), bad, &status);
  EXPECT_EQ(status, 400) << j;
  EXPECT_NE(j.dump().find("'stop_token_ids'"), std::string::npos) << j;
  // vLLM's penalties and min_tokens are served within their ranges, on both endpoints.
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"presence_penalty", 0.5}, {"presence_penalty", -2}, {"frequency_penalty", 1.5},
           {"frequency_penalty", 2}, {"repetition_penalty", 1.2}, {"repetition_penalty", 0.5},
           {"min_tokens", 4}, {"min_tokens", 16}}) {
    json u = base;
    u[field] = value;
    j = completion(s.port(), u, &status);
    EXPECT_EQ(status, 200) << field << "=" << value << ": " << j;
    json chat = {{"model", "kjv-tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 16},
                 {field, value}};
    auto r = http_request(s.port(), "POST", "/v1/chat/completions", chat.dump());
    EXPECT_EQ(r.status, 200) << "chat " << field << "=" << value << ": " << r.body;
  }
  // Out of their ranges: a 400 naming the field.
  for (const auto& [field, value, needle] : std::vector<std::tuple<std::string, json, std::string>>{
           {"presence_penalty", 2.5, "'presence_penalty' must be a number between -2 and 2"},
           {"frequency_penalty", -3, "'frequency_penalty' must be a number between -2 and 2"},
           {"frequency_penalty", "1", "'frequency_penalty' must be a number"},
           {"repetition_penalty", 0, "'repetition_penalty' must be a number greater than 0 and at most 10"},
           {"repetition_penalty", 11, "'repetition_penalty' must be a number greater than 0 and at most 10"},
           {"min_tokens", -1, "'min_tokens' must be a non-negative integer"},
           {"min_tokens", 17, "'min_tokens' (17) must be at most 'max_tokens' (16, its default when left out)"}}) {
    json u = base;
    u[field] = value;
    j = completion(s.port(), u, &status);
    EXPECT_EQ(status, 400) << field << "=" << value << ": " << j;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << j;
    EXPECT_NE(j.dump().find(needle), std::string::npos) << j;
  }
  json refused = base;
  refused["suffix"] = " amen";  // text after the insertion point: this server does not, so a 400, never ignored
  j = completion(s.port(), refused, &status);
  EXPECT_EQ(status, 400) << j;
  EXPECT_NE(j.dump().find("'suffix' is not supported"), std::string::npos) << j;
  // The neutral values many clients always send are served.
  json neutral = base;
  neutral.update({{"max_tokens", 2}, {"logprobs", nullptr}, {"presence_penalty", 0}, {"frequency_penalty", 0},
                  {"repetition_penalty", 1.0}, {"min_tokens", 0}, {"top_logprobs", 0}, {"min_p", 0}});
  completion(s.port(), neutral, &status);
  EXPECT_EQ(status, 200);

  // min_tokens holds stop strings back as vLLM's detokenizer does: a stop string (" ") in the
  // first 4 tokens' text does not end the generation, the first one after it does.
  json first4 = base;
  first4["max_tokens"] = 4;
  const std::string head = completion(s.port(), first4)["choices"][0]["text"];
  const std::string whole = free_run["choices"][0]["text"];
  ASSERT_EQ(whole.substr(0, head.size()), head);
  ASSERT_NE(head.find(' '), std::string::npos) << head;
  ASSERT_NE(whole.find(' ', head.size()), std::string::npos) << whole;
  for (int min_tokens : {0, 4}) {
    json stop = base;
    stop.update({{"max_tokens", 16}, {"stop", " "}, {"min_tokens", min_tokens}});
    j = completion(s.port(), stop, &status);
    ASSERT_EQ(status, 200) << j;
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << j;
    EXPECT_EQ(j["choices"][0]["text"], whole.substr(0, whole.find(' ', min_tokens == 0 ? 0 : head.size())))
        << "min_tokens " << min_tokens << ": " << j;
  }
}

/// The choices of a streamed body reassembled per index (text, token ids, finish reason), the
/// usage chunk (null if none), and how many [DONE] events came (checked to be last).
struct reassembled {
  std::map<size_t, json> choices;
  json usage;
  int done = 0;
  std::vector<std::string> first_texts;  ///< each choice's first chunk text, by index order of arrival
};
reassembled reassemble(const std::string& sse) {
  reassembled out;
  for (size_t pos = 0; (pos = sse.find("data: ", pos)) != std::string::npos;) {
    const size_t end = sse.find("\n\n", pos);
    const std::string payload = sse.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      ++out.done;
      EXPECT_EQ(end + 2, sse.size()) << "[DONE] is not the last event";
      continue;
    }
    const auto e = json::parse(payload);
    if (e.contains("usage")) out.usage = e["usage"];
    for (const auto& c : e["choices"]) {
      const size_t index = c["index"];
      auto [it, first] = out.choices.try_emplace(index, json{{"text", ""}, {"token_ids", json::array()},
                                                             {"finish_reason", nullptr}});
      if (first) out.first_texts.push_back(c["text"]);
      EXPECT_TRUE(it->second["finish_reason"].is_null()) << "a chunk of choice " << index << " after its finish";
      it->second["text"] = it->second["text"].get<std::string>() + c["text"].get<std::string>();
      for (const auto& t : c.value("token_ids", json::array())) it->second["token_ids"].push_back(t);
      it->second["finish_reason"] = c["finish_reason"];
    }
  }
  return out;
}

// OpenAI's n, batched prompts, echo and best_of, as vLLM serves them: each choice is its own
// generation; a prompt's first choice samples with the request's seed, exactly as a single
// request does; a seeded n > 1 request is reproducible with distinct choices; streamed, the
// choices' chunks reassemble per index into the non-streamed response, with one usage chunk
// and one [DONE]; echo puts the prompt's text ahead of each choice's; best_of returns the
// candidates with the highest summed log-probabilities.
TEST(Serve, NBatchedPromptsEchoAndBestOfAsVllmServesThem) {
  server_process s(bin, {"--model", model_dir});
  ASSERT_GT(s.port(), 0) << s.log();
  const json base = {{"model", "kjv-tiny"}, {"temperature", 0.9}, {"top_k", 40}, {"seed", 11}, {"max_tokens", 12},
                     {"return_token_ids", true}, {"ignore_eos", true}};
  const std::vector<std::string> two = {prompts[0], prompts[3]};
  std::vector<json> singles;
  size_t prompt_tokens = 0;
  for (const auto& p : two) {
    json body = base;
    body["prompt"] = p;
    auto j = completion(s.port(), body);
    ASSERT_TRUE(j.contains("choices")) << j;
    singles.push_back(j["choices"][0]);
    prompt_tokens += j["usage"]["prompt_tokens"].get<size_t>();
  }
  // Two prompts × n = 2: choice 2p is prompt p's first, the single request's output.
  json batch = base;
  batch["prompt"] = two;
  batch["n"] = 2;
  int status = 0;
  auto b = completion(s.port(), batch, &status);
  ASSERT_EQ(status, 200) << b;
  ASSERT_EQ(b["choices"].size(), 4u) << b;
  size_t completion_tokens = 0;
  for (size_t i = 0; i < 4; ++i) {
    const json& c = b["choices"][i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["prompt_token_ids"], singles[i / 2]["prompt_token_ids"]) << i;
    EXPECT_EQ(c["token_ids"].size(), 12u) << i;
    completion_tokens += c["token_ids"].size();
  }
  for (size_t p = 0; p < 2; ++p) {
    EXPECT_EQ(b["choices"][2 * p]["text"], singles[p]["text"]) << "prompt " << p;
    EXPECT_EQ(b["choices"][2 * p]["token_ids"], singles[p]["token_ids"]) << "prompt " << p;
    EXPECT_NE(b["choices"][2 * p + 1]["token_ids"], singles[p]["token_ids"]) << "prompt " << p;
  }
  EXPECT_EQ(b["usage"]["prompt_tokens"], prompt_tokens);  // each prompt once, not n times
  EXPECT_EQ(b["usage"]["completion_tokens"], completion_tokens);

  // n = 3 with a seed: three distinct choices, the same on a second identical request.
  json three = base;
  three["prompt"] = prompts[4];
  three["n"] = 3;
  auto first = completion(s.port(), three), again = completion(s.port(), three);
  ASSERT_EQ(first["choices"].size(), 3u) << first;
  EXPECT_EQ(again["choices"], first["choices"]);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first["choices"][i]["index"], i);
    for (size_t k = i + 1; k < 3; ++k) EXPECT_NE(first["choices"][i]["token_ids"], first["choices"][k]["token_ids"]);
  }

  // Streamed n = 2: reassembled per index, the non-streamed response; usage and [DONE] once.
  json streamed = three;
  streamed["n"] = 2;
  auto whole = completion(s.port(), streamed);
  ASSERT_EQ(whole["choices"].size(), 2u) << whole;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  auto sse = http_request(s.port(), "POST", "/v1/completions", streamed.dump());
  ASSERT_EQ(sse.status, 200) << sse.body;
  const reassembled r = reassemble(sse.body);
  EXPECT_EQ(r.done, 1);
  ASSERT_EQ(r.choices.size(), 2u) << sse.body;
  for (size_t i = 0; i < 2; ++i) {
    for (const char* f : {"text", "token_ids", "finish_reason"}) {
      EXPECT_EQ(r.choices.at(i)[f], whole["choices"][i][f]) << "choice " << i << " " << f;
    }
  }
  EXPECT_EQ(r.usage, whole["usage"]);
  EXPECT_EQ(sse.body.find("\"usage\""), sse.body.rfind("\"usage\""));  // the usage chunk alone carries usage

  // echo: the prompt's text ahead of each choice's (a string as sent; ids decoded), streamed
  // on the first chunk; with logprobs it is refused for now.
  json echo = base;
  echo["echo"] = true;
  echo["prompt"] = prompts[0];
  auto e = completion(s.port(), echo, &status);
  ASSERT_EQ(status, 200) << e;
  EXPECT_EQ(e["choices"][0]["text"], prompts[0] + singles[0]["text"].get<std::string>());
  EXPECT_EQ(e["choices"][0]["token_ids"], singles[0]["token_ids"]);
  echo["prompt"] = json::array({singles[0]["prompt_token_ids"]});
  e = completion(s.port(), echo, &status);
  ASSERT_EQ(status, 200) << e;
  EXPECT_EQ(e["choices"][0]["text"], prompts[0] + singles[0]["text"].get<std::string>());
  echo["stream"] = true;
  auto es = http_request(s.port(), "POST", "/v1/completions", echo.dump());
  const reassembled er = reassemble(es.body);
  ASSERT_EQ(er.choices.size(), 1u) << es.body;
  EXPECT_EQ(er.choices.at(0)["text"], prompts[0] + singles[0]["text"].get<std::string>());
  ASSERT_EQ(er.first_texts.size(), 1u);
  EXPECT_EQ(er.first_texts[0].rfind(prompts[0], 0), 0u) << er.first_texts[0];
  json many = base;
  many["prompt"] = prompts[0];
  many["n"] = 65;
  e = completion(s.port(), many, &status);
  EXPECT_EQ(status, 400) << e;
  EXPECT_NE(e.dump().find("limit of 64 per request"), std::string::npos) << e;

  // best_of = 3, n = 2: the two of the three candidates (the choices of n = 3, same seed) whose
  // tokens' log-probabilities sum highest, best first; usage counts all three; no logprobs
  // shown unless asked for.
  json all3 = three;
  all3["logprobs"] = 0;
  auto candidates = completion(s.port(), all3);
  ASSERT_EQ(candidates["choices"].size(), 3u) << candidates;
  std::vector<std::pair<double, size_t>> ranked;
  for (size_t i = 0; i < 3; ++i) {
    double sum = 0;
    for (const auto& v : candidates["choices"][i]["logprobs"]["token_logprobs"]) sum += v.get<double>();
    ranked.emplace_back(-sum, i);  // best first, ties the lower index
  }
  std::sort(ranked.begin(), ranked.end());
  json best = three;
  best["n"] = 2;
  best["best_of"] = 3;
  auto bo = completion(s.port(), best, &status);
  ASSERT_EQ(status, 200) << bo;
  ASSERT_EQ(bo["choices"].size(), 2u) << bo;
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(bo["choices"][r]["index"], r);
    EXPECT_EQ(bo["choices"][r]["token_ids"], candidates["choices"][ranked[r].second]["token_ids"]) << r;
    EXPECT_TRUE(bo["choices"][r]["logprobs"].is_null());
  }
  EXPECT_EQ(bo["usage"], candidates["usage"]);
}

TEST(Serve, PenaltiesMinTokensAndMinPGiveGeneratesTokens) {
  server_process s(bin, {"--model", model_dir, "--replicas", "2", "--tp", "2"});
  ASSERT_GT(s.port(), 0) << s.log();
  const std::vector<int32_t> prompt{1142, 258, 2078, 386, 3345};
  struct variant {
    json fields;
    std::string flags;
  };
  const std::vector<variant> variants{
      {{{"temperature", 0}, {"repetition_penalty", 1.5}}, "--temperature 0 --repetition-penalty 1.5"},
      {{{"temperature", 0.8}, {"seed", 7}, {"presence_penalty", 0.6}, {"frequency_penalty", 0.9}},
       "--temperature 0.8 --seed 7 --presence-penalty 0.6 --frequency-penalty 0.9"},
      {{{"temperature", 0}, {"min_tokens", 20}, {"frequency_penalty", -0.3}}, "--temperature 0 --min-tokens 20 --frequency-penalty -0.3"},
      {{{"temperature", 1.0}, {"seed", 9}, {"min_p", 0.1}, {"top_k", 40}}, "--temperature 1 --seed 9 --min-p 0.1 --top-k 40"},
  };
  for (const auto& v : variants) {
    const auto want = testing::generate_ids(bin, model_dir, "--prompt-ids " + id_list(prompt), 20, v.flags);
    ASSERT_FALSE(want.empty()) << v.flags;
    json body = {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 20}, {"return_token_ids", true}};
    body.update(v.fields);
    int status = 0;
    auto j = completion(s.port(), body, &status);
    ASSERT_EQ(status, 200) << j;
    EXPECT_EQ(j["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want) << v.flags;
  }
  // The penalties do something: the greedy stream changes under a repetition penalty.
  EXPECT_NE(testing::generate_ids(bin, model_dir, "--prompt-ids " + id_list(prompt), 20, "--temperature 0"),
            testing::generate_ids(bin, model_dir, "--prompt-ids " + id_list(prompt), 20, "--temperature 0 --repetition-penalty 1.5"));
}

// Echo with logprobs (how evaluation harnesses score text): the prompt's tokens come back
// scored. The reference is the model's own logprobs for tokens it generated: prompt P's
// greedy continuation G, then P + G echoed — G's prompt entries must be exactly G's generated
// entries (same logits: chunk- and batch-invariant kernels), at tp 2. The first prompt token
// has null value and alternatives; streamed, the same entries arrive; a batch of prompts
// scores each (P's entries are a prefix of P + G's). vLLM's prompt_logprobs report the same
// scores with each token's rank.
TEST(Serve, EchoWithLogprobsScoresThePromptAsTheModelScoresItsOwnTokens) {
  server_process s(bin, {"--model", model_dir, "--replicas", "1", "--tp", "2"});
  ASSERT_GT(s.port(), 0) << s.log();
  const std::vector<int32_t> prompt{1142, 258, 2078, 386, 3345};
  int status = 0;
  auto gen = completion(s.port(), {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0},
                                   {"logprobs", 2}, {"return_token_ids", true}}, &status);
  ASSERT_EQ(status, 200) << gen;
  const auto g_ids = gen["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(g_ids.size(), 6u) << gen;
  const auto& glp = gen["choices"][0]["logprobs"];

  std::vector<int32_t> whole = prompt;
  whole.insert(whole.end(), g_ids.begin(), g_ids.end());
  const json body = {{"model", "kjv-tiny"}, {"prompt", whole}, {"max_tokens", 1}, {"temperature", 0},
                     {"logprobs", 2}, {"echo", true}};
  auto e = completion(s.port(), body, &status);
  ASSERT_EQ(status, 200) << e;
  const auto& lp = e["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), whole.size() + 1) << lp;
  ASSERT_EQ(lp["token_logprobs"].size(), whole.size() + 1);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null()) << lp;
  EXPECT_TRUE(lp["top_logprobs"][0].is_null()) << lp;
  EXPECT_EQ(lp["text_offset"][0], 0);
  for (size_t i = 0; i < g_ids.size(); ++i) {
    const size_t at = prompt.size() + i;
    EXPECT_EQ(lp["tokens"][at], glp["tokens"][i]) << "token " << i;
    EXPECT_EQ(lp["token_logprobs"][at], glp["token_logprobs"][i]) << "token " << i;
    EXPECT_EQ(lp["top_logprobs"][at], glp["top_logprobs"][i]) << "token " << i;
  }
  for (size_t i = 1; i < prompt.size(); ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_GE(lp["top_logprobs"][i].size(), 2u) << lp["top_logprobs"][i];  // the token, then 2 (keys may merge)
    EXPECT_GE(lp["text_offset"][i].get<size_t>(), lp["text_offset"][i - 1].get<size_t>());
  }
  const std::string text = e["choices"][0]["text"];
  EXPECT_EQ(lp["text_offset"][whole.size()].get<size_t>(), text.size() - lp["tokens"][whole.size()].get<std::string>().size())
      << e;  // the generated token's text ends the choice's text

  // Streamed: the same entries over the chunks.
  json streamed = body;
  streamed["stream"] = true;
  auto sse = http_request(s.port(), "POST", "/v1/completions", streamed.dump());
  ASSERT_EQ(sse.status, 200);
  json got = json::array();
  std::istringstream lines(sse.body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    auto c = json::parse(line.substr(6));
    const auto& l = c["choices"][0]["logprobs"];
    if (l.is_object()) for (const auto& v : l["token_logprobs"]) got.push_back(v);
  }
  EXPECT_EQ(got, lp["token_logprobs"]) << sse.body;

  // A batch (as lm-evaluation-harness sends it): each prompt scored on its own.
  json batch = body;
  batch["prompt"] = json::array({whole, prompt});
  auto b = completion(s.port(), batch, &status);
  ASSERT_EQ(status, 200) << b;
  ASSERT_EQ(b["choices"].size(), 2u) << b;
  const auto& l0 = b["choices"][0]["logprobs"]["token_logprobs"];
  const auto& l1 = b["choices"][1]["logprobs"]["token_logprobs"];
  EXPECT_EQ(l0, lp["token_logprobs"]);
  ASSERT_EQ(l1.size(), prompt.size() + 1);
  for (size_t i = 0; i < prompt.size(); ++i) EXPECT_EQ(l1[i], l0[i]) << "position " << i;

  // vLLM's prompt_logprobs: P + G's entries are echo's scores; after P they are G's own (rank
  // 1: greedy drew each), with G's text and alternatives; chat puts them on the response.
  const json pl = {{"model", "kjv-tiny"}, {"prompt", whole}, {"max_tokens", 1}, {"temperature", 0}, {"prompt_logprobs", 2}};
  auto p = completion(s.port(), pl, &status);
  ASSERT_EQ(status, 200) << p;
  const auto& entries = p["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(entries.size(), whole.size()) << p;
  EXPECT_TRUE(entries[0].is_null()) << entries;
  EXPECT_TRUE(p["choices"][0]["logprobs"].is_null()) << "prompt_logprobs asks for no generated logprobs";
  for (size_t i = 1; i < whole.size(); ++i) {
    const auto& mine = entries[i][std::to_string(whole[i])];
    ASSERT_TRUE(mine.is_object()) << i << ": " << entries[i];
    EXPECT_EQ(mine["logprob"], lp["token_logprobs"][i]) << "position " << i;
    EXPECT_EQ(mine["decoded_token"], lp["tokens"][i]) << "position " << i;
    EXPECT_GE(mine["rank"].get<int>(), 1);
    std::set<double> values, want;
    for (const auto& [k, v] : entries[i].items()) values.insert(v["logprob"].get<double>());
    for (const auto& [k, v] : lp["top_logprobs"][i].items()) want.insert(v.get<double>());
    EXPECT_EQ(values, want) << "position " << i << ": " << entries[i] << " vs " << lp["top_logprobs"][i];
    if (i >= prompt.size()) EXPECT_EQ(mine["rank"], 1) << "generated greedily at " << i;
  }
  const json chat_body = {{"model", "kjv-tiny"}, {"messages", {{{"role", "user"}, {"content", "Who begat Enos?"}}}},
                          {"max_tokens", 2}, {"prompt_logprobs", 0}, {"n", 2}};
  auto chat = http_request(s.port(), "POST", "/v1/chat/completions", chat_body.dump());
  ASSERT_EQ(chat.status, 200) << chat.body;
  const auto cj = json::parse(chat.body);
  ASSERT_EQ(cj["prompt_logprobs"].size(), cj["usage"]["prompt_tokens"].get<size_t>()) << cj;
  EXPECT_TRUE(cj["prompt_logprobs"][0].is_null());
  EXPECT_EQ(cj["prompt_logprobs"][1].size(), 1u) << "0 alternatives: the token alone";
  EXPECT_FALSE(cj["choices"][0].contains("prompt_logprobs"));
  // Both at once, each with its own count: echo's 1 alternative, prompt_logprobs' 5.
  json both = pl;
  both["echo"] = true;
  both["logprobs"] = 1;
  both["prompt_logprobs"] = 5;
  auto bj = completion(s.port(), both, &status);
  ASSERT_EQ(status, 200) << bj;
  for (size_t i = 1; i < whole.size(); ++i) {
    EXPECT_LE(bj["choices"][0]["logprobs"]["top_logprobs"][i].size(), 2u) << i;  // the token, 1 alternative
    EXPECT_GE(bj["choices"][0]["prompt_logprobs"][i].size(), 5u) << i;           // 5 alternatives (and the token)
    EXPECT_LE(bj["choices"][0]["prompt_logprobs"][i].size(), 6u) << i;
    EXPECT_EQ(bj["choices"][0]["prompt_logprobs"][i][std::to_string(whole[i])]["logprob"],
              bj["choices"][0]["logprobs"]["token_logprobs"][i]) << i;
  }
  json streamed_pl = pl;
  streamed_pl["stream"] = true;
  auto refused = http_request(s.port(), "POST", "/v1/completions", streamed_pl.dump());
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("prompt_logprobs"), std::string::npos) << refused.body;
}

TEST(Serve, LogprobsAreTheModelsLogSoftmaxForEveryToken) {
  server_process s(bin, {"--model", model_dir, "--replicas", "1", "--tp", "2"});
  ASSERT_GT(s.port(), 0) << s.log();
  const std::vector<int32_t> prompt{1142, 258, 2078, 386, 3345};
  // The reference: the engine's logits at the first generated position, log-softmaxed here.
  temp_dir dir;
  const std::string dump = dir.path() + "/first.f32";
  auto r = run_command(bin + " generate --device cpu --model " + model_dir + " --prompt-ids " + id_list(prompt) +
                       " --max-tokens 1 --temperature 0 --print-ids --dump-logits " + dump);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(dump, std::ios::binary);
  std::vector<float> logits(4096);
  in.read(reinterpret_cast<char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  ASSERT_TRUE(in.good());
  double mx = *std::max_element(logits.begin(), logits.end()), z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l) - mx);
  const size_t best = static_cast<size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const double want_lp = static_cast<double>(logits[best]) - mx - std::log(z);

  const json body = {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 3},
                     {"return_token_ids", true}};
  int status = 0;
  auto j = completion(s.port(), body, &status);
  ASSERT_EQ(status, 200) << j;
  const auto& lp = j["choices"][0]["logprobs"];
  const auto ids = j["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 6u) << j;
  ASSERT_EQ(lp["tokens"].size(), 6u) << j;
  ASSERT_EQ(lp["token_logprobs"].size(), 6u) << j;
  ASSERT_EQ(lp["top_logprobs"].size(), 6u) << j;
  ASSERT_EQ(ids[0], static_cast<int32_t>(best));
  EXPECT_NEAR(lp["token_logprobs"][0].get<double>(), want_lp, 1e-5) << j;
  for (size_t i = 0; i < 6; ++i) {
    const double chosen = lp["token_logprobs"][i].get<double>();
    EXPECT_LE(chosen, 0.0);
    // Greedy: the chosen token is the most likely, so no alternative beats it; the dict holds
    // the chosen token and its 3 alternatives (the chosen one among them: 3 keys).
    EXPECT_EQ(lp["top_logprobs"][i].size(), 3u) << lp["top_logprobs"][i];
    for (const auto& [tok, v] : lp["top_logprobs"][i].items()) EXPECT_LE(v.get<double>(), chosen + 1e-9) << tok;
  }
  EXPECT_EQ(lp["text_offset"][0], 0);

  // Streamed, the same numbers arrive over the chunks; chat's shape carries them too.
  json streamed = body;
  streamed["stream"] = true;
  auto sse = http_request(s.port(), "POST", "/v1/completions", streamed.dump());
  ASSERT_EQ(sse.status, 200);
  std::vector<double> got;
  std::istringstream lines(sse.body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    auto c = json::parse(line.substr(6));
    const auto& l = c["choices"][0]["logprobs"];
    if (l.is_object()) for (const auto& v : l["token_logprobs"]) got.push_back(v.get<double>());
  }
  EXPECT_EQ(got, lp["token_logprobs"].get<std::vector<double>>()) << sse.body;
  const json chat = {{"model", "kjv-tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 2},
                     {"logprobs", true}, {"top_logprobs", 2}};
  auto c = http_request(s.port(), "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  auto cj = json::parse(c.body);
  const auto& content = cj["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u) << c.body;
  for (const auto& e : content) {
    EXPECT_TRUE(e["token"].is_string());
    EXPECT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
  }
}

}  // namespace
}  // namespace llmesh::testing
