// net/rdma_fake.cpp — the in-process fabric of net/rdma_fake.hpp.
#include "net/rdma_fake.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
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
};

class fake_qp final : public queue_pair {
 public:
  fake_qp(std::shared_ptr<fake_fabric_impl> fabric, std::uint32_t qpn, std::uint8_t port);
  ~fake_qp() override;

  qp_address local_address() const override;
  void connect(const qp_address& remote) override;
  memory_keys register_memory(void* data, std::size_t size) override;
  void deregister(const memory_keys& keys) override;
  void post_recv(std::uint64_t wr_id, void* buffer, std::uint32_t size, std::uint32_t lkey) override;
  void post_send(std::uint64_t wr_id, const void* data, std::uint32_t size, std::uint32_t lkey) override;
  void post_read(std::uint64_t wr_id, void* local, std::uint32_t size, std::uint32_t lkey, std::uint64_t remote_addr,
                 std::uint32_t rkey) override;
  int poll(completion* out, int max) override;
  int event_fd() const override { return event_fd_; }
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
  std::deque<posted_recv> recvs_;
  std::uint32_t remote_qpn_ = 0;
  bool connected_ = false;
  std::deque<completion> completions_;
  std::unordered_set<std::uint32_t> keys_;  // registrations of this queue pair

 private:
  std::shared_ptr<fake_fabric_impl> fabric_;
  std::uint32_t qpn_;
  std::uint8_t port_;
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

  mutable std::mutex mu;
  std::map<std::uint32_t, fake_qp*> qps;
  std::map<std::uint32_t, region> regions;  // rkey -> range
  std::uint32_t next_qpn = 0x100, next_key = 1;
  int next_device = 0;
  std::string failure;
  counters totals;
};

fake_qp::fake_qp(std::shared_ptr<fake_fabric_impl> fabric, std::uint32_t qpn, std::uint8_t port)
    : fabric_(std::move(fabric)), qpn_(qpn), port_(port) {
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
  a.port = port_;
  a.mtu = 5;  // IBV_MTU_4096
  a.max_read_size = 1u << 30;
  return a;
}

void fake_qp::connect(const qp_address& remote) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  if (!fabric_->qps.count(remote.qpn))
    throw std::runtime_error("fake RDMA: no queue pair " + std::to_string(remote.qpn) + " on this fabric");
  remote_qpn_ = remote.qpn;
  connected_ = true;
}

memory_keys fake_qp::register_memory(void* data, std::size_t size) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  const std::uint32_t key = fabric_->next_key++;
  fabric_->regions[key] = region{data, size};
  keys_.insert(key);
  return {key, key};
}

void fake_qp::deregister(const memory_keys& keys) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  if (keys_.erase(keys.lkey)) fabric_->regions.erase(keys.lkey);
}

void fake_qp::post_recv(std::uint64_t wr_id, void* buffer, std::uint32_t size, std::uint32_t) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  recvs_.push_back({wr_id, buffer, size});
}

void fake_qp::post_send(std::uint64_t wr_id, const void* data, std::uint32_t size, std::uint32_t) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  auto fail = [&](const std::string& why) { complete({wr_id, completion::op::send, false, 0, why}); };
  if (!fabric_->failure.empty()) return fail(fabric_->failure);
  if (!connected_) return fail("fake RDMA: send on a queue pair that is not connected");
  auto peer_it = fabric_->qps.find(remote_qpn_);
  if (peer_it == fabric_->qps.end()) return fail("transport retry counter exceeded (peer queue pair gone)");
  fake_qp& peer = *peer_it->second;
  if (peer.recvs_.empty())
    return fail("receiver not ready: the peer has no receive posted (the protocol's credits failed)");
  posted_recv r = peer.recvs_.front();
  peer.recvs_.pop_front();
  if (size > r.size) {
    peer.complete({r.wr_id, completion::op::recv, false, 0, "local length error"});
    return fail("remote invalid request error (message larger than the posted receive)");
  }
  if (size) std::memcpy(r.buffer, data, size);
  fabric_->totals.sends += 1;
  fabric_->totals.send_bytes += size;
  peer.complete({r.wr_id, completion::op::recv, true, size, ""});
  complete({wr_id, completion::op::send, true, size, ""});
}

void fake_qp::post_read(std::uint64_t wr_id, void* local, std::uint32_t size, std::uint32_t, std::uint64_t remote_addr,
                        std::uint32_t rkey) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  auto fail = [&](const std::string& why) { complete({wr_id, completion::op::read, false, 0, why}); };
  if (!fabric_->failure.empty()) return fail(fabric_->failure);
  if (!connected_ || !fabric_->qps.count(remote_qpn_)) return fail("fake RDMA: READ without a connected peer");
  auto it = fabric_->regions.find(rkey);
  if (it == fabric_->regions.end()) return fail("remote access error (unknown rkey)");
  const auto base = reinterpret_cast<std::uint64_t>(it->second.data);
  if (remote_addr < base || remote_addr + size > base + it->second.size)
    return fail("remote access error (outside the registered range)");
  if (size) std::memcpy(local, reinterpret_cast<const void*>(remote_addr), size);
  fabric_->totals.reads += 1;
  fabric_->totals.read_bytes += size;
  complete({wr_id, completion::op::read, true, size, ""});
}

int fake_qp::poll(completion* out, int max) {
  std::lock_guard<std::mutex> lock(fabric_->mu);
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
  auto qp = std::make_unique<fake_qp>(fabric_, qpn, std::uint8_t{1});
  std::lock_guard<std::mutex> lock(fabric_->mu);
  fabric_->qps[qpn] = qp.get();
  return qp;
}

}  // namespace

std::shared_ptr<fake_fabric> fake_fabric::create() { return std::make_shared<fake_fabric_impl>(); }

}  // namespace corolla::net::rdma
