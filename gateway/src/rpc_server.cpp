// The native client API over Cap'n Proto RPC (rpc_server.hpp).
#include "llmesh/gateway/rpc_server.hpp"

#include "llmesh/gateway/completion_stream.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <kj/async-io.h>
#include <kj/async.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <future>
#include <thread>
#include <unordered_map>

#include "llmesh/gateway/completion_stream.hpp"
#include "llmesh/gateway/otlp_exporter.hpp"
#include "llmesh/gateway/stop_matcher.hpp"
#include "llmesh/gateway/tracing.hpp"
#include "llmesh/actors/serving_metrics.hpp"
#include "llmesh/schemas/rpc.capnp.h"
#include "rpc_fields.hpp"
#include "rpc_listener.hpp"

namespace llmesh::gateway {
namespace {

/// One choice of a call (its request's n): its generation in the mesh and what it produced.
struct choice_state {
  uint64_t id = 0;  ///< its generation's id in the mesh
  model::stream_decoder decoder;
  std::vector<int32_t> ids;
  std::string text;
  std::vector<kernels::token_logprobs> logprobs;  ///< one per id, when the request asked
  std::optional<stop_matcher> stops;              ///< the request's stop strings, if any
  actors::finish_reason finish = actors::finish_reason::none;
  bool ended = false;      ///< its last token came, or a stop string ended it
  bool mesh_done = false;  ///< the mesh sent its last message, or it was cancelled there
  bool absent = false;     ///< a beam search found fewer beams than choices: not in the result
  /// When its call began and its last token came (the serving metrics, as completion_stream's).
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now(), last = start;
  actors::replica_times times;  ///< its time on the replica, as its messages said

  choice_state(uint64_t i, const model::detokenizer& d, bool skip) : id(i), decoder(d, skip) {}
};

/// One generate call (n choices), owned by its RPC call's promise: destroyed on the loop thread
/// when the call ends or is cancelled (then its generations still running are cancelled in the
/// mesh).
struct call_state {
  rpc_server::impl* owner = nullptr;
  std::shared_ptr<void> slot;  ///< the api_service concurrency slots (one per choice)
  size_t prompt_tokens = 0;
  size_t cached_prompt_tokens = 0;  ///< choice 0's first token's word (the prefix-cache hit)
  rpc::TokenSink::Client sink;
  kj::Own<kj::PromiseFulfiller<void>> done;
  kj::Promise<void> chain = kj::READY_NOW;  ///< the streaming calls to the sink, in order
  std::shared_ptr<const model::tokenizer> tok;  ///< the served model's: token bytes for logprobs
  std::string response_id;  ///< the id the API gave the call (its request log line's)
  std::vector<int32_t> scored_prompt;                    ///< the prompt, when it asked for prompt logprobs
  std::vector<kernels::token_logprobs> prompt_logprobs;  ///< prompt token i + 1's at i (choice 0's)
  std::vector<int32_t> stop_ids;      ///< its stop_token_ids: their text is left out, as over HTTP
  bool include_stop_str = false;      ///< include_stop_str_in_output: ... unless this
  bool skip_special = true;           ///< skip_special_tokens (false: an end token's text is left out all the same)
  size_t min_tokens = 0;              ///< no stop string ends it before this many tokens
  std::vector<choice_state> choices;  ///< in index order; not resized once the call runs
  /// A beam search's call: the group that runs it (its steps go to the mesh as they come; the
  /// finished beams are replayed into `choices`), and every step request's id.
  std::unique_ptr<completion_group> beams;
  std::vector<uint64_t> step_ids;
  bool want_logprobs = false;  ///< the request's logprobs >= 0 (a beam's entries are shown then)
  size_t ended = 0;                   ///< choices ended
  bool finished = false;              ///< the RPC call's outcome is decided
  std::optional<error> failure;
  /// With a tracer: the call's span so far (recorded, and reset, once the call is decided or
  /// dropped).
  std::unique_ptr<request_trace> trace;

