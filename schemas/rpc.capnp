# The native client API (DESIGN.md §1, client plane): Cap'n Proto RPC over TCP, served by the
# gateway next to its HTTP API (`llmesh serve --rpc HOST:PORT`, default 127.0.0.1:8081). A
# generation streams its tokens to a sink the client passes in, then returns the summary.
# Evolution rules as for mesh.capnp (schemas/README.md): append only.
@0x85e61152eaeda7bd;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("llmesh::rpc");

interface Llmesh {
  # Runs one generation. Tokens go to `sink` as they are produced (in order, flow-controlled);
  # the call returns when the generation ends. Cancelling the call (or dropping the
  # connection) cancels the generation in the mesh.
  generate @0 (request :GenerateRequest, sink :TokenSink) -> (result :GenerateResult);

  # The served model's name (what GenerateRequest.model must be); the first one when the
  # gateway serves several.
  model @1 () -> (name :Text);

  # Every served model's name, in the gateway's order (as GET /v1/models lists them).
  models @2 () -> (names :List(Text));

  # Embeds inputs as POST /v1/embeddings does (the same checks, the model's pooling, a window
  # of inputs in flight and as many concurrency slots); returns every vector, in input order.
  # Cancelling the call cancels the inputs still running.
  embed @3 (request :EmbedRequest) -> (result :EmbedResult);
}

struct EmbedRequest {
  apiKey @0 :Text;
  model @1 :Text;                   # empty: the one served model
  texts @2 :List(Text);             # the inputs as text, or
  ids @3 :List(List(Int32));        # as token ids (one of the two; 1..2048 inputs, none empty)
  dimensions @4 :UInt32;            # keep the first k values (0: all), then normalize
  normalize @5 :Normalize;
  truncatePromptTokens @6 :Int64;   # as GenerateRequest's
  addSpecialTokens @7 :Bool = true; # text inputs are tokenized with the tokenizer's special tokens
  priority @8 :Int32;               # as GenerateRequest's
  enum Normalize {
    modelDefault @0;                # the model's (sentence-transformers' Normalize module; else yes)
    yes @1;
    no @2;
  }
}

struct EmbedResult {
  ok @0 :Bool;
  errorCode @1 :UInt16;             # when not ok: the HTTP status the same error has
  errorMessage @2 :Text;
  embeddings @3 :List(List(Float32));
  promptTokens @4 :UInt32;
}

struct GenerateRequest {
  apiKey @0 :Text;              # required when the server has an API key
  model @1 :Text;
  prompt :union {
    text @2 :Text;              # tokenized with the model's tokenizer (BOS added as /v1/completions does)
    ids @3 :List(Int32);
  }
  maxTokens @4 :UInt32;         # 0: until EOS or the context, at most the server's max-tokens limit (above it: 400)
  temperature @5 :Float32;      # 0: greedy
  topP @6 :Float32 = 1.0;
  topK @7 :Int32;
  seed @8 :UInt64;
  hasSeed @9 :Bool;             # false: the server picks one
  ignoreEos @10 :Bool;
  # The HTTP API's other generation fields, checked by the same rules (errors name them as
  # /v1/completions spells them: 'presence_penalty', 'guided_regex', ...).
  presencePenalty @11 :Float32;     # -2..2
  frequencyPenalty @12 :Float32;    # -2..2
  repetitionPenalty @13 :Float32 = 1.0;  # > 0, at most 10
  minTokens @14 :UInt32;            # no end id before this many tokens; at most maxTokens
  minP @15 :Float32;                # 0..1
  stopTokenIds @16 :List(Int32);    # generation also ends after any of these
  logitBias @17 :List(TokenBias);   # OpenAI's logit_bias
  constraint @18 :OutputConstraint; # structured output: every token drawn under its grammar
  stop @19 :List(Text);             # stop strings (at most 4, 1..256 bytes): the text ends before
                                    # the first one, finishReason "stop"; held-back text streams late
  allowedTokenIds @20 :List(Int32); # vLLM's allowed_token_ids: non-empty, only these may be drawn
                                    # (not with a constraint)
  badWords @21 :List(Text);         # vLLM's bad_words (at most 128, 1..256 bytes each): never generated
  logprobs @22 :Int32 = -1;         # -1: none. 0..20: each drawn token's log-probability and rank, with
                                    # this many most likely alternatives (OpenAI's logprobs), streamed
                                    # with the token and in the result
  promptLogprobs @23 :Int32 = -1;   # -1: none. 0..20: vLLM's prompt_logprobs: every prompt token after
                                    # the first scored, with this many alternatives, in the result
  includeStopStr @24 :Bool;         # vLLM's include_stop_str_in_output: the stop string (or stop
                                    # token's text) that ended the output stays at its end
  skipSpecialTokens @25 :Bool = true;  # vLLM's skip_special_tokens: false keeps special tokens'
                                    # text (the end token that stopped it is left out all the same)
  truncatePromptTokens @26 :Int64;  # vLLM's truncate_prompt_tokens: 0 none; k >= 1 keeps the
                                    # prompt's last k tokens; -1 the model's context's worth
  addSpecialTokens @27 :Bool = true;   # a text prompt is tokenized with BOS (add_special_tokens)
  n @28 :UInt32 = 1;                # OpenAI's n: this many generations of the prompt (1..64), choice
                                    # j seeded from the request's seed as over HTTP (choice 0: the seed)
  useBeamSearch @29 :Bool;          # vLLM's use_beam_search: the n best beams (n at most 10) as the
                                    # choices, best first; their tokens reach the sink when the search ends
  lengthPenalty @30 :Float32 = 1.0; # vLLM's length_penalty: a beam scores cum_logprob / len^this
  priority @31 :Int32;              # vLLM's priority (lower first); non-zero needs the server's
                                    # --scheduling-policy priority (else a 400, as over HTTP)
  cacheSalt @32 :Text;              # vLLM's cache_salt (empty: none): prefix-cache hits only among
                                    # requests of the same salt
  promptCacheKey @33 :Text;         # OpenAI's prompt_cache_key (empty: none): the router sends a
                                    # key's requests where its last one went (unless much busier)
  traceparent @34 :Text;            # W3C Trace Context (empty: none): with the server's
  tracestate @35 :Text;             # --otlp-traces-endpoint, the call's span is a child of it
}

