// The continuous-batching scheduler (batch_scheduler.hpp).
#include "llmesh/actors/batch_scheduler.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "llmesh/actors/draft_model_proposer.hpp"

namespace llmesh::actors {

batch_scheduler::batch_scheduler(scheduler_config cfg, block_manager& blocks) : cfg_(std::move(cfg)), blocks_(blocks) {}

batch_scheduler::~batch_scheduler() {
  for (auto& [id, r] : requests_) blocks_.release(r.blocks);
}

status batch_scheduler::add(request_spec r) {
  if (r.prompt.empty()) return make_error(errc::invalid_request, "request " + std::to_string(r.id) + ": empty prompt");
  if (r.max_tokens == 0 && r.pool == pooling::none) return make_error(errc::invalid_request, "request " + std::to_string(r.id) + ": max_tokens is 0");
  if (requests_.contains(r.id)) return make_error(errc::invalid_request, "request " + std::to_string(r.id) + " exists");
  const uint64_t id = r.id;
  request q;
  q.tokens = r.prompt;
  q.spec = std::move(r);
  q.added = std::chrono::steady_clock::now();
  requests_.emplace(id, std::move(q));
  enqueue(id, false);
  return ok_status();
}

void batch_scheduler::enqueue(uint64_t id, bool front) {
  const int32_t p = requests_.at(id).spec.priority;
  auto prio = [&](uint64_t w) { return requests_.at(w).spec.priority; };
  // The waiting queue stays sorted by priority; within one, a preempted request goes first.
  auto at = front ? std::find_if(waiting_.begin(), waiting_.end(), [&](uint64_t w) { return prio(w) >= p; })
                  : std::find_if(waiting_.begin(), waiting_.end(), [&](uint64_t w) { return prio(w) > p; });
  waiting_.insert(at, id);
}

uint64_t batch_scheduler::victim() const {
  uint64_t v = running_.back();
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (requests_.at(*it).spec.priority > requests_.at(v).spec.priority) v = *it;
  }
  return v;
}

bool batch_scheduler::cancel(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  blocks_.release(it->second.blocks);
  requests_.erase(it);
  if (drafter_) drafter_->forget(id);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  return true;
}

std::span<const int32_t> batch_scheduler::output(uint64_t id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return {};
  const auto& r = it->second;
  return std::span<const int32_t>(r.tokens).subspan(r.tokens.size() - r.n_generated);
}

void batch_scheduler::preempt(uint64_t id) {
  auto& r = requests_.at(id);
  blocks_.release(r.blocks);
  r.n_computed = 0;
  r.step_tokens.clear();
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  enqueue(id, true);  // first of its priority to come back
  ++preemptions_;
}

/// Starts a waiting request: prefix-cache hit, then blocks for its first chunk.
bool batch_scheduler::admit(request& r, size_t& budget) {
  // The salt starts its blocks' hash chain: what it finds and what it commits are its salt's.
  r.blocks.last_hash = prefix_key(r.spec);
  // A prompt to score is computed whole (vLLM does the same): cached positions have no logits
  // (nor hidden rows, for a pooling over them).
  const size_t hit = whole(r) ? 0 : blocks_.match_prefix(r.tokens, r.blocks);
  const size_t chunk = chunk_of(r, hit, budget);
  if (!blocks_.reserve(r.blocks, hit + chunk).ok()) {
    blocks_.release(r.blocks);
    return false;
  }
  r.n_computed = hit;
  if (!r.cached) {  // the first admission's (a preempted request's later ones are not the client's)
    r.cached = hit;
    r.admitted = std::chrono::steady_clock::now();
  }
  return true;
}

size_t batch_scheduler::chunk_of(const request& r, size_t from, size_t budget) const {
  const size_t n = std::min(r.tokens.size() - from, budget);
  return cfg_.long_prefill_threshold > 0 ? std::min(n, cfg_.long_prefill_threshold) : n;
}

replica_times batch_scheduler::times_of(const request& r, bool last) {
  using us = std::chrono::microseconds;
  const auto span = [](auto from, auto to) { return std::max<int64_t>(0, std::chrono::duration_cast<us>(to - from).count()); };
  replica_times t;
  if (!r.cached) return t;  // never admitted
  t.queued_us = span(r.added, r.admitted);
  if (!r.cached_reported) return t;  // no first token yet
  t.prefill_us = span(r.admitted, r.first_token);
  if (last) t.inference_us = span(r.admitted, std::chrono::steady_clock::now());
  return t;
}

replica_times batch_scheduler::times(uint64_t id, bool last) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? replica_times{} : times_of(it->second, last);
}