  call_state(rpc_server::impl* o, rpc::TokenSink::Client s) : owner(o), sink(kj::mv(s)) {}
  ~call_state();
};

/// One embed call, owned by its RPC call's promise as call_state is: its job's output runs the
/// inputs (a window in the mesh at a time); destroyed on the loop thread, cancelling those still
/// running.
struct embed_call {
  rpc_server::impl* owner = nullptr;
  generation_job job;
  kj::Own<kj::PromiseFulfiller<void>> done;
  bool finished = false;
  embed_call(rpc_server::impl* o, generation_job j) : owner(o), job(std::move(j)) {}
  ~embed_call();
};

}  // namespace

struct rpc_server::impl {
  api_service& api;
  rpc_options opt;
  std::thread loop;
  uint16_t port = 0;
  // Set and used on the loop thread only (the executor reference is safe from any thread).
  kj::Own<const kj::Executor> executor;
  kj::Own<kj::PromiseFulfiller<void>> stop;
  /// Each running generation's call and choice index (beam_step: a step of the call's search).
  std::unordered_map<uint64_t, std::pair<call_state*, size_t>> calls;
  /// Each running embedding input's call.
  std::unordered_map<uint64_t, embed_call*> embeds;
  static constexpr size_t beam_step = static_cast<size_t>(-1);
  /// Runs native_generate (the checks, tokenizing, a structured-output compile) off the loop,
  /// which streams every other call's tokens. Joined before the loop stops.
  boost::asio::thread_pool workers{2};
  span_ids trace_ids;  ///< the loop thread's

  impl(api_service& a, rpc_options o) : api(a), opt(std::move(o)) {}

  /// The call's span, to the tracer, once (the call was decided, or dropped by its client).
  void record_span(call_state* st) {
    if (!st->trace || !opt.tracer) return;
    request_facts& f = st->trace->facts;
    f.id = st->response_id;
    f.n = static_cast<int64_t>(st->choices.size());
    f.prompt_tokens = static_cast<int64_t>(st->prompt_tokens);
    int64_t generated = 0;
    actors::replica_times rt;
    for (const auto& c : st->choices) {
      generated += static_cast<int64_t>(c.ids.size());
      rt.keep_slower(c.times);
    }
    f.completion_tokens = generated;
    f.sequences = f.n;
    if (st->failure) f.error = st->failure->message;
    f.cancelled = !st->finished;  // recorded from the destructor: its client dropped it
    opt.tracer->record(st->trace->finish(rt, trace_ids));
    st->trace.reset();  // once
  }

  /// A token of generation `id` (on the loop thread): decoded, streamed to the client's sink
  /// with its choice's index; the last one of the last choice completes the call once every
  /// streaming call before it was delivered. A failed choice fails the call.
  /// Submits `req`: its messages reach on_token on the loop thread.
  void submit(actors::replica_request req) {
    // Tokens arrive on actor threads: each is handed to the loop (a blocking hand-over of
    // microseconds; after the server stopped, the executor refuses and the token is dropped).
    auto exec = std::shared_ptr<kj::Own<const kj::Executor>>(new kj::Own<const kj::Executor>(executor->addRef()));
    const uint64_t id = req.id;
    api.mesh().submit(std::move(req), [exec, owner = this, id](const actors::token_msg& t) {
      try {
        (*exec)->executeSync([&] { owner->on_token(id, t); });
      } catch (const kj::Exception&) {
      }
    });
  }

  /// The beam search's next step requests, each registered as a step of `st`, submitted.
  void submit_steps(call_state* st) {
    for (auto& req : st->beams->take_submissions()) {
      calls[req.id] = {st, beam_step};
      st->step_ids.push_back(req.id);
      submit(std::move(req));
    }
  }

  /// A step message of `st`'s search: on to the search; a finished search's beams become the
  /// choices' tokens (as completion_group replays them for HTTP), a failed one fails the call.
  void on_step(call_state* st, uint64_t id, const actors::token_msg& t) {
    if (st->finished) return;
    // The search's first step token is its first token, as the HTTP span counts it.
    if (st->trace && !t.failed && t.token >= 0) st->trace->saw_token();
    if (t.failed || t.finish != actors::finish_reason::none) calls.erase(id);
    (void)st->beams->on_message(t);  // (the group's own rendering of the beams is not used)
    const beam_search& b = st->beams->search(0);
    if (b.failure()) {
      fail_call(st, *b.failure());
      return;
    }
    if (!b.done()) {
      submit_steps(st);
      return;
    }
    replay_beams(st);
  }

