// OpenAI request parsing: valid bodies, each invalid field named in a one-line 400, a mutation
// fuzz loop that must never throw or crash. (openai_shapes_test.cpp: the response shapes.)
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <random>

#include "json_mutation.hpp"
#include "llmesh/gateway/openai_api.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;

TEST(OpenaiApi, ParsesCompletionRequests) {
  request_limits lim;
  auto r = parse_completion_request(
      R"({"model":"m","prompt":"Hello","max_tokens":5,"temperature":0,"top_p":0.9,"top_k":40,"seed":7,
          "stop":["\n","END"],"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true,
          "unknown_field":{"ignored":1}})",
      lim);
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(r->model, "m");
  ASSERT_EQ(r->prompts.size(), 1u);
  EXPECT_EQ(*r->prompts[0].text, "Hello");
  EXPECT_EQ(r->gen.n, 1u);
  EXPECT_FALSE(r->echo);
  EXPECT_EQ(r->gen.max_tokens, 5u);
  EXPECT_EQ(r->gen.temperature, 0.0f);
  EXPECT_EQ(r->gen.top_k, 40);
  EXPECT_EQ(*r->gen.seed, 7u);
  EXPECT_EQ(r->gen.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r->gen.stream && r->gen.include_usage && r->gen.return_token_ids);
  auto ids = parse_completion_request(R"({"model":"m","prompt":[1,2,3]})", lim);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->prompts.size(), 1u);
  EXPECT_FALSE(ids->prompts[0].text);
  EXPECT_EQ(ids->prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ids->gen.max_tokens, 16u);  // OpenAI's default
}

TEST(OpenaiApi, ParsesChatRequests) {
  request_limits lim;
  lim.max_tokens = 100;
  auto r = parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":9})", lim);
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(r->messages.size(), 1u);
  EXPECT_EQ(r->gen.max_tokens, 9u);
  auto d = parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"Hi"}]})", lim);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->gen.max_tokens, 100u);  // chat without a limit: the server's bound
}

TEST(OpenaiApi, NamesTheBadField) {
  request_limits lim;
  const std::pair<const char*, const char*> cases[] = {
      {"not json", "not valid JSON"},
      {"[1,2]", "JSON object"},
      {R"({"prompt":"x"})", "'model'"},
      {R"({"model":"m"})", "'prompt' is required"},
      {R"({"model":"m","prompt":""})", "'prompt' is empty"},
      {R"({"model":"m","prompt":[1,-2]})", "token ids"},
      {R"({"model":"m","prompt":["a",["b"]]})", "one kind throughout"},
      {R"({"model":"m","prompt":"x","max_tokens":0})", "'max_tokens'"},
      {R"({"model":"m","prompt":"x","max_tokens":100000})", "'max_tokens'"},
      {R"({"model":"m","prompt":"x","max_tokens":"5"})", "'max_tokens' must be an integer"},
      {R"({"model":"m","prompt":"x","temperature":3})", "'temperature'"},
      {R"({"model":"m","prompt":"x","top_p":-0.1})", "'top_p'"},
      {R"({"model":"m","prompt":"x","n":0})", "'n' must be a positive integer"},
      {R"({"model":"m","prompt":"x","stop":["a","b","c","d","e"]})", "at most 4"},
      {R"({"model":"m","prompt":"x","stop":[""]})", "'stop'"},
      {R"({"model":"m","prompt":"x","stop":5})", "'stop'"},
      {R"({"model":"m","prompt":"x","stream":"yes"})", "'stream'"},
      {R"({"model":"m","prompt":"x","echo":"yes"})", "'echo' must be true or false"},
      {R"({"model":"m","prompt":"x","echo":1})", "'echo' must be true or false"},
      {R"({"model":"m","prompt":"x","top_k":-2})", "'top_k'"},
      {R"({"model":"m","prompt":"x","top_k":18446744073709551615})", "'top_k'"},  // must not wrap to -1
      {R"({"model":"m","prompt":"x","seed":1.5})", "'seed'"},
  };
  for (const auto& [body, needle] : cases) {
    auto r = parse_completion_request(body, lim);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.err().code, errc::invalid_request);
    EXPECT_NE(r.err().message.find(needle), std::string::npos) << body << " -> " << r.err().message;
    EXPECT_EQ(r.err().message.find('\n'), std::string::npos);
  }
  EXPECT_FALSE(parse_chat_request(R"({"model":"m","messages":[]})", lim).ok());
  EXPECT_FALSE(parse_chat_request(R"({"model":"m","messages":[{"role":"user"}]})", lim).ok());
  EXPECT_FALSE(parse_chat_request(R"({"model":"m","messages":[{"role":1,"content":"x"}]})", lim).ok());
}

