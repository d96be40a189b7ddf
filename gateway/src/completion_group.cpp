// One response's choices (completion_group.hpp).
#include "llmesh/gateway/completion_group.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace llmesh::gateway {

completion_group::completion_group(group_setup g, const model::detokenizer& d, actors::metrics_registry* metrics)
    : g_(std::move(g)), detok_(d), metrics_(metrics) {
  g_.n = std::max<size_t>(g_.n, 1);
  g_.best_of = std::max<size_t>(g_.best_of, 1);
}

void completion_group::add_choice(uint64_t request_id, stream_setup s) {
  s.chat = g_.chat;
  s.streaming = g_.streaming;
  s.id = g_.id;
  s.created = g_.created;
  s.model = g_.model;
  s.index = choices_.size();
  choices_.push_back({request_id, std::make_unique<completion_stream>(std::move(s), detok_, metrics_)});
}

void completion_group::add_beam_search(std::unique_ptr<beam_search> b, std::vector<uint64_t> choice_ids) {
  for (auto& r : b->take_requests()) submissions_.push_back(std::move(r));
  beams_.push_back({std::move(b), std::move(choice_ids)});
  if (beams_.back().search->done()) replay(beams_.back());  // nothing to search (never streamed)
}

void completion_group::render_as_embeddings(std::unique_ptr<embeddings_output> e) {
  embeddings_ = std::move(e);
  done_ = embeddings_->done();
}

std::vector<actors::replica_request> completion_group::take_submissions() {
  std::vector<actors::replica_request> out;
  out.swap(submissions_);
  if (embeddings_ && !done_) {
    for (auto& r : embeddings_->take_submissions()) out.push_back(std::move(r));
  }
  return out;
}

std::vector<uint64_t> completion_group::running_searches() const {
  std::vector<uint64_t> out;
  for (const auto& b : beams_) {
    if (b.search->done() && !b.search->failure()) continue;  // a failed one's other requests may still run
    for (uint64_t id : b.search->running()) out.push_back(id);
  }
  if (embeddings_) {
    for (uint64_t id : embeddings_->running()) out.push_back(id);
  }
  return out;
}

std::string completion_group::replay(const beam_member& b) {
  std::string bytes;
  const auto& beams = b.search->results();
  for (size_t r = 0; r < b.choice_ids.size(); ++r) {
    if (r >= beams.size()) {
      // Fewer beams than choices: this choice is not in the response.
      auto it = std::find_if(choices_.begin(), choices_.end(), [&](const member& m) { return m.request_id == b.choice_ids[r]; });
      if (it != choices_.end() && !it->absent) {
        it->absent = true;
        if (++finished_ == choices_.size()) bytes += end();
      }
      continue;
    }
    for (size_t i = 0; i < beams[r].tokens.size() && !done_; ++i) bytes += on_chat_message(b.search->replayed(r, i, b.choice_ids[r]));
  }
  return bytes;
}

actors::replica_times completion_group::times() const {
  if (embeddings_) return embeddings_->times();
  actors::replica_times t;
  for (const auto& c : choices_) t.keep_slower(c.stream->times());
  return t;
}

usage_counts completion_group::usage() const {
  usage_counts u;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const usage_counts c = choices_[i].stream->usage();
    if (i % g_.candidates() == 0) {  // a prompt's first choice counts it
      u.prompt_tokens += c.prompt_tokens;
      if (c.cached_tokens) u.cached_tokens = u.cached_tokens.value_or(0) + *c.cached_tokens;
    }
    u.completion_tokens += c.completion_tokens;
    if (c.reasoning_tokens) u.reasoning_tokens = u.reasoning_tokens.value_or(0) + *c.reasoning_tokens;
  }
  return u;
}