  /// A finished search's beams, best first, as choices' tokens; choices past the beams found
  /// are absent.
  void replay_beams(call_state* st) {
    const beam_search& b = st->beams->search(0);
    const auto& beams = b.results();
    if (beams.empty()) {
      fail_call(st, make_error(errc::internal, "the beam search found no output"));
      return;
    }
    for (size_t r = 0; r < st->choices.size() && !st->finished; ++r) {
      choice_state& c = st->choices[r];
      if (r >= beams.size()) {
        c.absent = c.ended = true;
        ++st->ended;
        continue;
      }
      for (size_t i = 0; i < beams[r].tokens.size() && !c.ended; ++i) {
        actors::token_msg m = b.replayed(r, i, c.id);
        if (!st->want_logprobs) m.logprobs.reset();  // shown only when asked (HTTP's streams decide alike)
        on_token(c.id, m);
      }
    }
    if (!st->finished && st->ended == st->choices.size()) finish_call(st);  // the last choices were absent
  }

  /// A generated token of a choice, in the serving metrics as an HTTP choice's
  /// (completion_stream::observe_token): time to the first, between the others, and the count.
  void observe_token(choice_state& c) {
    const auto now = std::chrono::steady_clock::now();
    const bool first = c.ids.size() == 1;
    api.metrics().get_histogram(first ? actors::metric::ttft : actors::metric::itl)
        ->observe(std::chrono::duration<double>(now - (first ? c.start : c.last)).count());
    api.metrics().get_counter(actors::metric::generation_tokens)->add();
    c.last = now;
  }

  /// The embed call's next inputs, each registered, submitted.
  void submit_inputs(embed_call* c) {
    for (auto& req : c->job.output->take_submissions()) {
      embeds[req.id] = c;
      submit(std::move(req));
    }
  }

  /// An input's message: on to the call's output; the call completes once every vector is in
  /// (or one input failed: the others are cancelled).
  void on_embedding(embed_call* c, uint64_t id, const actors::token_msg& t) {
    if (c->finished) return;
    if (t.failed || t.finish != actors::finish_reason::none) embeds.erase(id);
    auto& out = *c->job.output;
    (void)out.on_message(t);
    for (uint64_t x : out.take_cancellations()) {
      api.mesh().cancel(x);
      embeds.erase(x);
    }
    submit_inputs(c);
    if (out.done()) {
      c->finished = true;
      c->done->fulfill();
    }
  }