// echo (completions): true or false (null: false); with logprobs n the prompt is scored too
// (prompt_logprobs n); logprobs null or false ask for nothing.
TEST(OpenaiApi, EchoIsParsedAndScoresThePromptWithLogprobs) {
  request_limits lim;
  for (const auto& [fields, want] : std::vector<std::pair<std::string, bool>>{
           {R"("echo":false)", false}, {R"("echo":null)", false}, {R"("echo":true)", true},
           {R"("echo":true,"logprobs":null)", true}, {R"("echo":true,"logprobs":false)", true},
           {R"("echo":true,"n":2,"prompt":["a","b"])", true}}) {
    auto r = parse_completion_request(R"({"model":"m","prompt":"x",)" + fields + "}", lim);
    ASSERT_TRUE(r.ok()) << fields << " -> " << r.err().message;
    EXPECT_EQ(r->echo, want) << fields;
    EXPECT_EQ(r->gen.prompt_logprobs, -1) << fields;
  }
  for (int lp : {0, 5}) {
    auto r = parse_completion_request(R"({"model":"m","prompt":"x","echo":true,"logprobs":)" + std::to_string(lp) + "}", lim);
    ASSERT_TRUE(r.ok()) << lp << " -> " << r.err().message;
    EXPECT_EQ(r->gen.prompt_logprobs, lp);
    EXPECT_EQ(r->gen.logprobs, lp);
  }
  auto e = parse_completion_request(R"({"model":"m","prompt":"x","echo":"yes"})", lim);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.err().message, "'echo' must be true or false");
}

// n on both endpoints: an integer >= 1 (null: 1); prompts × n at most max_choices.
TEST(OpenaiApi, NIsParsedOnBothEndpointsWithinMaxChoices) {
  request_limits lim;
  lim.max_choices = 6;
  const std::string chat_head = R"({"model":"m","messages":[{"role":"user","content":"x"}])";
  for (const auto& [field, want] : std::vector<std::pair<std::string, size_t>>{
           {"", 1}, {R"(,"n":null)", 1}, {R"(,"n":1)", 1}, {R"(,"n":3)", 3}, {R"(,"n":6)", 6}}) {
    auto c = parse_completion_request(R"({"model":"m","prompt":"x")" + field + "}", lim);
    ASSERT_TRUE(c.ok()) << field << " -> " << c.err().message;
    EXPECT_EQ(c->gen.n, want) << field;
    auto h = parse_chat_request(chat_head + field + "}", lim);
    ASSERT_TRUE(h.ok()) << field << " -> " << h.err().message;
    EXPECT_EQ(h->gen.n, want) << field;
  }
  const std::string over_n = "the request asks for more choices ('n') than this server's limit of 6 per request";
  const std::string over_batch =
      "the request asks for more choices (prompts × 'n') than this server's limit of 6 per request";
  for (const auto& [field, msg] : std::vector<std::pair<std::string, std::string>>{
           {R"("n":0)", "'n' must be a positive integer"},
           {R"("n":-1)", "'n' must be a positive integer"},
           {R"("n":2.0)", "'n' must be a positive integer"},
           {R"("n":"2")", "'n' must be a positive integer"},
           {R"("n":7)", over_n},
           {R"("n":18446744073709551615)", over_n}}) {  // must not wrap
    auto c = parse_completion_request(R"({"model":"m","prompt":"x",)" + field + "}", lim);
    ASSERT_FALSE(c.ok()) << field;
    EXPECT_EQ(c.err().message, msg) << field;
    auto h = parse_chat_request(chat_head + "," + field + "}", lim);
    ASSERT_FALSE(h.ok()) << field;
    EXPECT_EQ(h.err().message, msg) << field;
  }
  // A batch counts: 3 prompts × n = 2 fit 6; × 3 do not; 7 prompts do not even at n = 1.
  EXPECT_TRUE(parse_completion_request(R"({"model":"m","prompt":["a","b","c"],"n":2})", lim).ok());
  auto b = parse_completion_request(R"({"model":"m","prompt":["a","b","c"],"n":3})", lim);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.err().message, over_batch);
  auto seven = parse_completion_request(R"({"model":"m","prompt":[[1],[2],[3],[4],[5],[6],[7]]})", lim);
  ASSERT_FALSE(seven.ok());
  EXPECT_EQ(seven.err().message, over_batch);
  EXPECT_EQ(request_limits{}.max_choices, 64u);  // the default bound
}

// best_of (completions): an integer >= 1 (null and 1: off); above 1 at least n, not streamed,
// and prompts × best_of within max_choices (vLLM's rules, this server's bound).
TEST(OpenaiApi, BestOfIsParsedForCompletionsWithVllmsRules) {
  request_limits lim;
  lim.max_choices = 8;
  auto parse = [&](const std::string& fields) {
    return parse_completion_request(R"({"model":"m","prompt":"x",)" + fields + "}", lim);
  };
  struct ok_case {
    std::string fields;
    size_t best_of, candidates;
  };
  for (const auto& c : std::vector<ok_case>{{R"("best_of":null)", 1, 1}, {R"("best_of":1,"n":3)", 1, 3},
                                            {R"("best_of":3)", 3, 3}, {R"("best_of":3,"n":3)", 3, 3},
                                            {R"("best_of":5,"n":2)", 5, 5}, {R"("best_of":8)", 8, 8},
                                            {R"("best_of":4,"prompt":["a","b"])", 4, 4},
                                            {R"("best_of":1,"stream":true)", 1, 1}}) {
    auto r = parse(c.fields);
    ASSERT_TRUE(r.ok()) << c.fields << " -> " << r.err().message;
    EXPECT_EQ(r->gen.best_of, c.best_of) << c.fields;
    EXPECT_EQ(r->gen.candidates(), c.candidates) << c.fields;
  }
  for (const auto& [fields, msg] : std::vector<std::pair<std::string, std::string>>{
           {R"("best_of":0)", "'best_of' must be a positive integer"},
           {R"("best_of":1.5)", "'best_of' must be a positive integer"},
           {R"("best_of":2,"n":3)", "'best_of' (2) must be at least 'n' (3)"},
           {R"("best_of":2,"stream":true)", "'best_of' above 1 cannot be streamed (send 'stream': false)"},
           {R"("best_of":9)", "the request asks for more choices ('best_of') than this server's limit of 8 per request"},
           {R"("best_of":18446744073709551615)",
            "the request asks for more choices ('best_of') than this server's limit of 8 per request"},
           {R"("best_of":5,"prompt":["a","b"])",
            "the request asks for more choices (prompts × 'best_of') than this server's limit of 8 per request"}}) {
    auto r = parse(fields);
    ASSERT_FALSE(r.ok()) << fields;
    EXPECT_EQ(r.err().message, msg) << fields;
  }
}

