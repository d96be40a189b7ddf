// Engine: validation and KV block allocation, then the explicit tensor-parallel map-reduce:
// map = every rank runs forward() on the same batch; reduce = the step succeeds only if every
// rank did; the logits are rank 0's (all ranks hold identical ones after the all-gather).
#include "llmesh/model/engine.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>
#include <thread>

#include "llmesh/kernels/device.hpp"
#include "llmesh/model/cuda_executor.hpp"

namespace llmesh::model {

engine::engine(std::shared_ptr<const model> m, engine_options opt) : model_(std::move(m)), opt_(opt) {}

engine::~engine() = default;

result<backend> parse_backend(const std::string& name) {
  if (name == "cpu") return backend::cpu;
  if (name == "cuda") return backend::cuda;
  if (name == "auto") return backend::automatic;
  return make_error(errc::invalid_request, "unknown device '" + name + "' (expected cpu, cuda or auto)");
}

status engine::create_cuda_shards(const std::vector<shard_layout>& layouts) {
  const int tp = opt_.tp;
  if (tp > kernels::cuda_device_count()) {
    return make_error(errc::invalid_request, "--tp " + std::to_string(tp) + " on CUDA needs " + std::to_string(tp) +
                                                 " GPUs (one rank per device; NCCL refuses two ranks on one GPU), found " +
                                                 std::to_string(kernels::cuda_device_count()));
  }
  cuda_options co;
  co.deterministic = opt_.deterministic;
  co.graphs = opt_.cuda_graphs;
  if (tp == 1) {
    auto e = make_cuda_executor(model_, layouts[0], kv_, co, nullptr);
    if (!e) return e.take_error();
    shards_.push_back(std::move(*e));
    return ok_status();
  }
  // Rank 0 makes the group id; in one process it reaches the other ranks directly (between
  // processes it travels in a control message). Ranks join concurrently, one thread each.
  auto id = kernels::nccl_make_id();
  if (!id) return id.take_error();
  device_comms_.resize(tp);
  shards_.resize(tp);
  std::vector<status> st(tp);
  std::vector<std::thread> joiners;
  for (int r = 0; r < tp; ++r) {
    joiners.emplace_back([&, r] {
      auto c = kernels::nccl_connect(*id, r, tp, r, std::chrono::seconds(60));
      if (!c) { st[r] = c.take_error(); return; }
      device_comms_[r] = std::move(*c);
      cuda_options rco = co;
      rco.device = r;
      auto e = make_cuda_executor(model_, layouts[r], kv_, rco, device_comms_[r].get());
      if (!e) { st[r] = e.take_error(); return; }
      shards_[r] = std::move(*e);
    });
  }
  for (auto& j : joiners) j.join();
  for (auto& s : st) LLMESH_TRY(s);
  return ok_status();
}

namespace {

/// int8, fp8 and int4 weights are read in blocks of 32 along each row, so a rank's column slice of
/// o_proj and down_proj (a row-parallel split) must start at a block boundary. (A Q4_K / Q6_K
/// matrix whose slice would cut a super-block is copied by its rank as int8: shard_executor's
/// row slices.)
status check_quantized_layout(const model& m, const shard_layout& l) {
  if (!m.holds_blocks_of_32()) return ok_status();
  const size_t head_dim = m.config().head_dim;
  if ((l.q_head0 * head_dim) % kernels::q8_block != 0 || l.inter0 % kernels::q8_block != 0 ||
      l.shared0 % kernels::q8_block != 0) {
    return make_error(errc::invalid_request,
                      m.quantized_weights() + " weights (--quantization int8 or fp8, a quantized GGUF, or an AWQ/GPTQ/FP8/compressed-tensors/MXFP4 checkpoint) with --tp " + std::to_string(l.tp) +
                          " needs each rank's share of the attention width and of intermediate_size (and of "
                          "shared_expert_intermediate_size) to be a multiple of " +
                          std::to_string(kernels::q8_block));
  }
  return ok_status();
}

}  // namespace

result<kernels::dtype> parse_kv_cache_dtype(std::string_view s) {
  if (s == "auto" || s == "float32" || s == "fp32") return kernels::dtype::f32;
  if (s == "bfloat16" || s == "bf16") return kernels::dtype::bf16;
  if (s == "fp8" || s == "fp8_e4m3") return kernels::dtype::f8_e4m3;  // vLLM: fp8 is e4m3
  if (s == "fp8_e5m2") return kernels::dtype::f8_e5m2;
  if (s.substr(0, 3) == "fp8") {
    return make_error(errc::unsupported, "--kv-cache-dtype " + std::string(s) +
                                             ": not supported (auto, float32, bfloat16, fp8, fp8_e4m3 or fp8_e5m2)");
  }
  return make_error(errc::invalid_request,
                    "--kv-cache-dtype must be auto, float32, bfloat16, fp8, fp8_e4m3 or fp8_e5m2, not '" + std::string(s) + "'");
}

std::string_view kv_cache_dtype_name(kernels::dtype t) {
  switch (t) {
    case kernels::dtype::bf16: return "bfloat16";
    case kernels::dtype::f8_e4m3: return "fp8_e4m3";
    case kernels::dtype::f8_e5m2: return "fp8_e5m2";
    case kernels::dtype::f32: return "float32";
    case kernels::dtype::f16: case kernels::dtype::q8: case kernels::dtype::q4_k: case kernels::dtype::q5_k: case kernels::dtype::q6_k:
    case kernels::dtype::q2_k: case kernels::dtype::q3_k: case kernels::dtype::iq4_xs: case kernels::dtype::q4: case kernels::dtype::fp8: case kernels::dtype::mxfp4: break;
  }
  return kernels::dtype_name(t);  // not a KV cache type (set_kv_type refuses it)
}

namespace {

status set_kv_type(kv_cache_config& kv, kernels::dtype type, const model& m) {
  if (type != kernels::dtype::f32 && type != kernels::dtype::bf16 && !kernels::is_f8(type)) {
    return make_error(errc::invalid_request, "a KV cache holds float32, bfloat16, fp8_e4m3 or fp8_e5m2");
  }
  const auto& layers = m.weights().layers;
  const bool calibrated = std::any_of(layers.begin(), layers.end(), [](const layer_weights& l) { return l.k_scale > 0.0f; });
  if (type == kernels::dtype::f8_e5m2 && calibrated) {  // vLLM: "fp8_e5m2 kv-cache is not supported with fp8 checkpoints"
    return make_error(errc::unsupported, "--kv-cache-dtype fp8_e5m2 with a checkpoint's FP8 KV-cache scales (k_scale, v_scale): "
                                         "they are e4m3 scales; use --kv-cache-dtype fp8");
  }
  kv.type = type;
  return ok_status();
}

}  // namespace

result<backend_choice> choose_backend(const model& m, const engine_options& opt) {
  const auto& c = m.config();
  const bool quantized = !m.quantized_weights().empty();
  const std::string kv_name(kv_cache_dtype_name(opt.kv_type));
  const std::string kv_reason = kv_name + " KV caches (--kv-cache-dtype " + kv_name + ")";
  const char* cpu_only = m.lora_enabled()                     ? "LoRA adapters"
                         : opt.kv_type != kernels::dtype::f32 ? kv_reason.c_str()
                                                              : cpu_only_family(c);
  if (opt.device == backend::cuda && quantized) {
    return make_error(errc::unsupported, m.quantized_weights() + " weights (--quantization int8 or fp8, a quantized GGUF, or an AWQ/GPTQ/FP8/compressed-tensors/MXFP4 checkpoint) run on the CPU backend only (use --device cpu)");
  }
  if (opt.device == backend::cuda && cpu_only) {
    return make_error(errc::unsupported, std::string(cpu_only) + " run on the CPU backend only (use --device cpu)");
  }
  if (opt.device != backend::automatic) return backend_choice{opt.device, {}};
  const int gpus = kernels::cuda_device_count();
  if (gpus >= opt.tp && !quantized && !cpu_only) return backend_choice{backend::cuda, {}};
  backend_choice out{backend::cpu, {}};
  if (kernels::cuda_compiled()) {
    out.note = quantized   ? m.quantized_weights() + " weights run on the CPU"
               : cpu_only  ? std::string(cpu_only) + " run on the CPU"
               : gpus == 0 ? "no CUDA device found; running on the CPU"
                           : "--tp " + std::to_string(opt.tp) + " needs as many GPUs; running on the CPU";
  }
  return out;
}

result<size_t> kv_mb_for_gpu_memory(const model_config& c, size_t device_bytes, double utilization, size_t weight_bytes,
                                    size_t embed_bytes, int tp, int replicas, size_t max_batch_tokens) {
  if (!(utilization > 0.0 && utilization <= 1.0)) {
    return make_error(errc::invalid_request, "--gpu-memory-utilization must be in (0, 1]");
  }
  tp = std::max(tp, 1);
  replicas = std::max(replicas, 1);
  const auto per_rank = [tp](size_t n) { return (n + static_cast<size_t>(tp) - 1) / static_cast<size_t>(tp); };
  // float32 activations of a step: the residual stream and norms, q/k/v/o, the MLP's gate/up/act.
  const size_t activations =
      max_batch_tokens * (4 * c.hidden + per_rank((c.n_heads + 2 * c.n_kv_heads) * c.head_dim) + 3 * per_rank(c.intermediate)) * 4;
  const size_t logits = max_batch_tokens * c.vocab * 4;
  // Every rank holds the whole embedding (its gather needs every row) and its slice of the rest.
  const size_t shard = embed_bytes + per_rank(weight_bytes - std::min(embed_bytes, weight_bytes)) + activations + logits +
                       (size_t{512} << 20);
  const auto share = static_cast<size_t>(static_cast<double>(device_bytes) * utilization);
  const size_t used = shard * static_cast<size_t>(replicas);
  if (share <= used + (size_t{1} << 20) * static_cast<size_t>(replicas)) {
    return make_error(errc::invalid_request,
                      "--gpu-memory-utilization " + std::to_string(utilization) + " leaves no memory for the KV cache: " +
                          std::to_string(share >> 20) + " MiB of the device, " + std::to_string(used >> 20) +
                          " MiB for the weights and working memory of " + std::to_string(replicas) + " shard(s)");
  }
  return (share - used) / static_cast<size_t>(replicas) >> 20;
}

result<std::unique_ptr<engine>> engine::create(std::shared_ptr<const model> m, engine_options opt) {
  if (opt.tp < 1) return make_error(errc::invalid_request, "--tp must be at least 1");
  if (opt.threads <= 0) opt.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (opt.block_size == 0) return make_error(errc::invalid_request, "KV block size must be positive");
  const auto& c = m->config();
  if (opt.kv_tokens == 0) opt.kv_tokens = std::min<size_t>(c.max_positions, 8192);
  std::vector<shard_layout> layouts;
  for (int r = 0; r < opt.tp; ++r) {
    auto l = make_shard_layout(c, r, opt.tp, opt.expert_parallel);
    if (!l) return l.take_error();
    LLMESH_TRY(check_quantized_layout(*m, *l));
    layouts.push_back(*l);
  }
  std::vector<int> all(static_cast<size_t>(opt.tp));
  std::iota(all.begin(), all.end(), 0);
  LLMESH_TRY(m->check_ranks(opt.tp, opt.expert_parallel, all));
  std::unique_ptr<engine> e(new engine(m, opt));
  e->kv_.block_size = opt.block_size;
  e->kv_.n_blocks = (opt.kv_tokens + opt.block_size - 1) / opt.block_size;
  LLMESH_TRY(set_kv_type(e->kv_, opt.kv_type, *m));
  auto where = choose_backend(*m, opt);
  if (!where) return where.take_error();
  opt.device = where->device;
  e->opt_.device = opt.device;
  e->device_note_ = where->note;
  if (opt.device == backend::cuda) {
    e->on_cuda_ = true;
    for (int r = 0; r < opt.tp; ++r) e->local_.push_back(r);
    LLMESH_TRY(e->create_cuda_shards(layouts));
    for (size_t b = e->kv_.n_blocks; b-- > 0;) e->free_blocks_.push_back(static_cast<int32_t>(b));
    if (opt.tp > 1) e->ranks_ = std::make_unique<kernels::thread_pool>(opt.tp);
    return e;
  }
  for (int r = 0; r < opt.tp; ++r) e->local_.push_back(r);
  e->comms_ = kernels::make_local_communicators(opt.tp);
  int per_rank = std::max(1, opt.threads / opt.tp);
  for (int r = 0; r < opt.tp; ++r) {
    e->pools_.push_back(std::make_unique<kernels::thread_pool>(per_rank));
    auto shard = std::make_unique<shard_executor>(m, layouts[r], e->kv_, e->comms_[r].get(), e->pools_[r].get());
    LLMESH_TRY(shard->make_row_slices());
    e->shards_.push_back(std::move(shard));
  }
  if (opt.tp > 1) e->ranks_ = std::make_unique<kernels::thread_pool>(opt.tp);
  for (size_t b = e->kv_.n_blocks; b-- > 0;) e->free_blocks_.push_back(static_cast<int32_t>(b));
  return e;
}

result<std::unique_ptr<engine>> engine::create_part(std::shared_ptr<const model> m, engine_options opt,
                                                     std::vector<std::unique_ptr<kernels::communicator>> comms) {
  if (opt.tp < 1) return make_error(errc::invalid_request, "--tp must be at least 1");
  if (opt.device == backend::cuda) {
    return make_error(errc::unsupported, "a tensor-parallel group split over processes runs on the CPU only");
  }
  if (comms.empty()) return make_error(errc::invalid_request, "engine part: no ranks");
  if (opt.threads <= 0) opt.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (opt.block_size == 0) return make_error(errc::invalid_request, "KV block size must be positive");
  const auto& c = m->config();
  if (opt.kv_tokens == 0) opt.kv_tokens = std::min<size_t>(c.max_positions, 8192);
  std::sort(comms.begin(), comms.end(), [](const auto& a, const auto& b) { return a->rank() < b->rank(); });
  std::vector<int> ranks;
  for (const auto& comm : comms) ranks.push_back(comm->rank());
  LLMESH_TRY(m->check_ranks(opt.tp, opt.expert_parallel, ranks));
  std::unique_ptr<engine> e(new engine(m, opt));
  e->opt_.device = backend::cpu;
  e->kv_.block_size = opt.block_size;
  e->kv_.n_blocks = (opt.kv_tokens + opt.block_size - 1) / opt.block_size;
  LLMESH_TRY(set_kv_type(e->kv_, opt.kv_type, *m));
  const int per_rank = std::max(1, opt.threads / static_cast<int>(comms.size()));
  for (auto& comm : comms) {
    const int r = comm->rank();
    if (comm->size() != opt.tp || r < 0 || r >= opt.tp || (!e->local_.empty() && e->local_.back() == r)) {
      return make_error(errc::invalid_request, "engine part: communicator rank " + std::to_string(r) + " of " +
                                                   std::to_string(comm->size()) + " does not fit tp " + std::to_string(opt.tp));
    }
    auto l = make_shard_layout(c, r, opt.tp, opt.expert_parallel);
    if (!l) return l.take_error();
    LLMESH_TRY(check_quantized_layout(*m, *l));
    e->local_.push_back(r);
    e->comms_.push_back(std::move(comm));
    e->pools_.push_back(std::make_unique<kernels::thread_pool>(per_rank));
    auto shard = std::make_unique<shard_executor>(m, *l, e->kv_, e->comms_.back().get(), e->pools_.back().get());
    LLMESH_TRY(shard->make_row_slices());
    e->shards_.push_back(std::move(shard));
  }
  // Holding every rank, it is a whole engine: forward() and step() run the ranks on ranks_.
  if (opt.tp > 1 && static_cast<int>(e->local_.size()) == opt.tp) e->ranks_ = std::make_unique<kernels::thread_pool>(opt.tp);
  for (size_t b = e->kv_.n_blocks; b-- > 0;) e->free_blocks_.push_back(static_cast<int32_t>(b));
  return e;
}

int engine::index_of(int rank) const {
  for (size_t i = 0; i < local_.size(); ++i) {
    if (local_[i] == rank) return static_cast<int>(i);
  }
  return -1;
}

status engine::all_local(const char* what) const {
  if (static_cast<int>(local_.size()) == opt_.tp) return ok_status();
  return make_error(errc::invalid_request, std::string(what) + ": this engine holds only part of its tensor-parallel group");
}

void engine::abort() {
  failed_ = true;
  for (auto& c : comms_) c->abort();
  for (auto& c : device_comms_) {
    if (c) c->abort();
  }
}

int engine::open_sequence() {
  int id = next_seq_++;
  seqs_[id] = sequence{};
  return id;
}

void engine::close_sequence(int seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) free_blocks_.push_back(*b);
  seqs_.erase(it);
}