  void on_token(uint64_t id, const actors::token_msg& t) {
    if (auto e = embeds.find(id); e != embeds.end()) {
      on_embedding(e->second, id, t);
      return;
    }
    auto it = calls.find(id);
    if (it == calls.end()) return;  // cancelled meanwhile
    auto [st, k] = it->second;
    if (k == beam_step) {
      on_step(st, id, t);
      return;
    }
    choice_state& c = st->choices[k];
    if (st->finished || c.ended) return;
    bool stopped = false;  // by a stop string
    if (t.failed) {
      st->failure = t.err;
      c.mesh_done = true;
    } else {
      c.ids.push_back(t.token);
      c.times.update(t.times);
      if (st->trace) st->trace->saw_token();
      if (!st->beams) {  // (a beam call's group counts its own choices)
        observe_token(c);
        actors::metric::observe_replica_times(api.metrics(), t.times, c.ids.size() == 1);
      }
      if (t.logprobs) c.logprobs.push_back(*t.logprobs);
      if (k == 0 && !t.prompt_logprobs.empty()) st->prompt_logprobs = t.prompt_logprobs;
      if (k == 0 && c.ids.size() == 1 && t.cached_tokens >= 0) {
        st->cached_prompt_tokens = std::min(static_cast<size_t>(t.cached_tokens), st->prompt_tokens);
        // As completion_stream counts an HTTP choice's (a beam call's group counted it already).
        if (!st->beams) {
          api.metrics().get_counter(actors::metric::prompt_tokens_cached)->add(static_cast<double>(st->cached_prompt_tokens));
        }
      }
      // As completion_stream does: a stop token id's text is left out; text that may begin a
      // stop string is held back; a stop string ends the text before itself.
      const bool past_min = c.ids.size() > st->min_tokens;
      auto pass = [&](std::string s) {
        if (!c.stops) return s;
        auto out = c.stops->push(s, past_min);
        stopped = stopped || out.stopped;
        return std::move(out.text);
      };
      const bool stop_token = ending_token_unshown(t, st->stop_ids, st->skip_special, st->tok->decoder());
      std::string piece = stop_token && !st->include_stop_str ? std::string() : pass(c.decoder.push(t.token));
      if (!stopped && t.finish != actors::finish_reason::none) {
        piece += pass(c.decoder.flush());
        if (!stopped && c.stops) piece += c.stops->flush();
      }
      if (t.finish != actors::finish_reason::none) c.mesh_done = true;
      if (stopped && !c.mesh_done) {
        api.mesh().cancel(c.id);  // at once, as HTTP does: not after the sink has taken the backlog
        c.mesh_done = true;
      }
      c.text += piece;
      auto req = st->sink.tokensRequest();
      req.initIds(1).set(0, t.token);
      req.setText(piece);
      req.setChoice(static_cast<uint32_t>(k));
      if (t.logprobs) set_logprob(req.initLogprobs(1)[0], t.token, *t.logprobs, st->tok->decoder());
      st->chain = st->chain.then([r = kj::mv(req)]() mutable { return r.send(); });
      c.finish = stopped ? actors::finish_reason::eos : t.finish;
      if (stopped || t.finish != actors::finish_reason::none) {
        c.ended = true;
        ++st->ended;
        if (!st->beams) {
          api.metrics().get_histogram(actors::metric::e2e)
              ->observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - c.start).count());
          actors::metric::observe_finished(api.metrics(), c.finish == actors::finish_reason::eos ? "stop" : "length",  // the reply's
                                           st->prompt_tokens, c.ids.size());
        }
      }
    }
    if (t.failed || st->ended == st->choices.size()) {
      finish_call(st);
    } else {
      st->chain = st->chain.eagerlyEvaluate([st](kj::Exception&& e) {
        if (!st->finished) st->done->reject(kj::mv(e));  // the client's sink failed: the call ends
        st->finished = true;
      });
    }
  }

  void fail_call(call_state* st, error e) {
    actors::token_msg f;
    f.failed = true;
    f.err = std::move(e);
    on_token(st->choices.front().id, f);
  }

  /// The call's outcome is decided (every choice ended, or a failure): what still runs in the
  /// mesh is not wanted; the result goes once the sink has taken every token sent before.
  void finish_call(call_state* st) {
    st->finished = true;
    record_span(st);
    for (auto& other : st->choices) {
      if (!other.mesh_done) {
        api.mesh().cancel(other.id);
        other.mesh_done = true;
      }
    }
    if (st->beams) {
      for (uint64_t step : st->beams->running_searches()) api.mesh().cancel(step);
    }
    st->chain = st->chain.then([st] { st->done->fulfill(); }, [st](kj::Exception&& e) { st->done->reject(kj::mv(e)); })
                    .eagerlyEvaluate(nullptr);
  }
};

namespace {

call_state::~call_state() {
  owner->record_span(this);  // a call its client dropped (a decided one's is recorded already)
  for (const auto& c : choices) {
    if (!c.mesh_done) owner->api.mesh().cancel(c.id);
    owner->calls.erase(c.id);
  }
  if (beams) {
    for (uint64_t step : beams->running_searches()) owner->api.mesh().cancel(step);
  }
  for (uint64_t step : step_ids) owner->calls.erase(step);
}

embed_call::~embed_call() {
  for (uint64_t id : job.output->running_searches()) {  // the inputs still in the mesh
    owner->api.mesh().cancel(id);
    owner->embeds.erase(id);
  }
}

uint16_t status_of(const error& e) { return static_cast<uint16_t>(http_error_of(e.code).status); }

/// A call's result as failed with `e` (GenerateResult's and EmbedResult's ok, errorCode, errorMessage).
template <class Builder>
void set_failure(Builder r, const error& e) {
  r.setOk(false);
  r.setErrorCode(status_of(e));
  r.setErrorMessage(e.message);
}

class llmesh_service final : public rpc::Llmesh::Server {
 public:
  explicit llmesh_service(rpc_server::impl* p) : p_(p) {}

