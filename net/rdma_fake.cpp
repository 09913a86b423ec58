// net/rdma_fake.cpp — the in-process fabric of net/rdma_fake.hpp.
//
// Work requests are checked when posted (keys, ranges, access) and carried
// out later, in post order, when any queue pair on the fabric polls: the
// bytes of a SEND or READ are taken at that moment, as a NIC would DMA them
// after the post, so a sender that reuses a buffer before its completion
// sends the wrong bytes here too.
#include "net/rdma_fake.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_set>

namespace corolla::net::rdma {

namespace {

class fake_fabric_impl;

struct posted_recv {
  std::uint64_t wr_id;
  void* buffer;
  std::uint32_t size;
};

struct region {
  const void* data;
  std::size_t size;
  unsigned access;
  std::uint32_t owner_qpn;
};

/// A posted SEND or READ waiting for the fabric to carry it out.
struct transfer {
  bool read = false;
  std::uint32_t from_qpn = 0;  ///< the poster
  std::uint64_t wr_id = 0;
  const void* send_data = nullptr;  ///< SEND: the bytes to send
  void* read_local = nullptr;       ///< READ: where the bytes go
  std::uint32_t size = 0;
  std::uint64_t remote_addr = 0;
  std::uint32_t rkey = 0;
};

class fake_qp final : public queue_pair {
 public:
  fake_qp(std::shared_ptr<fake_fabric_impl> fabric, std::uint32_t qpn);
  ~fake_qp() override;

  qp_address local_address() const override;
  void connect(const qp_address& remote) override;
  memory_keys register_memory(void* data, std::size_t size, unsigned access) override;
  void deregister(const memory_keys& keys) override;
  void post_recv(std::uint64_t wr_id, void* buffer, std::uint32_t size, std::uint32_t lkey) override;
  void post_send(std::uint64_t wr_id, const void* data, std::uint32_t size, std::uint32_t lkey) override;
  void post_read(std::uint64_t wr_id, void* local, std::uint32_t size, std::uint32_t lkey, std::uint64_t remote_addr,
                 std::uint32_t rkey) override;
  int poll(completion* out, int max) override;
  int event_fd() const override { return event_fd_; }
  /// Makes the owner's poller look (the fabric unstalled).
  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(event_fd_, &one, sizeof one);
  }
  void arm() override {
    std::uint64_t n;
    [[maybe_unused]] auto r = ::read(event_fd_, &n, sizeof n);
  }

  // ---- under the fabric's lock ----
  void complete(completion c) {
    completions_.push_back(std::move(c));
    const std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(event_fd_, &one, sizeof one);
  }
  /// "" when [p, p + size) lies in a registration of this queue pair with
  /// `lkey` and `access`, else why not.
  std::string check_local(const void* p, std::uint32_t size, std::uint32_t lkey, unsigned access) const;

  std::deque<posted_recv> recvs_;
  std::uint32_t remote_qpn_ = 0;
  bool connected_ = false;
  std::deque<completion> completions_;
  std::unordered_set<std::uint32_t> keys_;  // registrations of this queue pair

 private:
  std::shared_ptr<fake_fabric_impl> fabric_;
  std::uint32_t qpn_;
  int event_fd_ = -1;
};

class fake_device final : public device {
 public:
  fake_device(std::shared_ptr<fake_fabric_impl> fabric, int index, nic_kind kind)
      : fabric_(std::move(fabric)), index_(index), kind_(kind) {}
  std::unique_ptr<queue_pair> create_queue_pair(int depth) override;
  std::string name() const override { return "fake" + std::to_string(index_) + ":1"; }
  nic_info nic() const override {
    nic_info n;
    n.name = name();
    n.kind = kind_;
    n.bandwidth_bps = 100e9;
    n.active = true;
    n.verbs_device = "fake" + std::to_string(index_);
    n.port = 1;
    return n;
  }

