# Every message that crosses a process boundary in the mesh, as one Envelope per frame.
# Evolution rules (schemas/README.md): fields and union members are only ever appended with
# the next ordinal; nothing is renumbered, retyped or removed; a retired field keeps its slot
# with a "deprecated" comment. A reader that meets an unknown union member drops the frame
# with a logged error (a newer peer), never guesses.
@0xcb71ad75eb6899c6;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("llmesh::schemas");

# An actor somewhere in the mesh: the node that hosts it and its id there (0: the node agent).
struct ActorAddress {
  node @0 :Text;
  actor @1 :UInt64;
}

# One frame. The union's discriminant is the message kind.
struct Envelope {
  source @0 :ActorAddress;
  destination @1 :ActorAddress;
  correlationId @2 :UInt64;  # pairs a reply with its request (0: none)
  traceId @3 :UInt64;        # follows one client request across the mesh
  body :union {
    generate @4 :GenerateRequest;
    token @5 :Token;
    cancel @6 :Cancel;
    statusRequest @7 :Void;
    load @8 :ReplicaLoad;
    hello @9 :Hello;
    challenge @10 :Challenge;
    proof @11 :Proof;
    welcome @12 :Welcome;
    heartbeat @13 :Heartbeat;
    replicaState @14 :ReplicaState;
    collectiveId @15 :CollectiveId;
    assign @16 :Assign;
    control @17 :ControlRequest;
    controlReply @18 :ControlReply;
    shardStep @19 :ShardStep;
    shardResult @20 :ShardResult;
    shardReady @21 :ShardReady;
    shardGroup @22 :ShardGroup;
    kvBlocks @23 :KvBlocks;
    resetPrefixCache @24 :Void;  # a replica empties its prefix cache, then answers its load
    kvEventsRequest @25 :UInt64; # a router asks a replica for its KV events after this cursor
    kvEvents @26 :KvEvents;      # the replica's answer
  }
}

# --- inference ---------------------------------------------------------------------------

struct Sampling {
  temperature @0 :Float32;
  topP @1 :Float32 = 1.0;
  topK @2 :Int32;
  seed @3 :UInt64;
  logprobs @4 :Int32 = -1;  # -1: none; n in 0..20: each token's logprob and the n most likely
  presencePenalty @5 :Float32;
  frequencyPenalty @6 :Float32;
  repetitionPenalty @7 :Float32 = 1.0;
  minTokens @8 :UInt32;     # end ids cannot be drawn before this many output tokens
  logitBias @9 :Bool;       # the request's GenerateRequest.logitBias apply (a step row: some do)
  minP @10 :Float32;        # 0: off; in [0, 1]
  promptLogprobs @11 :Int32 = -1;  # -1: none; n in 0..20: every prompt token after the first
                                   # with its logprob and the n most likely (vLLM's prompt_logprobs)
  constrained @12 :Bool;    # the request's constraint or allowedIds mask its draws (a step row: some do)
  badWords @13 :Bool;       # the request's GenerateRequest.badWords ban tokens (a step row: some rows)
  processedLogprobs @14 :Bool;  # logprobs of the adjusted logits (masked: -inf), not the raw ones
}

enum ConstraintKind {
  none @0;
  jsonSchema @1;
  jsonObject @2;
  regex @3;
  choice @4;
  grammar @5;
}

struct Constraint {          # structured outputs: what the output must match (model::constraint_spec)
  kind @0 :ConstraintKind;
  text @1 :Text;             # the schema, pattern, choices (a JSON array) or GBNF grammar
}

struct TokenBias {
  id @0 :Int32;
  bias @1 :Float32;
}

struct GenerateRequest {
  id @0 :UInt64;
  prompt @1 :List(Int32);
  maxTokens @2 :UInt32;
  sampling @3 :Sampling;
  eosIds @4 :List(Int32);
  generated @5 :UInt32;     # the prompt's last tokens that are output already (after failover)
  logitBias @6 :List(TokenBias);  # added to these tokens' logits before every draw
  constraint @7 :Constraint;      # none: unconstrained
  allowedIds @8 :List(Int32);     # non-empty: only these tokens may be drawn (vLLM's allowed_token_ids)
  badWords @9 :List(List(Int32)); # vLLM's bad_words: a word's last token is banned after the rest of it
  constraintAfter @10 :List(Int32);  # non-empty: the constraint holds only after the output shows these
                                     # (a reasoning model's "</think>": it thinks freely first)
  priority @11 :Int32;               # vLLM's priority: the replica admits and preempts lower values first
  cacheSalt @12 :UInt64;             # vLLM's cache_salt as a key (0: none): prefix-cache hits only
                                     # among requests of the same salt
  pooling @13 :UInt8;                # an embedding request's pooling (0: a generation; 1 last, 2 mean,
                                     # 3 cls, 4 all): its one Token is the end, with the pooled hidden
                                     # state (all: every prompt position's, in order)
  lora @14 :Text;                    # the LoRA adapter its projections add, by name ("": none)
  prefillOnly @15 :Bool;             # disaggregated prefill: compute the prompt only and answer with
                                     # its whole KV blocks (a KvBlocks), not tokens
}