  kj::Promise<void> model(ModelContext ctx) override {
    const auto names = p_->api.model_names();
    ctx.getResults().setName(names.empty() ? std::string() : names.front());
    return kj::READY_NOW;
  }

  kj::Promise<void> models(ModelsContext ctx) override {
    const auto names = p_->api.model_names();
    auto out = ctx.getResults().initNames(static_cast<unsigned>(names.size()));
    for (unsigned i = 0; i < names.size(); ++i) out.set(i, names[i]);
    return kj::READY_NOW;
  }

  kj::Promise<void> generate(GenerateContext ctx) override {
    // Cap'n Proto 0.9 runs a call to completion unless the server opts in: a client that drops
    // its call must stop its generation.
    ctx.allowCancellation();
    auto in = ctx.getParams().getRequest();
    // Everything the checks need, copied out of the message: they run on a worker.
    auto work = std::make_shared<pending>();
    // The sampling fields go through the HTTP API's checks (apply_sampling, in native_generate).
    if (in.getMaxTokens() > 0) work->sampling.max_tokens = in.getMaxTokens();  // 0: not given
    work->sampling.temperature = in.getTemperature();
    work->sampling.top_p = in.getTopP();
    work->sampling.top_k = in.getTopK();
    if (in.getHasSeed()) work->g.seed = in.getSeed();
    work->g.n = in.getN();  // native_generate checks it
    work->g.ignore_eos = in.getIgnoreEos();
    work->g.logprobs = std::clamp(in.getLogprobs(), -1, kernels::max_logprobs);  // extra_fields refuses beyond
    work->g.prompt_logprobs_shown = std::clamp(in.getPromptLogprobs(), -1, kernels::max_logprobs);
    work->extra = extra_fields(in, p_->api.max_logprobs());  // its error, if any, comes after the API key's
    auto prompt = in.getPrompt();
    if (prompt.isText()) {
      work->text = std::string(prompt.getText().cStr(), prompt.getText().size());
    } else {
      for (auto id : prompt.getIds()) work->ids.push_back(id);
    }
    work->add_special_tokens = in.getAddSpecialTokens();
    work->key.assign(in.getApiKey().cStr(), in.getApiKey().size());
    work->model.assign(in.getModel().cStr(), in.getModel().size());
    // The call goes on here, on the loop, once the worker is done. A call dropped meanwhile
    // drops the promise; the worker's result (and its concurrency slot) goes with `work`.
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    auto done = std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<void>>>(kj::mv(paf.fulfiller));
    api_service* api = &p_->api;
    boost::asio::post(p_->workers, [api, work, done] {
      work->job.emplace(api->native_generate(work->key, work->model, work->text, std::move(work->ids), work->sampling,
                                             std::move(work->g), work->extra, work->add_special_tokens));
      (*done)->fulfill();
    });
    return paf.promise.then([this, ctx, work]() mutable { return start(ctx, *work->job, *work); });
  }