// prompt: a string, an array of token ids, or a batch (an array of strings, or an array of
// token-id arrays), in the order sent; a batch of one is one prompt. Empty arrays, empty
// prompts, mixed kinds and bad ids are a 400 naming the prompt.
TEST(OpenaiApi, PromptsComeAloneOrInBatchesOfOneKind) {
  request_limits lim;
  auto prompts = [&](const std::string& p) { return parse_completion_request(R"({"model":"m","prompt":)" + p + "}", lim); };
  using texts = std::vector<std::string>;
  using id_lists = std::vector<std::vector<int32_t>>;
  struct ok_case {
    std::string prompt;
    texts want_text;    // one per prompt when text prompts
    id_lists want_ids;  // one per prompt when id prompts
  };
  const ok_case ok[] = {
      {R"("Hello")", {"Hello"}, {}},
      {R"(["Hello"])", {"Hello"}, {}},
      {R"([""])", {""}, {}},  // a batch of one string, as before batches were served
      {R"(["In the", "And God", "x"])", {"In the", "And God", "x"}, {}},
      {R"([1, 2, 3])", {}, {{1, 2, 3}}},
      {R"([[7]])", {}, {{7}}},
      {R"([[1, 2], [3], [2147483647, 0]])", {}, {{1, 2}, {3}, {2147483647, 0}}},
  };
  for (const auto& c : ok) {
    auto r = prompts(c.prompt);
    ASSERT_TRUE(r.ok()) << c.prompt << " -> " << r.err().message;
    texts got_text;
    id_lists got_ids;
    for (const auto& p : r->prompts) {
      if (p.text) {
        got_text.push_back(*p.text);
        EXPECT_TRUE(p.ids.empty());
      } else {
        got_ids.push_back(p.ids);
      }
    }
    EXPECT_EQ(got_text, c.want_text) << c.prompt;
    EXPECT_EQ(got_ids, c.want_ids) << c.prompt;
  }
  const std::string forms =
      "'prompt' must be a string, an array of token ids, or an array of strings or of token-id arrays";
  const std::pair<std::string, std::string> bad[] = {
      {R"("")", "'prompt' is empty"},
      {R"([])", "'prompt' is an empty array"},
      {R"([[]])", "'prompt' is empty"},
      {R"([[1], []])", "'prompt[1]' is empty"},
      {R"(["a", ""])", "'prompt[1]' is empty"},
      {R"(["a", 5])", forms + " (one kind throughout)"},
      {R"([[1], "a"])", forms + " (one kind throughout)"},
      {R"([1, "a"])", "'prompt' token ids must be non-negative integers"},
      {R"([1, [2]])", "'prompt' token ids must be non-negative integers"},
      {R"([[1], [2, -3]])", "'prompt[1]' token ids must be non-negative integers"},
      {R"([[1], [2147483648]])", "'prompt[1]' token ids must be non-negative integers"},
      {R"([["a"]])", "'prompt' token ids must be non-negative integers"},
      {R"([null])", forms + " (one kind throughout)"},
      {R"(5)", forms},
      {R"({"text":"a"})", forms},
  };
  for (const auto& [p, msg] : bad) {
    auto r = prompts(p);
    ASSERT_FALSE(r.ok()) << p << " was accepted";
    EXPECT_EQ(r.err().code, errc::invalid_request);
    EXPECT_EQ(r.err().message, msg) << p;
  }
}

TEST(OpenaiApi, StopTokenIdsAreParsedAndBounded) {
  request_limits lim;
  auto r = parse_completion_request(R"({"model":"m","prompt":"x","stop_token_ids":[7,0,2147483647]})", lim);
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(r->gen.stop_token_ids, (std::vector<int32_t>{7, 0, 2147483647}));
  auto c = parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop_token_ids":[9]})", lim);
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->gen.stop_token_ids, (std::vector<int32_t>{9}));
  for (const char* neutral : {"null", "[]"}) {
    auto n = parse_completion_request(std::string(R"({"model":"m","prompt":"x","stop_token_ids":)") + neutral + "}", lim);
    ASSERT_TRUE(n.ok()) << neutral << ": " << n.err().message;
    EXPECT_TRUE(n->gen.stop_token_ids.empty());
  }
  json many = json::array();
  for (int i = 0; i < 65; ++i) many.push_back(i);
  const std::string too_many = json{{"model", "m"}, {"prompt", "x"}, {"stop_token_ids", many}}.dump();
  many.erase(many.end() - 1);
  EXPECT_TRUE(parse_completion_request(json{{"model", "m"}, {"prompt", "x"}, {"stop_token_ids", many}}.dump(), lim).ok());
  for (const std::string& bad : {std::string("5"), std::string("\"7\""), std::string("[1,-1]"), std::string("[1.5]"),
                                 std::string("[\"3\"]"), std::string("[2147483648]"), std::string("[18446744073709551615]"),
                                 std::string("[[1]]")}) {
    auto e = parse_completion_request(R"({"model":"m","prompt":"x","stop_token_ids":)" + bad + "}", lim);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.err().code, errc::invalid_request);
    EXPECT_NE(e.err().message.find("'stop_token_ids'"), std::string::npos) << bad << " -> " << e.err().message;
  }
  auto e = parse_completion_request(too_many, lim);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.err().message.find("'stop_token_ids' holds at most 64"), std::string::npos) << e.err().message;
}

