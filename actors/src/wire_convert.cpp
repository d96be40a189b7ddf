// Actor messages <-> wire structs (wire_convert.hpp).
#include "llmesh/actors/wire_convert.hpp"

#include <algorithm>
#include <climits>
#include <iterator>

namespace llmesh::actors {
namespace {

static_assert(transport::max_logprobs == kernels::max_logprobs);
static_assert(transport::max_constraint_text == model::max_constraint_bytes);
static_assert(static_cast<int>(model::constraint_spec::kind::grammar) == 5);

transport::sampling to_wire(const kernels::sampling_params& p) {
  return {p.temperature,      p.top_p,           p.top_k,
          p.seed,             p.logprobs,        p.presence_penalty,
          p.frequency_penalty, p.repetition_penalty, static_cast<uint32_t>(std::max(p.min_tokens, 0)), p.logit_bias,
          p.min_p,            p.prompt_logprobs,    p.constrained,        p.bad_words,
          p.processed_logprobs};
}

kernels::sampling_params from_wire(const transport::sampling& p) {
  kernels::sampling_params out;
  out.temperature = p.temperature;
  out.top_p = p.top_p;
  out.top_k = p.top_k;
  out.seed = p.seed;
  out.logprobs = p.logprobs;
  out.presence_penalty = p.presence_penalty;
  out.frequency_penalty = p.frequency_penalty;
  out.repetition_penalty = p.repetition_penalty;
  out.min_tokens = static_cast<int>(std::min<uint32_t>(p.min_tokens, INT32_MAX));
  out.logit_bias = p.logit_bias;
  out.min_p = p.min_p;
  out.prompt_logprobs = p.prompt_logprobs;
  out.constrained = p.constrained;
  out.bad_words = p.bad_words;
  out.processed_logprobs = p.processed_logprobs;
  return out;
}

/// KvBlocks.kvDtype (mesh.capnp): a KV cache type's number on the wire is its place here.
constexpr kernels::dtype kv_wire_types[] = {kernels::dtype::f32, kernels::dtype::bf16, kernels::dtype::f8_e4m3,
                                            kernels::dtype::f8_e5m2};

uint8_t kv_wire_number(kernels::dtype t) {
  for (uint8_t i = 0; i < std::size(kv_wire_types); ++i) {
    if (kv_wire_types[i] == t) return i;
  }
  return 0;
}

}  // namespace

transport::generate_msg to_wire(const replica_request& r) {
  transport::generate_msg m{r.id, r.prompt, static_cast<uint32_t>(std::min<size_t>(r.max_tokens, UINT32_MAX)),
                            to_wire(r.sampling), r.eos_ids, static_cast<uint32_t>(std::min<size_t>(r.generated, UINT32_MAX)),
                            {}, static_cast<uint8_t>(r.constraint.type), r.constraint.text,
                            r.allowed_ids, r.bad_words, r.constraint_after, r.priority,
                            r.cache_salt, static_cast<uint8_t>(r.pool), r.lora};
  for (const auto& b : r.logit_bias) m.logit_bias.push_back({b.id, b.bias});
  return m;
}

replica_request from_wire(const transport::generate_msg& m) {
  replica_request r;
  r.id = m.id;
  r.prompt = m.prompt;
  r.max_tokens = m.max_tokens;
  r.sampling = from_wire(m.params);
  r.eos_ids = m.eos_ids;
  r.generated = m.generated;
  for (const auto& b : m.logit_bias) r.logit_bias.push_back({b.id, b.bias});  // the replica checks them
  r.constraint.type = static_cast<model::constraint_spec::kind>(m.constraint_kind);  // 0..5: the codec checked
  r.constraint.text = m.constraint_text;
  r.allowed_ids = m.allowed_ids;  // the replica checks them
  r.bad_words = m.bad_words;      // and these
  r.constraint_after = m.constraint_after;
  r.priority = m.priority;
  r.cache_salt = m.cache_salt;
  r.pool = static_cast<pooling>(m.pooling);  // 0..4: the codec checked
  r.lora = m.lora;  // the replica looks it up
  return r;
}

namespace {

transport::token_body::logprobs_t to_wire(const kernels::token_logprobs& x) {
  transport::token_body::logprobs_t l;
  l.logprob = x.logprob;
  l.rank = x.rank;
  for (const auto& t : x.top) {
    l.top_ids.push_back(t.id);
    l.top_logprobs.push_back(t.logprob);
  }
  return l;
}

kernels::token_logprobs from_wire(const transport::token_body::logprobs_t& x) {
  kernels::token_logprobs l;  // the codec checked that ids and values pair up
  l.logprob = x.logprob;
  l.rank = x.rank;
  for (size_t i = 0; i < x.top_ids.size(); ++i) l.top.push_back({x.top_ids[i], x.top_logprobs[i]});
  return l;
}

}  // namespace

transport::token_body to_wire(const token_msg& t) {
  transport::token_body out{t.id, t.token, static_cast<transport::finish_kind>(t.finish), t.failed, t.err.code,
                            t.failed ? t.err.message : "", std::nullopt, {}};
  if (t.logprobs) out.logprobs = to_wire(*t.logprobs);
  out.cached_tokens = t.cached_tokens;
  out.prompt_logprobs.reserve(t.prompt_logprobs.size());
  for (const auto& x : t.prompt_logprobs) out.prompt_logprobs.push_back(to_wire(x));
  out.embedding = t.embedding;
  out.queued_us = t.times.queued_us;
  out.prefill_us = t.times.prefill_us;
  out.inference_us = t.times.inference_us;
  return out;
}

token_msg from_wire(const transport::token_body& t) {
  token_msg out{t.id, t.token, static_cast<finish_reason>(t.finish), t.failed,
                t.failed ? make_error(t.code, t.message) : error{}, std::nullopt, {}};
  if (t.logprobs) out.logprobs = from_wire(*t.logprobs);
  out.cached_tokens = t.cached_tokens;
  out.prompt_logprobs.reserve(t.prompt_logprobs.size());
  for (const auto& x : t.prompt_logprobs) out.prompt_logprobs.push_back(from_wire(x));
  out.embedding = t.embedding;
  out.times = {t.queued_us, t.prefill_us, t.inference_us};
  return out;
}

transport::load_msg to_wire(const replica_load& l) {
  return {l.replica, l.ready, static_cast<uint32_t>(l.running), static_cast<uint32_t>(l.waiting), l.kv_used, l.kv_total,
          l.drafted, l.accepted, l.preemptions, l.kv_imported, l.kv_refused};
}

replica_load from_wire(const transport::load_msg& l) {
  return {l.replica, l.ready, l.running, l.waiting, l.kv_used, l.kv_total, l.drafted, l.accepted, l.preemptions, l.kv_imported,
          l.kv_refused};
}

transport::kv_events_msg to_wire(const kv_events& e) { return {e.full, e.seq, e.stored, e.removed, e.block_size}; }

kv_events from_wire(const transport::kv_events_msg& m) { return {0, m.full, m.seq, m.stored, m.removed, m.block_size}; }

transport::shard_step_msg to_wire(const shard_step& s) {
  transport::shard_step_msg m;
  m.step = s.step;
  m.tokens = s.data->tokens;
  m.tables = s.data->tables;
  for (const auto& q : s.data->batch) {
    m.seqs.push_back({static_cast<uint32_t>(q.tokens.size()), q.pos0, static_cast<uint32_t>(q.block_table.size()), q.want_logits,
                      q.prompt_logprobs, q.next, q.draws, q.lora});
  }
  for (const auto& r : s.data->rows) {
    m.rows.push_back({to_wire(r.params), r.position});
  }
  return m;
}

result<shard_step> from_wire(const transport::shard_step_msg& m) {
  auto d = std::make_shared<step_data>();
  d->tokens = m.tokens;
  d->tables = m.tables;
  size_t t = 0, b = 0;
  for (const auto& q : m.seqs) {
    if (q.pos0 > UINT32_MAX || q.n_tokens > d->tokens.size() - t || q.n_blocks > d->tables.size() - b) {
      return make_error(errc::protocol_violation, "shard step: its sequences need more tokens or blocks than it carries");
    }
    d->batch.push_back({std::span<const int32_t>(d->tokens.data() + t, q.n_tokens), static_cast<size_t>(q.pos0),
                        std::span<const int32_t>(d->tables.data() + b, q.n_blocks), q.want_logits, q.prompt_logprobs,
                        q.next, q.draws});
    d->batch.back().lora = q.lora;  // the engine checks it against its adapters
    t += q.n_tokens;
    b += q.n_blocks;
  }
  if (t != d->tokens.size() || b != d->tables.size()) {
    return make_error(errc::protocol_violation, "shard step: tokens or blocks left over after its sequences");
  }
  size_t want = 0;
  for (const auto& s : d->batch) want += model::drawn_rows(s);
  if (m.rows.size() != want) {
    return make_error(errc::protocol_violation, "shard step: " + std::to_string(m.rows.size()) + " sampling rows for " +
                                                    std::to_string(want) + " drawn positions");
  }
  for (const auto& r : m.rows) d->rows.push_back({from_wire(r.params), r.position});
  return shard_step{m.step, std::move(d)};
}

transport::shard_result_msg to_wire(const shard_result& r) {
  return {r.step, static_cast<uint32_t>(r.rank), r.ok, r.err.code, r.ok ? "" : r.err.message};
}

shard_result from_wire(const transport::shard_result_msg& m) {
  return {m.step, static_cast<int>(m.rank), m.ok, m.ok ? error{} : make_error(m.code, m.message), {}, {}};
}

transport::kv_blocks_msg to_wire(const kv_prefix& p, bool import) {
  transport::kv_blocks_msg m;
  m.ok = true;
  m.import = import;
  m.cache_salt = p.cache_salt;
  m.lora = p.lora;
  m.block_size = p.block_size;
  m.kv_dtype = kv_wire_number(p.kv_type);
  m.block_bytes = p.block_bytes;
  size_t blocks = p.data ? std::min(p.blocks(), p.data->size() / std::max<uint64_t>(p.block_bytes, 1)) : 0;
  // A block costs its bytes and its positions' token ids (4 bytes each): the frame stays under
  // max_kv_bytes of both, well within the 64 MiB frame limit.
  blocks = std::min<size_t>(blocks, transport::max_kv_bytes / (p.block_bytes + 4 * uint64_t{p.block_size} + 1));
  m.tokens.assign(p.tokens.begin(), p.tokens.begin() + static_cast<std::ptrdiff_t>(blocks * p.block_size));
  if (blocks == p.blocks() && p.data && p.data->size() == blocks * p.block_bytes) {
    m.data = p.data;  // shared: the frame is where it is copied
  } else if (blocks) {
    m.data = std::make_shared<const std::vector<std::byte>>(p.data->begin(), p.data->begin() + static_cast<std::ptrdiff_t>(blocks * p.block_bytes));
  }
  return m;
}

kv_prefix prefix_from_wire(const transport::kv_blocks_msg& m) {
  kv_prefix p;
  p.tokens = m.tokens;
  p.cache_salt = m.cache_salt;
  p.lora = m.lora;
  p.block_size = m.block_size;
  p.kv_type = m.kv_dtype < std::size(kv_wire_types) ? kv_wire_types[m.kv_dtype] : kernels::dtype::f32;  // the codec refuses others
  p.block_bytes = m.block_bytes;
  p.data = m.data ? m.data : std::make_shared<const std::vector<std::byte>>();
  return p;
}

transport::kv_blocks_msg to_wire(const prefill_reply& r) {
  transport::kv_blocks_msg m = r.ok ? to_wire(r.prefix, false) : transport::kv_blocks_msg{};
  m.id = r.id;
  m.ok = r.ok;
  if (!r.ok) {
    m.code = r.err.code;
    m.message = r.err.message;
  }
  return m;
}

prefill_reply reply_from_wire(const transport::kv_blocks_msg& m) {
  prefill_reply r{m.id, m.ok, {}, {}};
  if (m.ok) r.prefix = prefix_from_wire(m);
  else r.err = make_error(m.code, m.message);
  return r;
}

}  // namespace llmesh::actors