std::string completion_group::fail(const error& e) {
  done_ = true;
  for (const auto& m : choices_) {
    if (!m.stream->done()) cancels_.push_back(m.request_id);
  }
  for (uint64_t id : running_searches()) cancels_.push_back(id);
  submissions_.clear();  // another search's next step: not to be run now
  if (!started_) {
    failure_ = e;  // nothing went out: the answer is this error (the status is still free)
    return "";
  }
  // Mid-stream: the status is already 200; the error travels as an event, then [DONE].
  return sse_event(error_json(e)) + std::string(sse_done);
}

std::string completion_group::on_message(const actors::token_msg& t) {
  std::string bytes = on_chat_message(t);
  if (bytes.empty()) return bytes;
  if (responses_) return responses_->stream(bytes);
  return messages_ ? messages_->stream(bytes) : bytes;
}

std::string completion_group::on_chat_message(const actors::token_msg& t) {
  if (done_) return "";
  if (embeddings_) {
    embeddings_->on_message(t);
    if (embeddings_->failure()) return fail(*embeddings_->failure());
    done_ = embeddings_->done();
    return "";
  }
  for (auto& b : beams_) {
    if (b.search->done() || !b.search->owns(t.id)) continue;
    b.search->on_message(t);
    if (b.search->failure()) return fail(*b.search->failure());
    for (auto& r : b.search->take_requests()) submissions_.push_back(std::move(r));
    return b.search->done() ? replay(b) : std::string();
  }
  auto it = std::find_if(choices_.begin(), choices_.end(), [&](const member& m) { return m.request_id == t.id; });
  if (it == choices_.end() || it->stream->done()) return "";
  std::string bytes = it->stream->on_message(t);
  if (it->stream->failure()) return fail(*it->stream->failure());
  if (!bytes.empty()) started_ = true;
  if (it->stream->stopped_by_string()) cancels_.push_back(t.id);  // only this choice ends
  if (it->stream->done() && ++finished_ == choices_.size()) bytes += end();
  return bytes;
}

std::string completion_group::end() {
  done_ = true;
  if (!g_.streaming) return "";
  started_ = true;
  std::string bytes;
  if (g_.include_usage) bytes += sse_event(usage_chunk_json(chunk_kind(), g_.id, g_.created, g_.model, usage()));
  return bytes + std::string(sse_done);
}

std::vector<uint64_t> completion_group::take_cancellations() {
  std::vector<uint64_t> out;
  out.swap(cancels_);
  return out;
}

std::vector<choice_delta> completion_group::results() const {
  std::vector<choice_delta> out;
  const size_t per_prompt = g_.candidates();
  for (size_t first = 0; first < choices_.size(); first += per_prompt) {
    std::vector<size_t> order;  // this prompt's candidates, best first
    for (size_t i = first; i < std::min(first + per_prompt, choices_.size()); ++i) {
      if (!choices_[i].absent) order.push_back(i);
    }
    if (per_prompt > g_.n) {
      // best_of: the highest cumulative log-probability first; stable, so ties keep the lower
      // index. NaN (an engine fault) ranks last, keeping the order strict.
      auto score = [&](size_t i) {
        const double v = choices_[i].stream->cumulative_logprob();
        return std::isnan(v) ? -std::numeric_limits<double>::infinity() : v;
      };
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score(a) > score(b); });
      order.resize(std::min(order.size(), g_.n));
    }
    for (size_t i : order) {
      out.push_back(choices_[i].stream->result());
      out.back().index = out.size() - 1;  // prompt * n + rank
    }
  }
  return out;
}

http_reply completion_group::reply() const {
  if (failure_) {
    http_reply r = error_reply(*failure_);
    if (messages_) r.body = messages_->whole(r.body);
    return r;
  }
  if (embeddings_) return embeddings_->reply();
  http_reply r;
  r.body = response_json(g_.chat ? "chat.completion" : "text_completion", g_.id, g_.created, g_.model, results(),
                         usage());
  if (responses_) r.body = responses_->whole(r.body);
  if (messages_) r.body = messages_->whole(r.body);
  return r;
}

}  // namespace llmesh::gateway