// Fields asking for behaviour the server does not implement are refused, naming the field,
// on both endpoints; their neutral values (what many clients send on every request) pass.
// (logprobs and top_logprobs are served: LogprobsAreParsedPerEndpointWithinTheEngineBound;
// the penalties and min_tokens too: PenaltiesAndMinTokensAreParsedWithinVllmsRanges.)
TEST(OpenaiApi, UnsupportedFieldsAreRefusedAndTheirNeutralValuesAccepted) {
  request_limits lim;
  struct field_case {
    const char* name;
    std::vector<const char*> neutral, refused;
  };
  const field_case cases[] = {
      {"suffix", {"null", R"("")"}, {R"("end")"}},
      // tools and response_format are served now (structured_output_test.cpp).
  };
  auto parse = [&](bool chat, const std::string& field, const char* value) -> status {
    const std::string body =
        (chat ? std::string(R"({"model":"m","messages":[{"role":"user","content":"x"}],")")
              : std::string(R"({"model":"m","prompt":"x",")")) +
        field + "\":" + value + "}";
    if (chat) {
      auto r = parse_chat_request(body, lim);
      return r.ok() ? ok_status() : status(r.err());
    }
    auto r = parse_completion_request(body, lim);
    return r.ok() ? ok_status() : status(r.err());
  };
  for (bool chat : {false, true}) {
    for (const auto& f : cases) {
      for (const char* v : f.neutral) {
        auto s = parse(chat, f.name, v);
        EXPECT_TRUE(s.ok()) << (chat ? "chat " : "completions ") << f.name << "=" << v << " -> " << s.err().message;
      }
      for (const char* v : f.refused) {
        auto s = parse(chat, f.name, v);
        ASSERT_FALSE(s.ok()) << (chat ? "chat " : "completions ") << f.name << "=" << v << " was accepted";
        EXPECT_EQ(s.err().code, errc::invalid_request);
        EXPECT_NE(s.err().message.find(std::string("'") + f.name + "' is not supported"), std::string::npos)
            << f.name << "=" << v << " -> " << s.err().message;
      }
    }
  }
  // best_of is a completions field (BestOfIsParsedForCompletionsWithVllmsRules): chat refuses it
  // above 1, and both take its neutral values.
  for (const char* v : {"null", "1"}) {
    EXPECT_TRUE(parse(true, "best_of", v).ok()) << v;
    EXPECT_TRUE(parse(false, "best_of", v).ok()) << v;
  }
  for (const char* v : {"2", "5"}) {
    auto s = parse(true, "best_of", v);
    ASSERT_FALSE(s.ok()) << v;
    EXPECT_EQ(s.err().message, "'best_of' is not supported by this server (send 1 or null, or leave it out)");
  }
  // Values of the wrong type are type errors, still naming the field.
  const std::pair<const char*, const char*> typed[] = {
      {R"("logprobs":"yes")", "'logprobs'"},    {R"("logprobs":-1)", "'logprobs'"},
      {R"("logprobs":1.5)", "'logprobs'"},      {R"("top_logprobs":-1)", "'top_logprobs'"},
      {R"("top_logprobs":true)", "'top_logprobs'"}, {R"("presence_penalty":"0")", "'presence_penalty'"},
      {R"("frequency_penalty":false)", "'frequency_penalty'"}, {R"("repetition_penalty":[1])", "'repetition_penalty'"},
      {R"("min_tokens":-1)", "'min_tokens'"},   {R"("min_tokens":2.5)", "'min_tokens'"},
  };
  for (const auto& [field, needle] : typed) {
    auto r = parse_completion_request(std::string(R"({"model":"m","prompt":"x",)") + field + "}", lim);
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(r.err().code, errc::invalid_request);
    EXPECT_NE(r.err().message.find(needle), std::string::npos) << field << " -> " << r.err().message;
  }
  // All the neutral values at once, as a client that always sends them would.
  auto all = parse_chat_request(
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":false,"top_logprobs":null,
          "presence_penalty":0,"frequency_penalty":0.0,"repetition_penalty":1.0,"min_tokens":0,"min_p":0,
          "best_of":1,"logit_bias":{},"tools":[]})",
      lim);
  ASSERT_TRUE(all.ok()) << all.err().message;
  EXPECT_EQ(all->gen.presence_penalty, 0.0f);
  EXPECT_EQ(all->gen.frequency_penalty, 0.0f);
  EXPECT_EQ(all->gen.repetition_penalty, 1.0f);
  EXPECT_EQ(all->gen.min_tokens, 0);
}

