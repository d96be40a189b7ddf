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

usage_counts completion_group::usage() const {
  usage_counts u;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const usage_counts c = choices_[i].stream->usage();
    if (i % g_.candidates() == 0) u.prompt_tokens += c.prompt_tokens;  // a prompt's first choice counts it
    u.completion_tokens += c.completion_tokens;
  }
  return u;
}

std::string completion_group::fail(const error& e) {
  done_ = true;
  for (const auto& m : choices_) {
    if (!m.stream->done()) cancels_.push_back(m.request_id);
  }
  if (!started_) {
    failure_ = e;  // nothing went out: the answer is this error (the status is still free)
    return "";
  }
  // Mid-stream: the status is already 200; the error travels as an event, then [DONE].
  return sse_event(error_json(e)) + std::string(sse_done);
}

std::string completion_group::on_message(const actors::token_msg& t) {
  if (done_) return "";
  auto it = std::find_if(choices_.begin(), choices_.end(), [&](const member& m) { return m.request_id == t.id; });
  if (it == choices_.end() || it->stream->done()) return "";
  std::string bytes = it->stream->on_message(t);
  if (it->stream->failure()) return fail(*it->stream->failure());
  if (!bytes.empty()) started_ = true;
  if (it->stream->stopped_by_string()) cancels_.push_back(t.id);  // only this choice ends
  if (it->stream->done() && ++finished_ == choices_.size()) {
    done_ = true;
    if (g_.streaming) {
      if (g_.include_usage) bytes += sse_event(usage_chunk_json(chunk_kind(), g_.id, g_.created, g_.model, usage()));
      bytes += sse_done;
      started_ = true;
    }
  }
  return bytes;
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
    for (size_t i = first; i < std::min(first + per_prompt, choices_.size()); ++i) order.push_back(i);
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
  if (failure_) return error_reply(*failure_);
  http_reply r;
  r.body = response_json(g_.chat ? "chat.completion" : "text_completion", g_.id, g_.created, g_.model, results(),
                         usage());
  return r;
}

}  // namespace llmesh::gateway
