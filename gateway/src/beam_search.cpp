// Beam search over the mesh (beam_search.hpp).
#include "llmesh/gateway/beam_search.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace llmesh::gateway {

beam_search::beam_search(beam_setup s, std::function<uint64_t()> next_id) : s_(std::move(s)), next_id_(std::move(next_id)) {
  s_.width = std::clamp<size_t>(s_.width, 1, max_beam_width);
  if (!s_.stop.empty() && s_.detok) {
    auto first = std::make_shared<text_state>(text_state{model::stream_decoder(*s_.detok, s_.skip_special), stop_matcher(s_.stop)});
    first->decoder.keep_special(s_.keep_special);
    live_.front().text = std::move(first);
  }
  if (s_.base.max_tokens == 0) {
    done_ = true;  // nothing to generate (api_service never asks this)
    return;
  }
  begin_step();
}

std::vector<actors::replica_request> beam_search::take_requests() {
  std::vector<actors::replica_request> out;
  out.swap(ready_);
  return out;
}

bool beam_search::owns(uint64_t id) const {
  return std::any_of(step_.begin(), step_.end(), [&](const pending& p) { return p.id == id; });
}

std::vector<uint64_t> beam_search::running() const {
  std::vector<uint64_t> out;
  for (const auto& p : step_) {
    if (!p.result) out.push_back(p.id);
  }
  return out;
}

bool beam_search::is_end(int32_t token) const {
  return std::find(s_.base.eos_ids.begin(), s_.base.eos_ids.end(), token) != s_.base.eos_ids.end();
}

double beam_search::score_of(const beam_hypothesis& h) const {
  // vLLM's get_beam_search_score: the length counts the prompt, not an end id.
  const double len = static_cast<double>(s_.base.prompt.size() + h.tokens.size() - (h.ended && !h.by_stop ? 1 : 0));
  return h.cumulative_logprob / std::pow(std::max(len, 1.0), s_.length_penalty);
}

void beam_search::begin_step() {
  step_.clear();
  // Every step asks for the row's 2 × width most likely tokens, or the client's deeper count.
  const int alternatives = std::max(static_cast<int>(2 * s_.width), s_.logprobs);
  for (size_t b = 0; b < live_.size(); ++b) {
    actors::replica_request r = s_.base;
    r.id = next_id_();
    const auto& tokens = live_[b].h.tokens;
    r.prompt.insert(r.prompt.end(), tokens.begin(), tokens.end());
    r.generated = s_.base.generated + tokens.size();
    r.max_tokens = 1;
    r.sampling.logprobs = alternatives;
    r.sampling.processed_logprobs = true;  // masked tokens -inf: the beams honour what the request allows
    if (steps_done_ > 0) r.sampling.prompt_logprobs = -1;  // the prompt is scored once, by the first step
    step_.push_back({r.id, b, std::nullopt});
    ready_.push_back(std::move(r));
  }
}

void beam_search::on_message(const actors::token_msg& t) {
  if (done_) return;
  auto it = std::find_if(step_.begin(), step_.end(), [&](const pending& p) { return p.id == t.id; });
  if (it == step_.end() || it->result) return;
  if (t.failed) {
    failure_ = t.err;
    done_ = true;
    return;
  }
  if (t.finish == actors::finish_reason::none) return;  // a one-token request ends with its token
  if (!t.logprobs) {
    failure_ = make_error(errc::internal, "beam search: a step's token came without its log-probabilities");
    done_ = true;
    return;
  }
  it->result = t;
  if (std::all_of(step_.begin(), step_.end(), [](const pending& p) { return p.result.has_value(); })) end_step();
}

actors::token_msg beam_search::replayed(size_t r, size_t i, uint64_t id) const {
  const beam_hypothesis& h = completed_.at(r);
  actors::token_msg t;
  t.id = id;
  t.token = h.tokens.at(i);
  const bool last = i + 1 == h.tokens.size();
  t.finish = !last ? actors::finish_reason::none : h.ended ? actors::finish_reason::eos : actors::finish_reason::length;
  t.logprobs = h.logprobs.at(i);
  if (i == 0) {
    t.prompt_logprobs = prompt_logprobs_;
    t.cached_tokens = cached_tokens_;
  }
  return t;
}