  kj::Promise<void> embed(EmbedContext ctx) override {
    ctx.allowCancellation();  // a dropped call cancels its inputs (embed_call's destructor)
    auto in = ctx.getParams().getRequest();
    auto work = std::make_shared<embed_pending>();
    // Copied out of the message for the worker, bounded first (the count is checked again there).
    const size_t n = in.hasTexts() ? in.getTexts().size() : in.getIds().size();
    if (n > max_embedding_inputs) {
      work->job.emplace(make_error(errc::invalid_request, "an embed call takes at most " + std::to_string(max_embedding_inputs) +
                                                              " inputs, not " + std::to_string(n)));
      return start_embed(ctx, *work->job);
    }
    if (in.hasTexts() && in.hasIds() && in.getIds().size() > 0 && in.getTexts().size() > 0) {
      work->job.emplace(make_error(errc::invalid_request, "an embed call takes texts or ids, not both"));
      return start_embed(ctx, *work->job);
    }
    for (auto t : in.getTexts()) work->inputs.push_back({std::string(t.cStr(), t.size()), {}});
    for (auto ids : in.getIds()) {
      prompt_input p;
      for (auto id : ids) p.ids.push_back(id);
      work->inputs.push_back(std::move(p));
    }
    for (const auto& p : work->inputs) {
      for (int32_t id : p.ids) {
        if (id < 0) {
          work->job.emplace(make_error(errc::invalid_request, "token ids must be non-negative"));
          return start_embed(ctx, *work->job);
        }
      }
    }
    work->key.assign(in.getApiKey().cStr(), in.getApiKey().size());
    work->model.assign(in.getModel().cStr(), in.getModel().size());
    work->options.add_special_tokens = in.getAddSpecialTokens();
    work->options.truncate_prompt_tokens = in.getTruncatePromptTokens();
    work->options.priority = in.getPriority();
    using norm = rpc::EmbedRequest::Normalize;
    if (in.getNormalize() != norm::MODEL_DEFAULT) work->options.normalize = in.getNormalize() == norm::YES;
    work->dimensions = in.getDimensions();
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    auto done = std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<void>>>(kj::mv(paf.fulfiller));
    api_service* api = &p_->api;
    boost::asio::post(p_->workers, [api, work, done] {
      work->job.emplace(api->native_embed(work->key, work->model, std::move(work->inputs), work->options, work->dimensions));
      (*done)->fulfill();
    });
    return paf.promise.then([this, ctx, work]() mutable { return start_embed(ctx, *work->job); });
  }

 private:
  /// An embed call's input, and the job native_embed made of it.
  struct embed_pending {
    std::vector<prompt_input> inputs;
    api_service::pooling_options options;
    size_t dimensions = 0;
    std::string key, model;
    std::optional<result<generation_job>> job;
  };

  /// The call's inputs in the mesh (on the loop), then its result.
  kj::Promise<void> start_embed(EmbedContext ctx, result<generation_job>& job) {
    if (!job) {
      set_failure(ctx.getResults().initResult(), job.err());
      return kj::READY_NOW;
    }
    auto c = kj::heap<embed_call>(p_, std::move(*job));
    auto paf = kj::newPromiseAndFulfiller<void>();
    c->done = kj::mv(paf.fulfiller);
    embed_call* raw = c.get();
    p_->submit_inputs(raw);
    return paf.promise
        .then([ctx, raw]() mutable {
          auto r = ctx.getResults().initResult();
          const auto& group = *raw->job.output;
          if (group.failure()) return set_failure(r, *group.failure());
          const embeddings_output& out = *group.embeddings();
          r.setOk(true);
          r.setPromptTokens(static_cast<uint32_t>(out.prompt_tokens()));
          auto list = r.initEmbeddings(static_cast<unsigned>(out.size()));
          for (unsigned i = 0; i < out.size(); ++i) {
            const auto& v = out.vector(i);
            auto row = list.init(i, static_cast<unsigned>(v.size()));
            for (unsigned d = 0; d < v.size(); ++d) row.set(d, v[d]);
          }
        })
        .attach(kj::mv(c));
  }

  /// A generate call's input, and the job native_generate made of it.
  struct pending {
    sampling_input sampling;
    generation_fields g;
    result<nlohmann::ordered_json> extra = nlohmann::ordered_json();
    std::optional<std::string> text;
    std::vector<int32_t> ids;
    bool add_special_tokens = true;
    std::string key, model;
    std::optional<result<generation_job>> job;
    request_trace trace;  ///< stamped when the call came (its span's start)
  };