// vLLM's sampling penalties and min_tokens, on both endpoints: presence_penalty and
// frequency_penalty within [-2, 2], repetition_penalty within (0, 10], min_tokens from 0 to
// the request's max_tokens; null (or absent) is the neutral value. Out of range or of the
// wrong type: a 400 naming the field. (JSON has no NaN or infinity, and the parser refuses an
// overflowing literal such as 1e400 as invalid JSON; the range checks refuse them anyway.)
TEST(OpenaiApi, PenaltiesAndMinTokensAreParsedWithinVllmsRanges) {
  request_limits lim;
  lim.max_tokens = 100;
  auto parse = [&](bool chat, const std::string& fields) -> result<generation_fields> {
    const std::string body =
        (chat ? std::string(R"({"model":"m","messages":[{"role":"user","content":"x"}])")
              : std::string(R"({"model":"m","prompt":"x")")) +
        (fields.empty() ? "" : "," + fields) + "}";
    if (chat) {
      auto r = parse_chat_request(body, lim);
      if (!r) return r.take_error();
      return r->gen;
    }
    auto r = parse_completion_request(body, lim);
    if (!r) return r.take_error();
    return r->gen;
  };
  for (bool chat : {false, true}) {
    const char* endpoint = chat ? "chat: " : "completions: ";
    auto defaults = parse(chat, "");
    ASSERT_TRUE(defaults.ok()) << endpoint << defaults.err().message;
    EXPECT_EQ(defaults->presence_penalty, 0.0f);
    EXPECT_EQ(defaults->frequency_penalty, 0.0f);
    EXPECT_EQ(defaults->repetition_penalty, 1.0f);
    EXPECT_EQ(defaults->min_tokens, 0);
    struct good_case {
      std::string fields;
      float presence, frequency, repetition;
      int min_tokens;
    };
    const good_case good[] = {
        {R"("presence_penalty":null,"frequency_penalty":null,"repetition_penalty":null,"min_tokens":null)", 0, 0, 1, 0},
        {R"("presence_penalty":0.5,"frequency_penalty":-0.25,"repetition_penalty":1.2,"min_tokens":3)", 0.5f, -0.25f,
         1.2f, 3},
        {R"("presence_penalty":2,"frequency_penalty":2.0)", 2, 2, 1, 0},
        {R"("presence_penalty":-2,"frequency_penalty":-2.0)", -2, -2, 1, 0},
        {R"("presence_penalty":1,"frequency_penalty":-1)", 1, -1, 1, 0},  // integers are numbers
        {R"("repetition_penalty":10)", 0, 0, 10, 0},
        {R"("repetition_penalty":0.01)", 0, 0, 0.01f, 0},
        {R"("repetition_penalty":1e-30)", 0, 0, 1e-30f, 0},  // > 0 is vLLM's only lower bound
        {R"("min_tokens":16)", 0, 0, 1, 16},                 // completions' default max_tokens
        {R"("max_tokens":7,"min_tokens":7)", 0, 0, 1, 7},
        {R"("max_tokens":7,"min_tokens":0)", 0, 0, 1, 0},
    };
    for (const auto& c : good) {
      auto g = parse(chat, c.fields);
      ASSERT_TRUE(g.ok()) << endpoint << c.fields << " -> " << g.err().message;
      EXPECT_EQ(g->presence_penalty, c.presence) << endpoint << c.fields;
      EXPECT_EQ(g->frequency_penalty, c.frequency) << endpoint << c.fields;
      EXPECT_EQ(g->repetition_penalty, c.repetition) << endpoint << c.fields;
      EXPECT_EQ(g->min_tokens, c.min_tokens) << endpoint << c.fields;
    }
    const std::pair<std::string, std::string> bad[] = {
        {R"("presence_penalty":2.01)", "'presence_penalty' must be a number between -2 and 2"},
        {R"("presence_penalty":-2.5)", "'presence_penalty' must be a number between -2 and 2"},
        {R"("presence_penalty":1e308)", "'presence_penalty' must be a number between -2 and 2"},
        {R"("presence_penalty":-1e308)", "'presence_penalty' must be a number between -2 and 2"},
        {R"("presence_penalty":"0.5")", "'presence_penalty' must be a number"},
        {R"("presence_penalty":true)", "'presence_penalty' must be a number"},
        {R"("frequency_penalty":3)", "'frequency_penalty' must be a number between -2 and 2"},
        {R"("frequency_penalty":-2.0001)", "'frequency_penalty' must be a number between -2 and 2"},
        {R"("frequency_penalty":1e308)", "'frequency_penalty' must be a number between -2 and 2"},
        {R"("frequency_penalty":[0])", "'frequency_penalty' must be a number"},
        {R"("repetition_penalty":0)", "'repetition_penalty' must be a number greater than 0 and at most 10"},
        {R"("repetition_penalty":-0.0)", "'repetition_penalty' must be a number greater than 0 and at most 10"},
        {R"("repetition_penalty":-1)", "'repetition_penalty' must be a number greater than 0 and at most 10"},
        {R"("repetition_penalty":10.5)", "'repetition_penalty' must be a number greater than 0 and at most 10"},
        {R"("repetition_penalty":1e308)", "'repetition_penalty' must be a number greater than 0 and at most 10"},
        {R"("repetition_penalty":{})", "'repetition_penalty' must be a number"},
        {R"("min_tokens":-1)", "'min_tokens' must be a non-negative integer"},
        {R"("min_tokens":-9223372036854775808)", "'min_tokens' must be a non-negative integer"},
        {R"("min_tokens":2.5)", "'min_tokens' must be an integer"},
        {R"("min_tokens":"3")", "'min_tokens' must be an integer"},
        {R"("min_tokens":18446744073709551615)", "'min_tokens' ("},  // must not wrap into range
        {R"("max_tokens":7,"min_tokens":8)", "'min_tokens' (8) must be at most 'max_tokens' (7)"},
    };
    for (const auto& [fields, needle] : bad) {
      auto g = parse(chat, fields);
      ASSERT_FALSE(g.ok()) << endpoint << fields << " was accepted";
      EXPECT_EQ(g.err().code, errc::invalid_request);
      EXPECT_NE(g.err().message.find(needle), std::string::npos) << endpoint << fields << " -> " << g.err().message;
      EXPECT_EQ(g.err().message.find('\n'), std::string::npos);
    }
  }
  // min_tokens against the max_tokens each endpoint has when the client sends none:
  // completions' default 16, chat's the server's limit; chat's newer name is the one named.
  auto c16 = parse(false, R"("min_tokens":17)");
  ASSERT_FALSE(c16.ok());
  EXPECT_EQ(c16.err().message, "'min_tokens' (17) must be at most 'max_tokens' (16, its default when left out)");
  auto chat_limit = parse(true, R"("min_tokens":100)");
  ASSERT_TRUE(chat_limit.ok()) << chat_limit.err().message;
  EXPECT_EQ(chat_limit->min_tokens, 100);
  auto over = parse(true, R"("min_tokens":101)");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.err().message, "'min_tokens' (101) must be at most the server's max_tokens limit (100)");
  auto named = parse(true, R"("max_completion_tokens":4,"min_tokens":5)");
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.err().message, "'min_tokens' (5) must be at most 'max_completion_tokens' (4)");
  auto legacy = parse(true, R"("max_tokens":4,"min_tokens":5)");
  ASSERT_FALSE(legacy.ok());
  EXPECT_EQ(legacy.err().message, "'min_tokens' (5) must be at most 'max_tokens' (4)");
  EXPECT_TRUE(parse(true, R"("max_completion_tokens":5,"min_tokens":5)").ok());
  // The fields the server still does not implement stay refused next to the accepted ones.
  auto best_of = parse(true, R"("presence_penalty":0.5,"best_of":2)");  // best_of: completions only
  ASSERT_FALSE(best_of.ok());
  EXPECT_NE(best_of.err().message.find("'best_of' is not supported"), std::string::npos) << best_of.err().message;
  // min_p: a number within [0, 1].
  auto mp = parse(false, R"("min_p":0.05)");
  ASSERT_TRUE(mp.ok()) << mp.err().message;
  for (const char* bad : {R"("min_p":1.5)", R"("min_p":-0.1)", R"("min_p":"0.1")"}) {
    auto r = parse(true, bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.err().message.find("'min_p'"), std::string::npos) << r.err().message;
  }
}