bool batch_scheduler::awaits_shared_prefix(const request& r) const {
  if (!blocks_.prefix_caching() || whole(r)) return false;
  const size_t bs = blocks_.block_size();
  const size_t usable = r.tokens.empty() ? 0 : r.tokens.size() - 1;  // as match_prefix: never the last token
  for (uint64_t pid : running_) {
    const auto& p = requests_.at(pid);
    // Only a prefill can be waited for; and a scored prompt recomputes what the cache may
    // already hold (its n_computed says nothing about the cache).
    if (p.n_computed + 1 >= p.tokens.size() || whole(p)) continue;  // decoding, or scoring
    if (prefix_key(p.spec) != prefix_key(r.spec)) continue;  // its blocks are not r's to share
    const size_t limit = std::min(p.tokens.size(), usable);
    size_t n = 0;
    while (n < limit && p.tokens[n] == r.tokens[n]) ++n;
    const size_t shared = n / bs * bs;
    if (shared > p.n_computed && 2 * shared >= r.tokens.size()) return true;
  }
  return false;
}

void batch_scheduler::set_draft_model(std::unique_ptr<draft_model_proposer> d) { drafter_ = std::move(d); }

size_t batch_scheduler::draft_limit(request& r, size_t left) {
  const auto& cfg = cfg_.speculation;
  if (!r.spec.speculate || cfg.tokens == 0 || scoring(r) || r.n_generated == 0 || left < 2) return 0;
  if (r.sit_out > 0) {
    --r.sit_out;
    return 0;
  }
  // Drafts past max_tokens would be drawn for nothing; with a long-prefill threshold a step runs
  // at most that many tokens of a request, drafts included (vLLM V1 caps them alike).
  const size_t cap = cfg_.long_prefill_threshold > 0 ? cfg_.long_prefill_threshold - 1 : max_speculative_tokens;
  return std::min({cfg.tokens, r.draft_cap, max_speculative_tokens, cap, r.spec.max_tokens - r.n_generated - 1, left - 1});
}

size_t batch_scheduler::take_drafts(request& r, std::vector<int32_t>& drafts) {
  // Past an end id nothing is drawn; and the caller may know drafts can never be drawn (a
  // grammar that does not allow them).
  for (size_t i = 0; i < drafts.size(); ++i) {
    if (std::find(r.spec.eos_ids.begin(), r.spec.eos_ids.end(), drafts[i]) != r.spec.eos_ids.end()) drafts.resize(i + 1);
  }
  if (filter_) drafts.resize(std::min(drafts.size(), filter_(r.spec.id, drafts)));
  if (drafts.empty()) return 1;
  // Only blocks nobody uses, not even the prefix cache (every request of the step has its
  // blocks already; complete() gives these back): drafts never preempt or evict.
  if (blocks_.blocks_needed(r.blocks, r.n_computed + 1 + drafts.size()) > blocks_.unused_blocks()) return 1;
  if (!blocks_.reserve(r.blocks, r.n_computed + 1 + drafts.size()).ok()) return 1;
  r.step_tokens.push_back(r.tokens.back());
  r.step_tokens.insert(r.step_tokens.end(), drafts.begin(), drafts.end());
  return r.step_tokens.size();
}

void batch_scheduler::speculate(std::vector<std::pair<uint64_t, size_t>>& picks, size_t& budget) {
  const auto decoding = [&](size_t p) {
    const auto& r = requests_.at(picks[p].first);
    return picks[p].second == 1 && r.n_computed + 1 == r.tokens.size();  // not a prompt chunk
  };
  if (cfg_.draft_model && !drafter_) return;  // its draft model did not start, or failed: no drafts
  if (!drafter_) {  // prompt lookup: each decode in admission order, from what the ones before it took
    drafts_.resize(1);
    for (size_t p = 0; p < picks.size() && budget >= 2; ++p) {
      if (!decoding(p)) continue;
      auto& r = requests_.at(picks[p].first);
      const size_t k = draft_limit(r, budget);
      if (k == 0 || propose_ngram(r.tokens, cfg_.speculation, k, drafts_[0]) == 0) continue;
      picks[p].second = take_drafts(r, drafts_[0]);
      budget -= picks[p].second - 1;
    }
    return;
  }
  // A draft model: every decode that may speculate asks at once, each for what the ones before
  // it leave if they take all they ask for.
  queries_.clear();
  std::vector<size_t> at;  // the pick of each query
  size_t left = budget;
  for (size_t p = 0; p < picks.size() && left >= 2; ++p) {
    if (!decoding(p)) continue;
    auto& r = requests_.at(picks[p].first);
    const size_t k = draft_limit(r, left);
    if (k == 0) continue;
    queries_.push_back({picks[p].first, r.tokens, k});
    at.push_back(p);
    left -= k;
  }
  if (queries_.empty()) return;
  if (auto ok = drafter_->propose(queries_, drafts_); !ok) {
    // Its engine is failed for good: speculation goes on without drafts (the output is the same).
    ++draft_failures_;
    std::fprintf(stderr, "llmesh: the draft model failed (%s); decoding goes on without its drafts\n", ok.err().message.c_str());
    drafter_.reset();
    return;
  }
  for (size_t i = 0; i < queries_.size(); ++i) {
    auto& n = picks[at[i]].second;
    n = take_drafts(requests_.at(queries_[i].id), drafts_[i]);
    budget -= n - 1;
  }
}

