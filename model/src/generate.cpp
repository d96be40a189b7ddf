#include "llmesh/model/generate.hpp"

#include <algorithm>
#include <chrono>

namespace llmesh::model {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
    step_item item{seq, std::span(req.prompt).subspan(at, n), last};
    LLMESH_TRY(eng.step(std::span(&item, 1), logits));
  }
  out.prefill_seconds = seconds_since(t0);
  out.first_logits.assign(logits.begin(), logits.begin() + static_cast<ptrdiff_t>(vocab));
  out.finish_reason = "length";

  t0 = std::chrono::steady_clock::now();
  size_t position = req.prompt.size();
  while (out.tokens.size() < req.max_tokens) {
    int32_t next = kernels::sample(std::span(logits.data(), vocab), req.sampling, position);
    out.tokens.push_back(next);
    if (on_token) on_token(next);
    if (std::find(req.stop_ids.begin(), req.stop_ids.end(), next) != req.stop_ids.end()) {
      out.finish_reason = "stop";
      break;
    }
    if (out.tokens.size() == req.max_tokens) break;
    step_item item{seq, std::span(&out.tokens.back(), 1), true};
    LLMESH_TRY(eng.step(std::span(&item, 1), logits));
    ++position;
  }
  out.decode_seconds = seconds_since(t0);
  return out;
}

}  // namespace llmesh::model