enum Finish {
  none @0;
  length @1;
  eos @2;
  cancelled @3;
}

struct Error {
  code @0 :UInt16;   # llmesh::errc
  message @1 :Text;
}

struct Token {
  id @0 :UInt64;
  token @1 :Int32;
  finish @2 :Finish;
  failed @3 :Bool;
  error @4 :Error;   # when failed
  logprobs @5 :TokenLogprobs;  # when the request asked for them (unset otherwise)
  promptLogprobs @6 :List(TokenLogprobs);  # with a request's first token, when it asked
                                           # (Sampling.promptLogprobs): entry i is prompt token i + 1's
  cachedTokens @7 :Int32 = -1;  # with a request's first token: how many of its tokens the replica's
                                # prefix cache held when it was admitted; -1 on the others
  embedding @8 :List(Float32);  # an embedding request's end: its pooled final hidden state
  queuedUs @9 :Int64 = -1;      # the request's time on its replica, microseconds: queued (arrival to
  prefillUs @10 :Int64 = -1;    # first admission) and prefill (to its first token) with its first
  inferenceUs @11 :Int64 = -1;  # token; those and inference (first admission to the end) with its last
}

# A token's log-probability and the most likely tokens' at its position (raw log-softmax).
struct TokenLogprobs {
  logprob @0 :Float32;
  topIds @1 :List(Int32);        # most likely first; as many as topLogprobs
  topLogprobs @2 :List(Float32);
  rank @3 :Int32;                # the token's rank in its row (1: the most likely; 0: unknown)
}

struct Cancel {
  id @0 :UInt64;
}

struct ReplicaLoad {
  replica @0 :UInt64;
  ready @1 :Bool;
  running @2 :UInt32;
  waiting @3 :UInt32;
  kvUsed @4 :UInt64;
  kvTotal @5 :UInt64;
  specDrafted @6 :UInt64;   # speculative decoding: drafts run since the replica started
  specAccepted @7 :UInt64;  # and drafts kept
  preemptions @8 :UInt64;   # running requests sent back to wait for KV blocks since the replica started
  kvImported @9 :UInt64;    # disaggregated prefill: KV blocks taken in from prefill replicas since it started
  kvRefused @10 :UInt64;    # and imports it refused (another block shape, a full cache, ...)
}

# What a replica's prefix cache gained (stored) and lost (removed) after a router's cursor, as
# chained block hashes (the router's prefix-aware policy hashes prompts the same way), netted:
# a hash is in one list at most. full: the cursor was too old (or the cache was reset since),
# stored is the whole cache. seq: the cursor for the next request. A list holds at most the
# decoder's list limit (4 Mi hashes).
struct KvEvents {
  full @0 :Bool;
  seq @1 :UInt64;
  stored @2 :List(UInt64);
  removed @3 :List(UInt64);
  blockSize @4 :UInt32;     # tokens per block of these hashes
}

# Disaggregated prefill: a prompt's leading whole blocks of KV, from a prefill replica to the
# request's owner (its answer to a prefillOnly GenerateRequest), and from the owner to the
# request's replica (import set), which caches them before the request comes.
struct KvBlocks {
  id @0 :UInt64;             # the request's
  ok @1 :Bool;               # false: no blocks, error says why
  error @2 :Error;
  tokens @3 :List(Int32);    # the positions the blocks hold: whole blocks of the prompt's start
  cacheSalt @4 :UInt64;
  lora @5 :Text;
  blockSize @6 :UInt32;
  kvDtype @7 :UInt8;         # 0 float32, 1 bfloat16, 2 fp8_e4m3, 3 fp8_e5m2
  blockBytes @8 :UInt64;     # one block: per layer, keys then values, [position][KV head][head dim]
  data @9 :Data;             # tokens / blockSize blocks of blockBytes
  import @10 :Bool;          # to a replica: take them in
}

# --- membership --------------------------------------------------------------------------

enum Role {
  coordinator @0;
  gateway @1;
  router @2;
  replica @3;
}