step_plan batch_scheduler::schedule() {
  step_plan plan;
  size_t budget = cfg_.max_batch_tokens;
  std::vector<std::pair<uint64_t, size_t>> picks;  // (request, tokens to run)

  // Running requests in admission order: decodes take one token, prefills a chunk.
  for (size_t i = 0; i < running_.size() && budget > 0 && picks.size() < cfg_.max_seqs;) {
    const uint64_t id = running_[i];
    auto& r = requests_.at(id);
    const size_t n = chunk_of(r, r.n_computed, budget);
    r.step_tokens.clear();
    bool ok = blocks_.reserve(r.blocks, r.n_computed + n).ok();
    // Free blocks by preempting the newest request of the lowest priority (the highest value).
    while (!ok && victim() != id) {
      const uint64_t victim = this->victim();
      for (auto p = picks.begin(); p != picks.end(); ++p) {
        if (p->first != victim) continue;
        budget += p->second;  // its tokens go back to the budget
        picks.erase(p);
        break;
      }
      // One admitted before this one (a lower priority) leaves from before index i.
      if (std::find(running_.begin(), running_.begin() + static_cast<std::ptrdiff_t>(i), victim) !=
          running_.begin() + static_cast<std::ptrdiff_t>(i)) {
        --i;
      }
      preempt(victim);
      plan.preempted.push_back(victim);
      ok = blocks_.reserve(r.blocks, r.n_computed + n).ok();
    }
    if (!ok) {  // this request is the one to preempt: it waits instead
      preempt(id);
      plan.preempted.push_back(id);
      continue;
    }
    picks.emplace_back(id, n);
    budget -= n;
    ++i;
  }
  // New requests, in priority order and first come first served within one, while tokens,
  // sequences and blocks allow (none in
  // a step that had to preempt: the pool is short, admitting would thrash). A request that
  // waits for a shared prefix lets the ones behind it pass; at most max_deferred_scan of those
  // are looked past per step (each look compares its prompt with the running prefills).
  // With vLLM's partial-prefill limits, prompts being computed are counted (long ones apart): a
  // waiting prompt past the limit waits with those behind it; a long one past the long limit
  // lets shorter ones behind it pass.
  constexpr size_t max_deferred_scan = 64;
  size_t deferred = 0;
  const bool limited = cfg_.max_partial_prefills > 1;
  size_t partial = 0, partial_long = 0;
  for (uint64_t id : running_) {
    const auto& r = requests_.at(id);
    if (limited && prefilling(r)) {
      ++partial;
      partial_long += long_prefill(r) ? 1 : 0;
    }
  }
  for (auto w = waiting_.begin(); plan.preempted.empty() && w != waiting_.end() && budget > 0 &&
                                  picks.size() < cfg_.max_seqs && deferred < max_deferred_scan;) {
    const uint64_t id = *w;
    auto& r = requests_.at(id);
    const bool counted = limited && prefilling(r), is_long = counted && long_prefill(r);
    if (counted && partial >= cfg_.max_partial_prefills) break;
    if (is_long && partial_long >= std::max<size_t>(1, cfg_.max_long_partial_prefills)) {
      ++w;  // an O(1) look: not counted against the scan's limit, so every short one behind is reached
      continue;
    }
    if (awaits_shared_prefix(r)) {
      ++deferrals_;
      ++deferred;
      ++w;
      continue;
    }
    if (!admit(r, budget)) break;  // blocks are short: keep arrival order among the rest
    w = waiting_.erase(w);
    running_.push_back(id);
    const size_t n = chunk_of(r, r.n_computed, budget);
    picks.emplace_back(id, n);
    budget -= n;
    partial += counted ? 1 : 0;
    partial_long += is_long ? 1 : 0;
  }
  // Speculation last: drafts take only the budget and blocks every running request's token and
  // every admission left over, decodes in admission order.
  const size_t busy = cfg_.speculation.disable_by_batch_size;
  // A step that had to preempt is short of blocks.
  if (budget >= 2 && plan.preempted.empty() && !(busy > 0 && running_.size() > busy)) speculate(picks, budget);
  for (const auto& [id, n] : picks) {
    const auto& r = requests_.at(id);
    scheduled_seq s;
    s.id = id;
    s.pos0 = r.n_computed;
    s.tokens = std::span<const int32_t>(r.tokens).subspan(r.n_computed, n);
    s.block_table = r.blocks.ids;
    s.want_logits = r.n_computed + n == r.tokens.size();
    s.lora = r.spec.lora;
    s.adapter = r.spec.adapter.get();
    if (r.spec.pool != pooling::none) {  // an embedding: no draw, the hidden rows its pooling needs
      s.hidden = r.spec.pool == pooling::mean || r.spec.pool == pooling::all ? model::hidden_rows::all
                 : r.spec.pool == pooling::cls ? (s.pos0 == 0 ? model::hidden_rows::first : model::hidden_rows::none)
                 : s.want_logits               ? model::hidden_rows::last
                                               : model::hidden_rows::none;
      s.want_logits = false;
    }
    if (!r.step_tokens.empty()) {  // the last token, then its drafts
      s.tokens = r.step_tokens;
      s.want_logits = true;
      s.draws = static_cast<uint32_t>(r.step_tokens.size());
      drafted_ += r.step_tokens.size() - 1;
    }
    if (scoring(r)) {  // before the first token, tokens are the prompt
      s.prompt_logprobs = r.spec.prompt_logprobs;
      s.next = s.want_logits ? -1 : r.tokens[r.n_computed + n];
    }
    plan.seqs.push_back(s);
    plan.n_tokens += n;
  }
  return plan;
}

