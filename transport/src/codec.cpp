// Envelopes <-> Cap'n Proto frames (codec.hpp). The only file that sees the generated types.
#include "llmesh/transport/codec.hpp"

#include <capnp/message.h>
#include <capnp/orphan.h>
#include <capnp/serialize.h>
#include <kj/io.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "llmesh/schemas/mesh.capnp.h"

namespace llmesh::transport {
namespace {

namespace s = llmesh::schemas;
using Body = s::Envelope::Body;

capnp::Text::Reader text(const std::string& v) { return capnp::Text::Reader(v.data(), v.size()); }
capnp::Data::Reader data(const std::string& v) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(v.data()), v.size());
}

template <class ListBuilder, class Vec>
void fill(ListBuilder list, const Vec& v) {
  for (unsigned i = 0; i < v.size(); ++i) list.set(i, v[i]);
}

void put_roles(capnp::List<s::Role>::Builder list, const std::vector<role>& roles) {
  for (unsigned i = 0; i < roles.size(); ++i) list.set(i, static_cast<s::Role>(roles[i]));
}

void write_sampling(s::Sampling::Builder sp, const sampling& p) {
  sp.setTemperature(p.temperature);
  sp.setTopP(p.top_p);
  sp.setTopK(p.top_k);
  sp.setSeed(p.seed);
  sp.setLogprobs(p.logprobs);
  sp.setPresencePenalty(p.presence_penalty);
  sp.setFrequencyPenalty(p.frequency_penalty);
  sp.setRepetitionPenalty(p.repetition_penalty);
  sp.setMinTokens(p.min_tokens);
  sp.setLogitBias(p.logit_bias);
  sp.setMinP(p.min_p);
  sp.setPromptLogprobs(p.prompt_logprobs);
  sp.setConstrained(p.constrained);
  sp.setBadWords(p.bad_words);
  sp.setProcessedLogprobs(p.processed_logprobs);
}

sampling read_sampling(s::Sampling::Reader sp) {
  return {sp.getTemperature(), sp.getTopP(),          sp.getTopK(),
          sp.getSeed(),        sp.getLogprobs(),      sp.getPresencePenalty(),
          sp.getFrequencyPenalty(), sp.getRepetitionPenalty(), sp.getMinTokens(), sp.getLogitBias(), sp.getMinP(),
          sp.getPromptLogprobs(), sp.getConstrained(), sp.getBadWords(), sp.getProcessedLogprobs()};
}

/// An Error's code and message.
void write_error(s::Error::Builder e, errc code, const std::string& message) {
  e.setCode(static_cast<uint16_t>(code));
  e.setMessage(text(message));
}