  /// The call's generation in the mesh (on the loop): its state, the submit, the result.
  kj::Promise<void> start(GenerateContext ctx, result<generation_job>& job, const pending& work) {
    auto params = ctx.getParams();
    auto in = params.getRequest();
    if (!job) {
      set_failure(ctx.getResults().initResult(), job.err());
      return kj::READY_NOW;
    }
    // Choice 0's request (n choices in index order), or a beam search's base request.
    const bool beams = job->output && job->output->searches() > 0;
    const actors::replica_request& first = beams ? job->output->search(0).setup().base : job->requests.front();
    auto st = kj::heap<call_state>(p_, params.getSink());
    st->want_logprobs = in.getLogprobs() >= 0;
    st->include_stop_str = in.getIncludeStopStr();
    st->skip_special = in.getSkipSpecialTokens();
    st->slot = std::move(job->slot);
    st->prompt_tokens = first.prompt.size();
    st->tok = job->tok;
    if (job->output) st->response_id = job->output->id();
    if (first.sampling.prompt_logprobs >= 0) st->scored_prompt = first.prompt;
    std::vector<std::string> stops;
    if (in.hasStop()) {
      for (auto s : in.getStop()) stops.emplace_back(s.cStr(), s.size());
    }
    if (in.hasStopTokenIds()) {
      for (auto t : in.getStopTokenIds()) st->stop_ids.push_back(t);
    }
    st->min_tokens = static_cast<size_t>(std::max(first.sampling.min_tokens, 0));
    if (p_->opt.tracer) {
      // A span unless the caller's trace context says "not sampled" (HTTP's rule).
      auto parent = parse_traceparent(std::string_view(in.getTraceparent().cStr(), in.getTraceparent().size()),
                                      std::string_view(in.getTracestate().cStr(), in.getTracestate().size()));
      if (!parent || parent->sampled()) {
        st->trace = std::make_unique<request_trace>(work.trace);
        auto& t = *st->trace;
        t.parent = std::move(parent);
        t.facts.operation = "text_completion";
        t.facts.method = "";
        t.facts.rpc_method = "generate";
        t.facts.model = job->output ? job->output->setup().model : work.model;
        t.facts.max_tokens = static_cast<int64_t>(first.max_tokens);
        t.facts.temperature = first.sampling.temperature;
        t.facts.top_p = first.sampling.top_p;
      }
    }
    std::vector<uint64_t> choice_ids;
    for (const auto& req : job->requests) choice_ids.push_back(req.id);
    if (beams) choice_ids = job->output->search_choices(0);
    st->choices.reserve(choice_ids.size());
    for (uint64_t id : choice_ids) {
      st->choices.emplace_back(id, job->tok->decoder(), st->skip_special);
      if (!stops.empty()) st->choices.back().stops.emplace(stops, st->include_stop_str);
      st->choices.back().mesh_done = beams;  // a beam's choice runs nothing in the mesh: its steps do
    }
    auto paf = kj::newPromiseAndFulfiller<void>();
    st->done = kj::mv(paf.fulfiller);
    call_state* raw = st.get();
    for (size_t k = 0; k < st->choices.size(); ++k) p_->calls[st->choices[k].id] = {raw, k};
    if (beams) {
      raw->beams = std::move(job->output);
      p_->submit_steps(raw);
      if (raw->beams->search(0).done()) p_->replay_beams(raw);  // nothing to search
    }
    for (auto& req : job->requests) p_->submit(std::move(req));
    return paf.promise
        .then([ctx, raw]() mutable {
          auto r = ctx.getResults().initResult();
          if (raw->failure) return set_failure(r, *raw->failure);
          const auto& d = raw->tok->decoder();
          auto finish_of = [](const choice_state& c) { return c.finish == actors::finish_reason::eos ? "stop" : "length"; };
          auto ids_to = [](capnp::List<int32_t>::Builder out, const std::vector<int32_t>& ids) {
            for (unsigned i = 0; i < ids.size(); ++i) out.set(i, ids[i]);
          };
          auto logprobs_to = [&](auto init, const choice_state& c) {
            if (c.logprobs.empty()) return;
            auto lp = init(static_cast<unsigned>(c.logprobs.size()));
            for (unsigned i = 0; i < c.logprobs.size(); ++i) set_logprob(lp[i], c.ids[i], c.logprobs[i], d);
          };
          if (raw->owner->api.logs_outputs() && !raw->failure) {
            for (size_t k = 0; k < raw->choices.size(); ++k) {
              const auto& c = raw->choices[k];
              if (c.absent) continue;
              std::fprintf(stderr, "%s\n", raw->owner->api.output_line(raw->response_id, k, finish_of(c), c.ids, c.text).c_str());
            }
          }
          // The top-level fields are choice 0's (a one-choice call's, as before choices existed).
          const choice_state& c0 = raw->choices.front();
          r.setOk(true);
          r.setFinishReason(finish_of(c0));
          r.setPromptTokens(static_cast<uint32_t>(raw->prompt_tokens));
          r.setCachedPromptTokens(static_cast<uint32_t>(raw->cached_prompt_tokens));
          r.setCompletionTokens(static_cast<uint32_t>(c0.ids.size()));
          r.setText(c0.text);
          ids_to(r.initTokenIds(static_cast<unsigned>(c0.ids.size())), c0.ids);
          logprobs_to([&](unsigned n) { return r.initLogprobs(n); }, c0);
          // Every choice but a beam search's absent ones (fewer beams than n were possible).
          std::vector<const choice_state*> present;
          for (const auto& c : raw->choices) {
            if (!c.absent) present.push_back(&c);
          }
          auto choices = r.initChoices(static_cast<unsigned>(present.size()));
          for (unsigned k = 0; k < present.size(); ++k) {
            const choice_state& c = *present[k];
            auto out = choices[k];
            out.setFinishReason(finish_of(c));
            out.setCompletionTokens(static_cast<uint32_t>(c.ids.size()));
            out.setText(c.text);
            ids_to(out.initTokenIds(static_cast<unsigned>(c.ids.size())), c.ids);
            logprobs_to([&](unsigned n) { return out.initLogprobs(n); }, c);
          }
          const size_t scored = std::min(raw->prompt_logprobs.size(), raw->scored_prompt.size() - std::min<size_t>(raw->scored_prompt.size(), 1));
          if (scored > 0) {
            auto lp = r.initPromptLogprobs(static_cast<unsigned>(scored));
            for (unsigned i = 0; i < scored; ++i) set_logprob(lp[i], raw->scored_prompt[i + 1], raw->prompt_logprobs[i], d);
          }
        })
        .attach(kj::mv(st));
  }

