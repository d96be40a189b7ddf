// The speculation benchmark (speculation_bench.hpp). Built-in prompts ask for text that copies
// its context — the workload prompt lookup is for (edits, summaries, quotes, extraction) — and
// a model without a tokenizer gets token prompts that repeat a stretch.
#include "llmesh/bench/speculation_bench.hpp"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include "llmesh/actors/draft_model_proposer.hpp"
#include "llmesh/actors/replica_core.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::bench {
namespace {

using clock_type = std::chrono::steady_clock;

const char* builtin_prompts[] = {
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
    "darkness was upon the face of the deep. In the beginning God created",
    "And God said, Let there be light: and there was light. And God saw the light, that it was good: and God "
    "divided the light from the darkness. And God said,",
    "The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures: he leadeth me "
    "beside the still waters. The LORD is my shepherd;",
    "And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto them, When ye be "
    "come into the land. And the LORD spake unto Moses, saying,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "name: alpha, id: 1, role: admin\nname: beta, id: 2, role: editor\nname: gamma, id: 3, role:",
    "Blessed are the poor in spirit: for theirs is the kingdom of heaven. Blessed are they that mourn: for they "
    "shall be comforted. Blessed are the meek: for",
    "For God so loved the world, that he gave his only begotten Son, that whosoever believeth in him should not "
    "perish, but have everlasting life. For God so loved the world,",
};

struct run_result {
  double seconds = 0;
  size_t tokens = 0, steps = 0, seq_steps = 0, drafted = 0, accepted = 0;
  std::map<uint64_t, std::vector<int32_t>> out;
};

result<run_result> run(model::engine& eng, const std::vector<std::vector<int32_t>>& prompts,
                       const speculation_bench_options& opt, const std::vector<int32_t>& eos, size_t drafts,
                       std::shared_ptr<const model::model> draft) {
  actors::scheduler_config cfg;
  cfg.speculation = {drafts, opt.max_n, opt.min_n, opt.disable_by_batch_size};
  if (drafts > 0) cfg.draft_model = std::move(draft);
  actors::replica_core rc(eng, cfg, /*prefix_caching=*/false);  // each run computes its prompts
  run_result r;
  size_t next = 0;
  auto submit = [&] {
    actors::replica_request q;
    q.id = next;
    q.prompt = prompts[next];
    q.max_tokens = opt.max_tokens;
    q.eos_ids = eos;
    q.sampling.temperature = opt.temperature;
    q.sampling.seed = 1000 + next;
    ++next;
    return rc.submit(std::move(q));
  };
  const auto t0 = clock_type::now();
  while (next < prompts.size() && next < std::max<size_t>(opt.concurrency, 1)) LLMESH_TRY(submit());
  while (!rc.idle()) {
    if (!rc.begin_step()) return make_error(errc::internal, "bench: the replica stalled");
    r.seq_steps += rc.batch().size();
    std::vector<int32_t> sampled;
    model::step_logprobs lp;
    LLMESH_TRY(eng.forward_sample(rc.batch(), rc.rows(), sampled, &lp));
    for (const auto& e : rc.finish_step(sampled, lp)) {
      if (e.token >= 0) r.out[e.id].push_back(e.token), ++r.tokens;
      if (e.finish != actors::finish_reason::none && next < prompts.size()) LLMESH_TRY(submit());
    }
    ++r.steps;
  }
  r.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  r.drafted = rc.scheduler().drafted();
  r.accepted = rc.scheduler().accepted();
  return r;
}

}  // namespace