struct Resources {
  cores @0 :UInt32;
  memoryBytes @1 :UInt64;
  gpus @2 :UInt32;
  slots @3 :UInt32;         # shards it may host (0: the coordinator's default, 2)
}

# A node asks to join: who it is, what it does, where it listens, what it has, and a fresh
# nonce of its own (the coordinator's challenge must cover it).
struct Hello {
  node @0 :Text;
  roles @1 :List(Role);
  listen @2 :Text;
  resources @3 :Resources;
  nonce @4 :Data;
}

# The coordinator's fresh nonce; the joiner proves it knows the cluster token without sending it.
struct Challenge {
  nonce @0 :Data;
}

# HMAC-SHA256 keyed by the cluster token over both nonces and the node's name.
struct Proof {
  mac @0 :Data;
}

struct Member {
  node @0 :Text;
  roles @1 :List(Role);
  listen @2 :Text;
}

struct Welcome {
  accepted @0 :Bool;
  reason @1 :Text;          # when refused
  members @2 :List(Member);
}

struct Heartbeat {
  node @0 :Text;
  seq @1 :UInt64;
}

# --- control -----------------------------------------------------------------------------

enum ReplicaPhase {
  loading @0;
  ready @1;
  draining @2;
  dead @3;
}

struct ReplicaState {
  replica @0 :UInt64;
  node @1 :Text;
  model @2 :Text;
  phase @3 :ReplicaPhase;
  actor @4 :UInt64;         # the replica actor's id on its node (ready: where to send requests)
  reason @5 :Text;          # dead: why (a model that failed to load, ...)
  listen @6 :Text;          # the hosting node's mesh address (for routers in other processes)
  prefillFor @7 :Text;      # ready: a prefill replica for this model's requests ("": a replica of `model`)
  maxLocalPrefill @8 :UInt64;  # with prefillFor: prompts of which more than this is not cached on their replica go to it first (0: the router's own)
  maxPrefillQueue @9 :UInt64;  # with prefillFor: ... unless every prefill replica has this many requests (0: the router's own)
}

# A tensor-parallel group's rendezvous: rank 0 makes the collective's id (e.g. NCCL's unique
# id) and sends it to the other ranks of its replica.
struct CollectiveId {
  replica @0 :UInt64;
  ranks @1 :UInt32;
  id @2 :Data;
}

# The coordinator tells a node agent to start or stop one replica (all of its shards are on
# that node: packed placement).
enum AssignOp {
  start @0;
  stop @1;        # drain: in-flight requests finish, then the replica stops
}

struct Assign {
  replica @0 :UInt64;
  model @1 :Text;
  path @2 :Text;            # the model directory, as the cluster config names it
  tp @3 :UInt32;
  kvCacheMb @4 :UInt64;
  op @5 :AssignOp;
  # A replica whose shards live on several nodes (spread placement); empty lists: all on this
  # node. ranks: the ranks this node runs (rank 0's node runs the replica); shardNodes: every
  # rank's node mesh address, by rank; groupKey: the tensor group's secret.
  ranks @6 :List(UInt32);
  shardNodes @7 :List(Text);
  groupKey @8 :Data;
  # How the node holds the weights: "" or "none" as the checkpoint stores them, "int8" as
  # `--quantization int8` (every node of a model uses the model's one setting).
  quantization @9 :Text;
  # The LoRA adapters served beside the model (its cluster config entry's loras), in order: a
  # step names one by its index in this list.
  loras @10 :List(LoraModule);
  # The KV cache's elements: "" or "float32", "bfloat16" (`--kv-cache-dtype`; every rank of a
  # replica holds the same).
  kvCacheDtype @11 :Text;
  # The context its gateways grant (`max_model_len`; 0: the model's): the node sizes the KV cache
  # for no more than --max-seqs contexts of it.
  maxModelLen @12 :UInt64;
  # How the node holds the weight matrices (`--dtype`): "" or "auto" as the checkpoint stores
  # them, "float32", "bfloat16" or "float16" (every node of a model uses the model's one setting).
  dtype @13 :Text;
  # The model takes LoRA adapters while it serves (the cluster config's `enable_lora`, or any
  # `loras`): the node loads it so, and later adapters come as ControlRequest "lora" commands.
  enableLora @14 :Bool;
  # Adapters the model holds at once (the cluster config's `max_loras`; 0: the node's default, 64).
  maxLoras @15 :UInt32;
  # A mixture of experts' ranks run whole experts instead of a slice of each (the cluster
  # config's `expert_parallel`, vLLM's --enable-expert-parallel; every rank of a replica alike).
  expertParallel @16 :Bool;
  # vLLM's speculative_config for its replica as JSON (the cluster config's
  # `speculative_config`; "": the replica node's own --speculative-config or flags). A draft model
  # it names is loaded by the node hosting the replica.
  speculativeConfig @17 :Text;
  # The cluster config's scheduler limits for its replica (0: the node's own): vLLM's
  # max_num_batched_tokens (16 to 2^20), max_num_seqs (to 2^16), long_prefill_token_threshold
  # (to 2^30), max_num_partial_prefills and max_long_partial_prefills (to 2^16; long <= partial).
  maxBatchTokens @18 :UInt64;
  maxSeqs @19 :UInt64;
  longPrefillThreshold @20 :UInt64;
  maxPartialPrefills @21 :UInt32;
  maxLongPartialPrefills @22 :UInt32;
}