// Completions: `logprobs` is a count 0..20 (false / null: none). Chat: `logprobs` a boolean and
// `top_logprobs` a count 0..20 that above 0 needs logprobs true. Both land in gen.logprobs.
TEST(OpenaiApi, LogprobsAreParsedPerEndpointWithinTheEngineBound) {
  request_limits lim;
  auto completion = [&](const std::string& fields) {
    return parse_completion_request(R"({"model":"m","prompt":"x")" + (fields.empty() ? "" : "," + fields) + "}", lim);
  };
  auto chat = [&](const std::string& fields) {
    return parse_chat_request(
        R"({"model":"m","messages":[{"role":"user","content":"x"}])" + (fields.empty() ? "" : "," + fields) + "}", lim);
  };
  const std::pair<std::string, int> completion_ok[] = {
      {"", -1}, {R"("logprobs":null)", -1}, {R"("logprobs":false)", -1}, {R"("logprobs":0)", 0},
      {R"("logprobs":5)", 5}, {R"("logprobs":20)", 20}, {R"("logprobs":3,"top_logprobs":0)", 3},
      {R"("logprobs":2,"echo":false)", 2}, {R"("logprobs":2,"echo":true)", 2},
  };
  for (const auto& [fields, want] : completion_ok) {
    auto r = completion(fields);
    ASSERT_TRUE(r.ok()) << fields << " -> " << r.err().message;
    EXPECT_EQ(r->gen.logprobs, want) << fields;
  }
  const std::pair<std::string, std::string> completion_bad[] = {
      {R"("logprobs":21)", "'logprobs' must be an integer between 0 and 20"},
      {R"("logprobs":-1)", "'logprobs' must be an integer between 0 and 20"},
      {R"("logprobs":true)", "'logprobs' must be an integer between 0 and 20"},
      {R"("logprobs":"5")", "'logprobs'"},
      {R"("logprobs":1.5)", "'logprobs'"},
      {R"("logprobs":18446744073709551615)", "'logprobs'"},  // must not wrap into range
      {R"("top_logprobs":3)", "'top_logprobs' is a chat field"},
      {R"("logprobs":2,"top_logprobs":21)", "'top_logprobs' must be between 0 and 20"},
  };
  for (const auto& [fields, needle] : completion_bad) {
    auto r = completion(fields);
    ASSERT_FALSE(r.ok()) << fields << " was accepted";
    EXPECT_EQ(r.err().code, errc::invalid_request);
    EXPECT_NE(r.err().message.find(needle), std::string::npos) << fields << " -> " << r.err().message;
  }
  const std::pair<std::string, int> chat_ok[] = {
      {"", -1}, {R"("logprobs":false)", -1}, {R"("logprobs":null,"top_logprobs":null)", -1},
      {R"("logprobs":true)", 0}, {R"("logprobs":true,"top_logprobs":null)", 0},
      {R"("logprobs":true,"top_logprobs":0)", 0}, {R"("logprobs":true,"top_logprobs":5)", 5},
      {R"("logprobs":true,"top_logprobs":20)", 20}, {R"("top_logprobs":0)", -1},
      {R"("logprobs":false,"top_logprobs":0)", -1}, {R"("logprobs":0)", -1}, {R"("logprobs":1,"top_logprobs":2)", 2},
  };
  for (const auto& [fields, want] : chat_ok) {
    auto r = chat(fields);
    ASSERT_TRUE(r.ok()) << fields << " -> " << r.err().message;
    EXPECT_EQ(r->gen.logprobs, want) << fields;
  }
  const std::pair<std::string, std::string> chat_bad[] = {
      {R"("top_logprobs":3)", "'top_logprobs' needs 'logprobs': true"},
      {R"("logprobs":false,"top_logprobs":1)", "'top_logprobs' needs 'logprobs': true"},
      {R"("logprobs":true,"top_logprobs":21)", "'top_logprobs' must be between 0 and 20"},
      {R"("logprobs":true,"top_logprobs":-1)", "'top_logprobs' must be between 0 and 20"},
      {R"("logprobs":true,"top_logprobs":2.5)", "'top_logprobs' must be an integer"},
      {R"("logprobs":5)", "'logprobs' must be true or false"},
      {R"("logprobs":"true")", "'logprobs' must be true or false"},
  };
  for (const auto& [fields, needle] : chat_bad) {
    auto r = chat(fields);
    ASSERT_FALSE(r.ok()) << fields << " was accepted";
    EXPECT_EQ(r.err().code, errc::invalid_request);
    EXPECT_NE(r.err().message.find(needle), std::string::npos) << fields << " -> " << r.err().message;
  }
}

