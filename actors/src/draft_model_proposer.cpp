// Draft-model speculation (draft_model_proposer.hpp): catch each sequence's draft KV up with
// its history, then decode k - 1 more tokens greedily, every sequence of the call in one batch.
#include "llmesh/actors/draft_model_proposer.hpp"

#include <algorithm>
#include <cstdlib>

#include "llmesh/model/detokenizer.hpp"

namespace llmesh::actors {

status check_draft_model(const model::model& draft, const model::model& target, const std::string& target_tokenizer_dir) {
  const std::string what = "draft model " + draft.dir();
  const auto& d = draft.config();
  const auto& t = target.config();
  if (d.classifier.labels > 0) return make_error(errc::invalid_request, what + ": a sequence classifier; a draft model is a causal LM");
  const auto gap = std::llabs(static_cast<long long>(d.vocab) - static_cast<long long>(t.vocab));
  if (gap > 128) {
    return make_error(errc::invalid_request, what + ": its vocabulary (" + std::to_string(d.vocab) + " tokens) is not the target's (" +
                                                 std::to_string(t.vocab) + "): a draft model must share the target's tokenizer");
  }
  auto dt = model::detokenizer::load(draft.dir());
  if (!dt) return make_error(dt.err().code, what + ": its tokenizer is needed to check it shares the target's: " + dt.err().message);
  auto tt = model::detokenizer::load(target_tokenizer_dir);
  if (!tt) return make_error(tt.err().code, "the target's tokenizer: " + tt.err().message);
  const size_t common = std::min(dt->vocab_size(), tt->vocab_size());
  for (size_t i = 0; i < common; ++i) {
    const auto id = static_cast<int32_t>(i);
    if (dt->is_special(id) || tt->is_special(id)) continue;
    if (dt->token_bytes(id) != tt->token_bytes(id)) {
      return make_error(errc::invalid_request, what + ": token " + std::to_string(i) + " is '" + dt->token_bytes(id) +
                                                   "' there and '" + tt->token_bytes(id) +
                                                   "' in the target's tokenizer: a draft model must share the target's tokenizer");
    }
  }
  return ok_status();
}

result<std::shared_ptr<const model::model>> load_draft_model(const std::string& dir, const model::model& target,
                                                             const std::string& target_tokenizer_dir, size_t max_model_len) {
  model::load_options o;
  o.max_model_len = max_model_len != 0 ? max_model_len : target.config().max_positions;  // vLLM: the smaller of the two
  auto m = model::model::load(dir, o);
  if (!m) return make_error(m.err().code, "draft model " + dir + ": " + m.err().message);
  LLMESH_TRY(check_draft_model(**m, target, target_tokenizer_dir));
  return *m;
}

result<std::unique_ptr<draft_model_proposer>> draft_model_proposer::create(std::shared_ptr<const model::model> draft,
                                                                           options opt) {
  if (!draft) return make_error(errc::invalid_request, "draft model: none given");
  if (opt.target_vocab <= 0) return make_error(errc::invalid_request, "draft model: the target's vocabulary size is needed");
  if (opt.chunk == 0) opt.chunk = 512;
  if (opt.catch_up == 0) opt.catch_up = 2048;
  model::engine_options eo;
  eo.tp = 1;
  eo.threads = opt.threads;  // 0: one per hardware thread
  eo.kv_tokens = opt.kv_tokens;
  eo.block_size = opt.block_size;
  eo.kv_type = opt.kv_type;
  eo.device = model::backend::cpu;  // the target may run on a GPU; the draft's engine is the CPU's
  auto e = model::engine::create(std::move(draft), eo);
  if (!e) return make_error(e.err().code, "draft model: " + e.err().message);
  return std::unique_ptr<draft_model_proposer>(new draft_model_proposer(std::move(*e), opt));
}

draft_model_proposer::draft_model_proposer(std::unique_ptr<model::engine> eng, options opt) : eng_(std::move(eng)), opt_(opt) {
  max_positions_ = eng_->config().max_positions;  // (0: the engine refuses every position; no drafts)
  draft_vocab_ = eng_->config().vocab;
  free_.resize(eng_->kv_blocks());
  // Handed out from the back: block 0 first.
  for (size_t i = 0; i < free_.size(); ++i) free_[i] = static_cast<int32_t>(free_.size() - 1 - i);
}

draft_model_proposer::~draft_model_proposer() = default;

void draft_model_proposer::release(sequence& s) {
  free_.insert(free_.end(), s.blocks.begin(), s.blocks.end());
  s.blocks.clear();
  s.tokens.clear();
}

void draft_model_proposer::forget(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  release(it->second);
  seqs_.erase(it);
}

bool draft_model_proposer::reserve(uint64_t id, sequence& s, size_t positions,
                                   const std::unordered_map<uint64_t, size_t>& keep) {
  const size_t bs = eng_->kv_block_size();
  const size_t need = (positions + bs - 1) / bs;
  if (s.blocks.size() >= need) return true;
  const size_t more = need - s.blocks.size();
  if (more > eng_->kv_blocks()) return false;
  while (free_.size() < more) {  // drop the state asked for least recently, never one asked now
    auto victim = seqs_.end();
    for (auto it = seqs_.begin(); it != seqs_.end(); ++it) {
      if (it->first == id || keep.contains(it->first) || it->second.blocks.empty()) continue;
      if (victim == seqs_.end() || it->second.used < victim->second.used) victim = it;
    }
    if (victim == seqs_.end()) return false;
    release(victim->second);
    seqs_.erase(victim);
  }
  for (size_t i = 0; i < more; ++i) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

status draft_model_proposer::fail(const std::string& why, std::vector<std::vector<int32_t>>& out) {
  for (auto& [id, s] : seqs_) release(s);  // the draft KV is in no known state: start over
  seqs_.clear();
  for (auto& o : out) o.clear();
  return make_error(errc::internal, "draft model: " + why);
}

status draft_model_proposer::propose(std::span<const draft_query> queries, std::vector<std::vector<int32_t>>& out) {
  try {
    return run(queries, out);
  } catch (const std::exception& e) {  // a kernel's allocation, say: no drafts, and no replica lost
    return fail(e.what(), out);
  }
}

status draft_model_proposer::run(std::span<const draft_query> queries, std::vector<std::vector<int32_t>>& out) {
  ++calls_;
  out.assign(queries.size(), {});
  std::unordered_map<uint64_t, size_t> asked;
  for (size_t i = 0; i < queries.size(); ++i) asked[queries[i].id] = i;

  struct job {
    size_t q = 0;
    sequence* s = nullptr;
    size_t done = 0;  ///< history tokens whose draft KV is in place
    size_t k = 0;
    bool open = true;  ///< still drafting
  };
  std::vector<job> jobs;
  for (size_t i = 0; i < queries.size(); ++i) {
    const auto& q = queries[i];
    const size_t n = q.history.size();
    if (q.k == 0 || n == 0 || n > max_positions_) continue;
    const size_t k = std::min(q.k, max_positions_ + 1 - n);  // the last draft fed sits at n + k - 2
    sequence& s = seqs_[q.id];
    s.used = calls_;
    // What the draft has seen and the history still share (the target may have kept fewer
    // drafts than ran here); the history's last token always runs (its logits give draft 1).
    size_t common = 0;
    const size_t limit = std::min(s.tokens.size(), n - 1);
    while (common < limit && s.tokens[common] == q.history[common]) ++common;
    s.tokens.resize(common);
    // A token the draft's vocabulary lacks (a target's larger padding) cannot run there.
    const auto fresh = q.history.subspan(common);
    if (std::any_of(fresh.begin(), fresh.end(), [&](int32_t t) { return t < 0 || static_cast<size_t>(t) >= draft_vocab_; })) continue;
    if (!reserve(q.id, s, n + k - 1, asked)) continue;
    jobs.push_back({i, &s, common, k, true});
  }
  if (jobs.empty()) return ok_status();

  const auto accept = [&](job& j, int32_t tok) {
    if (tok < 0 || tok >= opt_.target_vocab) {
      j.open = false;
      return;
    }
    out[j.q].push_back(tok);
    if (out[j.q].size() >= j.k) j.open = false;
  };

  std::vector<model::step_sequence> batch;
  std::vector<size_t> who;  // jobs of the batch, in order
  std::vector<int32_t> drawn;
  // Catch-up: each history's tokens not yet run, in chunks; a chunk that ends the history draws
  // the first draft. At most opt_.catch_up tokens a call: a long prompt catches up over several
  // steps (its request gets drafts once it has), so no step waits long on the draft.
  // The shortest catch-ups first: one long prompt does not hold up everyone else's drafts.
  std::vector<size_t> order(jobs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return queries[jobs[x].q].history.size() - jobs[x].done < queries[jobs[y].q].history.size() - jobs[y].done;
  });
  size_t caught = 0;
  for (;;) {
    batch.clear();
    who.clear();
    size_t budget = std::min(opt_.chunk, opt_.catch_up - caught);
    for (size_t oi = 0; oi < order.size() && budget > 0; ++oi) {
      const size_t ji = order[oi];
      auto& j = jobs[ji];
      const auto& h = queries[j.q].history;
      if (j.done == h.size()) continue;
      const size_t take = std::min(h.size() - j.done, budget);
      model::step_sequence s;
      s.tokens = h.subspan(j.done, take);
      s.pos0 = j.done;
      s.block_table = j.s->blocks;
      s.want_logits = j.done + take == h.size();
      batch.push_back(s);
      who.push_back(ji);
      budget -= take;
    }
    if (batch.empty()) break;
    for (const auto& b : batch) caught += b.tokens.size();
    size_t rows = 0;
    for (const auto& s : batch) rows += s.want_logits ? 1 : 0;
    const std::vector<kernels::sample_row> greedy(rows);
    if (auto st = eng_->forward_sample(batch, greedy, drawn); !st.ok()) return fail(st.err().message, out);
    size_t row = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      auto& j = jobs[who[b]];
      j.s->tokens.insert(j.s->tokens.end(), batch[b].tokens.begin(), batch[b].tokens.end());
      j.done += batch[b].tokens.size();
      tokens_run_ += batch[b].tokens.size();
      if (batch[b].want_logits) accept(j, drawn[row++]);
    }
  }
  for (auto& j : jobs) {
    if (j.done < queries[j.q].history.size()) j.open = false;  // still catching up: no drafts this time
  }
  // Decodes: each open sequence feeds its latest draft and draws the next.
  std::vector<int32_t> fed(jobs.size());
  for (;;) {
    batch.clear();
    who.clear();
    for (size_t ji = 0; ji < jobs.size(); ++ji) {
      auto& j = jobs[ji];
      if (!j.open) continue;
      fed[ji] = out[j.q].back();
      model::step_sequence s;
      s.tokens = std::span<const int32_t>(&fed[ji], 1);
      s.pos0 = j.s->tokens.size();
      s.block_table = j.s->blocks;
      batch.push_back(s);
      who.push_back(ji);
    }
    if (batch.empty()) break;
    const std::vector<kernels::sample_row> greedy(batch.size());
    if (auto st = eng_->forward_sample(batch, greedy, drawn); !st.ok()) return fail(st.err().message, out);
    for (size_t b = 0; b < batch.size(); ++b) {
      auto& j = jobs[who[b]];
      j.s->tokens.push_back(fed[who[b]]);
      ++tokens_run_;
      accept(j, drawn[b]);
    }
  }
  return ok_status();
}

}  // namespace llmesh::actors