 private:
  std::shared_ptr<fake_fabric_impl> fabric_;
  int index_;
  nic_kind kind_;
};

class fake_fabric_impl final : public fake_fabric, public std::enable_shared_from_this<fake_fabric_impl> {
 public:
  std::shared_ptr<device> open_device(nic_kind kind) override {
    std::lock_guard<std::mutex> lock(mu);
    return std::make_shared<fake_device>(shared_from_this(), next_device++, kind);
  }
  void fail_all(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu);
    failure = reason;
  }
  counters stats() const override {
    std::lock_guard<std::mutex> lock(mu);
    return totals;
  }
  void stall(bool on) override;

  /// Carries out every posted transfer, in post order (under the lock).
  void run_transfers();

  mutable std::mutex mu;
  std::map<std::uint32_t, fake_qp*> qps;
  std::map<std::uint32_t, region> regions;  // key -> range (lkey = rkey)
  std::deque<transfer> transfers;
  std::uint32_t next_qpn = 0x100, next_key = 1;
  int next_device = 0;
  std::string failure;
  bool stalled = false;
  counters totals;
};

fake_qp::fake_qp(std::shared_ptr<fake_fabric_impl> fabric, std::uint32_t qpn)
    : fabric_(std::move(fabric)), qpn_(qpn) {
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) throw std::runtime_error("fake RDMA: eventfd failed");
}

fake_qp::~fake_qp() {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  fabric_->qps.erase(qpn_);
  for (std::uint32_t key : keys_) fabric_->regions.erase(key);
  ::close(event_fd_);
}

qp_address fake_qp::local_address() const {
  qp_address a;
  a.qpn = qpn_;
  a.psn = qpn_ * 7 & 0xFFFFFFu;
  a.lid = 1;
  a.port = 1;
  a.mtu = 5;  // IBV_MTU_4096
  a.max_read_size = 1u << 30;
  a.max_dest_reads = 16;
  return a;
}

void fake_qp::connect(const qp_address& remote) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  if (!fabric_->qps.count(remote.qpn))
    throw std::runtime_error("fake RDMA: no queue pair " + std::to_string(remote.qpn) + " on this fabric");
  remote_qpn_ = remote.qpn;
  connected_ = true;
}

memory_keys fake_qp::register_memory(void* data, std::size_t size, unsigned access) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  const std::uint32_t key = fabric_->next_key++;
  fabric_->regions[key] = region{data, size, access, qpn_};
  keys_.insert(key);
  return {key, key};
}

void fake_qp::deregister(const memory_keys& keys) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  if (keys_.erase(keys.lkey)) fabric_->regions.erase(keys.lkey);
}

std::string fake_qp::check_local(const void* p, std::uint32_t size, std::uint32_t lkey, unsigned access) const {
  if (!keys_.count(lkey)) return "local protection error (lkey " + std::to_string(lkey) + " not registered here)";
  const region& r = fabric_->regions.at(lkey);
  const auto base = reinterpret_cast<std::uintptr_t>(r.data), at = reinterpret_cast<std::uintptr_t>(p);
  if (at < base || at + size > base + r.size) return "local protection error (buffer outside its registration)";
  if ((r.access & access) != access) return "local protection error (registered without local write)";
  return "";
}

void fake_qp::post_recv(std::uint64_t wr_id, void* buffer, std::uint32_t size, std::uint32_t lkey) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  if (auto why = check_local(buffer, size, lkey, local_write); !why.empty())
    throw std::runtime_error("fake RDMA: post_recv: " + why);
  recvs_.push_back({wr_id, buffer, size});
}

void fake_qp::post_send(std::uint64_t wr_id, const void* data, std::uint32_t size, std::uint32_t lkey) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  if (auto why = check_local(data, size, lkey, 0); !why.empty()) throw std::runtime_error("fake RDMA: post_send: " + why);
  transfer t;
  t.from_qpn = qpn_;
  t.wr_id = wr_id;
  t.send_data = data;
  t.size = size;
  fabric_->transfers.push_back(t);
  const std::uint64_t one = 1;  // the poster's own poll runs it
  [[maybe_unused]] auto r = ::write(event_fd_, &one, sizeof one);
}