std::vector<token_event> batch_scheduler::complete(const step_plan& plan, std::span<const int32_t> sampled) {
  std::vector<token_event> events;
  size_t next = 0;
  for (const auto& s : plan.seqs) {
    auto it = requests_.find(s.id);
    if (it == requests_.end()) {  // cancelled while the step ran
      if (s.want_logits) next += s.draws;
      continue;
    }
    auto& r = it->second;
    const auto drafts = s.tokens.last(s.draws - 1);  // empty unless it speculated
    r.n_computed = s.pos0 + s.tokens.size() - drafts.size();
    if (s.want_logits && next + s.draws > sampled.size()) {  // a short result: the caller's bug; keep state sane
      r.step_tokens.clear();
      blocks_.commit(r.blocks, std::span<const int32_t>(r.tokens).first(r.n_computed));
      break;
    }
    if (r.spec.pool != pooling::none) {  // an embedding ends once its prompt is computed
      blocks_.commit(r.blocks, std::span<const int32_t>(r.tokens).first(r.n_computed));
      if (r.n_computed < r.tokens.size()) continue;
      token_event e;
      e.id = s.id;
      e.finish = finish_reason::length;
      e.cached_tokens = static_cast<int32_t>(r.cached.value_or(0));
      r.first_token = std::chrono::steady_clock::now();  // its end is its one result
      r.cached_reported = true;
      e.times = times_of(r, true);
      events.push_back(std::move(e));
      cancel(s.id);
      continue;
    }
    bool finished = false;
    size_t kept = 0;
    for (size_t i = 0; s.want_logits && i < s.draws; ++i) {
      const int32_t tok = sampled[next + i];
      r.tokens.push_back(tok);
      ++r.n_generated;
      token_event e;
      e.id = s.id;
      e.token = tok;
      e.row = next + i;
      if (std::find(r.spec.eos_ids.begin(), r.spec.eos_ids.end(), tok) != r.spec.eos_ids.end()) {
        e.finish = finish_reason::eos;
      } else if (r.n_generated >= r.spec.max_tokens) {
        e.finish = finish_reason::length;
      }
      if (!r.cached_reported) {
        e.cached_tokens = static_cast<int32_t>(r.cached.value_or(0));
        r.cached_reported = true;
        r.first_token = std::chrono::steady_clock::now();
        e.times = times_of(r, false);
      }
      if (e.finish != finish_reason::none) e.times = times_of(r, true);
      events.push_back(e);
      finished = e.finish != finish_reason::none;
      // A draft drawn as proposed is kept: its KV is in place, and the row after it was drawn
      // from the logits a plain decode would have had there.
      if (finished || i >= drafts.size() || tok != drafts[i]) break;
      ++kept;
    }
    if (s.want_logits) next += s.draws;
    accepted_ += kept;
    r.n_computed += kept;
    if (!drafts.empty() && !finished) {  // how much to try next time
      if (kept == 0) {
        r.draft_cap = 1;
        r.sit_out = (size_t{1} << std::min(r.misses, 5u)) - 1;  // 0, 1, 3, ... 31 steps
        ++r.misses;
      } else {
        r.misses = 0;
        r.draft_cap = kept == drafts.size() ? 2 * kept : kept + 1;
      }
    }
    r.step_tokens.clear();
    blocks_.commit(r.blocks, std::span<const int32_t>(r.tokens).first(r.n_computed));
    if (!drafts.empty()) blocks_.trim(r.blocks, r.n_computed);  // the blocks of drafts not kept, as a plain step leaves it
    if (finished) cancel(s.id);
  }
  return events;
}

}  // namespace llmesh::actors
