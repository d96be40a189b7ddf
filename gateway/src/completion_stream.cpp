// A generation's client-side output (completion_stream.hpp).
#include "llmesh/gateway/completion_stream.hpp"

#include <algorithm>
#include <limits>

#include "llmesh/actors/serving_metrics.hpp"
#include "llmesh/gateway/openai_api.hpp"

namespace llmesh::gateway {

namespace metric = actors::metric;

http_reply error_reply(const error& e) {
  http_reply r;
  r.status = http_error_of(e.code).status;
  r.body = error_json(e);
  if (e.code == errc::overloaded) r.headers.emplace_back("Retry-After", "1");
  return r;
}

completion_stream::completion_stream(stream_setup s, const model::detokenizer& d, actors::metrics_registry* metrics)
    : s_(std::move(s)),
      detok_(d),
      decoder_(d, s_.skip_special),
      matcher_(s_.stop, s_.include_stop_str),
      metrics_(metrics),
      start_(std::chrono::steady_clock::now()),
      text_(s_.streaming ? std::string() : s_.echo_prefix) {
  if (metrics_) {
    metric::declare_serving(*metrics_);
    metrics_->get_counter(metric::prompt_tokens)->add(static_cast<double>(s_.prompt_ids.size()));
  }
  last_ = start_;
  decoder_.keep_special(s_.keep_special);
  if (s_.chat && s_.streaming && s_.tools.shapes()) tool_stream_.emplace(s_.tools);
  if (s_.chat && s_.streaming && s_.reasoning.active()) reasoning_stream_.emplace(s_.reasoning);
}

void completion_stream::observe_token() {
  if (!metrics_) return;
  const auto now = std::chrono::steady_clock::now();
  metrics_->get_histogram(tokens_.size() == 1 ? metric::ttft : metric::itl)
      ->observe(std::chrono::duration<double>(now - (tokens_.size() == 1 ? start_ : last_)).count());
  metrics_->get_counter(metric::generation_tokens)->add();
  last_ = now;
}

logprob_entry completion_stream::entry_of(int32_t id, const kernels::token_logprobs* lp, size_t text_offset) const {
  auto token = [this](int32_t tid, float logprob) {
    logprob_token out;
    out.bytes = s_.tokens_as_ids ? "token_id:" + std::to_string(tid) : detok_.token_bytes(tid);
    out.text = model::sanitize_utf8(out.bytes);  // U+FFFD for a piece of a character (see logprob_token)
    out.logprob = logprob;
    return out;
  };
  logprob_entry e;
  e.text_offset = text_offset;
  if (!lp) {  // unknown (the mesh owes them on every token that asked): null
    e.chosen = token(id, std::numeric_limits<float>::quiet_NaN());
    return e;
  }
  e.chosen = token(id, lp->logprob);
  const size_t n = std::min(lp->top.size(), static_cast<size_t>(std::max(s_.logprobs, 0)));
  for (size_t i = 0; i < n; ++i) e.top.push_back(token(lp->top[i].id, lp->top[i].logprob));
  return e;
}

bool completion_stream::ready(const pending_entry& p) const {
  // Some of its text is out, or none of it is left to come. Offsets only grow along the
  // stream, so the ready entries are always a prefix of pending_.
  return p.entry.text_offset < released_bytes_ || p.text_end <= released_bytes_;
}

void completion_stream::take_prompt_entries(const actors::token_msg& t) {
  size_t offset = 0;
  for (size_t i = 0; i < s_.prompt_ids.size(); ++i) {
    // Prompt token i's scores are entry i - 1; the first token has no context to be scored in.
    const bool scored = i > 0 && i - 1 < t.prompt_logprobs.size();
    logprob_entry e = entry_of(s_.prompt_ids[i], scored ? &t.prompt_logprobs[i - 1] : nullptr, offset);
    e.top_null = i == 0;
    offset += model::sanitize_utf8(detok_.token_bytes(s_.prompt_ids[i])).size();  // the text's, named by id or not
    prompt_entries_.push_back(std::move(e));
  }
  prompt_text_bytes_ = offset;
}

void completion_stream::take_prompt_scores(const actors::token_msg& t) {
  auto& out = prompt_scores_.emplace();
  auto item = [this](int32_t id, float logprob, int32_t rank) {
    return prompt_logprob_item{id, logprob, rank, model::sanitize_utf8(detok_.token_bytes(id))};
  };
  for (size_t i = 0; i < s_.prompt_ids.size(); ++i) {
    // Prompt token i's scores are entry i - 1; the first token has no context to be scored in.
    if (i == 0 || i - 1 >= t.prompt_logprobs.size()) {
      out.emplace_back(std::nullopt);
      continue;
    }
    const auto& lp = t.prompt_logprobs[i - 1];
    const int32_t id = s_.prompt_ids[i];
    std::vector<prompt_logprob_item> items{item(id, lp.logprob, lp.rank)};
    const size_t n = std::min(lp.top.size(), static_cast<size_t>(s_.prompt_logprobs));
    for (size_t k = 0; k < n; ++k) {
      // Among the top, the token keeps one entry with its place there (vLLM's dict update).
      if (lp.top[k].id == id) items.front().rank = static_cast<int32_t>(k + 1);
      else items.push_back(item(lp.top[k].id, lp.top[k].logprob, static_cast<int32_t>(k + 1)));
    }
    out.emplace_back(std::move(items));
  }
}

logprob_entry completion_stream::reported(logprob_entry e) const {
  e.text_offset += prompt_text_bytes_;  // 0 without echo's entries
  return e;
}

void completion_stream::take_ready(std::vector<logprob_entry>& out) {
  if (!started_) {  // the echoed prompt's entries ride with its text on the first chunk
    for (auto& e : prompt_entries_) out.push_back(std::move(e));
    prompt_entries_.clear();
  }
  size_t n = 0;
  for (; n < pending_.size() && ready(pending_[n]); ++n) out.push_back(reported(std::move(pending_[n].entry)));
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
}

std::string completion_stream::chunk(const std::string& text, const std::optional<std::string>& finish) {
  choice_delta c;
  c.index = s_.index;
  c.text = started_ ? text : s_.echo_prefix + text;
  c.finish = finish;
  if (finish) stop_reason_into(c);
  c.role = s_.chat && !started_;
  c.role_name = s_.role;
  if (s_.return_token_ids) {
    c.with_token_ids = true;
    c.token_ids.assign(tokens_.begin() + static_cast<std::ptrdiff_t>(ids_sent_), tokens_.end());
    ids_sent_ = tokens_.size();
    if (!started_) c.prompt_token_ids = s_.prompt_ids;
  }
  if (s_.logprobs >= 0) take_ready(c.logprobs.emplace());
  started_ = true;
  const std::string_view kind = s_.chat ? "chat.completion.chunk" : "text_completion";
  if (reasoning_stream_) {
    reasoning_stream_->shape(c);  // the thinking leaves the text; a held tag piece sends nothing
    if (empty_delta(c)) return "";
  }
  const auto u = s_.continuous_usage ? std::optional<usage_counts>(usage()) : std::nullopt;
  if (!tool_stream_) return sse_event(chunk_json(kind, s_.id, s_.created, s_.model, c, u));
  std::string out;  // chat with tools: the text becomes tool_calls deltas (or is held)
  for (const auto& d : tool_stream_->shape(std::move(c))) out += sse_event(chunk_json(kind, s_.id, s_.created, s_.model, d, u));
  return out;
}

std::string completion_stream::finish(const std::string& reason, std::string text) {
  done_ = true;
  finish_reason_ = reason;
  if (metrics_) {
    metrics_->get_histogram(metric::e2e)
        ->observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    metric::observe_finished(*metrics_, reason, s_.prompt_ids.size(), tokens_.size());
  }
  std::string rest = std::move(text);  // the last token's text rides on the final chunk (as vLLM sends it)
  if (!stopped_by_string_) {
    const std::string tail = decoder_.flush();
    decoded_bytes_ += tail.size();
    auto out = matcher_.push(tail, past_min_tokens());
    const std::string released = out.text + (out.stopped ? "" : matcher_.flush());
    released_bytes_ += released.size();
    rest += released;
  }
  // From here on released_bytes_ is the whole text: pending entries still not ready had all
  // their text cut by a stop string, and are never reported.
  if (!s_.streaming) {
    text_ += rest;
    return "";
  }
  if (s_.keep_text) text_ += rest;
  return chunk(rest, reason);
}

std::string completion_stream::on_message(const actors::token_msg& t) {
  if (done_) return "";
  if (t.failed) {
    done_ = true;
    failure_ = t.err;
    return "";  // completion_group answers: an error reply, or an error event mid-stream
  }
  if (s_.echo_logprobs && tokens_.empty()) take_prompt_entries(t);
  if (s_.prompt_logprobs >= 0 && tokens_.empty()) take_prompt_scores(t);
  if (tokens_.empty() && t.cached_tokens >= 0) {
    // Of the prompt (a continued request's count also covers its earlier output; and the
    // first replica's word stands after a migration).
    cached_ = std::min(static_cast<size_t>(t.cached_tokens), s_.prompt_ids.size());
    if (metrics_) metrics_->get_counter(metric::prompt_tokens_cached)->add(static_cast<double>(*cached_));
  }
  times_.update(t.times);
  if (metrics_) metric::observe_replica_times(*metrics_, t.times, tokens_.empty());
  tokens_.push_back(t.token);
  if (t.logprobs) cumulative_logprob_ += t.logprobs->logprob;
  observe_token();
  // A requested stop token ends the text before itself (vLLM's default); an EOS id's text is
  // empty anyway, being a special token the decoder skips — or, with skip_special_tokens false,
  // left out as vLLM leaves out the token that stopped it.
  const bool stop_token = ending_token_unshown(t, s_.stop_token_ids, s_.skip_special, detok_);
  const size_t text_start = decoded_bytes_;
  const std::string piece = stop_token && !s_.include_stop_str ? std::string() : decoder_.push(t.token);
  decoded_bytes_ += piece.size();
  if (s_.logprobs >= 0) pending_.push_back({entry_of(t.token, t.logprobs ? &*t.logprobs : nullptr, text_start), decoded_bytes_});
  auto out = matcher_.push(piece, past_min_tokens());
  released_bytes_ += out.text.size();
  if (out.stopped) {
    stopped_by_string_ = true;
    return finish("stop", std::move(out.text));
  }
  if (t.finish == actors::finish_reason::eos &&
      std::find(s_.stop_reason_ids.begin(), s_.stop_reason_ids.end(), t.token) != s_.stop_reason_ids.end()) {
    stop_token_ = t.token;  // vLLM's stop_reason: a stop id, not the tokenizer's EOS
  }
  if (t.finish != actors::finish_reason::none) {
    return finish(t.finish == actors::finish_reason::length ? "length" : "stop", std::move(out.text));
  }
  if (!s_.streaming) {
    text_ += out.text;
    return "";
  }
  if (s_.keep_text) text_ += out.text;
  // The first chunk goes out at once (it carries the role); later ones when there is text.
  if (out.text.empty() && started_) return "";
  return chunk(out.text, std::nullopt);
}

void completion_stream::stop_reason_into(choice_delta& c) const {
  if (stopped_by_string_) {
    c.stop_string = matcher_.matched();
  } else {
    c.stop_token = stop_token_;
  }
}

choice_delta completion_stream::result() const {
  choice_delta c;
  c.role_name = s_.role;
  c.index = s_.index;
  c.text = text_;
  c.finish = finish_reason_;
  stop_reason_into(c);
  if (s_.return_token_ids) {
    c.with_token_ids = true;
    c.token_ids = tokens_;
    c.prompt_token_ids = s_.prompt_ids;
  }
  if (s_.logprobs >= 0) {
    auto& entries = c.logprobs.emplace();
    entries = prompt_entries_;
    for (const auto& p : pending_) {
      if (ready(p)) entries.push_back(reported(p.entry));
    }
  }
  if (s_.prompt_logprobs >= 0) {
    c.prompt_logprobs = prompt_scores_ ? *prompt_scores_ : std::vector<prompt_logprob_entry>(s_.prompt_ids.size());
  }
  if (s_.chat) {
    split_reasoning(s_.reasoning, c);  // tool calls are looked for in the content only
    shape_tool_calls(s_.tools, c);
  }
  return c;
}

}  // namespace llmesh::gateway