void fake_qp::post_read(std::uint64_t wr_id, void* local, std::uint32_t size, std::uint32_t lkey,
                        std::uint64_t remote_addr, std::uint32_t rkey) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  if (auto why = check_local(local, size, lkey, local_write); !why.empty())
    throw std::runtime_error("fake RDMA: post_read: " + why);
  transfer t;
  t.read = true;
  t.from_qpn = qpn_;
  t.wr_id = wr_id;
  t.read_local = local;
  t.size = size;
  t.remote_addr = remote_addr;
  t.rkey = rkey;
  fabric_->transfers.push_back(t);
  const std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(event_fd_, &one, sizeof one);
}

void fake_fabric_impl::stall(bool on) {
  std::lock_guard<std::mutex> lock(mu);
  stalled = on;
  if (!on)
    for (auto& [qpn, qp] : qps) qp->wake();
}

void fake_fabric_impl::run_transfers() {
  if (stalled) return;
  while (!transfers.empty()) {
    const transfer t = transfers.front();
    transfers.pop_front();
    auto self_it = qps.find(t.from_qpn);
    if (self_it == qps.end()) continue;  // the poster is gone with its queue
    fake_qp& self = *self_it->second;
    const completion::op op = t.read ? completion::op::read : completion::op::send;
    auto fail = [&](const std::string& why) { self.complete({t.wr_id, op, false, 0, why}); };
    if (!failure.empty()) {
      fail(failure);
      continue;
    }
    auto peer_it = self.connected_ ? qps.find(self.remote_qpn_) : qps.end();
    if (peer_it == qps.end()) {
      fail("transport retry counter exceeded (no connected peer queue pair)");
      continue;
    }
    fake_qp& peer = *peer_it->second;
    if (!peer.connected_ || peer.remote_qpn_ != t.from_qpn) {
      fail("transport retry counter exceeded (the peer's queue pair is not connected to this one)");
      continue;
    }
    if (t.read) {
      auto it = regions.find(t.rkey);
      if (it == regions.end() || it->second.owner_qpn != peer_it->first) {
        fail("remote access error (unknown rkey)");
        continue;
      }
      const region& r = it->second;
      const auto base = reinterpret_cast<std::uint64_t>(r.data);
      if (!(r.access & remote_read)) {
        fail("remote access error (registered without remote read)");
        continue;
      }
      if (t.remote_addr < base || t.remote_addr + t.size > base + r.size) {
        fail("remote access error (outside the registered range)");
        continue;
      }
      if (t.size) std::memcpy(t.read_local, reinterpret_cast<const void*>(t.remote_addr), t.size);
      totals.reads += 1;
      totals.read_bytes += t.size;
      self.complete({t.wr_id, op, true, t.size, ""});
      continue;
    }
    if (peer.recvs_.empty()) {
      fail("receiver not ready: the peer has no receive posted (the protocol's credits failed)");
      continue;
    }
    const posted_recv r = peer.recvs_.front();
    peer.recvs_.pop_front();
    if (t.size > r.size) {
      peer.complete({r.wr_id, completion::op::recv, false, 0, "local length error"});
      fail("remote invalid request error (message larger than the posted receive)");
      continue;
    }
    if (t.size) std::memcpy(r.buffer, t.send_data, t.size);
    totals.sends += 1;
    totals.send_bytes += t.size;
    peer.complete({r.wr_id, completion::op::recv, true, t.size, ""});
    self.complete({t.wr_id, op, true, t.size, ""});
  }
}

int fake_qp::poll(completion* out, int max) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  fabric_->run_transfers();
  int n = 0;
  while (n < max && !completions_.empty()) {
    out[n++] = std::move(completions_.front());
    completions_.pop_front();
  }
  return n;
}

std::unique_ptr<queue_pair> fake_device::create_queue_pair(int) {
  std::uint32_t qpn;
  {
    std::lock_guard<std::mutex> lock(fabric_->mu);
    qpn = fabric_->next_qpn++;
  }
  auto qp = std::make_unique<fake_qp>(fabric_, qpn);
  std::lock_guard<std::mutex> lock(fabric_->mu);
  fabric_->qps[qpn] = qp.get();
  return qp;
}

}  // namespace

std::shared_ptr<fake_fabric> fake_fabric::create() { return std::make_shared<fake_fabric_impl>(); }

}  // namespace corolla::net::rdma