struct LoraModule {
  name @0 :Text;
  path @1 :Text;
}

# A replica's step for a shard in another process (its replica's rank 0 samples, so no rows).
# Sequence i has tokens[sum of nTokens before i ..] and blockTable[sum of nBlocks before i ..].
struct ShardStep {
  step @0 :UInt64;
  tokens @1 :List(Int32);
  blockTable @2 :List(Int32);
  seqs @3 :List(StepSequence);
  rows @4 :List(StepRow);   # how each drawn row (draws per sequence with wantLogits) draws: every rank runs the same
                            # LM-head collective (all greedy: each slice's argmax only)
}

struct StepRow {
  sampling @0 :Sampling;
  position @1 :UInt64;
}

struct StepSequence {
  nTokens @0 :UInt32;
  pos0 @1 :UInt64;
  nBlocks @2 :UInt32;
  wantLogits @3 :Bool;
  promptLogprobs @4 :Int32 = -1;  # score each token's successor (model::step_sequence)
  next @5 :Int32 = -1;            # the successor of the sequence's last token (-1: not scored)
  draws @6 :UInt32 = 1;           # with wantLogits: rows drawn from its last positions (speculation)
  lora @7 :Int32 = -1;            # its LoRA adapter: an index into the Assign's loras (-1: none)
}

# A shard in another process answers a step only when it failed (its replica's rank 0 fails the
# same step: a failing rank aborts the tensor group); for the replica node's log.
struct ShardResult {
  step @0 :UInt64;
  rank @1 :UInt32;
  ok @2 :Bool;
  error @3 :Error;          # when not ok
}

# A shard's node tells the replica's node (rank 0's) that its ranks are loaded and where their
# tensor plane listens (or why they failed to load).
struct ShardReady {
  replica @0 :UInt64;
  rank @1 :UInt32;
  tensor @2 :Text;          # the rank's tensor-plane address
  actor @3 :UInt64;         # the shard actor's id on its node
  key @4 :Data;             # the group's key, from the Assign
  ok @5 :Bool;
  reason @6 :Text;          # when not ok
  kvBlocks @7 :UInt64;      # its KV cache's blocks: every rank's must equal rank 0's
  quantization @8 :Text;    # how its node holds the weights ("none", "int8"; "" from older
                            # nodes, which hold them as stored): every rank's must equal rank 0's
  loras @9 :Text;           # the LoRA adapters its node loaded, their names in order, one per line
                            # ("" from older nodes, which load none): every rank's must equal rank 0's
  kvCacheDtype @10 :Text;   # its KV cache's elements ("float32", "bfloat16"; "" from older nodes:
                            # float32): every rank's must equal rank 0's
  dtype @11 :Text;          # the type its node rewrote the weights in ("auto", "bfloat16", ...; ""
                            # from older nodes, which hold them as stored): every rank's must equal rank 0's
}

# The replica's node tells every shard's node that the group forms: connect to the ranks above.
struct ShardGroup {
  replica @0 :UInt64;
  key @1 :Data;
  tensors @2 :List(Text);   # every rank's tensor-plane address, by rank
}

# An operator command for the coordinator (`llmesh ctl`). mac = HMAC-SHA256(cluster token,
# "llmesh-ctl" | nonce | timestampMs | command | args), so the token never travels and a
# recorded request cannot be replayed (nonces are remembered, timestamps must be recent).
struct ControlRequest {
  command @0 :Text;
  args @1 :List(Text);
  nonce @2 :Data;
  timestampMs @3 :UInt64;
  mac @4 :Data;
}

struct ControlReply {
  ok @0 :Bool;
  text @1 :Text;            # for people
  json @2 :Text;            # the same, for scripts
}
