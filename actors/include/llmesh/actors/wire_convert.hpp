// The actors' messages <-> the transport's wire structs (plain functions; the bridge uses them).
#pragma once

#include "llmesh/actors/balancer.hpp"
#include "llmesh/actors/replica_actor.hpp"
#include "llmesh/actors/replica_core.hpp"
#include "llmesh/actors/shard_actor.hpp"
#include "llmesh/actors/token_stream.hpp"
#include "llmesh/transport/wire.hpp"

namespace llmesh::actors {

transport::generate_msg to_wire(const replica_request& r);
replica_request from_wire(const transport::generate_msg& m);
transport::token_body to_wire(const token_msg& t);
token_msg from_wire(const transport::token_body& t);
transport::load_msg to_wire(const replica_load& l);
replica_load from_wire(const transport::load_msg& l);
transport::kv_events_msg to_wire(const kv_events& e);
/// The replica field is 0: the receiver's proxy names it.
kv_events from_wire(const transport::kv_events_msg& m);
/// A step for a shard in another process (its rows stay home: rank 0 samples).
transport::shard_step_msg to_wire(const shard_step& s);
/// protocol_violation when the sequences' counts do not add up to the lists.
result<shard_step> from_wire(const transport::shard_step_msg& m);
transport::shard_result_msg to_wire(const shard_result& r);
shard_result from_wire(const transport::shard_result_msg& m);
/// Disaggregated prefill's blocks: a prefix of more than transport::max_kv_bytes (its data and
/// token ids together) keeps the leading blocks that fit (the request's replica computes the rest).
transport::kv_blocks_msg to_wire(const kv_prefix& p, bool import);
kv_prefix prefix_from_wire(const transport::kv_blocks_msg& m);
transport::kv_blocks_msg to_wire(const prefill_reply& r);
prefill_reply reply_from_wire(const transport::kv_blocks_msg& m);

}  // namespace llmesh::actors