TEST(OpenaiApi, ChatContentTextPartsAreJoinedWithNewlinesAsVllmDoes) {
  request_limits lim;
  auto r = parse_chat_request(
      R"({"model":"m","messages":[{"role":"system","content":"Be brief."},
          {"role":"user","content":[{"type":"text","text":"Hello"},{"type":"text","text":"world"}]},
          {"role":"assistant","content":null},
          {"role":"user","content":[]}]})",
      lim);
  ASSERT_TRUE(r.ok()) << r.err().message;
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[0]["content"], "Be brief.");
  EXPECT_EQ(r->messages[1]["content"], "Hello\nworld");  // a plain string for the chat template
  EXPECT_EQ(r->messages[1]["role"], "user");
  EXPECT_TRUE(r->messages[2]["content"].is_null());
  EXPECT_EQ(r->messages[3]["content"], "");
}

TEST(OpenaiApi, ChatContentRefusesNonTextPartsNamingTheirType) {
  request_limits lim;
  const std::pair<const char*, const char*> cases[] = {
      {R"([{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}])",
       "'image_url'"},
      {R"([{"type":"input_audio","input_audio":{"data":"","format":"wav"}}])", "'input_audio'"},
      {R"([{"type":"text"}])", "'text'"},
      {R"([{"type":"text","text":5}])", "'text'"},
      {R"([{"text":"x"}])", "'type'"},
      {R"(["x"])", "content part"},
      {R"(5)", "'content'"},
      {R"({"type":"text","text":"x"})", "'content'"},
  };
  for (const auto& [content, needle] : cases) {
    const std::string body = std::string(R"({"model":"m","messages":[{"role":"user","content":)") + content + "}]}";
    auto r = parse_chat_request(body, lim);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.err().code, errc::invalid_request);
    EXPECT_NE(r.err().message.find(needle), std::string::npos) << body << " -> " << r.err().message;
  }
}

TEST(OpenaiApi, ApplySamplingChecksRangesAndTheMaxTokensLimit) {
  request_limits lim;
  lim.max_tokens = 64;
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  auto refused = [&](const std::function<void(sampling_input&)>& set, const char* needle) {
    sampling_input in;
    set(in);
    generation_fields g;
    auto s = apply_sampling(in, lim, g);
    if (s.ok()) return ::testing::AssertionFailure() << "accepted, wanted an error naming " << needle;
    if (s.err().code != errc::invalid_request || s.err().message.find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << s.err().message;
    }
    return ::testing::AssertionSuccess();
  };
  EXPECT_TRUE(refused([&](sampling_input& in) { in.temperature = nan; }, "'temperature'"));
  EXPECT_TRUE(refused([&](sampling_input& in) { in.temperature = -0.1; }, "'temperature'"));
  EXPECT_TRUE(refused([&](sampling_input& in) { in.temperature = 2.5; }, "'temperature'"));
  EXPECT_TRUE(refused([&](sampling_input& in) { in.temperature = inf; }, "'temperature'"));
  EXPECT_TRUE(refused([&](sampling_input& in) { in.top_p = nan; }, "'top_p'"));
  EXPECT_TRUE(refused([&](sampling_input& in) { in.top_p = 1.5; }, "'top_p'"));
  EXPECT_TRUE(refused([&](sampling_input& in) { in.top_p = -1; }, "'top_p'"));
  EXPECT_TRUE(refused([&](sampling_input& in) { in.top_k = -2; }, "'top_k'"));
  EXPECT_TRUE(refused([&](sampling_input& in) { in.top_k = int64_t{1} << 40; }, "'top_k'"));
  EXPECT_TRUE(refused([&](sampling_input& in) { in.max_tokens = 65; }, "between 1 and 64"));
  EXPECT_TRUE(refused([&](sampling_input& in) { in.max_tokens = 0; }, "'max_tokens'"));
  EXPECT_TRUE(refused(
      [&](sampling_input& in) {
        in.max_tokens = 0;
        in.max_tokens_name = "max_completion_tokens";
      },
      "'max_completion_tokens'"));

  generation_fields g;
  sampling_input edges;
  edges.max_tokens = 64;
  edges.temperature = 2.0;
  edges.top_p = 0.0;
  edges.top_k = -1;
  ASSERT_TRUE(apply_sampling(edges, lim, g).ok());
  EXPECT_EQ(g.max_tokens, 64u);
  EXPECT_TRUE(g.max_tokens_given);
  EXPECT_EQ(g.temperature, 2.0f);
  EXPECT_EQ(g.top_p, 0.0f);
  EXPECT_EQ(g.top_k, 0);  // -1: off, as 0
  generation_fields defaults;
  ASSERT_TRUE(apply_sampling({}, lim, defaults).ok());  // nothing sent: the defaults stay
  EXPECT_EQ(defaults.max_tokens, generation_fields{}.max_tokens);
  EXPECT_FALSE(defaults.max_tokens_given);
  EXPECT_EQ(defaults.temperature, 1.0f);

  // The HTTP parser goes through the same checks (and the same limit).
  auto r = parse_completion_request(R"({"model":"m","prompt":"x","max_tokens":65})", lim);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("between 1 and 64"), std::string::npos) << r.err().message;
  auto c = parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":65})", lim);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.err().message.find("'max_completion_tokens' must be between 1 and 64"), std::string::npos)
      << c.err().message;
}