size_t engine::sequence_length(int seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.length;
}

status engine::step(std::span<const step_item> items, std::vector<float>& logits) {
  return run_step(items, [&](int r, std::span<const step_sequence> batch, std::vector<float>& scratch) {
    return shards_[r]->forward(batch, r == 0 ? logits : scratch);
  });
}

status engine::step_sample(std::span<const step_item> items, std::span<const kernels::sample_row> rows,
                           std::vector<int32_t>& tokens, kernels::row_logprobs* logprobs) {
  size_t want = 0;
  for (const auto& it : items) want += it.want_logits ? 1 : 0;
  if (want != rows.size()) {
    return make_error(errc::invalid_request, "step: " + std::to_string(rows.size()) + " sampling rows for " +
                                                 std::to_string(want) + " items that want a token");
  }
  std::vector<std::vector<int32_t>> rank_tokens(opt_.tp);
  step_logprobs out;
  LLMESH_TRY(run_step(items, [&](int r, std::span<const step_sequence> batch, std::vector<float>&) {
    return r == 0 ? shards_[r]->forward_sample(batch, rows, tokens, logprobs ? &out : nullptr)
                  : shards_[r]->forward_sample(batch, rows, rank_tokens[r]);
  }));
  if (logprobs) *logprobs = std::move(out.rows);
  return ok_status();
}

