// The replica's work loop (replica_core.hpp): schedule → engine::forward → sample → complete.
#include "llmesh/actors/replica_core.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_set>

#include "llmesh/actors/draft_model_proposer.hpp"
#include "llmesh/transport/wire.hpp"

namespace llmesh::actors {

replica_core::replica_core(model::engine& eng, scheduler_config cfg, bool prefix_caching)
    : eng_(eng), blocks_(eng.kv_blocks(), eng.kv_block_size(), prefix_caching && cfg.prefix_caching), sched_(cfg, blocks_) {
  sched_.set_draft_filter([this](uint64_t id, std::span<const int32_t> drafts) { return grammatical_drafts(id, drafts); });
  // A draft model, where speculation can run: a generating model whose logits do not depend on
  // the batch (on CUDA, --deterministic). Its KV holds as many positions as the replica's (at
  // most 128 Ki): every running sequence's history and drafts fit beside each other.
  if (cfg.draft_model && eng.batch_invariant() && eng.config().classifier.labels == 0 && cfg.speculation.tokens > 0) {
    draft_model_proposer::options o;
    o.threads = eng.threads();
    o.kv_tokens = std::min<size_t>(eng.kv_blocks() * eng.kv_block_size(), size_t{1} << 17);
    o.block_size = eng.kv_block_size();
    o.kv_type = eng.kv_type();
    o.target_vocab = static_cast<int32_t>(eng.config().vocab);
    o.catch_up = cfg.max_batch_tokens;
    auto d = draft_model_proposer::create(cfg.draft_model, o);
    if (d) {
      sched_.set_draft_model(std::move(*d));
    } else {  // the output does not depend on drafts: serve without them
      std::fprintf(stderr, "llmesh: the draft model's engine did not start (%s); decoding goes on without drafts\n",
                   d.err().message.c_str());
    }
  }
}

replica_core::~replica_core() = default;

status replica_core::submit(replica_request r) {
  const auto& c = eng_.config();
  if (r.pool != pooling::none) {
    const auto& p = r.sampling;
    if (r.max_tokens != 1 || r.generated != 0 || p.logprobs >= 0 || p.prompt_logprobs >= 0 || kernels::has_adjustments(p) ||
        !r.logit_bias.empty() || r.constraint.type != model::constraint_spec::kind::none || !r.allowed_ids.empty() ||
        !r.bad_words.empty() || !r.constraint_after.empty()) {
      return make_error(errc::invalid_request, "an embedding request takes max_tokens 1 and no generation fields");
    }
  }
  int32_t lora = -1;
  std::shared_ptr<const model::lora_adapter> adapter;
  if (!r.lora.empty()) {
    std::tie(lora, adapter) = eng_.loaded_model().loras().find(r.lora);
    if (lora < 0) return make_error(errc::not_found, "the LoRA adapter '" + r.lora + "' is not loaded on this replica");
  }
  if (r.pool == pooling::none && c.classifier.labels > 0) {
    return make_error(errc::invalid_request, c.classifier.reward ? "this model is a reward model: it serves /pooling and /classify, "
                                                                   "not generation"
                                                                 : "this model is a sequence classifier: it serves /classify, "
                                                                   "/score, /rerank and /pooling, not generation");
  }
  if (r.pool == pooling::none && !c.has_lm_head) {
    return make_error(errc::invalid_request, "this model has no LM head (a bare transformer's checkpoint): it serves embeddings only");
  }
  // Every position's values come back in one message: the wire's bound (the gateway checks it first).
  const size_t per_position = c.classifier.labels > 0 ? c.classifier.labels : c.hidden;
  if (r.pool == pooling::all && r.prompt.size() * per_position > transport::max_embedding) {
    return make_error(errc::invalid_request, "a token task's " + std::to_string(r.prompt.size()) + " positions × " +
                                                 std::to_string(per_position) + " values exceed one message's " +
                                                 std::to_string(transport::max_embedding));
  }
  // An embedding's prompt is all it needs room for.
  const size_t longest = r.prompt.size() + (r.pool == pooling::none ? r.max_tokens : 0);
  if (longest > c.max_positions) {
    return make_error(errc::invalid_request, "prompt of " + std::to_string(r.prompt.size()) + " tokens plus max_tokens " +
                                                 std::to_string(r.max_tokens) + " exceeds the model's context of " +
                                                 std::to_string(c.max_positions));
  }
  if ((longest + eng_.kv_block_size() - 1) / eng_.kv_block_size() > blocks_.total_blocks()) {
    return make_error(errc::invalid_request, "request needs more KV cache than this replica has");
  }
  for (int32_t t : r.prompt) {
    if (t < 0 || static_cast<size_t>(t) >= c.vocab) {
      return make_error(errc::invalid_request, "token id " + std::to_string(t) + " is outside the vocabulary");
    }
  }
  if (r.generated > r.prompt.size()) {
    return make_error(errc::invalid_request, "request says " + std::to_string(r.generated) + " of its " +
                                                 std::to_string(r.prompt.size()) + " prompt tokens are output");
  }
  std::unordered_set<int32_t> biased;
  for (const auto& b : r.logit_bias) {
    if (b.id < 0 || static_cast<size_t>(b.id) >= c.vocab || !std::isfinite(b.bias)) {
      return make_error(errc::invalid_request, "logit_bias: token " + std::to_string(b.id) +
                                                   " is outside the vocabulary, or its bias is not finite");
    }
    if (!biased.insert(b.id).second) return make_error(errc::invalid_request, "logit_bias: token " + std::to_string(b.id) + " twice");
  }
  r.sampling.logit_bias = !r.logit_bias.empty();
  std::shared_ptr<const model::grammar> grammar;
  if (r.constraint.type != model::constraint_spec::kind::none) {
    if (!vocab_) {
      return make_error(errc::invalid_request, "structured outputs need the model's tokenizer, which this replica has not loaded");
    }
    auto g = grammar_of(r.constraint);
    if (!g) return g.take_error();
    grammar = std::move(*g);
  }
  std::vector<uint32_t> allowed_bits;
  if (!r.allowed_ids.empty()) {
    if (grammar) return make_error(errc::invalid_request, "allowed_token_ids cannot be combined with a structured output");
    allowed_bits.assign((c.vocab + 31) / 32, 0);
    for (int32_t t : r.allowed_ids) {
      if (t < 0 || static_cast<size_t>(t) >= c.vocab) {
        return make_error(errc::invalid_request, "allowed_token_ids: token " + std::to_string(t) + " is outside the vocabulary");
      }
      allowed_bits[static_cast<size_t>(t) / 32] |= 1u << (t % 32);
    }
  }
  r.sampling.constrained = grammar != nullptr || !allowed_bits.empty();
  size_t longest_bad_word = 0;
  for (const auto& w : r.bad_words) {
    if (w.empty()) return make_error(errc::invalid_request, "bad_words: a word without tokens");
    for (int32_t t : w) {
      if (t < 0 || static_cast<size_t>(t) >= c.vocab) {
        return make_error(errc::invalid_request, "bad_words: token " + std::to_string(t) + " is outside the vocabulary");
      }
    }
    longest_bad_word = std::max(longest_bad_word, w.size());
  }
  r.sampling.bad_words = !r.bad_words.empty();
  if (!r.constraint_after.empty()) {
    if (!grammar) return make_error(errc::invalid_request, "constraint_after without a constraint");
    for (int32_t t : r.constraint_after) {
      if (t < 0 || static_cast<size_t>(t) >= c.vocab) {
        return make_error(errc::invalid_request, "constraint_after: token " + std::to_string(t) + " is outside the vocabulary");
      }
    }
  }
  if (r.sampling.prompt_logprobs > kernels::max_logprobs || r.sampling.logprobs > kernels::max_logprobs) {
    return make_error(errc::invalid_request, "logprobs: at most " + std::to_string(kernels::max_logprobs) + " alternatives");
  }
  // A continued request (failover) had its prompt scored before its first token went out.
  if (r.generated > 0) r.sampling.prompt_logprobs = -1;
  std::optional<adjust_state> adjust;
  if (kernels::has_adjustments(r.sampling)) {
    adjust.emplace();
    adjust->bad_words = std::move(r.bad_words);
    adjust->recent_keep = std::max(longest_bad_word > 0 ? longest_bad_word - 1 : 0, r.constraint_after.size());
    adjust->wait_for = r.constraint_after;
    const size_t output_from = r.prompt.size() - r.generated;
    for (size_t i = 0; i < r.prompt.size(); ++i) adjust->see(r.prompt[i], i >= output_from);
    adjust->end_ids = r.eos_ids;
    adjust->generated = r.generated;
    adjust->bias = std::move(r.logit_bias);
    adjust->allowed_ids = std::move(allowed_bits);
    adjust->allowed_only_end_ids =
        !r.allowed_ids.empty() && std::all_of(r.allowed_ids.begin(), r.allowed_ids.end(), [&](int32_t t) {
          return std::find(r.eos_ids.begin(), r.eos_ids.end(), t) != r.eos_ids.end();
        });
    if (grammar) {
      // A continued request's output so far is where its grammar stands (from the end of
      // constraint_after in it on, or nowhere yet if it has not come).
      adjust->matcher.emplace(grammar);
      size_t from = output_from;
      if (const auto& wait = adjust->wait_for; !wait.empty()) {
        const auto out = r.prompt.begin() + static_cast<std::ptrdiff_t>(output_from);
        const auto at = std::search(out, r.prompt.end(), wait.begin(), wait.end());
        from = at == r.prompt.end() ? r.prompt.size() : static_cast<size_t>(at - r.prompt.begin()) + wait.size();
        if (at != r.prompt.end()) adjust->wait_for.clear();
      }
      for (size_t i = from; i < r.prompt.size(); ++i) {
        const int32_t t = r.prompt[i];
        if (vocab_->excluded(t) || !adjust->matcher->accept(vocab_->bytes(t))) {
          return make_error(errc::invalid_request, "output token " + std::to_string(i - output_from) + " (id " +
                                                       std::to_string(t) + ") does not follow the request's constraint");
        }
      }
    }
  }
  request_spec spec;
  spec.id = r.id;
  spec.prompt = std::move(r.prompt);
  spec.max_tokens = r.max_tokens;
  spec.eos_ids = std::move(r.eos_ids);
  spec.prompt_logprobs = r.sampling.prompt_logprobs;
  spec.priority = r.priority;
  spec.cache_salt = r.cache_salt;
  spec.pool = r.pool;
  spec.lora = lora;
  spec.adapter = std::move(adapter);
  // Drafts are checked by drawing after each as a plain decode would (each row's adjustments
  // count the drafts before it): only logits that shift with the batch rule it out.
  // A grammar that waits for constraint_after would mask some drafts' rows and not others:
  // such a request decodes one token a step.
  spec.speculate = eng_.batch_invariant() && r.constraint_after.empty();
  const size_t prompt_len = spec.prompt.size();
  LLMESH_TRY(sched_.add(std::move(spec)));
  sampling_[r.id] = r.sampling;
  if (r.sampling.prompt_logprobs >= 0) scored_[r.id].resize(prompt_len - 1);
  if (adjust) adjust_[r.id] = std::move(*adjust);
  if (r.pool != pooling::none) {
    auto& st = pooled_[r.id];
    st.pool = r.pool;
    st.positions = prompt_len;
    if (r.pool == pooling::mean) st.sum.assign(c.hidden, 0.0);
    if (r.pool == pooling::all) st.row.reserve(prompt_len * per_position);
  }
  return ok_status();
}

void replica_core::pool_rows(pool_state& st, const model::step_sequence& s, std::span<const float> rows) const {
  const size_t hidden = eng_.config().hidden;
  const size_t k = rows.size() / hidden;
  const size_t first = s.pos0 + model::hidden_row_first(s);  // the position of rows' first
  switch (st.pool) {
    case pooling::last:
      st.row.assign(rows.end() - static_cast<std::ptrdiff_t>(hidden), rows.end());
      break;
    case pooling::cls:
      if (first == 0 && k > 0) st.row.assign(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(hidden));
      break;
    case pooling::mean:
      // Each position once, in order: a chunk recomputed after a preemption adds nothing again.
      for (size_t i = 0; i < k; ++i) {
        if (first + i != st.next) continue;
        for (size_t d = 0; d < hidden; ++d) st.sum[d] += rows[i * hidden + d];
        ++st.next;
      }
      break;
    case pooling::all: {  // each position once, in order, as for mean; a classifier's logits of them
      if (st.next < first || st.next >= first + k) break;
      const auto fresh = rows.subspan((st.next - first) * hidden);
      if (eng_.config().classifier.labels > 0) {
        const auto logits = eng_.classify(fresh);  // the chunk's rows at once
        st.row.insert(st.row.end(), logits.begin(), logits.end());
      } else {
        st.row.insert(st.row.end(), fresh.begin(), fresh.end());
      }
      st.next = first + k;
      break;
    }
    case pooling::none:
      break;
  }
}

result<std::shared_ptr<const model::grammar>> replica_core::grammar_of(const model::constraint_spec& spec) {
  // The process's cache: in `llmesh serve` the gateway compiled it already.
  return model::constraint_cache::shared().get(spec);
}

replica_core::followed replica_core::follow(adjust_state& st, int32_t token) const {
  if (!st.matcher) return followed::on;
  if (!st.wait_for.empty()) {  // thinking: the grammar holds from the token after constraint_after
    if (st.output_ends_with(st.wait_for, {})) st.wait_for.clear();
    return followed::on;
  }
  if (std::find(st.end_ids.begin(), st.end_ids.end(), token) != st.end_ids.end()) return followed::on;  // it ends here anyway
  if (vocab_->excluded(token) || !st.matcher->accept(vocab_->bytes(token))) return followed::outside;
  return st.matcher->done() && st.end_ids.empty() ? followed::done : followed::on;
}

void replica_core::adjust_state::see(int32_t id, bool output) {
  auto [it, fresh] = index.emplace(id, seen.size());
  if (fresh) seen.push_back({id, 0});
  if (output) ++seen[it->second].count;
  if (output && recent_keep > 0) {
    recent.push_back(id);
    if (recent.size() >= 2 * recent_keep + 64) recent.erase(recent.begin(), recent.end() - static_cast<std::ptrdiff_t>(recent_keep));
  }
}

bool replica_core::adjust_state::output_ends_with(std::span<const int32_t> prefix, std::span<const int32_t> drafts) const {
  const size_t have = recent.size() + drafts.size();
  if (prefix.size() > have) return false;
  for (size_t k = 0, at = have - prefix.size(); k < prefix.size(); ++k, ++at) {
    const int32_t t = at < recent.size() ? recent[at] : drafts[at - recent.size()];
    if (t != prefix[k]) return false;
  }
  return true;
}

bool replica_core::cancel(uint64_t id) {
  sampling_.erase(id);
  adjust_.erase(id);
  scored_.erase(id);
  pooled_.erase(id);
  return sched_.cancel(id);
}

size_t replica_core::grammatical_drafts(uint64_t id, std::span<const int32_t> drafts) const {
  auto a = adjust_.find(id);
  if (a == adjust_.end()) return drafts.size();
  const auto& st = a->second;
  if (!st.wait_for.empty()) return 0;  // not speculating (submit)
  if (!st.matcher) {  // allowed_token_ids: drafts up to the first the set does not hold
    if (st.allowed_ids.empty()) return drafts.size();
    for (size_t n = 0; n < drafts.size(); ++n) {
      const auto t = static_cast<size_t>(drafts[n]);
      if (!(st.allowed_ids[t / 32] >> (t % 32) & 1u)) return n;
    }
    return drafts.size();
  }
  model::grammar_matcher m = *st.matcher;
  for (size_t n = 0; n < drafts.size(); ++n) {
    const int32_t t = drafts[n];
    // An end id is drawable only where the grammar is complete; nothing follows it.
    if (std::find(st.end_ids.begin(), st.end_ids.end(), t) != st.end_ids.end()) return m.accepting() ? n + 1 : n;
    if (vocab_->excluded(t) || !m.accept(vocab_->bytes(t))) return n;
  }
  return drafts.size();
}

void replica_core::build_views(adjust_state& st, const kernels::sampling_params& p, std::span<const int32_t> drafts) {
  const size_t rows = drafts.size() + 1;
  const bool penalties = kernels::has_penalties(p);
  st.views.assign(rows, {});
  const model::grammar_matcher* active = st.active();  // none while it waits for constraint_after
  st.masks.assign(active ? rows : 0, nullptr);
  st.seen_rows.resize(penalties ? rows - 1 : 0);
  st.bans.resize(rows);
  std::optional<model::grammar_matcher> m;  // the grammar after the drafts so far
  if (active && !drafts.empty()) m = *active;
  const model::grammar_matcher* at = active;
  for (size_t j = 0; j < rows; ++j) {
    auto& v = st.views[j];
    if (j > 0) {
      const int32_t d = drafts[j - 1];
      if (m && !(std::find(st.end_ids.begin(), st.end_ids.end(), d) == st.end_ids.end() && !vocab_->excluded(d) &&
                 m->accept(vocab_->bytes(d)))) {
        // The filter kept only drafts the grammar accepts (an end id last): no row after this
        // one can be kept, so its rows repeat the previous one.
        for (; j < rows; ++j) st.views[j] = st.views[j - 1];
        break;
      }
      if (m) at = &*m;
      if (penalties) {  // d counts as output from this row on
        auto& seen = st.seen_rows[j - 1];
        seen = j == 1 ? st.seen : st.seen_rows[j - 2];
        if (auto it = st.index.find(d); it != st.index.end()) {
          ++seen[it->second].count;
        } else {
          auto t = std::find_if(seen.begin() + static_cast<std::ptrdiff_t>(st.seen.size()), seen.end(),
                                [&](const kernels::seen_token& x) { return x.id == d; });
          if (t != seen.end()) ++t->count;
          else seen.push_back({d, 1});
        }
      }
    }
    v.seen = j > 0 && penalties ? std::span<const kernels::seen_token>(st.seen_rows[j - 1]) : std::span<const kernels::seen_token>(st.seen);
    v.bias = st.bias;
    if (at) {
      st.masks[j] = masks_.get(*vocab_, *at, st.end_ids);
      v.allowed = *st.masks[j];
    } else if (!st.allowed_ids.empty()) {
      v.allowed = st.allowed_ids;
    }
    // min_tokens yields to a grammar that is complete, or to an allowed set of end ids only:
    // nothing but an end id may follow (banning them would leave no token to draw).
    const bool too_early = st.generated + j < static_cast<size_t>(std::max(p.min_tokens, 0)) && !(at && at->done()) &&
                           !st.allowed_only_end_ids;
    auto& bans = st.bans[j];
    bans.clear();
    if (too_early) bans = st.end_ids;
    // vLLM's bad_words: a word's last token, where the output (with this row's drafts) ends
    // with the word's other tokens.
    for (const auto& w : st.bad_words) {
      if (st.output_ends_with(std::span(w).first(w.size() - 1), drafts.first(j))) bans.push_back(w.back());
    }
    v.banned = bans;
  }
}

bool replica_core::begin_step() {
  plan_ = sched_.schedule();
  batch_.clear();
  rows_.clear();
  if (plan_.seqs.empty()) return false;
  for (const auto& s : plan_.seqs) {
    batch_.push_back({s.tokens, s.pos0, s.block_table, s.want_logits, s.prompt_logprobs, s.next, s.draws, s.hidden, s.lora, s.adapter});
    // The token being drawn sits at position pos0 + n: the (seed, position) key generate uses.
    if (!s.want_logits) continue;
    const kernels::sampling_params& p = sampling_.at(s.id);
    // A row per drawn position: after the last token, then after each draft (speculation).
    const size_t first = s.pos0 + s.tokens.size() - s.draws + 1;
    auto a = adjust_.find(s.id);
    if (a != adjust_.end()) build_views(a->second, p, s.tokens.last(s.draws - 1));
    for (size_t j = 0; j < s.draws; ++j) rows_.push_back({p, first + j, a != adjust_.end() ? &a->second.views[j] : nullptr});
  }
  in_step_ = true;
  return true;
}

std::vector<token_event> replica_core::finish_step(std::span<const int32_t> sampled, const model::step_logprobs& logprobs) {
  in_step_ = false;
  // The scored positions, in batch order (model::step_logprobs::prompt).
  size_t at = 0;
  for (size_t i = 0; i < plan_.seqs.size() && !logprobs.prompt.empty(); ++i) {
    const size_t k = model::scored_positions(batch_[i]);
    auto it = scored_.find(plan_.seqs[i].id);  // gone: cancelled while the step ran
    for (size_t j = 0; j < k && at < logprobs.prompt.size(); ++j, ++at) {
      const size_t pos = plan_.seqs[i].pos0 + j;
      if (it != scored_.end() && pos < it->second.size()) it->second[pos] = logprobs.prompt[at];
    }
  }
  // The hidden rows of embedding requests, in batch order (model::step_logprobs::hidden).
  const size_t hidden = eng_.config().hidden;
  size_t hrow = 0;
  for (size_t i = 0; i < plan_.seqs.size(); ++i) {
    const size_t k = model::hidden_row_count(batch_[i]);
    if (k == 0) continue;
    auto it = pooled_.find(plan_.seqs[i].id);  // gone: cancelled while the step ran
    if (it != pooled_.end() && (hrow + k) * hidden <= logprobs.hidden.size()) {
      pool_rows(it->second, batch_[i], std::span<const float>(logprobs.hidden).subspan(hrow * hidden, k * hidden));
    }
    hrow += k;
  }
  auto events = sched_.complete(plan_, sampled);
  std::vector<token_event> out;
  out.reserve(events.size());
  std::unordered_set<uint64_t> ended;  // by its grammar at a token kept earlier in this step
  for (auto& e : events) {
    if (ended.contains(e.id)) continue;  // the tokens kept after it are not output
    if (auto p = pooled_.find(e.id); p != pooled_.end()) {  // an embedding's end
      auto& st = p->second;
      const bool by_position = st.pool == pooling::mean || st.pool == pooling::all;
      if (by_position ? st.next != st.positions : st.row.empty()) {
        // Rows the executor did not give (a bug there): an error, never a wrong vector.
        e.failure = make_error(errc::internal, "embedding: the step gave " + std::to_string(by_position ? st.next : 0) +
                                                   " of the prompt's hidden rows");
        e.finish = finish_reason::cancelled;
      } else if (st.pool == pooling::mean) {
        e.embedding.resize(st.sum.size());
        const double n = static_cast<double>(std::max<size_t>(st.next, 1));
        for (size_t d = 0; d < st.sum.size(); ++d) e.embedding[d] = static_cast<float>(st.sum[d] / n);
      } else {
        e.embedding = std::move(st.row);
      }
      // A classifier's answer is its score head's logits for that state (labels values; all's
      // rows were classified as they came).
      if (!e.failure && eng_.config().classifier.labels > 0 && st.pool != pooling::all) e.embedding = eng_.classify(e.embedding);
      pooled_.erase(p);
      sampling_.erase(e.id);
      adjust_.erase(e.id);
      out.push_back(std::move(e));
      continue;
    }
    if (e.row < logprobs.rows.size()) e.logprobs = logprobs.rows[e.row];
    if (auto it = scored_.find(e.id); it != scored_.end()) {  // its first token
      e.prompt_logprobs = std::move(it->second);
      scored_.erase(it);
    }
    if (e.finish != finish_reason::none) {
      sampling_.erase(e.id);
      adjust_.erase(e.id);
    } else if (auto a = adjust_.find(e.id); a != adjust_.end()) {
      a->second.see(e.token, true);
      ++a->second.generated;
      if (const auto f = follow(a->second, e.token); f != followed::on) {
        // Its grammar is complete and it has no end id to draw: it ends here, as at an end id.
        // Or the token is outside it (a vocabulary without some byte's token can leave a
        // grammar where nothing continues it): the request fails rather than end unfinished.
        e.times = sched_.times(e.id, true);  // its last token: its whole time here
        sched_.cancel(e.id);
        e.finish = f == followed::done ? finish_reason::eos : finish_reason::cancelled;
        if (f == followed::outside) {
          e.failure = make_error(errc::internal, "structured output: no token of the vocabulary continues the "
                                                 "request's grammar after " + std::to_string(a->second.generated - 1) +
                                                 " tokens");
          e.token = -1;
        }
        sampling_.erase(e.id);
        adjust_.erase(a);
        ended.insert(e.id);
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

result<std::vector<token_event>> replica_core::step() {
  if (!begin_step()) return std::vector<token_event>{};
  std::vector<int32_t> sampled;
  model::step_logprobs logprobs;
  if (auto s = eng_.forward_sample(batch_, rows_, sampled, &logprobs); !s) {
    in_step_ = false;
    return s.take_error();
  }
  return finish_step(sampled, logprobs);
}

}  // namespace llmesh::actors