struct writer {
  Body::Builder b;
  void operator()(const generate_msg& m) {
    auto g = b.initGenerate();
    g.setId(m.id);
    fill(g.initPrompt(static_cast<unsigned>(m.prompt.size())), m.prompt);
    g.setMaxTokens(m.max_tokens);
    write_sampling(g.initSampling(), m.params);
    fill(g.initEosIds(static_cast<unsigned>(m.eos_ids.size())), m.eos_ids);
    g.setGenerated(m.generated);
    auto lb = g.initLogitBias(static_cast<unsigned>(m.logit_bias.size()));
    for (unsigned i = 0; i < m.logit_bias.size(); ++i) {
      lb[i].setId(m.logit_bias[i].id);
      lb[i].setBias(m.logit_bias[i].bias);
    }
    if (!m.allowed_ids.empty()) fill(g.initAllowedIds(static_cast<unsigned>(m.allowed_ids.size())), m.allowed_ids);
    g.setPriority(m.priority);
    g.setCacheSalt(m.cache_salt);
    g.setPooling(m.pooling);
    g.setLora(text(m.lora));
    g.setPrefillOnly(m.prefill_only);
    if (!m.constraint_after.empty()) {
      fill(g.initConstraintAfter(static_cast<unsigned>(m.constraint_after.size())), m.constraint_after);
    }
    if (!m.bad_words.empty()) {
      auto words = g.initBadWords(static_cast<unsigned>(m.bad_words.size()));
      for (unsigned i = 0; i < m.bad_words.size(); ++i) {
        fill(words.init(i, static_cast<unsigned>(m.bad_words[i].size())), m.bad_words[i]);
      }
    }
    if (m.constraint_kind != 0) {
      auto c = g.initConstraint();
      c.setKind(static_cast<s::ConstraintKind>(m.constraint_kind));
      c.setText(m.constraint_text);
    }
  }
  void operator()(const token_body& m) {
    auto t = b.initToken();
    t.setId(m.id);
    t.setToken(m.token);
    t.setFinish(static_cast<s::Finish>(m.finish));
    t.setFailed(m.failed);
    if (m.failed) {
      write_error(t.initError(), m.code, m.message);
    }
    if (m.logprobs) write_logprobs(t.initLogprobs(), *m.logprobs);
    t.setCachedTokens(m.cached_tokens);
    t.setQueuedUs(m.queued_us);
    t.setPrefillUs(m.prefill_us);
    t.setInferenceUs(m.inference_us);
    if (!m.prompt_logprobs.empty()) {
      auto list = t.initPromptLogprobs(static_cast<unsigned>(m.prompt_logprobs.size()));
      for (unsigned i = 0; i < m.prompt_logprobs.size(); ++i) write_logprobs(list[i], m.prompt_logprobs[i]);
    }
    if (!m.embedding.empty()) fill(t.initEmbedding(static_cast<unsigned>(m.embedding.size())), m.embedding);
  }
  static void write_logprobs(s::TokenLogprobs::Builder l, const token_body::logprobs_t& x) {
    l.setLogprob(x.logprob);
    l.setRank(x.rank);
    fill(l.initTopIds(static_cast<unsigned>(x.top_ids.size())), x.top_ids);
    fill(l.initTopLogprobs(static_cast<unsigned>(x.top_logprobs.size())), x.top_logprobs);
  }
  void operator()(const cancel_msg& m) { b.initCancel().setId(m.id); }
  void operator()(const status_request&) { b.setStatusRequest(); }
  void operator()(const reset_prefix_cache_msg&) { b.setResetPrefixCache(); }
  void operator()(const kv_events_request& m) { b.setKvEventsRequest(m.since); }
  void operator()(const kv_events_msg& m) {
    auto k = b.initKvEvents();
    k.setFull(m.full);
    k.setSeq(m.seq);
    fill(k.initStored(static_cast<unsigned>(m.stored.size())), m.stored);
    fill(k.initRemoved(static_cast<unsigned>(m.removed.size())), m.removed);
    k.setBlockSize(m.block_size);
  }
  void operator()(const load_msg& m) {
    auto l = b.initLoad();
    l.setReplica(m.replica);
    l.setReady(m.ready);
    l.setRunning(m.running);
    l.setWaiting(m.waiting);
    l.setKvUsed(m.kv_used);
    l.setKvTotal(m.kv_total);
    l.setSpecDrafted(m.drafted);
    l.setSpecAccepted(m.accepted);
    l.setPreemptions(m.preemptions);
    l.setKvImported(m.kv_imported);
    l.setKvRefused(m.kv_refused);
  }
  void operator()(const hello_msg& m) {
    auto h = b.initHello();
    h.setNode(text(m.node));
    put_roles(h.initRoles(static_cast<unsigned>(m.roles.size())), m.roles);
    h.setListen(text(m.listen));
    auto r = h.initResources();
    r.setCores(m.res.cores);
    r.setMemoryBytes(m.res.memory_bytes);
    r.setGpus(m.res.gpus);
    r.setSlots(m.res.slots);
    h.setNonce(data(m.nonce));
  }
  void operator()(const challenge_msg& m) { b.initChallenge().setNonce(data(m.nonce)); }
  void operator()(const proof_msg& m) { b.initProof().setMac(data(m.mac)); }
  void operator()(const welcome_msg& m) {
    auto w = b.initWelcome();
    w.setAccepted(m.accepted);
    w.setReason(text(m.reason));
    auto list = w.initMembers(static_cast<unsigned>(m.members.size()));
    for (unsigned i = 0; i < m.members.size(); ++i) {
      list[i].setNode(text(m.members[i].node));
      put_roles(list[i].initRoles(static_cast<unsigned>(m.members[i].roles.size())), m.members[i].roles);
      list[i].setListen(text(m.members[i].listen));
    }
  }
  void operator()(const heartbeat_msg& m) {
    auto h = b.initHeartbeat();
    h.setNode(text(m.node));
    h.setSeq(m.seq);
  }
  void operator()(const replica_state_msg& m) {
    auto r = b.initReplicaState();
    r.setReplica(m.replica);
    r.setNode(text(m.node));
    r.setModel(text(m.model));
    r.setPhase(static_cast<s::ReplicaPhase>(m.phase));
    r.setActor(m.actor);
    r.setReason(text(m.reason));
    r.setListen(text(m.listen));
    r.setPrefillFor(text(m.prefill_for));
    r.setMaxLocalPrefill(m.max_local_prefill);
    r.setMaxPrefillQueue(m.max_prefill_queue);
  }
  void operator()(const kv_blocks_msg& m) {
    auto k = b.initKvBlocks();
    k.setId(m.id);
    k.setOk(m.ok);
    if (!m.ok) {
      write_error(k.initError(), m.code, m.message);
    }
    fill(k.initTokens(static_cast<unsigned>(m.tokens.size())), m.tokens);
    k.setCacheSalt(m.cache_salt);
    k.setLora(text(m.lora));
    k.setBlockSize(m.block_size);
    k.setKvDtype(m.kv_dtype);
    k.setBlockBytes(m.block_bytes);
    if (m.data_size() > 0) {
      // Referenced, not copied, by the builder (the frame's one copy is the serialization):
      // it outlives the builder (encode's), and a vector's storage is word-aligned.
      capnp::Data::Reader bytes(reinterpret_cast<const kj::byte*>(m.data->data()), m.data->size());
      if (m.data->size() % sizeof(capnp::word) == 0) {
        k.adoptData(capnp::Orphanage::getForMessageContaining(k).referenceExternalData(bytes));
      } else {
        k.setData(bytes);  // the padding after it would be read from beyond the vector
      }
    }
    k.setImport(m.import);
  }
  void operator()(const assign_msg& m) {
    auto a = b.initAssign();
    a.setReplica(m.replica);
    a.setModel(text(m.model));
    a.setPath(text(m.path));
    a.setTp(m.tp);
    a.setKvCacheMb(m.kv_cache_mb);
    a.setOp(static_cast<s::AssignOp>(m.op));
    fill(a.initRanks(static_cast<unsigned>(m.ranks.size())), m.ranks);
    auto nodes = a.initShardNodes(static_cast<unsigned>(m.shard_nodes.size()));
    for (unsigned i = 0; i < m.shard_nodes.size(); ++i) nodes.set(i, text(m.shard_nodes[i]));
    a.setGroupKey(data(m.group_key));
    a.setQuantization(text(m.quantization));
    auto loras = a.initLoras(static_cast<unsigned>(m.loras.size()));
    for (unsigned i = 0; i < m.loras.size(); ++i) {
      loras[i].setName(text(m.loras[i].name));
      loras[i].setPath(text(m.loras[i].path));
    }
    a.setKvCacheDtype(text(m.kv_cache_dtype));
    a.setMaxModelLen(m.max_model_len);
    a.setDtype(text(m.dtype));
    a.setEnableLora(m.enable_lora);
    a.setMaxLoras(m.max_loras);
    a.setExpertParallel(m.expert_parallel);
    a.setSpeculativeConfig(text(m.speculative_config));
    a.setMaxBatchTokens(m.max_batch_tokens);
    a.setMaxSeqs(m.max_seqs);
    a.setLongPrefillThreshold(m.long_prefill_threshold);
    a.setMaxPartialPrefills(m.max_partial_prefills);
    a.setMaxLongPartialPrefills(m.max_long_partial_prefills);
  }
  void operator()(const shard_step_msg& m) {
    auto st = b.initShardStep();
    st.setStep(m.step);
    fill(st.initTokens(static_cast<unsigned>(m.tokens.size())), m.tokens);
    fill(st.initBlockTable(static_cast<unsigned>(m.tables.size())), m.tables);
    auto seqs = st.initSeqs(static_cast<unsigned>(m.seqs.size()));
    for (unsigned i = 0; i < m.seqs.size(); ++i) {
      seqs[i].setNTokens(m.seqs[i].n_tokens);
      seqs[i].setPos0(m.seqs[i].pos0);
      seqs[i].setNBlocks(m.seqs[i].n_blocks);
      seqs[i].setWantLogits(m.seqs[i].want_logits);
      seqs[i].setPromptLogprobs(m.seqs[i].prompt_logprobs);
      seqs[i].setNext(m.seqs[i].next);
      seqs[i].setDraws(m.seqs[i].draws);
      seqs[i].setLora(m.seqs[i].lora);
    }
    auto rows = st.initRows(static_cast<unsigned>(m.rows.size()));
    for (unsigned i = 0; i < m.rows.size(); ++i) {
      write_sampling(rows[i].initSampling(), m.rows[i].params);
      rows[i].setPosition(m.rows[i].position);
    }
  }
  void operator()(const shard_result_msg& m) {
    auto r = b.initShardResult();
    r.setStep(m.step);
    r.setRank(m.rank);
    r.setOk(m.ok);
    if (!m.ok) {
      write_error(r.initError(), m.code, m.message);
    }
  }
  void operator()(const shard_ready_msg& m) {
    auto r = b.initShardReady();
    r.setReplica(m.replica);
    r.setRank(m.rank);
    r.setTensor(text(m.tensor));
    r.setActor(m.actor);
    r.setKey(data(m.key));
    r.setOk(m.ok);
    r.setReason(text(m.reason));
    r.setKvBlocks(m.kv_blocks);
    r.setQuantization(text(m.quantization));
    r.setLoras(text(m.loras));
    r.setKvCacheDtype(text(m.kv_cache_dtype));
    r.setDtype(text(m.dtype));
  }
  void operator()(const shard_group_msg& m) {
    auto g = b.initShardGroup();
    g.setReplica(m.replica);
    g.setKey(data(m.key));
    auto t = g.initTensors(static_cast<unsigned>(m.tensors.size()));
    for (unsigned i = 0; i < m.tensors.size(); ++i) t.set(i, text(m.tensors[i]));
  }
  void operator()(const control_msg& m) {
    auto c = b.initControl();
    c.setCommand(text(m.command));
    auto args = c.initArgs(static_cast<unsigned>(m.args.size()));
    for (unsigned i = 0; i < m.args.size(); ++i) args.set(i, text(m.args[i]));
    c.setNonce(data(m.nonce));
    c.setTimestampMs(m.timestamp_ms);
    c.setMac(data(m.mac));
  }
  void operator()(const control_reply_msg& m) {
    auto r = b.initControlReply();
    r.setOk(m.ok);
    r.setText(text(m.text));
    r.setJson(text(m.json));
  }
  void operator()(const collective_id_msg& m) {
    auto c = b.initCollectiveId();
    c.setReplica(m.replica);
    c.setRanks(m.ranks);
    c.setId(data(m.id));
  }
};