status engine::step_greedy(std::span<const step_item> items, std::vector<int32_t>& tokens) {
  size_t want = 0;
  for (const auto& it : items) want += it.want_logits ? 1 : 0;
  const std::vector<kernels::sample_row> rows(want);  // default parameters: greedy
  return step_sample(items, rows, tokens);
}

template <class Fn>
status engine::run_step(std::span<const step_item> items, Fn fn) {
  LLMESH_TRY(all_local("step"));
  if (failed_) return make_error(errc::shard_failed, "engine: a shard failed earlier; the group must be rebuilt");
  const auto& c = model_->config();
  // Validate everything and count blocks before touching any state.
  size_t blocks_needed = 0;
  std::vector<std::shared_ptr<const lora_adapter>> adapters;  // by item, held for the step
  for (const auto& it : items) {
    auto s = seqs_.find(it.seq);
    if (s == seqs_.end()) return make_error(errc::invalid_request, "step: unknown sequence " + std::to_string(it.seq));
    if (it.tokens.empty()) return make_error(errc::invalid_request, "step: no tokens for sequence " + std::to_string(it.seq));
    adapters.push_back(it.lora >= 0 ? model_->loras().get(it.lora) : nullptr);
    if (it.lora < -1 || (it.lora >= 0 && !adapters.back())) {
      return make_error(errc::invalid_request, "step: LoRA adapter " + std::to_string(it.lora) + " is not loaded");
    }
    for (int32_t id : it.tokens) {
      if (id < 0 || static_cast<size_t>(id) >= c.vocab) {
        return make_error(errc::invalid_request, "token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                                     std::to_string(c.vocab) + ")");
      }
    }
    size_t end = s->second.length + it.tokens.size();
    if (end > c.max_positions) {
      return make_error(errc::invalid_request, "sequence of " + std::to_string(end) +
                                                   " tokens exceeds the model's context of " + std::to_string(c.max_positions));
    }
    size_t have = s->second.blocks.size();
    size_t need = (end + kv_.block_size - 1) / kv_.block_size;
    blocks_needed += need > have ? need - have : 0;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (items[i].seq == items[j].seq) return make_error(errc::invalid_request, "step: a sequence appears twice");
    }
  }
  if (blocks_needed > free_blocks_.size()) {
    return make_error(errc::overloaded, "KV cache full: step needs " + std::to_string(blocks_needed) + " blocks, " +
                                            std::to_string(free_blocks_.size()) + " free");
  }
  std::vector<step_sequence> batch;
  batch.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& it = items[i];
    auto& s = seqs_[it.seq];
    size_t need = (s.length + it.tokens.size() + kv_.block_size - 1) / kv_.block_size;
    while (s.blocks.size() < need) {
      s.blocks.push_back(free_blocks_.back());
      free_blocks_.pop_back();
    }
    batch.push_back({it.tokens, s.length, s.blocks, it.want_logits});
    batch.back().lora = it.lora;
    batch.back().adapter = adapters[i].get();
  }

  LLMESH_TRY(run_ranks(batch, fn));
  for (const auto& it : items) seqs_[it.seq].length += it.tokens.size();
  return ok_status();
}