void beam_search::end_step() {
  if (steps_done_ == 0 && !step_.empty()) {
    prompt_logprobs_ = step_.front().result->prompt_logprobs;
    cached_tokens_ = step_.front().result->cached_tokens;
  }
  std::vector<live_beam> extended;
  const size_t min_tokens = static_cast<size_t>(std::max(s_.base.sampling.min_tokens, 0));
  for (const pending& p : step_) {
    const live_beam& beam = live_[p.beam];
    const kernels::token_logprobs& row = *p.result->logprobs;
    // The candidates: the drawn token (with a temperature it may lie outside the row's most
    // likely), then the most likely in order.
    struct candidate {
      int32_t id;
      float logprob;
      int32_t rank;
    };
    std::vector<candidate> candidates;
    // The candidates are vLLM's 2 × width, whatever deeper row the client asked to see.
    const size_t considered = std::min(row.top.size(), 2 * s_.width);
    const bool drawn_in_top = std::any_of(row.top.begin(), row.top.begin() + static_cast<std::ptrdiff_t>(considered),
                                          [&](const auto& e) { return e.id == p.result->token; });
    if (!drawn_in_top) candidates.push_back({p.result->token, row.logprob, row.rank});
    for (size_t j = 0; j < considered; ++j) {
      candidates.push_back({row.top[j].id, row.top[j].logprob, static_cast<int32_t>(j + 1)});
    }
    for (const candidate& c : candidates) {
      if (!std::isfinite(c.logprob)) continue;  // masked (a grammar, a ban): never drawn
      beam_hypothesis h = beam.h;
      h.tokens.push_back(c.id);
      kernels::token_logprobs entry;
      entry.logprob = c.logprob;
      entry.rank = c.rank;
      if (s_.logprobs > 0) {
        entry.top.assign(row.top.begin(), row.top.begin() + std::min<size_t>(row.top.size(), static_cast<size_t>(s_.logprobs)));
      }
      h.logprobs.push_back(std::move(entry));
      h.cumulative_logprob += c.logprob;
      h.ended = is_end(c.id);
      std::shared_ptr<const text_state> text;
      if (!h.ended && beam.text) {
        // The choice's stream pushes the same pieces through the same matcher: it will cut the
        // text where this sees the stop.
        auto next = std::make_shared<text_state>(*beam.text);
        const auto out = next->matcher.push(next->decoder.push(c.id), h.tokens.size() > min_tokens);
        h.ended = h.by_stop = out.stopped;
        text = std::move(next);
      }
      h.score = score_of(h);
      if (h.ended) {
        completed_.push_back(std::move(h));
      } else {
        extended.push_back({std::move(h), std::move(text)});
      }
    }
  }
  // A NaN score (0/0 with an extreme length_penalty) ranks last, keeping the order strict.
  auto key = [](const beam_hypothesis& h) { return std::isnan(h.score) ? -std::numeric_limits<double>::infinity() : h.score; };
  auto by_score = [&](const beam_hypothesis& a, const beam_hypothesis& b) { return key(a) > key(b); };
  std::stable_sort(extended.begin(), extended.end(), [&](const live_beam& a, const live_beam& b) { return by_score(a.h, b.h); });
  if (extended.size() > s_.width) extended.resize(s_.width);
  live_ = std::move(extended);
  step_.clear();
  ++steps_done_;
  if (steps_done_ < s_.base.max_tokens && !live_.empty()) {
    begin_step();
    return;
  }
  // The end: the live beams (out of steps) join the complete ones; the best `width` remain.
  for (auto& b : live_) completed_.push_back(std::move(b.h));
  live_.clear();
  std::stable_sort(completed_.begin(), completed_.end(), by_score);
  if (completed_.size() > s_.width) completed_.resize(s_.width);
  done_ = true;
}

}  // namespace llmesh::gateway