error bad(std::string what) { return make_error(errc::protocol_violation, "bad frame: " + std::move(what)); }

/// Reads with every length checked against the limits; any violation sets `err`.
struct reader {
  const frame_limits& lim;
  std::optional<error> err;

  std::string str(capnp::Text::Reader t, const char* field) {
    if (t.size() > lim.max_text) {
      err = bad(std::string(field) + " holds " + std::to_string(t.size()) + " bytes");
      return {};
    }
    return std::string(t.begin(), t.size());
  }
  /// An Error's code (a known errc, else a bad frame) and message.
  void error_of(s::Error::Reader e, errc& code, std::string& message) {
    const auto c = e.getCode();
    if (c > static_cast<uint16_t>(errc::internal)) err = bad("unknown error code " + std::to_string(c));
    code = static_cast<errc>(c);
    message = str(e.getMessage(), "error.message");
  }
  std::string bytes(capnp::Data::Reader d, const char* field) {
    if (d.size() > lim.max_text) {
      err = bad(std::string(field) + " holds " + std::to_string(d.size()) + " bytes");
      return {};
    }
    return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
  }
  template <class List>
  bool fits(List l, const char* field) {
    if (l.size() <= lim.max_list) return true;
    err = bad(std::string(field) + " holds " + std::to_string(l.size()) + " elements");
    return false;
  }
  template <class T>
  std::vector<T> values(typename capnp::List<T>::Reader l, const char* field) {
    std::vector<T> out;
    if (!fits(l, field)) return out;
    out.reserve(l.size());
    for (T v : l) out.push_back(v);
    return out;
  }
  std::vector<int32_t> ints(capnp::List<int32_t>::Reader l, const char* field) { return values<int32_t>(l, field); }
  std::vector<role> roles(capnp::List<s::Role>::Reader l) {
    std::vector<role> out;
    if (!fits(l, "roles")) return out;
    for (auto r : l) {
      if (static_cast<unsigned>(r) > static_cast<unsigned>(role::replica)) {
        err = bad("unknown role " + std::to_string(static_cast<unsigned>(r)));
        return {};
      }
      out.push_back(static_cast<role>(r));
    }
    return out;
  }
  token_body::logprobs_t logprobs_of(s::TokenLogprobs::Reader l) {
    token_body::logprobs_t x;
    auto ids = l.getTopIds();
    auto lps = l.getTopLogprobs();
    if (ids.size() > static_cast<unsigned>(max_logprobs) || lps.size() != ids.size()) {
      err = bad("token logprobs hold " + std::to_string(ids.size()) + " ids and " + std::to_string(lps.size()) +
                " values (equal, at most " + std::to_string(max_logprobs) + ")");
      return x;
    }
    x.logprob = l.getLogprob();
    if (l.getRank() < 0) {
      err = bad("token logprobs rank " + std::to_string(l.getRank()) + " is negative");
      return x;
    }
    x.rank = l.getRank();
    for (int32_t id : ids) x.top_ids.push_back(id);
    for (float v : lps) x.top_logprobs.push_back(v);
    return x;
  }
  sampling sampling_of(s::Sampling::Reader sp) {
    sampling p = read_sampling(sp);
    if (p.logprobs < -1 || p.logprobs > max_logprobs) {
      err = bad("sampling.logprobs is " + std::to_string(p.logprobs) + " (-1..." + std::to_string(max_logprobs) + ")");
    }
    if (p.prompt_logprobs < -1 || p.prompt_logprobs > max_logprobs) {
      err = bad("sampling.promptLogprobs is " + std::to_string(p.prompt_logprobs) + " (-1..." +
                std::to_string(max_logprobs) + ")");
    }
    if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty) || !std::isfinite(p.repetition_penalty) ||
        !(p.repetition_penalty > 0.0f)) {
      err = bad("sampling penalties must be finite, and repetitionPenalty above 0");
    }
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) err = bad("sampling.minP must be within [0, 1]");
    return p;
  }
  template <class E>
  E enum_value(E v, unsigned last, const char* field) {
    if (static_cast<unsigned>(v) > last) err = bad(std::string("unknown ") + field + " " + std::to_string(static_cast<unsigned>(v)));
    return v;
  }

  result<body> read(Body::Reader b) {
    body out;
    switch (b.which()) {
      case Body::GENERATE: {
        auto g = b.getGenerate();
        generate_msg m;
        m.id = g.getId();
        m.prompt = ints(g.getPrompt(), "prompt");
        m.max_tokens = g.getMaxTokens();
        m.params = sampling_of(g.getSampling());
        m.eos_ids = ints(g.getEosIds(), "eosIds");
        m.generated = g.getGenerated();
        if (m.generated > m.prompt.size()) err = bad("generated (" + std::to_string(m.generated) + ") exceeds the prompt");
        if (auto lb = g.getLogitBias(); fits(lb, "logitBias")) {
          for (auto b : lb) m.logit_bias.push_back({b.getId(), b.getBias()});
        }
        m.allowed_ids = ints(g.getAllowedIds(), "allowedIds");
        m.constraint_after = ints(g.getConstraintAfter(), "constraintAfter");
        m.priority = g.getPriority();
        m.cache_salt = g.getCacheSalt();
        m.pooling = g.getPooling();
        if (m.pooling > 4) err = bad("unknown pooling " + std::to_string(m.pooling));
        m.lora = str(g.getLora(), "lora");
        m.prefill_only = g.getPrefillOnly();
        if (auto words = g.getBadWords(); fits(words, "badWords")) {
          size_t total = 0;
          for (auto w : words) {
            total += w.size();
            if (total > lim.max_list) {
              err = bad("badWords hold more than " + std::to_string(lim.max_list) + " ids");
              break;
            }
            m.bad_words.push_back(ints(w, "badWords"));
          }
        }
        if (g.hasConstraint()) {
          auto c = g.getConstraint();
          m.constraint_kind = static_cast<uint8_t>(enum_value(c.getKind(), 5, "constraint kind"));
          if (c.getText().size() > max_constraint_text) {
            err = bad("constraint.text holds " + std::to_string(c.getText().size()) + " bytes (at most " +
                      std::to_string(max_constraint_text) + ")");
          } else {
            m.constraint_text = std::string(c.getText().begin(), c.getText().size());
          }
        }
        out = std::move(m);
        break;
      }
      case Body::TOKEN: {
        auto t = b.getToken();
        token_body m;
        m.id = t.getId();
        m.token = t.getToken();
        m.finish = static_cast<finish_kind>(enum_value(t.getFinish(), 3, "finish"));
        m.failed = t.getFailed();
        if (m.failed) {
          error_of(t.getError(), m.code, m.message);
        }
        if (t.hasLogprobs()) m.logprobs = logprobs_of(t.getLogprobs());
        m.cached_tokens = t.getCachedTokens();
        if (m.cached_tokens < -1) err = bad("cachedTokens " + std::to_string(m.cached_tokens) + " is below -1");
        m.queued_us = t.getQueuedUs();
        m.prefill_us = t.getPrefillUs();
        m.inference_us = t.getInferenceUs();
        for (const auto& [v, name] : {std::pair{m.queued_us, "queuedUs"}, {m.prefill_us, "prefillUs"}, {m.inference_us, "inferenceUs"}}) {
          if (v < -1) err = bad(std::string(name) + " " + std::to_string(v) + " is below -1");
        }
        if (auto pl = t.getPromptLogprobs(); fits(pl, "promptLogprobs")) {
          for (auto l : pl) m.prompt_logprobs.push_back(logprobs_of(l));
        }
        if (auto e = t.getEmbedding(); e.size() > max_embedding) {
          err = bad("embedding holds " + std::to_string(e.size()) + " values (at most " + std::to_string(max_embedding) + ")");
        } else {
          m.embedding.reserve(e.size());
          for (float v : e) m.embedding.push_back(v);
        }
        out = std::move(m);
        break;
      }
      case Body::CANCEL: out = cancel_msg{b.getCancel().getId()}; break;
      case Body::STATUS_REQUEST: out = status_request{}; break;
      case Body::RESET_PREFIX_CACHE: out = reset_prefix_cache_msg{}; break;
      case Body::KV_EVENTS_REQUEST: out = kv_events_request{b.getKvEventsRequest()}; break;
      case Body::KV_EVENTS: {
        auto k = b.getKvEvents();
        out = kv_events_msg{k.getFull(), k.getSeq(), values<uint64_t>(k.getStored(), "stored"),
                            values<uint64_t>(k.getRemoved(), "removed"), k.getBlockSize()};
        break;
      }
      case Body::LOAD: {
        auto l = b.getLoad();
        out = load_msg{l.getReplica(), l.getReady(), l.getRunning(), l.getWaiting(), l.getKvUsed(), l.getKvTotal(),
                       l.getSpecDrafted(), l.getSpecAccepted(), l.getPreemptions(), l.getKvImported(), l.getKvRefused()};
        break;
      }
      case Body::HELLO: {
        auto h = b.getHello();
        hello_msg m;
        m.node = str(h.getNode(), "node");
        m.roles = roles(h.getRoles());
        m.listen = str(h.getListen(), "listen");
        auto r = h.getResources();
        m.res = {r.getCores(), r.getMemoryBytes(), r.getGpus(), r.getSlots()};
        m.nonce = bytes(h.getNonce(), "nonce");
        out = std::move(m);
        break;
      }
      case Body::CHALLENGE: out = challenge_msg{bytes(b.getChallenge().getNonce(), "nonce")}; break;
      case Body::PROOF: out = proof_msg{bytes(b.getProof().getMac(), "mac")}; break;
      case Body::WELCOME: {
        auto w = b.getWelcome();
        welcome_msg m;
        m.accepted = w.getAccepted();
        m.reason = str(w.getReason(), "reason");
        if (fits(w.getMembers(), "members")) {
          for (auto x : w.getMembers()) m.members.push_back({str(x.getNode(), "node"), roles(x.getRoles()), str(x.getListen(), "listen")});
        }
        out = std::move(m);
        break;
      }
      case Body::HEARTBEAT: out = heartbeat_msg{str(b.getHeartbeat().getNode(), "node"), b.getHeartbeat().getSeq()}; break;
      case Body::REPLICA_STATE: {
        auto r = b.getReplicaState();
        out = replica_state_msg{r.getReplica(), str(r.getNode(), "node"), str(r.getModel(), "model"),
                                static_cast<replica_phase>(enum_value(r.getPhase(), 3, "phase")), r.getActor(),
                                str(r.getReason(), "reason"), str(r.getListen(), "listen"),
                                str(r.getPrefillFor(), "prefillFor"), r.getMaxLocalPrefill(),
                                r.getMaxPrefillQueue()};
        break;
      }
      case Body::KV_BLOCKS: {
        auto k = b.getKvBlocks();
        kv_blocks_msg m;
        m.id = k.getId();
        m.ok = k.getOk();
        if (!m.ok) {
          error_of(k.getError(), m.code, m.message);
        }
        m.tokens = ints(k.getTokens(), "tokens");
        m.cache_salt = k.getCacheSalt();
        m.lora = str(k.getLora(), "lora");
        m.block_size = k.getBlockSize();
        m.kv_dtype = k.getKvDtype();
        m.block_bytes = k.getBlockBytes();
        m.import = k.getImport();
        if (m.kv_dtype > 3) err = bad("unknown kvDtype " + std::to_string(m.kv_dtype));
        const auto d = k.getData();
        const size_t blocks = m.block_size ? m.tokens.size() / m.block_size : 0;
        if (d.size() > max_kv_bytes) {
          err = bad("data holds " + std::to_string(d.size()) + " bytes (at most " + std::to_string(max_kv_bytes) + ")");
        } else if ((m.block_size == 0 && !m.tokens.empty()) || (m.block_size && m.tokens.size() % m.block_size) ||
                   (m.block_bytes && blocks > d.size() / m.block_bytes) || d.size() != blocks * m.block_bytes) {
          err = bad("data holds " + std::to_string(d.size()) + " bytes for " + std::to_string(m.tokens.size()) +
                    " tokens in blocks of " + std::to_string(m.block_size) + " positions and " + std::to_string(m.block_bytes) +
                    " bytes");
        } else {
          const auto* first = reinterpret_cast<const std::byte*>(d.begin());
          m.data = std::make_shared<const std::vector<std::byte>>(first, first + d.size());
        }
        out = std::move(m);
        break;
      }
      case Body::ASSIGN: {
        auto a = b.getAssign();
        assign_msg m{a.getReplica(), str(a.getModel(), "model"), str(a.getPath(), "path"), a.getTp(),
                     a.getKvCacheMb(), static_cast<assign_op>(enum_value(a.getOp(), 1, "op")), {}, {}, {},
                     str(a.getQuantization(), "quantization"), {}, str(a.getKvCacheDtype(), "kvCacheDtype"),
                     a.getMaxModelLen(), str(a.getDtype(), "dtype"), a.getEnableLora(), a.getMaxLoras(),
                     a.getExpertParallel(), str(a.getSpeculativeConfig(), "speculativeConfig")};
        if (fits(a.getRanks(), "ranks")) {
          for (auto x : a.getRanks()) m.ranks.push_back(x);
        }
        if (fits(a.getShardNodes(), "shardNodes")) {
          for (auto x : a.getShardNodes()) m.shard_nodes.push_back(str(x, "shardNodes"));
        }
        m.group_key = bytes(a.getGroupKey(), "groupKey");
        if (fits(a.getLoras(), "loras")) {
          for (auto x : a.getLoras()) m.loras.push_back({str(x.getName(), "loras.name"), str(x.getPath(), "loras.path")});
        }
        m.max_batch_tokens = a.getMaxBatchTokens();
        m.max_seqs = a.getMaxSeqs();
        m.long_prefill_threshold = a.getLongPrefillThreshold();
        m.max_partial_prefills = a.getMaxPartialPrefills();
        m.max_long_partial_prefills = a.getMaxLongPartialPrefills();
        if ((m.max_batch_tokens != 0 && (m.max_batch_tokens < 16 || m.max_batch_tokens > (uint64_t{1} << 20))) ||
            m.max_seqs > (uint64_t{1} << 16) || m.long_prefill_threshold > (uint64_t{1} << 30) ||
            m.max_partial_prefills > (1u << 16) || m.max_long_partial_prefills > std::max(m.max_partial_prefills, 1u)) {
          err = bad("scheduler limits out of range (maxBatchTokens 16..2^20, maxSeqs, maxPartialPrefills ..2^16, "
                    "longPrefillThreshold ..2^30, maxLongPartialPrefills <= maxPartialPrefills)");
        }
        out = std::move(m);
        break;
      }
      case Body::SHARD_STEP: {
        auto st = b.getShardStep();
        shard_step_msg m;
        m.step = st.getStep();
        m.tokens = ints(st.getTokens(), "tokens");
        m.tables = ints(st.getBlockTable(), "blockTable");
        if (fits(st.getSeqs(), "seqs")) {
          for (auto x : st.getSeqs()) {
            m.seqs.push_back({x.getNTokens(), x.getPos0(), x.getNBlocks(), x.getWantLogits(), x.getPromptLogprobs(), x.getNext(),
                              x.getDraws(), x.getLora()});
            if (x.getLora() < -1) err = bad("seqs.lora is " + std::to_string(x.getLora()) + " (-1 or an adapter's index)");
            if (x.getDraws() < 1 || x.getDraws() > x.getNTokens()) {
              err = bad("seqs.draws is " + std::to_string(x.getDraws()) + " (1..nTokens, " + std::to_string(x.getNTokens()) + ")");
            }
            if (x.getPromptLogprobs() < -1 || x.getPromptLogprobs() > max_logprobs) {
              err = bad("seqs.promptLogprobs is " + std::to_string(x.getPromptLogprobs()) + " (-1..." +
                        std::to_string(max_logprobs) + ")");
            }
          }
        }
        if (fits(st.getRows(), "rows")) {
          for (auto x : st.getRows()) m.rows.push_back({sampling_of(x.getSampling()), x.getPosition()});
        }
        out = std::move(m);
        break;
      }
      case Body::SHARD_RESULT: {
        auto r = b.getShardResult();
        shard_result_msg m{r.getStep(), r.getRank(), r.getOk(), errc::internal, {}};
        if (!m.ok) {
          error_of(r.getError(), m.code, m.message);
        }
        out = std::move(m);
        break;
      }
      case Body::SHARD_READY: {
        auto r = b.getShardReady();
        out = shard_ready_msg{r.getReplica(), r.getRank(), str(r.getTensor(), "tensor"), r.getActor(),
                              bytes(r.getKey(), "key"), r.getOk(), str(r.getReason(), "reason"), r.getKvBlocks(),
                              str(r.getQuantization(), "quantization"), str(r.getLoras(), "loras"),
                              str(r.getKvCacheDtype(), "kvCacheDtype"), str(r.getDtype(), "dtype")};
        break;
      }
      case Body::SHARD_GROUP: {
        auto g = b.getShardGroup();
        shard_group_msg m;
        m.replica = g.getReplica();
        m.key = bytes(g.getKey(), "key");
        if (fits(g.getTensors(), "tensors")) {
          for (auto x : g.getTensors()) m.tensors.push_back(str(x, "tensors"));
        }
        out = std::move(m);
        break;
      }
      case Body::CONTROL: {
        auto c = b.getControl();
        control_msg m;
        m.command = str(c.getCommand(), "command");
        if (fits(c.getArgs(), "args")) {
          for (auto x : c.getArgs()) m.args.push_back(str(x, "args"));
        }
        m.nonce = bytes(c.getNonce(), "nonce");
        m.timestamp_ms = c.getTimestampMs();
        m.mac = bytes(c.getMac(), "mac");
        out = std::move(m);
        break;
      }
      case Body::CONTROL_REPLY: {
        auto r = b.getControlReply();
        out = control_reply_msg{r.getOk(), str(r.getText(), "text"), str(r.getJson(), "json")};
        break;
      }
      case Body::COLLECTIVE_ID: {
        auto c = b.getCollectiveId();
        out = collective_id_msg{c.getReplica(), c.getRanks(), bytes(c.getId(), "id")};
        break;
      }
      default:  // a newer peer's message: drop it, say what it was
        return bad("unknown message kind " + std::to_string(static_cast<unsigned>(b.which())));
    }
    if (err) return *err;
    return out;
  }
};

}  // namespace

