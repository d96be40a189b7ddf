#include "llmesh/model/generate.hpp"

#include <algorithm>
#include <chrono>
#include <map>

namespace llmesh::model {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The token to emit: the request's penalties and min_tokens applied to a copy of the logits
/// (the seen tokens counted afresh from the prompt and output every time: the plain reference
/// the replica's incremental bookkeeping is tested against), then sample().
int32_t next_token(std::span<const float> logits, const generate_request& req, const std::vector<int32_t>& output,
                   size_t position) {
  if (!kernels::has_adjustments(req.sampling) && req.logit_bias.empty()) {
    return kernels::sample(logits, req.sampling, position);
  }
  std::map<int32_t, int32_t> counts;
  for (int32_t t : req.prompt) counts.emplace(t, 0);
  for (int32_t t : output) ++counts[t];
  std::vector<kernels::seen_token> seen;
  for (const auto& [id, n] : counts) seen.push_back({id, n});
  kernels::logits_adjust a{seen, {}, req.logit_bias, {}};
  if (output.size() < static_cast<size_t>(std::max(req.sampling.min_tokens, 0))) a.banned = req.stop_ids;
  std::vector<float> row(logits.begin(), logits.end());
  kernels::apply_adjust(row, req.sampling, a);
  return kernels::sample(row, req.sampling, position);
}

}  // namespace

result<generate_result> generate(engine& eng, const generate_request& req,
                                 const std::function<void(int32_t)>& on_token) {
  if (req.prompt.empty()) return make_error(errc::invalid_request, "the prompt is empty");
  const size_t vocab = eng.config().vocab;
  int seq = eng.open_sequence();
  struct closer {
    engine& e;
    int s;
    ~closer() { e.close_sequence(s); }
  } close_at_exit{eng, seq};

  generate_result out;
  std::vector<float> logits;
  auto t0 = std::chrono::steady_clock::now();
  size_t chunk = req.prefill_chunk == 0 ? req.prompt.size() : req.prefill_chunk;
  for (size_t at = 0; at < req.prompt.size(); at += chunk) {
    size_t n = std::min(chunk, req.prompt.size() - at);
    bool last = at + n == req.prompt.size();
    step_item item{seq, std::span(req.prompt).subspan(at, n), last, req.lora};
    LLMESH_TRY(eng.step(std::span(&item, 1), logits));
  }
  out.prefill_seconds = seconds_since(t0);
  out.first_logits.assign(logits.begin(), logits.begin() + static_cast<ptrdiff_t>(vocab));
  out.finish_reason = "length";

  t0 = std::chrono::steady_clock::now();
  size_t position = req.prompt.size();
  while (out.tokens.size() < req.max_tokens) {
    int32_t next = next_token(std::span(logits.data(), vocab), req, out.tokens, position);
    out.tokens.push_back(next);
    if (on_token) on_token(next);
    if (std::find(req.stop_ids.begin(), req.stop_ids.end(), next) != req.stop_ids.end()) {
      out.finish_reason = "stop";
      break;
    }
    if (out.tokens.size() == req.max_tokens) break;
    step_item item{seq, std::span(&out.tokens.back(), 1), true, req.lora};
    LLMESH_TRY(eng.step(std::span(&item, 1), logits));
    ++position;
  }
  out.decode_seconds = seconds_since(t0);
  return out;
}

}  // namespace llmesh::model