template <class Fn>
status engine::run_ranks(std::span<const step_sequence> batch, Fn fn) {
  status result_status;
  std::vector<std::vector<float>> rank_scratch(opt_.tp);
  if (opt_.tp == 1) {
    result_status = fn(0, batch, rank_scratch[0]);
  } else {
    std::vector<status> statuses(opt_.tp);
    ranks_->run([&](int r, int) {
      statuses[r] = fn(r, batch, rank_scratch[r]);
      if (!statuses[r]) {
        if (on_cuda_) device_comms_[r]->abort();
        else comms_[r]->abort();
      }
    });
    // Merge rule: success only if all ranks succeeded; report the root cause, not the
    // "aborted" errors it caused on the peers.
    for (auto& s : statuses) {
      if (!s && (result_status.ok() || result_status.err().code == errc::shard_failed)) result_status = s;
    }
  }
  if (!result_status) failed_ = true;
  return result_status;
}

status engine::check_batch(std::span<const step_sequence> batch) const {
  if (failed_) return make_error(errc::shard_failed, "engine: a shard failed earlier; the group must be rebuilt");
  if (batch.empty()) return make_error(errc::invalid_request, "forward: empty batch");
  const auto& c = model_->config();
  for (const auto& s : batch) {
    if (s.tokens.empty()) return make_error(errc::invalid_request, "forward: a sequence without tokens");
    for (int32_t id : s.tokens) {
      if (id < 0 || static_cast<size_t>(id) >= c.vocab) {
        return make_error(errc::invalid_request, "token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                                     std::to_string(c.vocab) + ")");
      }
    }
    const size_t end = s.pos0 + s.tokens.size();
    if (end > c.max_positions) {
      return make_error(errc::invalid_request, "sequence of " + std::to_string(end) +
                                                   " tokens exceeds the model's context of " + std::to_string(c.max_positions));
    }
    if (s.block_table.size() * kv_.block_size < end) return make_error(errc::invalid_request, "forward: block table too short");
    // A chunk that is drawn from ends the prompt: nothing follows it to score (and its rows
    // would outnumber its tokens).
    if (s.prompt_logprobs > kernels::max_logprobs || s.next >= static_cast<int32_t>(c.vocab) || s.next < -1 ||
        (s.want_logits && s.next >= 0)) {
      return make_error(errc::invalid_request, "forward: prompt scoring asks for " + std::to_string(s.prompt_logprobs) +
                                                   " alternatives (at most " + std::to_string(kernels::max_logprobs) +
                                                   "), or its next token " + std::to_string(s.next) +
                                                   " is outside the vocabulary or follows a chunk that is drawn from");
    }
    if (s.draws < 1 || s.draws > s.tokens.size() || s.draws > max_draws || (s.draws > 1 && s.prompt_logprobs >= 0)) {
      return make_error(errc::invalid_request, "forward: a sequence of " + std::to_string(s.tokens.size()) +
                                                   " tokens draws from its last " + std::to_string(s.draws) +
                                                   " positions (1 to its tokens, at most " + std::to_string(max_draws) +
                                                   ", and 1 when it scores its prompt)");
    }
    if (s.lora < -1 || (s.lora >= 0 && !s.adapter && !model_->loras().get(s.lora))) {
      return make_error(errc::invalid_request, "forward: LoRA adapter " + std::to_string(s.lora) + " is not loaded");
    }
    for (size_t b = 0; b < (end + kv_.block_size - 1) / kv_.block_size; ++b) {
      if (s.block_table[b] < 0 || static_cast<size_t>(s.block_table[b]) >= kv_.n_blocks) {
        return make_error(errc::invalid_request, "forward: block id " + std::to_string(s.block_table[b]) + " out of range");
      }
    }
  }
  return ok_status();
}