const char* kind_name(const body& b) {
  static constexpr const char* names[] = {"generate", "token",   "cancel",    "status_request", "load",          "hello",
                                          "challenge", "proof", "welcome", "heartbeat",      "replica_state", "collective_id",
                                          "assign",    "control", "control_reply", "shard_step", "shard_result", "shard_ready", "shard_group",
                                          "kv_blocks", "reset_prefix_cache", "kv_events_request", "kv_events"};
  static_assert(std::size(names) == std::variant_size_v<body>);
  return names[b.index()];
}

std::vector<uint8_t> encode(const envelope& e) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<s::Envelope>();
  auto src = root.initSource();
  src.setNode(text(e.source.node));
  src.setActor(e.source.actor);
  auto dst = root.initDestination();
  dst.setNode(text(e.destination.node));
  dst.setActor(e.destination.actor);
  root.setCorrelationId(e.correlation_id);
  root.setTraceId(e.trace_id);
  std::visit(writer{root.getBody()}, e.msg);
  // Straight into the frame: one copy of each segment (KV blocks' data is one, referenced).
  std::vector<uint8_t> frame(capnp::computeSerializedSizeInWords(mb) * sizeof(capnp::word));
  kj::ArrayOutputStream out(kj::arrayPtr(reinterpret_cast<kj::byte*>(frame.data()), frame.size()));
  capnp::writeMessage(out, mb);
  return frame;
}