  rpc_server::impl* p_;
};

}  // namespace

rpc_server::rpc_server(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

result<std::unique_ptr<rpc_server>> rpc_server::start(api_service& api, rpc_options opt) {
  auto p = std::make_unique<impl>(api, std::move(opt));
  std::promise<result<uint16_t>> started;
  auto ready = started.get_future();
  impl* raw = p.get();
  p->loop = std::thread([raw, &started] {
    bool told = false;
    try {
      auto io = kj::setupAsyncIo();
      rpc_listener listener(io, kj::heap<llmesh_service>(raw), raw->opt.host, raw->opt.port, raw->opt.tls);
      auto& ws = io.waitScope;
      const uint16_t port = listener.port();
      auto accepting = listener.run().eagerlyEvaluate([](kj::Exception&& e) {
        std::fprintf(stderr, "llmesh: the native API stopped accepting connections: %s\n", e.getDescription().cStr());
      });
      auto paf = kj::newPromiseAndFulfiller<void>();
      raw->stop = kj::mv(paf.fulfiller);
      raw->executor = kj::getCurrentThreadExecutor().addRef();
      raw->port = port;
      told = true;
      started.set_value(port);
      paf.promise.wait(ws);
      raw->calls.clear();  // the listener's destruction below cancels every open call
    } catch (const kj::Exception& e) {
      if (!told) {
        started.set_value(make_error(errc::io_error, "cannot serve RPC on " + raw->opt.host + ":" +
                                                         std::to_string(raw->opt.port) + ": " +
                                                         std::string(e.getDescription().cStr())));
      }
    }
  });
  auto port = ready.get();
  if (!port) {
    p->loop.join();
    return port.take_error();
  }
  return std::unique_ptr<rpc_server>(new rpc_server(std::move(p)));
}

rpc_server::~rpc_server() {
  impl_->workers.join();  // every generate's checks done (their results reach the loop below)
  if (impl_->executor) {
    try {
      impl_->executor->executeSync([p = impl_.get()] { p->stop->fulfill(); });
    } catch (const kj::Exception&) {
    }
  }
  if (impl_->loop.joinable()) impl_->loop.join();
}

uint16_t rpc_server::port() const { return impl_->port; }

}  // namespace llmesh::gateway
