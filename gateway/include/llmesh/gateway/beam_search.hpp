// Beam search over the mesh (vLLM's use_beam_search), a plain class: no CAF, no I/O. Each
// step asks the mesh for one token after every live beam — a request whose prompt is the
// prompt plus the beam's tokens, those tokens counted as output already generated (as a
// continued request's are) — with 2 × width alternatives; every alternative with a finite
// log-probability extends its beam; a beam extended by an end id is complete; the `width`
// best of the rest live on. The steps ask for processed log-probabilities
// (sampling_params::processed_logprobs: after the request's biases, penalties, bans,
// min_tokens and grammar mask; a masked token is -inf), so the beams honour all of them — a
// structured output's beams all match it. With stop strings, each beam carries its text's
// decoder and stop matcher (completion_stream's, so the replay cuts the text where the search
// saw the stop): a beam whose text shows one is complete, as at an end id. After max_tokens steps (or when no beam lives) the `width` best of the complete and
// the live beams are the result, best first.
//
// The order is vLLM's (vllm/beam_search.py, EngineClient.beam_search): a beam's score is its
// cumulative log-probability / len^length_penalty, len counting the prompt's tokens and the
// beam's, an end id excluded; sorts are stable, ties keep the earlier beam and, within a beam,
// the more likely alternative (the drawn token first when it is not among them). There is no
// early stop: vLLM has none either (a longer beam may still score higher with a length
// penalty). The mesh's kernels are batch-invariant and its prefix cache keeps each beam's
// blocks, so a step costs a beam about one block of prefill.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "llmesh/actors/replica_core.hpp"
#include "llmesh/actors/token_stream.hpp"
#include "llmesh/common/error.hpp"
#include "llmesh/gateway/stop_matcher.hpp"
#include "llmesh/model/detokenizer.hpp"

namespace llmesh::gateway {

/// The widest beam: a step asks 2 × width alternatives, at most kernels::max_logprobs.
inline constexpr size_t max_beam_width = kernels::max_logprobs / 2;

struct beam_setup {
  /// The prompt's request as a plain generation would send it: prompt, max_tokens (the
  /// budget: steps at most), sampling (temperature and seed pick the drawn token, which is a
  /// candidate too), eos_ids (end a beam), model, constraint, biases. Its id is unused.
  actors::replica_request base;
  size_t width = 1;             ///< beams kept each step and returned (the request's n), 1..max_beam_width
  double length_penalty = 1.0;  ///< vLLM's: the score divides by len^length_penalty
  /// Alternatives each returned token's log-probability entry keeps (the client's logprobs);
  /// -1: none kept.
  int logprobs = -1;
  /// The request's stop strings: a beam whose text (decoded by `detok` as the choice's stream
  /// decodes it: skip_special, keep_special) shows one past base.sampling.min_tokens is
  /// complete. Empty: none (detok may be null).
  std::vector<std::string> stop;
  const model::detokenizer* detok = nullptr;
  bool skip_special = true;
  std::vector<int32_t> keep_special;
};

/// One beam: the tokens after the prompt and each one's log-probability entry.
struct beam_hypothesis {
  std::vector<int32_t> tokens;
  /// One per token: its log-probability, rank and (setup.logprobs of) the row's alternatives.
  std::vector<kernels::token_logprobs> logprobs;
  double cumulative_logprob = 0.0;
  bool ended = false;    ///< its last token is an end id or completes a stop string (finish "stop")
  bool by_stop = false;  ///< ended by a stop string (its length then counts every token)
  double score = 0.0;  ///< what it is ranked by (see the file comment)
};

/// Thread affinity: one thread (the connection's). `next_id` hands out mesh request ids.
class beam_search {
 public:
  beam_search(beam_setup s, std::function<uint64_t()> next_id);

  /// The requests of the step to run now (the first: the prompt alone), each once; empty while
  /// a step runs and once done.
  std::vector<actors::replica_request> take_requests();
  /// Whether `id` is one of the running step's requests.
  bool owns(uint64_t id) const;
  /// Takes one message of a running request (others are ignored). The last message of a
  /// step's last request ends the step: the next step's requests are then ready, or done().
  void on_message(const actors::token_msg& t);

  const beam_setup& setup() const { return s_; }
  bool done() const { return done_; }
  const std::optional<error>& failure() const { return failure_; }
  /// The running step's requests that have not ended (to cancel when the response fails).
  std::vector<uint64_t> running() const;
  /// The best hypotheses, best first: `width` of them, or fewer when fewer outputs were
  /// possible (a vocabulary smaller than 2 × width, -inf logits). REQUIRES: done() and no
  /// failure().
  const std::vector<beam_hypothesis>& results() const { return completed_; }
  /// The prompt's log-probabilities, when the base request asked (sampling.prompt_logprobs):
  /// from the first step, as its token message carried them.
  const std::vector<kernels::token_logprobs>& prompt_logprobs() const { return prompt_logprobs_; }
  /// The prompt tokens the prefix cache held for the first step (its token message's word;
  /// -1 before it, or when the replica did not say).
  int32_t cached_tokens() const { return cached_tokens_; }
  /// Token i of result r as a generation's message to choice `id` would carry it (the last one
  /// ending it, eos for a complete beam; the first with the prompt's logprobs and the cache hit):
  /// how a finished search is replayed into its choices. REQUIRES: i < results()[r].tokens.size().
  actors::token_msg replayed(size_t r, size_t i, uint64_t id) const;

 private:
  /// A beam's text so far, for its stop strings (shared by the beams it forks into until one
  /// extends it).
  struct text_state {
    model::stream_decoder decoder;
    stop_matcher matcher;
  };
  /// A live beam and its text state (null without stop strings).
  struct live_beam {
    beam_hypothesis h;
    std::shared_ptr<const text_state> text;
  };
  struct pending {
    uint64_t id = 0;
    size_t beam = 0;  ///< index into live_
    std::optional<actors::token_msg> result;
  };
  void begin_step();
  void end_step();
  double score_of(const beam_hypothesis& h) const;
  bool is_end(int32_t token) const;

  beam_setup s_;
  std::function<uint64_t()> next_id_;
  std::vector<live_beam> live_{1};  ///< the first step's one empty beam
  std::vector<beam_hypothesis> completed_;
  std::vector<pending> step_;
  std::vector<actors::replica_request> ready_;
  std::vector<kernels::token_logprobs> prompt_logprobs_;
  size_t steps_done_ = 0;
  int32_t cached_tokens_ = -1;
  bool done_ = false;
  std::optional<error> failure_;
};

}  // namespace llmesh::gateway