result<envelope> decode(std::span<const uint8_t> frame, const frame_limits& lim) {
  if (frame.size() > lim.max_frame_bytes) return bad(std::to_string(frame.size()) + " bytes exceed the frame limit");
  if (frame.size() < 8 || frame.size() % 8 != 0) return bad("size " + std::to_string(frame.size()) + " is not whole words");
  // The segment table, checked before Cap'n Proto reads it: count, then each size in words.
  uint32_t count_minus_one = 0;
  std::memcpy(&count_minus_one, frame.data(), 4);
  if (count_minus_one >= lim.max_segments) return bad(std::to_string(count_minus_one + 1ull) + " segments");
  const size_t segments = count_minus_one + 1;
  const size_t table_bytes = ((4 + 4 * segments) + 7) / 8 * 8;
  if (table_bytes > frame.size()) return bad("truncated segment table");
  uint64_t total_words = 0;
  for (size_t i = 0; i < segments; ++i) {
    uint32_t words = 0;
    std::memcpy(&words, frame.data() + 4 + 4 * i, 4);
    total_words += words;
  }
  if (table_bytes + total_words * 8 != frame.size()) return bad("segment sizes do not add up to the frame");

  kj::Array<capnp::word> aligned;
  const capnp::word* begin = reinterpret_cast<const capnp::word*>(frame.data());
  if (reinterpret_cast<uintptr_t>(frame.data()) % alignof(capnp::word) != 0) {
    aligned = kj::heapArray<capnp::word>(frame.size() / 8);
    std::memcpy(aligned.begin(), frame.data(), frame.size());
    begin = aligned.begin();
  }
  capnp::ReaderOptions opts;
  // Each word is read once by a well-formed message: more would be an amplification attack.
  opts.traversalLimitInWords = std::min<uint64_t>(lim.traversal_words, frame.size() / 8 * 2 + 64);
  opts.nestingLimit = lim.nesting;
  try {
    capnp::FlatArrayMessageReader msg(kj::arrayPtr(begin, frame.size() / 8), opts);
    auto root = msg.getRoot<s::Envelope>();
    reader r{lim, std::nullopt};
    envelope e;
    e.source = {r.str(root.getSource().getNode(), "source.node"), root.getSource().getActor()};
    e.destination = {r.str(root.getDestination().getNode(), "destination.node"), root.getDestination().getActor()};
    e.correlation_id = root.getCorrelationId();
    e.trace_id = root.getTraceId();
    auto b = r.read(root.getBody());
    if (!b) return b.take_error();
    if (r.err) return *r.err;
    e.msg = std::move(*b);
    return e;
  } catch (const kj::Exception& ex) {
    return bad(ex.getDescription().cStr());
  } catch (const std::exception& ex) {
    return bad(ex.what());
  }
}

}  // namespace llmesh::transport