result<std::span<const step_sequence>> engine::pin_adapters(std::span<const step_sequence> batch, std::vector<step_sequence>& copy,
                                                            std::vector<std::shared_ptr<const lora_adapter>>& pins) const {
  const bool unpinned = std::any_of(batch.begin(), batch.end(), [](const step_sequence& s) { return s.lora >= 0 && !s.adapter; });
  if (!unpinned) return batch;
  copy.assign(batch.begin(), batch.end());
  for (auto& s : copy) {
    if (s.lora < 0 || s.adapter) continue;
    pins.push_back(model_->loras().get(s.lora));
    if (!pins.back()) return make_error(errc::invalid_request, "forward: LoRA adapter " + std::to_string(s.lora) + " is not loaded");
    s.adapter = pins.back().get();
  }
  return std::span<const step_sequence>(copy);
}

status engine::forward(std::span<const step_sequence> unpinned, std::vector<float>& logits) {
  LLMESH_TRY(all_local("forward"));
  LLMESH_TRY(check_batch(unpinned));
  std::vector<step_sequence> copy;
  std::vector<std::shared_ptr<const lora_adapter>> pins;  // every rank sees the same adapters
  auto batch = pin_adapters(unpinned, copy, pins);
  if (!batch) return batch.take_error();
  return run_ranks(*batch, [&](int r, std::span<const step_sequence> b, std::vector<float>& scratch) {
    return shards_[r]->forward(b, r == 0 ? logits : scratch);
  });
}

