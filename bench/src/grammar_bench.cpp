// The grammar benchmark (grammar_bench.hpp). Documents come from random walks: each step picks
// uniformly among the tokens the mask allows (an end id as soon as the grammar is complete),
// so the walk visits the schema's states as generation would, without a model.
#include "llmesh/bench/grammar_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/constraint.hpp"
#include "llmesh/model/detokenizer.hpp"
#include "llmesh/model/token_mask.hpp"

namespace llmesh::bench {
namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

const char* default_schema = R"({
  "type": "object",
  "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 1000000},
    "name": {"type": "string", "maxLength": 40},
    "email": {"type": "string"},
    "role": {"enum": ["admin", "editor", "viewer"]},
    "active": {"type": "boolean"},
    "score": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 5},
    "address": {"type": "object", "properties": {
      "street": {"type": "string", "maxLength": 40}, "city": {"type": "string", "maxLength": 30},
      "zip": {"type": "string", "maxLength": 10}}, "required": ["city"]}
  },
  "required": ["id", "name", "role", "active"]
})";

bool allowed(const std::vector<uint32_t>& mask, size_t id) { return (mask[id >> 5] >> (id & 31)) & 1u; }

}  // namespace

status run_grammar_bench(const grammar_bench_options& opt) {
  auto d = model::detokenizer::load(opt.model_dir);
  if (!d) return d.take_error();
  auto t0 = clock_type::now();
  auto vocab = model::token_vocabulary::build(*d);
  const double vocab_s = since(t0);
  std::string schema = default_schema;
  if (!opt.schema_file.empty()) {
    std::ifstream in(opt.schema_file, std::ios::binary);
    if (!in) return make_error(errc::not_found, "cannot read " + opt.schema_file);
    std::stringstream ss;
    ss << in.rdbuf();
    schema = ss.str();
  }
  t0 = clock_type::now();
  auto g = model::compile_constraint({model::constraint_spec::kind::json_schema, schema});
  if (!g) return g.take_error();
  const double compile_s = since(t0);
  // The end id: the vocabulary's first special token (any id works for the walk).
  int32_t end = 0;
  while (static_cast<size_t>(end) + 1 < vocab->size() && !d->is_special(end)) ++end;
  const std::vector<int32_t> end_ids{end};

  model::token_mask_cache cache;
  std::mt19937 rng(1);
  double cold_s = 0, warm_s = 0, plain_s = 0;
  size_t cold = 0, warm = 0, plain = 0, steps = 0, complete = 0, bytes = 0;
  for (int doc = 0; doc < std::max(1, opt.documents); ++doc) {
    model::grammar_matcher m(*g);
    for (int step = 0; step < opt.max_tokens; ++step) {
      const size_t misses = cache.misses();
      t0 = clock_type::now();
      auto mask = cache.get(*vocab, m, end_ids);
      const double t = since(t0);
      (cache.misses() > misses ? cold_s : warm_s) += t;
      (cache.misses() > misses ? cold : warm) += 1;
      if (doc == 0 && step < 24) {  // the walk without the state table, for comparison
        t0 = clock_type::now();
        auto again = vocab->mask(m, end_ids);
        plain_s += since(t0);
        ++plain;
        if (again != *mask) return make_error(errc::internal, "the tabled and untabled masks differ");
      }
      ++steps;
      if (allowed(*mask, static_cast<size_t>(end))) {
        ++complete;
        break;
      }
      std::vector<int32_t> ids;
      for (size_t id = 0; id < vocab->size(); ++id) {
        if (allowed(*mask, id)) ids.push_back(static_cast<int32_t>(id));
      }
      if (ids.empty()) return make_error(errc::internal, "a mask allows nothing before the grammar is complete");
      const int32_t pick = ids[rng() % ids.size()];
      bytes += vocab->bytes(pick).size();
      if (!m.accept(vocab->bytes(pick))) return make_error(errc::internal, "the grammar refused a token its mask allowed");
    }
  }
  // The peer: one sampled draw over a row of the same vocabulary.
  std::vector<float> logits(vocab->size());
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (auto& x : logits) x = nd(rng);
  kernels::sampling_params p{0.8f, 0, 0.95f, 7};
  double sample_s = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    t0 = clock_type::now();
    int32_t sink = 0;
    for (int i = 0; i < 20; ++i) sink ^= kernels::sample(logits, p, static_cast<uint64_t>(i));
    sample_s = std::min(sample_s, since(t0) / 20);
    if (sink == -12345) std::printf(" ");
  }
  const double cold_ms = cold ? 1e3 * cold_s / static_cast<double>(cold) : 0.0;
  const double warm_ms = warm ? 1e3 * warm_s / static_cast<double>(warm) : 0.0;
  const double all_ms = 1e3 * (cold_s + warm_s) / static_cast<double>(steps);
  std::printf("llmesh bench grammar: %s (%zu tokens; vocabulary trie %.3f s)\n", opt.model_dir.c_str(), vocab->size(), vocab_s);
  std::printf("  schema compile   %.3f ms\n", 1e3 * compile_s);
  std::printf("  documents        %d, %zu complete, %zu steps, %.1f bytes/token\n", opt.documents, complete, steps,
              steps ? static_cast<double>(bytes) / static_cast<double>(steps) : 0.0);
  std::printf("  mask, cold       %8.3f ms/step (%zu states first seen)\n", cold_ms, cold);
  std::printf("  mask, cached     %8.4f ms/step (%zu steps)\n", warm_ms, warm);
  std::printf("  mask, untabled   %8.3f ms/step (%zu steps, no state table)\n", plain ? 1e3 * plain_s / plain : 0.0, plain);
  std::printf("  sampling draw    %8.3f ms/step (temperature 0.8, top-p 0.95: the peer)\n", 1e3 * sample_s);
  std::printf("  mask / draw      %8.2f (all steps), %.2f cold, %.3f cached\n", all_ms / (1e3 * sample_s),
              cold_ms / (1e3 * sample_s), warm_ms / (1e3 * sample_s));
  return ok_status();
}

}  // namespace llmesh::bench