struct TokenLogprob {
  id @0 :Int32;
  logprob @1 :Float32;              # natural log; -inf for a token the request's constraints masked
  rank @2 :Int32;                   # among the row's tokens, 1 the most likely (ties take the worse
                                    # rank, as vLLM's); 0 where unknown
  bytes @3 :Data;                   # the token's bytes (may be part of a UTF-8 character)
  top @4 :List(TokenLogprob);       # the most likely tokens, best first (equal ones: the lower id
                                    # first), each with its rank; their own `top` is empty
}

struct TokenBias {
  id @0 :Int32;
  bias @1 :Float32;                 # -100..100
}

struct OutputConstraint {
  kind @0 :Kind;
  text @1 :Text;                    # jsonSchema: the schema; regex; choice: a JSON array of strings; grammar: GBNF
  enum Kind {
    none @0;
    jsonSchema @1;                  # as guided_json
    jsonObject @2;                  # any JSON object (text unused)
    regex @3;                       # as guided_regex
    choice @4;                      # as guided_choice
    grammar @5;                     # as guided_grammar
  }
}

interface TokenSink {
  # New tokens and the text they complete (whole UTF-8 characters only).
  # With the request's logprobs, `logprobs` holds one entry per id.
  # With the request's n > 1, `choice` names the generation (0..n-1); each choice's tokens come
  # in its own order, the choices' interleaved as they are produced.
  tokens @0 (ids :List(Int32), text :Text, logprobs :List(TokenLogprob), choice :UInt32) -> stream;
}

struct GenerateResult {
  ok @0 :Bool;
  errorCode @1 :UInt16;         # when not ok: the HTTP status the same error has (400, 401, 404, 429, 503, ...)
  errorMessage @2 :Text;
  finishReason @3 :Text;        # "length" or "stop" (an EOS token)
  promptTokens @4 :UInt32;
  completionTokens @5 :UInt32;
  text @6 :Text;                # the whole completion
  tokenIds @7 :List(Int32);
  logprobs @8 :List(TokenLogprob);       # with the request's logprobs: one per tokenIds entry
  promptLogprobs @9 :List(TokenLogprob); # with its promptLogprobs: entry i for prompt token i + 1
  choices @10 :List(Choice);    # every choice, in index order (the fields above are choice 0's;
                                # promptTokens counts the prompt once)
  cachedPromptTokens @11 :UInt32;  # of promptTokens, those the replica's prefix cache held (choice 0's;
                                   # OpenAI's usage.prompt_tokens_details.cached_tokens)
}

struct Choice {
  finishReason @0 :Text;
  completionTokens @1 :UInt32;
  text @2 :Text;
  tokenIds @3 :List(Int32);
  logprobs @4 :List(TokenLogprob);
}