status engine::forward_sample(std::span<const step_sequence> unpinned, std::span<const kernels::sample_row> rows,
                              std::vector<int32_t>& tokens, step_logprobs* logprobs) {
  LLMESH_TRY(all_local("forward"));
  LLMESH_TRY(check_batch(unpinned));
  LLMESH_TRY(check_sample_rows(unpinned, rows.size()));
  std::vector<step_sequence> copy;
  std::vector<std::shared_ptr<const lora_adapter>> pins;
  auto batch = pin_adapters(unpinned, copy, pins);
  if (!batch) return batch.take_error();
  std::vector<std::vector<int32_t>> rank_tokens(opt_.tp);
  return run_ranks(*batch, [&](int r, std::span<const step_sequence> b, std::vector<float>&) {
    return r == 0 ? shards_[r]->forward_sample(b, rows, tokens, logprobs) : shards_[r]->forward_sample(b, rows, rank_tokens[r]);
  });
}

template <class Fn>
status engine::guarded_rank(int rank, Fn fn) {
  const int i = index_of(rank);
  if (i < 0) return make_error(errc::invalid_request, "forward_rank: rank " + std::to_string(rank) + " does not run here");
  status s = ok_status();
  try {
    s = fn(*shards_[static_cast<size_t>(i)]);
  } catch (const std::exception& e) {  // e.g. out of memory: still abort, or the peers wait forever
    s = make_error(errc::shard_failed, std::string("rank ") + std::to_string(rank) + ": " + e.what());
  }
  if (!s) {  // a failed rank aborts its collectives, so that no peer waits for it forever
    if (opt_.tp > 1) {
      if (on_cuda_) device_comms_[static_cast<size_t>(i)]->abort();
      else comms_[static_cast<size_t>(i)]->abort();
    }
    failed_ = true;
  }
  return s;
}

status engine::forward_rank(int rank, std::span<const step_sequence> batch, std::vector<float>& logits) {
  return guarded_rank(rank, [&](step_executor& ex) { return ex.forward(batch, logits); });
}

status engine::forward_rank_sample(int rank, std::span<const step_sequence> batch, std::span<const kernels::sample_row> rows,
                                   std::vector<int32_t>& tokens, step_logprobs* logprobs) {
  return guarded_rank(rank, [&](step_executor& ex) { return ex.forward_sample(batch, rows, tokens, logprobs); });
}

}  // namespace llmesh::model
