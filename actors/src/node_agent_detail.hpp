// The node agent's internals shared by its two files: node_agent.cpp (joining, packed replicas,
// routers) and node_agent_split.cpp (spread replicas: shards on several nodes).
#pragma once

#include <algorithm>

#include "llmesh/actors/draft_model_proposer.hpp"
#include "llmesh/actors/speculative_config.hpp"
#include "llmesh/actors/node_agent.hpp"

namespace llmesh::actors::agent_detail {

using agent = caf::stateful_actor<node_agent_state>;

using part_atom = caf::atom_constant<caf::atom("part")>;
using joined_atom = caf::atom_constant<caf::atom("joined")>;
using group_lost_atom = caf::atom_constant<caf::atom("grouplost")>;
using form_timeout_atom = caf::atom_constant<caf::atom("formtime")>;
using release_kept_atom = caf::atom_constant<caf::atom("relkept")>;

/// How long the models of replicas dropped on losing the coordinator stay loaded
/// (node_agent_state::kept): the rejoin and the coordinator's new assignments come well within it.
inline constexpr std::chrono::seconds kept_after_drop{120};

/// A spread replica's part, loaded on a helper: the engine (or why not) and its communicators.
struct loaded_part {
  uint64_t id = 0;
  std::string path;  ///< model_key() of the assignment
  std::shared_ptr<const model::model> m;
  std::shared_ptr<model::engine> engine;
  std::vector<tensor_communicator*> comms;  ///< inside engine, by ascending rank
  std::string err;
  size_t resident_mb = 0;  ///< the model's weights in memory once loaded (model::resident_weight_bytes)
  scheduler_config sched;  ///< rank 0's: the replica's scheduler settings (its assignment's speculation and draft, or the node's)
};

/// A replica's scheduler settings from its assignment: the node's (`node`), with the
/// assignment's scheduler limits where it sets them (`limits`), and with its speculative_config's
/// speculation where it brings one (`own`: no draft model yet, the draft's directory in
/// `draft_dir`, "": none). `err` says why the config is refused.
struct replica_speculation {
  scheduler_config sched;
  std::string draft_dir;
  bool own = false;  ///< speculation from the assignment
  std::string err;
  bool limits = false;  ///< scheduler limits from the assignment
};
/// The assignment's scheduler limits (0: the node's) over `s`; whether it set any.
inline bool apply_scheduler_limits(const transport::assign_msg& a, scheduler_config& s) {
  bool any = false;
  auto set = [&](size_t& field, uint64_t v) {
    if (v == 0) return;
    field = static_cast<size_t>(v);
    any = true;
  };
  set(s.max_batch_tokens, a.max_batch_tokens);
  set(s.max_seqs, a.max_seqs);
  set(s.long_prefill_threshold, a.long_prefill_threshold);
  set(s.max_partial_prefills, a.max_partial_prefills);
  set(s.max_long_partial_prefills, a.max_long_partial_prefills);
  return any;
}
inline replica_speculation speculation_of(const transport::assign_msg& a, const scheduler_config& node) {
  replica_speculation out{node, {}, false, {}};
  out.limits = apply_scheduler_limits(a, out.sched);
  if (a.speculative_config.empty()) return out;
  out.own = true;
  out.sched.draft_model = nullptr;
  out.sched.speculation = {};
  if (auto ok = apply_speculative_config(a.speculative_config, out.sched.speculation, out.draft_dir, "speculative_config"); !ok) {
    out.err = ok.err().message;
  }
  return out;
}

/// On a loading helper: the draft model `sp` names for target `m` (loaded and checked), or the
/// node's draft checked against `m`; `err` set when either fails.
inline std::shared_ptr<const model::model> draft_for(const replica_speculation& sp, const model::model& m,
                                                     const std::string& model_dir, size_t max_model_len, std::string& err) {
  if (!sp.err.empty()) {
    err = sp.err;
    return nullptr;
  }
  if (!sp.draft_dir.empty()) {
    auto d = load_draft_model(sp.draft_dir, m, model_dir, max_model_len);
    if (!d) err = "speculative_config: " + d.err().message;
    return d ? *d : nullptr;
  }
  if (!sp.own && sp.sched.draft_model) {  // the node's draft model must share this model's tokenizer
    if (auto ok = check_draft_model(*sp.sched.draft_model, m, model_dir); !ok) err = "--speculative-config: " + ok.err().message;
  }
  return nullptr;
}

/// The ranks of a spread replica's assignment this node loads the model for (model::load_options::ranks).
inline model::rank_set ranks_of(const transport::assign_msg& a) {
  model::rank_set r{static_cast<int>(std::max<uint32_t>(a.tp, 1)), a.expert_parallel, {}};
  for (uint32_t x : a.ranks) r.ranks.push_back(static_cast<int>(x));
  std::sort(r.ranks.begin(), r.ranks.end());
  r.ranks.erase(std::unique(r.ranks.begin(), r.ranks.end()), r.ranks.end());
  return r;
}

/// The node's model cache key: a model directory held one way (its path, quantization, dtype
/// and served context — a longrope model's factors follow max_model_len —, whether it takes
/// adapters, the ranks of a spread replica it holds the parts of, and its LoRA adapters in
/// order). The first five lines are the model's; adapter lines follow.
inline std::string model_key(const transport::assign_msg& a, bool spread = false) {
  // A model taking runtime updates is its own copy: another model of the same directory must
  // not see its adapters come and go.
  std::string key = a.path + '\n' + (a.quantization.empty() ? std::string("none") : a.quantization) + '\n' +
                    (a.dtype.empty() ? std::string("auto") : a.dtype) + " ctx " + std::to_string(a.max_model_len) + '\n' +
                    (a.enable_lora ? "lora " + a.model : !a.loras.empty() ? std::string("lora") : std::string()) + '\n';
  if (spread) {
    const auto r = ranks_of(a);
    key += "ranks";
    for (int x : r.ranks) key += ' ' + std::to_string(x);
    key += " of " + std::to_string(r.tp) + (r.expert_parallel ? " ep" : "");
  }
  for (const auto& l : a.loras) key += '\n' + l.name + '=' + l.path;
  return key;
}

/// `key` (a model_key) with the adapter lines of what `m` has loaded now: the key an assignment
/// listing those adapters looks the model up by.
inline std::string model_key(const std::string& key, const model::model& m) {
  size_t end = 0;
  for (int line = 0; line < 5 && end != std::string::npos; ++line) end = key.find('\n', end + (line > 0));
  std::string out = key.substr(0, end);
  for (const auto& l : m.loras().loaded()) out += '\n' + l->name + '=' + l->path;
  return out;
}

/// LoRA adapters' names in order, one per line: what every rank of a spread replica must have
/// loaded (ShardReady.loras), from the assignment or from a loaded model.
inline std::string lora_names(const transport::assign_msg& a) {
  std::string out;
  for (const auto& l : a.loras) out += l.name + '\n';
  return out;
}
inline std::string lora_names(const model::model& m) {
  std::string out;
  for (const auto& l : m.loras().loaded()) out += l->name + '\n';
  return out;
}

/// How an assignment asks this node to load the model: invalid_request for a quantization or
/// dtype this build does not know, unsupported for int8 or fp8 on a CUDA node (refused before loading).
inline result<model::load_options> load_options_of(const transport::assign_msg& a, model::backend device) {
  auto dtype = model::parse_weight_dtype(a.dtype.empty() ? "auto" : a.dtype);
  if (!dtype) return dtype.take_error();
  auto q = model::parse_quantization(a.quantization.empty() ? "none" : a.quantization);
  if (!q) return q.take_error();
  if ((*q == model::quantization::int8 || *q == model::quantization::fp8) && device == model::backend::cuda) {
    return make_error(errc::unsupported, "quantization " + a.quantization + " runs on the CPU backend only, and this node's device is cuda");
  }
  if ((!a.loras.empty() || a.enable_lora) && device == model::backend::cuda) {
    return make_error(errc::unsupported, "LoRA adapters run on the CPU backend only, and this node's device is cuda");
  }
  model::load_options o{.dtype = *dtype, .quant = *q, .loras = {}, .enable_lora = a.enable_lora, .max_loras = a.max_loras, .tokenizer_dir = {}, .lora_dtype = {}, .hf_overrides = {}, .ranks = {}, .max_model_len = a.max_model_len};
  for (const auto& l : a.loras) o.loras.push_back({l.name, l.path});
  return o;
}

/// The KV cache an assignment asks for: invalid_request for a dtype this build does not know,
/// unsupported for bfloat16 or fp8 on a CUDA node.
inline result<kernels::dtype> kv_type_of(const transport::assign_msg& a, model::backend device) {
  auto t = model::parse_kv_cache_dtype(a.kv_cache_dtype.empty() ? "float32" : a.kv_cache_dtype);
  if (!t) return t.take_error();
  if (*t != kernels::dtype::f32 && device == model::backend::cuda) {
    return make_error(errc::unsupported, "a " + a.kv_cache_dtype + " KV cache runs on the CPU backend only, and this node's device is cuda");
  }
  return t;
}

/// The model's config as the KV sizing sees it: its context capped at the assignment's
/// max_model_len (no more than --max-seqs contexts of it could ever be used).
inline model::model_config kv_sizing_config(const model::model_config& c, const transport::assign_msg& a) {
  model::model_config out = c;
  if (a.max_model_len > 0 && a.max_model_len < out.max_positions) out.max_positions = static_cast<size_t>(a.max_model_len);
  return out;
}

/// The id under which a shard of a spread replica is exported on its node.
inline uint64_t shard_actor_id(uint64_t replica, uint32_t rank) {
  return (uint64_t{1} << 30) + (replica % (uint64_t{1} << 20)) * 256 + rank % 256;
}

/// A frame body to the coordinator: through the bridge, or straight to it in this process.
void to_coordinator(agent* self, transport::body b);
/// A ReplicaState report to the coordinator.
void report(agent* self, uint64_t id, const std::string& model, transport::replica_phase phase, uint64_t actor = 0,
            std::string reason = {});
/// A connection to the node at mesh address `listen` (made once, kept in node_peers), then `then`.
void with_peer(agent* self, const std::string& listen, std::function<void(transport::peer_id)> then);

/// Records a replica actor started here: monitored with its local shard actors (the engine is
/// freed only when all are down; `remote`, the stand-ins for shards elsewhere, are not
/// counted), exported as replica_actor_base + id. Returns that id.
uint64_t host_replica(agent* self, uint64_t id, const std::string& model, std::shared_ptr<model::engine> eng,
                      caf::actor r, std::vector<caf::actor> remote);
/// Starts loading this node's ranks of a spread replica (assign with ranks).
void load_part(agent* self, const transport::assign_msg& a);
/// The helper finished loading.
void part_loaded(agent* self, const std::shared_ptr<loaded_part>& p);
/// Rank 0's node: another node's ranks are loaded (or failed).
void on_shard_ready(agent* self, transport::peer_id peer, const transport::shard_ready_msg& m);
/// Another rank's node: the group forms, join it.
void on_shard_group(agent* self, const transport::shard_group_msg& m);
/// Rank 0's node: the tensor group formed (err empty) or failed.
void joined(agent* self, uint64_t id, const std::string& err);
/// Rank 0's node: a replica still forming fails (reported dead with `why`; its engine freed).
void fail_forming(agent* self, uint64_t id, const std::string& why);
/// Stops whatever runs for a hosted replica now: its replica actor, or a follower's shards.
void stop_hosted(agent* self, hosted_replica& h);

// Runtime LoRA updates (node_agent_lora.cpp).
using lora_done_atom = caf::atom_constant<caf::atom("loradone")>;
using lora_late_atom = caf::atom_constant<caf::atom("loralate")>;
using lora_queued_atom = caf::atom_constant<caf::atom("loraqd")>;

/// A "lora" command applied (a load on a helper) to the models of the replicas hosted here.
struct lora_applied {
  uint64_t update = 0;
  std::string model;
  lora_op op;
  std::vector<std::shared_ptr<const model::model>> targets;  ///< the hosted replicas' copies
  errc code = errc::invalid_request;
  std::string err;
};
/// The coordinator's "lora" command: queued for the replicas of its model still loading here,
/// applied to the models of those hosted, then answered ({"lora_update", "applied": the copies
/// it went to, "code" on a refusal}).
void on_lora_command(agent* self, const transport::control_msg& m);
/// The helper of on_lora_command finished.
void lora_done(agent* self, const std::shared_ptr<lora_applied>& r);
/// The gateway's update `request` (hex nonce) got no answer in time.
void lora_late(agent* self, const std::string& request);
/// The coordinator's "lora-news" for a gateway node.
void on_lora_news(agent* self, const transport::control_msg& m);
/// The coordinator's answer to this node's gateway's update.
void on_lora_reply(agent* self, const transport::control_reply_msg& m);
/// The gateway asks for an update (lora_atom); the reply is `rp`'s.
void request_lora(agent* self, caf::response_promise rp, bool load, const std::string& model, const std::string& name,
                  const std::string& path);
/// A replica finished loading while updates came: they are applied to its model (on a helper),
/// then `lora_queued_atom` comes (queued_loras_applied).
void apply_queued_loras(agent* self, uint64_t id, const std::string& key, std::shared_ptr<const model::model> m,
                        std::shared_ptr<model::engine> eng, std::vector<lora_op> ops);
/// The helper of apply_queued_loras is done; `failed` names the adapter it refused (`err` why):
/// the replica fails to start, as one assigned after the update would have, unless an undo of
/// it was queued meanwhile. Then as `loaded_atom` (which applies what was queued meanwhile).
void queued_loras_applied(agent* self, uint64_t id, const std::string& key, std::shared_ptr<const model::model> m,
                          std::shared_ptr<model::engine> eng, const std::string& failed, const std::string& err);
/// The replica's model and engine are built (or `err`): node_agent.cpp.
void loaded(agent* self, uint64_t id, const std::string& key, std::shared_ptr<const model::model> m,
            std::shared_ptr<model::engine> eng, const std::string& err);
/// `m` as this node's replicas share it: once the last of them lets it go, its memory is
/// released on a thread of its own (unmapping tens of GB must not hold up the agent's
/// heartbeats) and the node logs "'model' unloaded (N MiB of weights released): no replica here
/// uses it".
std::shared_ptr<const model::model> held_model(std::shared_ptr<const model::model> m, const std::string& node,
                                               const std::string& model);
/// The cached model under `key`, or null (an expired entry goes).
std::shared_ptr<const model::model> cached_model(agent* self, const std::string& key);
/// The model cache holds `m` under the key of the adapters it has now (`key`: its key before).
void recache(agent* self, const std::string& key, const std::shared_ptr<const model::model>& m);
/// `m`'s cache entry moves to the key of the adapters it has now (none: not cached).
void recache(agent* self, const std::shared_ptr<const model::model>& m);
/// The node's replicas are dropped: updates waiting here go; with `why` (the coordinator is
/// gone, or the node stops) the gateway's own requests are answered with it.
void lora_reset(agent* self, const std::string& why);

}  // namespace llmesh::actors::agent_detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<llmesh::model::engine>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const llmesh::model::model>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<llmesh::actors::agent_detail::loaded_part>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<llmesh::actors::agent_detail::lora_applied>)