TEST(OpenaiApi, MutatedBodiesNeverThrow) {
  // Every field family: the basics; n, batched prompts, echo with logprobs and best_of; the
  // penalties, logit_bias and min_p; chat's logprobs.
  const std::string seed_bodies[] = {
      R"({"model":"m","prompt":[1,2,3],"max_tokens":5,"stop":["a"],"stream":true,"messages":[{"role":"user","content":"x"}]})",
      R"({"model":"m","prompt":[[1,2],[3]],"n":2,"best_of":3,"echo":true,"logprobs":2,"max_tokens":4,"seed":7})",
      R"({"model":"m","prompt":["a","bc"],"presence_penalty":0.5,"frequency_penalty":-1,"repetition_penalty":1.2,)"
      R"("min_tokens":2,"logit_bias":{"5":-100,"07":2.5},"min_p":0.1,"stream_options":{"include_usage":true}})",
      R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"logprobs":true,)"
      R"("top_logprobs":3,"n":2,"max_completion_tokens":8,"stop_token_ids":[1,2]})",
      // Tools, a forced call and the conversation's calls; structured outputs.
      R"({"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",)"
      R"("function":{"name":"f","arguments":"{\"a\":[1,2]}"}}]},{"role":"tool","tool_call_id":"c","content":"1"}],)"
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":)"
      R"({"type":"array","items":{"type":"integer"}}}}}}],"tool_choice":{"type":"function","function":{"name":"f"}}})",
      R"({"model":"m","prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"n","schema":)"
      R"({"type":"object","properties":{"b":{"type":"boolean"}},"required":["b"]}}},"guided_regex":null})",
      // /tokenize (a prompt; messages with tools) and /detokenize.
      R"({"model":"m","prompt":"In the beginning","add_special_tokens":false,"return_token_strs":true})",
      R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false,"tools":[{"type":"function","function":{"name":"f"}}]})",
      R"({"model":"m","tokens":[1,2,3,2147483647]})",
  };
  request_limits lim;
  for (size_t k : {0, 1, 2, 5}) EXPECT_TRUE(parse_completion_request(seed_bodies[k], lim).ok()) << seed_bodies[k];
  for (size_t k : {3, 4}) EXPECT_TRUE(parse_chat_request(seed_bodies[k], lim).ok()) << seed_bodies[k];  // the mutations start from valid bodies
  for (size_t k : {6, 7}) EXPECT_TRUE(parse_tokenize_request(seed_bodies[k], lim).ok()) << seed_bodies[k];
  EXPECT_TRUE(parse_detokenize_request(seed_bodies[8]).ok());
  std::mt19937 rng(11);
  for (int i = 0; i < 24000; ++i) {
    const std::string body = testing::mutate_json(seed_bodies[static_cast<size_t>(i) % std::size(seed_bodies)], rng);
    auto a = parse_completion_request(body, lim);
    auto b = parse_chat_request(body, lim);
    auto t = parse_tokenize_request(body, lim);
    auto d = parse_detokenize_request(body);
    if (!a.ok()) {
      EXPECT_EQ(a.err().code, errc::invalid_request);
    }
    if (!b.ok()) {
      EXPECT_EQ(b.err().code, errc::invalid_request);
    }
    if (!t.ok()) {
      EXPECT_EQ(t.err().code, errc::invalid_request);
    }
    if (!d.ok()) {
      EXPECT_EQ(d.err().code, errc::invalid_request);
    }
  }
  // Deep nesting is refused or parsed, never a stack overflow.
  std::string deep(100000, '[');
  EXPECT_FALSE(parse_completion_request(deep, lim).ok());
  // Valid but deep JSON is refused by its depth, naming the limit.
  const std::string nested = R"({"model":"m","prompt":"x","stop":)" + std::string(40, '[') + std::string(40, ']') + "}";
  auto r = parse_completion_request(nested, lim);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("nests deeper"), std::string::npos) << r.err().message;
}

}  // namespace
}  // namespace llmesh::gateway