status run_speculation_bench(const speculation_bench_options& opt) {
  if (opt.tokens == 0 || opt.tokens > actors::max_speculative_tokens) {
    return make_error(errc::invalid_request, "--speculative-tokens must be 1 to " + std::to_string(actors::max_speculative_tokens));
  }
  if (opt.min_n > opt.max_n) return make_error(errc::invalid_request, "--prompt-lookup-min is above --prompt-lookup-max");
  auto quant = model::parse_quantization(opt.quantization);
  if (!quant) return quant.take_error();
  model::load_options lo;
  lo.quant = *quant;
  auto m = model::model::load(opt.model_dir, lo);
  if (!m) return m.take_error();
  const auto& c = (*m)->config();
  std::vector<std::vector<int32_t>> prompts;
  const std::vector<int32_t> eos = c.eos_ids;
  auto tok = model::tokenizer::load(opt.model_dir);
  if (tok) {
    std::vector<std::string> texts;
    if (!opt.prompt_file.empty()) {
      std::ifstream in(opt.prompt_file);
      if (!in) return make_error(errc::not_found, "cannot read " + opt.prompt_file);
      for (std::string line; std::getline(in, line);) {
        if (!line.empty()) texts.push_back(line);
      }
    } else {
      texts.assign(std::begin(builtin_prompts), std::end(builtin_prompts));
    }
    for (const auto& t : texts) prompts.push_back((*tok)->encode(t));
  } else if (!opt.prompt_file.empty()) {
    return tok.take_error();
  } else {  // no tokenizer: token prompts that repeat a stretch
    std::mt19937 rng(3);
    for (int p = 0; p < 8; ++p) {
      std::vector<int32_t> stretch(24);
      for (auto& t : stretch) t = static_cast<int32_t>(rng() % c.vocab);
      std::vector<int32_t> prompt = stretch;
      prompt.insert(prompt.end(), stretch.begin(), stretch.end() - 8);
      prompts.push_back(prompt);
    }
  }
  if (prompts.empty()) return make_error(errc::invalid_request, "bench speculate: no prompts");
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  if (longest + opt.max_tokens > c.max_positions) return make_error(errc::invalid_request, "a prompt plus --max-tokens exceeds the model's context");
  model::engine_options eo;
  eo.threads = opt.threads;
  eo.kv_tokens = std::max<size_t>(opt.concurrency, 1) * (longest + opt.max_tokens + 64) + 256;  // every request in flight fits
  auto eng = model::engine::create(*m, eo);
  if (!eng) return eng.take_error();
  std::shared_ptr<const model::model> draft;
  if (!opt.draft_model.empty()) {
    auto d = actors::load_draft_model(opt.draft_model, **m, opt.model_dir);
    if (!d) return d.take_error();
    draft = std::move(*d);
  }

  // Each run twice, alternating, the faster of each kept: the first run also warms the caches.
  result<run_result> plain = make_error(errc::internal, ""), spec = make_error(errc::internal, "");
  for (int rep = 0; rep < 2; ++rep) {
    auto p = run(**eng, prompts, opt, eos, 0, nullptr);
    if (!p) return p.take_error();
    if (!plain || p->seconds < plain->seconds) plain = std::move(p);
    auto s = run(**eng, prompts, opt, eos, opt.tokens, draft);
    if (!s) return s.take_error();
    if (!spec || s->seconds < spec->seconds) spec = std::move(s);
  }
  const bool identical = plain->out == spec->out;

  std::printf("speculate: %s, %zu prompts, max_tokens %zu, concurrency %zu, temperature %.2f, %d threads\n",
              opt.model_dir.c_str(), prompts.size(), opt.max_tokens, opt.concurrency, opt.temperature, (*eng)->threads());
  if (draft) {
    std::printf("drafts: up to %zu a step, the greedy continuation of draft model %s\n\n", opt.tokens, opt.draft_model.c_str());
  } else {
    std::printf("drafts: up to %zu a step, by prompt lookup of %zu..%zu-grams\n\n", opt.tokens, opt.min_n, opt.max_n);
  }
  std::printf("%-26s %14s %14s\n", "", "plain decode", "speculative");
  std::printf("%-26s %14zu %14zu\n", "tokens", plain->tokens, spec->tokens);
  std::printf("%-26s %14zu %14zu\n", "engine steps", plain->steps, spec->steps);
  std::printf("%-26s %14.2f %14.2f\n", "tokens per sequence-step", static_cast<double>(plain->tokens) / plain->seq_steps,
              static_cast<double>(spec->tokens) / spec->seq_steps);
  std::printf("%-26s %14.1f %14.1f\n", "tokens/s", plain->tokens / plain->seconds, spec->tokens / spec->seconds);
  std::printf("%-26s %14s %8zu/%-5zu\n", "drafts kept / run", "-", spec->accepted, spec->drafted);
  const double rate = spec->drafted ? 100.0 * spec->accepted / spec->drafted : 0.0;
  std::printf("\nspeedup (tokens/s, speculative / plain): %.2fx   drafts kept: %.1f%%   outputs identical: %s\n",
              (spec->tokens / spec->seconds) / (plain->tokens / plain->seconds), rate, identical ? "yes" : "NO");
  if (!identical) return make_error(errc::internal, "speculative decoding changed the output: a kernel is not batch- or chunk-invariant");
  return ok_status();
}

}  // namespace llmesh::bench
