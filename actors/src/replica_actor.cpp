// The replica actor (replica_actor.hpp): messages in, calls on replica_core, messages out; the
// engine's ranks run in its shard actors (shard_actor.hpp), one step message to each.
#include "llmesh/actors/replica_actor.hpp"

#include "llmesh/actors/shard_actor.hpp"

namespace llmesh::actors {
namespace {

using replica = caf::stateful_actor<replica_state>;

void kick(replica* self) {
  auto& st = self->state;
  if (st.step_pending || st.dead || st.core->in_step() || st.core->idle()) return;
  st.step_pending = true;
  self->send(self, step_atom::value);
}

/// The group failed: every live request hears it as shard_failed, whatever the root cause (its
/// request actor moves it elsewhere), the shards stop, and the replica refuses further work.
void die(replica* self, const error& cause) {
  auto& st = self->state;
  const error e = make_error(errc::shard_failed, "replica failed: " + cause.message);
  st.dead = true;
  for (auto& [id, owner] : st.owners) {
    if (st.prefills.count(id)) self->send(owner, prefill_reply{id, false, e, {}});
    else self->send(owner, token_msg{id, -1, finish_reason::none, true, e, std::nullopt, {}});
  }
  st.owners.clear();
  st.prefills.clear();
  for (auto& s : st.shards) {
    if (s) self->send_exit(s, caf::exit_reason::user_shutdown);
  }
  st.deferred.clear();
}

void submit(replica* self, replica_request r, const caf::actor& reply_to) {
  auto& st = self->state;
  const uint64_t id = r.id;
  // A draining replica still takes what routers sent before they knew (routers stop at once).
  if (st.dead) {
    self->send(reply_to, token_msg{id, -1, finish_reason::none, true, make_error(errc::replica_unavailable, "replica is dead"), std::nullopt, {}});
    return;
  }
  if (auto s = st.core->submit(std::move(r)); !s) {
    self->send(reply_to, token_msg{id, -1, finish_reason::none, true, s.err(), std::nullopt, {}});
    return;
  }
  st.owners[id] = reply_to;
  kick(self);
}

/// Runs `fn` now, or after the step in flight: the step's batch points into request state and
/// its shards read the KV cache, so submits, cancels, prefills and imports wait for its end.
template <class Fn>
void between_steps(replica* self, Fn fn) {
  if (self->state.core->in_step()) self->state.deferred.push_back(std::move(fn));
  else fn();
}

replica_load load_of(replica* self) {
  const auto& st = self->state;
  const auto& b = st.core->blocks();
  const auto& sc = st.core->scheduler();
  return replica_load{self->id(), !st.dead && !st.draining, st.core->running(), st.core->waiting(),
                      b.total_blocks() - b.free_blocks(), b.total_blocks(), sc.drafted(), sc.accepted(),
                      sc.preemptions(), st.kv_imported, st.kv_refused};
}

void cancel(replica* self, uint64_t id) {
  self->state.core->cancel(id);
  self->state.owners.erase(id);
  self->state.prefills.erase(id);
}

/// Computes `r`'s prompt for another replica: a one-token request of it, whose end exports the
/// prompt's blocks to reply_to (prefill_done).
void prefill(replica* self, const replica_request& r, const caf::actor& reply_to) {
  auto& st = self->state;
  replica_request p;
  p.id = r.id;
  p.prompt = r.prompt;
  p.max_tokens = 1;
  p.sampling.seed = r.sampling.seed;
  p.priority = r.priority;
  p.cache_salt = r.cache_salt;
  p.lora = r.lora;
  auto refuse = [&](error e) { self->send(reply_to, prefill_reply{r.id, false, std::move(e), {}}); };
  if (st.dead) return refuse(make_error(errc::replica_unavailable, "replica is dead"));
  if (auto s = st.core->submit(std::move(p)); !s) return refuse(s.err());
  st.owners[r.id] = reply_to;
  st.prefills[r.id] = replica_state::prefill_job{r.prompt, r.cache_salt, r.lora};
  kick(self);
}

/// A prefill's one-token request ended (or failed): its prompt's blocks go to its owner.
void prefill_done(replica* self, const token_event& e, const caf::actor& owner) {
  auto& st = self->state;
  auto job = std::move(st.prefills.at(e.id));
  st.prefills.erase(e.id);
  if (e.failure) return self->send(owner, prefill_reply{e.id, false, *e.failure, {}});
  auto out = st.core->export_prefix(job.prompt, job.cache_salt, job.lora);
  if (!out) return self->send(owner, prefill_reply{e.id, false, out.err(), {}});
  self->send(owner, prefill_reply{e.id, true, {}, std::move(*out)});
}

void import(replica* self, const kv_prefix& p) {
  auto& st = self->state;
  if (st.dead) return;
  if (auto n = st.core->import_prefix(p); n) st.kv_imported += *n;
  else ++st.kv_refused;
}

/// All shards answered: merge (success only if every shard succeeded; the root cause wins
/// over the "aborted" errors it caused on the peers), then complete the step.
void step_done(replica* self) {
  auto& st = self->state;
  if (st.step_error) {
    st.core->finish_step({});  // leaves the core consistent; the replica is dead anyway
    return die(self, *st.step_error);
  }
  auto events = st.core->finish_step(st.sampled, st.logprobs);
  for (auto& e : events) {
    auto it = st.owners.find(e.id);
    if (it == st.owners.end()) continue;
    if (st.prefills.count(e.id)) {
      if (e.finish != finish_reason::none || e.failure) {
        prefill_done(self, e, it->second);
        st.owners.erase(it);
      }
      continue;
    }
    if (e.failure) {
      self->send(it->second, token_msg{e.id, -1, finish_reason::none, true, *e.failure, {}, {}});
    } else {
      self->send(it->second, token_msg{e.id, e.token, e.finish, false, {}, std::move(e.logprobs), std::move(e.prompt_logprobs),
                                       e.cached_tokens, std::move(e.embedding), e.times});
    }
    if (e.finish != finish_reason::none) st.owners.erase(it);
  }
  if (st.crash_after > 0 && --st.crash_after == 0) return self->quit(caf::exit_reason::kill);
  auto deferred = std::move(st.deferred);
  st.deferred.clear();
  for (auto& f : deferred) f();
  kick(self);
}

void on_shard_result(replica* self, shard_result r) {
  auto& st = self->state;
  if (!r.ok && (!st.step_error || st.step_error->code == errc::shard_failed)) st.step_error = r.err;
  if (r.ok && r.rank == 0) {
    st.sampled = std::move(r.sampled);
    st.logprobs = std::move(r.logprobs);
  }
  if (--st.pending == 0) step_done(self);
}

void step(replica* self, model::engine* eng) {
  auto& st = self->state;
  st.step_pending = false;
  if (st.dead || !st.core->begin_step()) return;
  if (auto s = eng->check_batch(st.core->batch()); !s) {
    st.core->finish_step({});
    return die(self, s.err());
  }
  st.pending = eng->local_ranks().size();
  st.step_error.reset();
  st.sampled.clear();
  st.logprobs.clear();
  const shard_step msg{++st.step_no, step_data::copy(st.core->batch(), st.core->rows())};
  for (size_t r = 0; r < st.shards.size(); ++r) {
    if (st.remote.count(static_cast<int>(r))) {
      // A shard in another process is told, not asked: the step cannot finish here unless it
      // took part in every collective, and a rank that fails or dies aborts the group, so
      // rank 0's step fails too. Not waiting for its answer saves a mesh hop per step.
      self->send(st.shards[r], shard_step_atom::value, msg);
      continue;
    }
    self->request(st.shards[r], caf::infinite, shard_step_atom::value, msg)
        .then([=](shard_result& res) { on_shard_result(self, std::move(res)); },
              [=](caf::error& e) {
                on_shard_result(self, shard_result{msg.step, static_cast<int>(r), false,
                                                   make_error(errc::shard_failed, "shard " + std::to_string(r) +
                                                                                      " is gone: " + self->system().render(e)),
                                                   {}, {}});
              });
  }
}

}  // namespace

caf::behavior replica_actor(replica* self, model::engine* eng, scheduler_config cfg) {
  return split_replica_actor(self, eng, cfg, {});
}

caf::behavior split_replica_actor(replica* self, model::engine* eng, scheduler_config cfg,
                                  std::map<int, caf::actor> remote_shards) {
  auto& st = self->state;
  st.core = std::make_unique<replica_core>(*eng, cfg);
  st.core->set_vocabulary(eng->loaded_model().vocabulary());
  st.shards.resize(static_cast<size_t>(eng->tp()));
  for (int r : eng->local_ranks()) st.shards[static_cast<size_t>(r)] = self->spawn<caf::detached + caf::linked>(shard_actor, eng, r);
  for (auto& [r, a] : remote_shards) {
    if (r < 0 || r >= eng->tp() || st.shards[static_cast<size_t>(r)]) continue;
    st.shards[static_cast<size_t>(r)] = a;
    st.remote.insert(r);
    self->monitor(a);  // a shard in another process: its stand-in stops when that process is lost
  }
  std::string missing;
  for (int r = 0; r < eng->tp(); ++r) {
    if (!st.shards[static_cast<size_t>(r)]) missing.append(" ").append(std::to_string(r));
  }
  if (!missing.empty() || eng->local_ranks().empty() || eng->local_ranks().front() != 0) {
    die(self, make_error(errc::internal, "replica: rank 0 must run in the replica's process, and ranks" + missing + " have no shard"));
  }
  self->set_down_handler([=](const caf::down_msg& d) {
    auto& st = self->state;
    for (size_t r = 0; r < st.shards.size(); ++r) {
      if (st.shards[r] && st.shards[r].address() == d.source) {
        // The group fails as a unit: a step in flight fails too (its request errors out).
        // (appended piecewise: g++ 12 misreports the chained "+" here, -Wrestrict)
        die(self, make_error(errc::shard_failed, std::string("shard ").append(std::to_string(r)).append(" in another process is gone")));
        return self->quit(caf::exit_reason::remote_link_unreachable);
      }
    }
  });
  return {
      [=](generate_atom, replica_request r, caf::actor reply_to) {
        between_steps(self, [=]() mutable { submit(self, std::move(r), reply_to); });
      },
      [=](cancel_atom, uint64_t id) { between_steps(self, [=] { cancel(self, id); }); },
      [=](status_atom, caf::actor reply_to) { self->send(reply_to, load_of(self)); },
      [=](kv_events_atom, caf::actor reply_to, uint64_t since) {
        auto e = self->state.core->blocks().events_since(since);
        e.replica = self->id();
        self->send(reply_to, std::move(e));
      },
      [=](reset_atom, caf::actor reply_to) {
        between_steps(self, [=] {
          self->state.core->reset_prefix_cache();
          self->send(reply_to, load_of(self));
        });
      },
      [=](prefill_atom, const replica_request& r, caf::actor reply_to) {
        between_steps(self, [=] { prefill(self, r, reply_to); });
      },
      [=](kvimport_atom, const kv_prefix& p) { between_steps(self, [=] { import(self, p); }); },
      [=](fault_atom, int64_t steps) { self->state.crash_after = steps; },
      [=](drain_atom) { self->state.draining = true; },
      [=](shards_atom) { return self->state.shards; },
      [=](step_atom) { step(self, eng); },
  };
}

}  // namespace llmesh::actors
