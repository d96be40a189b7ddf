// The tensor plane between processes (tensor_communicator.hpp).
#include "llmesh/actors/tensor_communicator.hpp"

#include <algorithm>
#include <cstring>
#include <openssl/crypto.h>

namespace llmesh::actors {
namespace {

constexpr uint32_t frame_magic = 0x4c4d5450;  // "LMTP"
constexpr uint8_t type_hello = 1, type_data = 2;
constexpr transport::peer_id no_peer = ~transport::peer_id{0};

struct header {
  uint32_t magic = frame_magic;
  uint8_t type = 0;
  uint8_t pad[3] = {0, 0, 0};
  uint32_t rank = 0;
  uint32_t pad2 = 0;
  uint64_t seq = 0;
};
static_assert(sizeof(header) == 24);

}  // namespace

tensor_communicator::tensor_communicator(std::shared_ptr<transport::transport> net, tensor_group_options opt)
    : net_(std::move(net)), tx_(net_.get()), opt_(std::move(opt)) {
  peer_of_.assign(static_cast<size_t>(opt_.size), no_peer);
  greeted_.assign(static_cast<size_t>(opt_.size), false);
  inbox_.resize(static_cast<size_t>(opt_.size));
}

result<std::unique_ptr<tensor_communicator>> tensor_communicator::create(std::shared_ptr<transport::transport> net,
                                                                          const std::string& listen,
                                                                          tensor_group_options opt) {
  if (opt.size < 1 || opt.rank < 0 || opt.rank >= opt.size) {
    return make_error(errc::invalid_request, "tensor group: rank " + std::to_string(opt.rank) + " of " + std::to_string(opt.size));
  }
  if (opt.key.size() < 16) return make_error(errc::invalid_request, "tensor group: the key must have at least 16 bytes");
  std::unique_ptr<tensor_communicator> c(new tensor_communicator(std::move(net), std::move(opt)));
  tensor_communicator* self = c.get();
  transport::transport_handlers h;
  h.on_frame = [self](transport::peer_id p, std::span<const uint8_t> f) { self->on_frame(p, f); };
  h.on_peer_down = [self](transport::peer_id p, const error& why) { self->on_peer_down(p, why); };
  c->net_->set_handlers(std::move(h));
  auto where = c->net_->listen(listen);
  if (!where) return where.take_error();
  c->address_ = *where;
  return c;
}

tensor_communicator::~tensor_communicator() {
  // The transport's handlers point here: it goes first (its destructor waits for a handler
  // still running, which reaches the transport through tx_: net_ is null during reset()).
  net_.reset();
}

void tensor_communicator::set_on_failed(std::function<void(const error&)> fn) {
  std::lock_guard lock(mu_);
  on_failed_ = std::move(fn);
}

uint64_t tensor_communicator::bytes_sent() const {
  std::lock_guard lock(mu_);
  return bytes_sent_;
}

status tensor_communicator::send_to(int rank, uint8_t type, std::span<const uint8_t> payload) {
  transport::peer_id p;
  {
    std::lock_guard lock(mu_);
    p = peer_of_[static_cast<size_t>(rank)];
    bytes_sent_ += payload.size();
  }
  if (p == no_peer) return make_error(errc::shard_failed, "tensor group: no connection to rank " + std::to_string(rank));
  header h;
  h.type = type;
  h.rank = static_cast<uint32_t>(opt_.rank);
  h.seq = seq_;
  std::vector<uint8_t> frame(sizeof(header) + payload.size());
  std::memcpy(frame.data(), &h, sizeof(header));
  if (!payload.empty()) std::memcpy(frame.data() + sizeof(header), payload.data(), payload.size());
  if (auto s = tx_->send(p, std::move(frame)); !s) {
    return make_error(errc::shard_failed, "tensor group: sending to rank " + std::to_string(rank) + ": " + s.err().message);
  }
  return ok_status();
}

void tensor_communicator::on_frame(transport::peer_id peer, std::span<const uint8_t> frame) {
  header h;
  if (frame.size() >= sizeof(header)) std::memcpy(&h, frame.data(), sizeof(header));
  const auto payload = frame.subspan(std::min(frame.size(), sizeof(header)));
  std::unique_lock lock(mu_);
  if (failed_) return;
  auto known = rank_of_.find(peer);
  if (frame.size() < sizeof(header) || h.magic != frame_magic || h.rank >= static_cast<uint32_t>(opt_.size) || static_cast<int>(h.rank) == opt_.rank) {
    lock.unlock();
    if (known == rank_of_.end()) return tx_->close(peer);  // a stranger: not our business
    return fail(make_error(errc::protocol_violation, "tensor group: a malformed frame from rank " + std::to_string(known->second)));
  }
  const int from = static_cast<int>(h.rank);
  if (h.type == type_hello) {
    const bool key_ok = payload.size() == opt_.key.size() &&
                        CRYPTO_memcmp(payload.data(), opt_.key.data(), opt_.key.size()) == 0;
    const bool clash = (known != rank_of_.end() && known->second != from) ||
                       (peer_of_[h.rank] != no_peer && peer_of_[h.rank] != peer) || greeted_[h.rank];
    if (!key_ok || clash) {
      lock.unlock();
      return tx_->close(peer);  // a wrong key or a second rank h.rank: refused
    }
    rank_of_[peer] = from;
    peer_of_[h.rank] = peer;
    const bool reply = from < opt_.rank;  // lower ranks connected to us: they wait for our greeting
    if (reply) {
      // Our greeting goes out before the peer counts as greeted: from then on join() may
      // return and this rank's first values must not overtake the greeting the peer waits for.
      lock.unlock();
      if (auto s = send_to(from, type_hello, std::span(reinterpret_cast<const uint8_t*>(opt_.key.data()), opt_.key.size())); !s) {
        return fail(s.err());
      }
      lock.lock();
    }
    greeted_[h.rank] = true;
    lock.unlock();
    cv_.notify_all();
    return;
  }
  if (known == rank_of_.end() || known->second != from || !greeted_[h.rank] || h.type != type_data ||
      payload.size() % sizeof(float) != 0) {
    lock.unlock();
    if (known == rank_of_.end()) return tx_->close(peer);
    return fail(make_error(errc::protocol_violation, "tensor group: an unexpected frame from rank " + std::to_string(from)));
  }
  received r;
  r.seq = h.seq;
  r.values.resize(payload.size() / sizeof(float));
  std::memcpy(r.values.data(), payload.data(), payload.size());
  inbox_[h.rank].push_back(std::move(r));
  lock.unlock();
  cv_.notify_all();
}

void tensor_communicator::on_peer_down(transport::peer_id peer, const error& why) {
  int rank = -1;
  {
    std::lock_guard lock(mu_);
    auto it = rank_of_.find(peer);
    if (it == rank_of_.end()) return;  // a refused stranger
    rank = it->second;
  }
  fail(make_error(errc::shard_failed, "tensor group: lost rank " + std::to_string(rank) + ": " + why.message));
}

void tensor_communicator::fail(const error& why) {
  std::vector<transport::peer_id> peers;
  std::function<void(const error&)> cb;
  {
    std::lock_guard lock(mu_);
    if (failed_) return;
    failed_ = true;
    why_ = why;
    for (auto p : peer_of_) {
      if (p != no_peer) peers.push_back(p);
    }
    cb = on_failed_;
  }
  cv_.notify_all();
  // The peers learn it by their connections closing: their collectives fail instead of waiting.
  for (auto p : peers) tx_->close(p);
  if (cb) cb(why);
}

status tensor_communicator::join(const std::vector<std::string>& addresses) {
  if (addresses.size() != static_cast<size_t>(opt_.size)) {
    return make_error(errc::invalid_request, "tensor group: " + std::to_string(addresses.size()) + " addresses for " +
                                                 std::to_string(opt_.size) + " ranks");
  }
  for (int r = opt_.rank + 1; r < opt_.size; ++r) {
    auto p = tx_->connect(addresses[static_cast<size_t>(r)]);
    if (!p) return make_error(errc::shard_failed, "tensor group: connecting to rank " + std::to_string(r) + ": " + p.err().message);
    {
      std::lock_guard lock(mu_);
      rank_of_[*p] = r;
      peer_of_[static_cast<size_t>(r)] = *p;
    }
    LLMESH_TRY(send_to(r, type_hello, std::span(reinterpret_cast<const uint8_t*>(opt_.key.data()), opt_.key.size())));
  }
  std::unique_lock lock(mu_);
  const bool done = cv_.wait_for(lock, opt_.timeout, [&] {
    if (failed_) return true;
    for (int r = 0; r < opt_.size; ++r) {
      if (r != opt_.rank && !greeted_[static_cast<size_t>(r)]) return false;
    }
    return true;
  });
  if (failed_) return why_;
  if (!done) {
    lock.unlock();
    auto e = make_error(errc::deadline_exceeded, "tensor group: not every rank joined within " +
                                                     std::to_string(opt_.timeout.count()) + " ms");
    fail(e);
    return e;
  }
  return ok_status();
}

status tensor_communicator::exchange(std::span<const float> in, std::vector<std::vector<float>>& from) {
  ++seq_;
  {
    std::lock_guard lock(mu_);
    if (failed_) return make_error(errc::shard_failed, "collective aborted: " + why_.message);
  }
  const auto bytes = std::span(reinterpret_cast<const uint8_t*>(in.data()), in.size_bytes());
  for (int r = 0; r < opt_.size; ++r) {
    if (r == opt_.rank) continue;
    if (auto s = send_to(r, type_data, bytes); !s) {
      fail(s.err());
      return s;
    }
  }
  from.resize(static_cast<size_t>(opt_.size));
  std::unique_lock lock(mu_);
  const bool done = cv_.wait_for(lock, opt_.timeout, [&] {
    if (failed_) return true;
    for (int r = 0; r < opt_.size; ++r) {
      if (r != opt_.rank && inbox_[static_cast<size_t>(r)].empty()) return false;
    }
    return true;
  });
  if (failed_) return make_error(errc::shard_failed, "collective aborted: " + why_.message);
  if (!done) {
    lock.unlock();
    auto e = make_error(errc::deadline_exceeded, "tensor group: a collective waited " +
                                                     std::to_string(opt_.timeout.count()) + " ms for its peers");
    fail(e);
    return e;
  }
  for (int r = 0; r < opt_.size; ++r) {
    if (r == opt_.rank) continue;
    auto& q = inbox_[static_cast<size_t>(r)];
    if (q.front().seq != seq_) {
      const auto got = q.front().seq;
      lock.unlock();
      auto e = make_error(errc::protocol_violation, "tensor group: rank " + std::to_string(r) + " sent collective " +
                                                        std::to_string(got) + " during " + std::to_string(seq_));
      fail(e);
      return e;
    }
    from[static_cast<size_t>(r)] = std::move(q.front().values);
    q.pop_front();
  }
  return ok_status();
}

status tensor_communicator::all_reduce_sum(std::span<float> data) {
  std::vector<std::vector<float>> from;
  LLMESH_TRY(exchange(data, from));
  for (int r = 0; r < opt_.size; ++r) {
    if (r != opt_.rank && from[static_cast<size_t>(r)].size() != data.size()) {
      auto e = make_error(errc::internal, "all_reduce_sum: ranks passed different lengths");
      fail(e);
      return e;
    }
  }
  // Rank order from rank 0's values, as the in-process communicator sums: the same bits.
  auto values = [&](int r) -> const float* { return r == opt_.rank ? data.data() : from[static_cast<size_t>(r)].data(); };
  scratch_.assign(values(0), values(0) + data.size());
  for (int r = 1; r < opt_.size; ++r) {
    const float* src = values(r);
    for (size_t i = 0; i < data.size(); ++i) scratch_[i] = scratch_[i] + src[i];
  }
  std::copy(scratch_.begin(), scratch_.end(), data.begin());
  return ok_status();
}

status tensor_communicator::all_gather(std::span<const float> in, std::span<float> out) {
  std::vector<std::vector<float>> from;
  LLMESH_TRY(exchange(in, from));
  size_t total = 0;
  for (int r = 0; r < opt_.size; ++r) total += r == opt_.rank ? in.size() : from[static_cast<size_t>(r)].size();
  if (total != out.size()) {
    auto e = make_error(errc::internal, "all_gather: output holds " + std::to_string(out.size()) + " floats, ranks sent " +
                                            std::to_string(total));
    fail(e);
    return e;
  }
  size_t at = 0;
  for (int r = 0; r < opt_.size; ++r) {
    std::span<const float> part = r == opt_.rank ? in : std::span<const float>(from[static_cast<size_t>(r)]);
    std::copy(part.begin(), part.end(), out.begin() + static_cast<ptrdiff_t>(at));
    at += part.size();
  }
  return ok_status();
}

}  // namespace llmesh::actors
