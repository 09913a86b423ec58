// net/rdma_verbs.cpp — the libibverbs implementation of net/rdma_verbs.hpp,
// and the address encoding shared with the fake fabric.
//
// One protection domain per opened device; per queue pair one completion
// channel and one completion queue shared by sends and receives. RoCE ports
// address the peer through its GID (global routing header, GID index from
// COROLLA_RDMA_GID_INDEX, default 0); InfiniBand ports through its LID.
#include "net/rdma_verbs.hpp"

#include <fcntl.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <unordered_map>

#include <spdlog/spdlog.h>

#ifdef COROLLA_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

#include "net/rdma.hpp"

namespace corolla::net::rdma {

namespace {

template <class T>
void put(std::vector<std::uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof v);  // little-endian hosts only (x86-64, aarch64)
}

template <class T>
T get(const std::uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  p += sizeof v;
  return v;
}

constexpr std::size_t address_bytes = 4 + 4 + 2 + 1 + 1 + 16 + 4 + 1 + 1 + 2;

}  // namespace

std::vector<std::uint8_t> qp_address::encode() const {
  std::vector<std::uint8_t> out;
  out.reserve(address_bytes + 4);
  put(out, qpn);
  put(out, psn);
  put(out, lid);
  put(out, port);
  put(out, mtu);
  out.insert(out.end(), gid.begin(), gid.end());
  put(out, max_read_size);
  put(out, max_dest_reads);
  put(out, roce);
  put(out, std::uint16_t{0});  // reserved
  return out;
}

qp_address qp_address::decode(const std::uint8_t* data, std::size_t size) {
  if (size != address_bytes)
    throw std::invalid_argument("RDMA address is " + std::to_string(size) + " bytes, expected " +
                                std::to_string(address_bytes));
  qp_address a;
  const std::uint8_t* p = data;
  a.qpn = get<std::uint32_t>(p);
  a.psn = get<std::uint32_t>(p) & 0xFFFFFFu;
  a.lid = get<std::uint16_t>(p);
  a.port = get<std::uint8_t>(p);
  a.mtu = get<std::uint8_t>(p);
  std::memcpy(a.gid.data(), p, 16);
  p += 16;
  a.max_read_size = get<std::uint32_t>(p);
  a.max_dest_reads = get<std::uint8_t>(p);
  a.roce = get<std::uint8_t>(p);
  return a;
}

#ifndef COROLLA_HAVE_VERBS

std::unique_ptr<device> open_verbs_device(const std::string&, int) {
  throw std::runtime_error("built without libibverbs (rdma-core); links use TCP");
}

#else

namespace {

std::string verbs_error(const std::string& what, int err) {
  return what + " failed: " + std::strerror(err);
}

/// The protection domain and context of an opened device, shared by its
/// queue pairs (they may outlive the device object).
struct verbs_context {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ~verbs_context() {
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
};

/// What every queue pair of one opened port shares.
struct port_params {
  std::uint8_t port = 1;
  bool roce = false;
  ibv_port_attr attr{};
  int gid_index = 0;
  std::uint32_t max_read_size = 1u << 30;
  int max_rd_atom = 16;       ///< READs this device answers at once per QP (responder)
  int max_init_rd_atom = 16;  ///< READs this device issues at once per QP (initiator)
};

class verbs_queue_pair final : public queue_pair {
 public:
  verbs_queue_pair(std::shared_ptr<verbs_context> vc, const port_params& pp, int depth)
      : vc_(std::move(vc)), port_(pp.port), roce_(pp.roce), port_attr_(pp.attr), gid_index_(pp.gid_index),
        max_init_rd_atom_(pp.max_init_rd_atom) {
    // Releases what was made so far and throws; `err` is errno or a verbs return code.
    auto fail = [this](const std::string& what, int err) {
      cleanup();
      throw std::runtime_error(verbs_error(what, err));
    };
    channel_ = ibv_create_comp_channel(vc_->ctx);
    if (!channel_) fail("ibv_create_comp_channel", errno);
    const int flags = ::fcntl(channel_->fd, F_GETFL);
    if (flags < 0 || ::fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0)
      fail("making the completion channel non-blocking", errno);
    cq_ = ibv_create_cq(vc_->ctx, 2 * depth + 1, nullptr, channel_, 0);
    if (!cq_) fail("ibv_create_cq", errno);
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 1;
    init.cap.max_send_wr = static_cast<std::uint32_t>(depth);
    init.cap.max_recv_wr = static_cast<std::uint32_t>(depth);
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    qp_ = ibv_create_qp(vc_->pd, &init);
    if (!qp_) fail("ibv_create_qp", errno);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = port_;
    attr.qp_access_flags = IBV_ACCESS_REMOTE_READ;  // the peer READs rendezvous frames
    if (int rc = ibv_modify_qp(qp_, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        rc != 0)
      fail("ibv_modify_qp(INIT)", rc);
    local_.qpn = qp_->qp_num;
    local_.psn = std::random_device{}() & 0xFFFFFFu;
    local_.lid = port_attr_.lid;
    local_.port = port_;
    local_.mtu = static_cast<std::uint8_t>(port_attr_.active_mtu);
    local_.max_read_size = pp.max_read_size;
    local_.max_dest_reads = static_cast<std::uint8_t>(std::clamp(pp.max_rd_atom, 1, 255));
    local_.roce = roce_ ? 1 : 0;
    if (roce_) {
      ibv_gid gid{};
      if (int rc = ibv_query_gid(vc_->ctx, port_, gid_index_, &gid); rc != 0)
        fail("ibv_query_gid", rc);
      std::memcpy(local_.gid.data(), gid.raw, 16);
    }
    if (int rc = ibv_req_notify_cq(cq_, 0); rc != 0)
      fail("ibv_req_notify_cq", rc);
  }
  ~verbs_queue_pair() override { cleanup(); }

  qp_address local_address() const override { return local_; }

  void connect(const qp_address& remote) override {
    if ((remote.roce != 0) != roce_)
      throw std::runtime_error(std::string("link layers differ: this port is ") + (roce_ ? "RoCE" : "InfiniBand") +
                               ", the peer's " + (remote.roce ? "RoCE" : "InfiniBand"));
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    const int remote_mtu = remote.mtu ? static_cast<int>(remote.mtu) : static_cast<int>(IBV_MTU_1024);
    attr.path_mtu = static_cast<ibv_mtu>(std::min<int>(remote_mtu, local_.mtu));
    attr.dest_qp_num = remote.qpn;
    attr.rq_psn = remote.psn;
    attr.max_dest_rd_atomic = local_.max_dest_reads;
    attr.min_rnr_timer = 12;  // 0.64 ms
    attr.ah_attr.port_num = port_;
    if (roce_) {
      attr.ah_attr.is_global = 1;
      std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid.data(), 16);
      attr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(gid_index_);
      attr.ah_attr.grh.hop_limit = 64;
    } else {
      attr.ah_attr.dlid = remote.lid;
    }
    if (int rc = ibv_modify_qp(qp_, &attr,
                               IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
        rc != 0)
      throw std::runtime_error(verbs_error("ibv_modify_qp(RTR)", rc));
    ibv_qp_attr rts{};
    rts.qp_state = IBV_QPS_RTS;
    rts.timeout = 14;   // 4.096 us * 2^14 = 67 ms per retry
    rts.retry_cnt = 7;
    rts.rnr_retry = 7;  // the protocol's credits should make RNR impossible; retry forever if not
    rts.sq_psn = local_.psn;
    // Never more READs in flight than this device issues or the peer answers.
    rts.max_rd_atomic = static_cast<std::uint8_t>(
        std::clamp(std::min<int>(max_init_rd_atom_, remote.max_dest_reads ? remote.max_dest_reads : 1), 1, 255));
    if (int rc = ibv_modify_qp(qp_, &rts,
                               IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                   IBV_QP_MAX_QP_RD_ATOMIC);
        rc != 0)
      throw std::runtime_error(verbs_error("ibv_modify_qp(RTS)", rc));
  }

  memory_keys register_memory(void* data, std::size_t size, unsigned access) override {
    int flags = 0;
    if (access & local_write) flags |= IBV_ACCESS_LOCAL_WRITE;
    if (access & remote_read) flags |= IBV_ACCESS_REMOTE_READ;
    ibv_mr* mr = ibv_reg_mr(vc_->pd, data, size, flags);
    if (!mr) throw std::runtime_error(verbs_error("ibv_reg_mr(" + std::to_string(size) + " bytes)", errno));
    mrs_[mr->lkey] = mr;
    return {mr->lkey, mr->rkey};
  }

  void deregister(const memory_keys& keys) override {
    auto it = mrs_.find(keys.lkey);
    if (it == mrs_.end()) return;
    ibv_dereg_mr(it->second);
    mrs_.erase(it);
  }

  void post_recv(std::uint64_t wr_id, void* buffer, std::uint32_t size, std::uint32_t lkey) override {
    ibv_sge sge{reinterpret_cast<std::uint64_t>(buffer), size, lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (int rc = ibv_post_recv(qp_, &wr, &bad); rc != 0) throw std::runtime_error(verbs_error("ibv_post_recv", rc));
  }

  void post_send(std::uint64_t wr_id, const void* data, std::uint32_t size, std::uint32_t lkey) override {
    post(IBV_WR_SEND, wr_id, const_cast<void*>(data), size, lkey, 0, 0);
  }

  void post_read(std::uint64_t wr_id, void* local, std::uint32_t size, std::uint32_t lkey, std::uint64_t remote_addr,
                 std::uint32_t rkey) override {
    post(IBV_WR_RDMA_READ, wr_id, local, size, lkey, remote_addr, rkey);
  }

  int poll(completion* out, int max) override {
    ibv_wc wc[16];
    int total = 0;
    while (total < max) {
      const int want = std::min(16, max - total);
      const int n = ibv_poll_cq(cq_, want, wc);
      if (n < 0) throw std::runtime_error("ibv_poll_cq failed");
      for (int i = 0; i < n; ++i) {
        completion& c = out[total++];
        c.wr_id = wc[i].wr_id;
        c.ok = wc[i].status == IBV_WC_SUCCESS;
        c.bytes = wc[i].byte_len;
        c.error = c.ok ? "" : ibv_wc_status_str(wc[i].status);
        // A failed work request's opcode is undefined; the caller knows it
        // from the wr_id.
        c.what = wc[i].opcode == IBV_WC_RECV ? completion::op::recv
                 : wc[i].opcode == IBV_WC_RDMA_READ ? completion::op::read
                                                    : completion::op::send;
      }
      if (n < want) break;
    }
    return total;
  }

  int event_fd() const override { return channel_->fd; }

  void arm() override {
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    unsigned events = 0;
    while (ibv_get_cq_event(channel_, &cq, &context) == 0) ++events;  // non-blocking fd: stops at EAGAIN
    if (events) ibv_ack_cq_events(cq_, events);
    ibv_req_notify_cq(cq_, 0);
  }

 private:
  /// One signaled work request on the send queue (a SEND or a READ).
  void post(ibv_wr_opcode opcode, std::uint64_t wr_id, void* local, std::uint32_t size, std::uint32_t lkey,
            std::uint64_t remote_addr, std::uint32_t rkey) {
    ibv_sge sge{reinterpret_cast<std::uint64_t>(local), size, lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote_addr;  // READ only
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0)
      throw std::runtime_error(verbs_error(opcode == IBV_WR_SEND ? "ibv_post_send(SEND)" : "ibv_post_send(RDMA READ)", rc));
  }

  void cleanup() {
    for (auto& [p, mr] : mrs_) ibv_dereg_mr(mr);
    mrs_.clear();
    if (qp_) ibv_destroy_qp(qp_);
    qp_ = nullptr;
    if (cq_) ibv_destroy_cq(cq_);
    cq_ = nullptr;
    if (channel_) ibv_destroy_comp_channel(channel_);
    channel_ = nullptr;
  }

  std::shared_ptr<verbs_context> vc_;
  std::uint8_t port_;
  bool roce_;
  ibv_port_attr port_attr_;
  int gid_index_;
  int max_init_rd_atom_;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  qp_address local_;
  std::unordered_map<std::uint32_t, ibv_mr*> mrs_;  // by lkey
};

class verbs_device final : public device {
 public:
  verbs_device(std::shared_ptr<verbs_context> vc, std::string name, port_params pp)
      : vc_(std::move(vc)), name_(std::move(name)), pp_(pp) {}
  std::unique_ptr<queue_pair> create_queue_pair(int depth) override {
    return std::make_unique<verbs_queue_pair>(vc_, pp_, depth);
  }
  std::string name() const override { return name_ + ":" + std::to_string(pp_.port); }
  nic_info nic() const override {
    nic_info n;
    n.name = name();
    n.kind = pp_.roce ? nic_kind::roce : nic_kind::infiniband;
    n.bandwidth_bps = ibv_lane_gbps(pp_.attr.active_speed) * ibv_width_lanes(pp_.attr.active_width) * 1e9;
    n.active = true;
    n.verbs_device = name_;
    n.port = pp_.port;
    return n;
  }

 private:
  std::shared_ptr<verbs_context> vc_;
  std::string name_;
  port_params pp_;
};

/// The GID index a RoCE port should use: COROLLA_RDMA_GID_INDEX if set, else
/// the first RoCE v2 GID holding an IPv4-mapped address (routable, what
/// rdma-core's tools pick), else the first RoCE v2 GID, else 0.
int choose_gid_index(ibv_context* ctx, std::uint8_t port, int table_len) {
  if (const char* g = std::getenv("COROLLA_RDMA_GID_INDEX")) return std::atoi(g);
  int first_v2 = -1;
  for (int i = 0; i < table_len; ++i) {
    ibv_gid_entry entry{};
    if (ibv_query_gid_ex(ctx, port, static_cast<std::uint32_t>(i), &entry, 0) != 0) continue;
    if (entry.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
    const std::uint8_t* raw = entry.gid.raw;
    const bool v4_mapped = std::all_of(raw, raw + 10, [](std::uint8_t b) { return b == 0; }) && raw[10] == 0xff &&
                           raw[11] == 0xff;
    if (v4_mapped) return i;
    if (first_v2 < 0) first_v2 = i;
  }
  return first_v2 >= 0 ? first_v2 : 0;
}

/// Each queue pair pins its 8 MiB of slots: warn when the locked-memory
/// limit will not allow many links.
void warn_about_memlock() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_MEMLOCK, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return;
  if (lim.rlim_cur < (rlim_t{64} << 20))
    spdlog::warn("RDMA: the locked-memory limit (RLIMIT_MEMLOCK) is {} KiB; every RDMA link pins 8 MiB of buffers "
                 "plus the tensors in flight, so registrations will fail beyond a few links (raise it with "
                 "ulimit -l or limits.conf)",
                 lim.rlim_cur / 1024);
}

}  // namespace

std::unique_ptr<device> open_verbs_device(const std::string& name, int port) {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (!list) throw std::runtime_error(verbs_error("ibv_get_device_list", errno) + "; links use TCP");
  struct list_guard {
    ibv_device** l;
    ~list_guard() { ibv_free_device_list(l); }
  } guard{list};
  if (count == 0) throw std::runtime_error("no RDMA devices found; links use TCP");
  std::string tried;
  for (int d = 0; d < count; ++d) {
    const std::string dev_name = ibv_get_device_name(list[d]);
    if (!name.empty() && dev_name != name) continue;
    auto vc = std::make_shared<verbs_context>();
    vc->ctx = ibv_open_device(list[d]);
    if (!vc->ctx) {
      tried += "; cannot open " + dev_name + ": " + std::strerror(errno);
      continue;
    }
    ibv_device_attr dattr{};
    if (int rc = ibv_query_device(vc->ctx, &dattr); rc != 0) {
      tried += "; " + verbs_error("ibv_query_device(" + dev_name + ")", rc);
      continue;
    }
    for (int p = 1; p <= dattr.phys_port_cnt; ++p) {
      if (port != 0 && p != port) continue;
      ibv_port_attr pa{};
      if (ibv_query_port(vc->ctx, static_cast<std::uint8_t>(p), &pa) != 0 || pa.state != IBV_PORT_ACTIVE) {
        tried += "; " + dev_name + " port " + std::to_string(p) + " is not active";
        continue;
      }
      vc->pd = ibv_alloc_pd(vc->ctx);
      if (!vc->pd) throw std::runtime_error(verbs_error("ibv_alloc_pd(" + dev_name + ")", errno));
      port_params pp;
      pp.port = static_cast<std::uint8_t>(p);
      pp.roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
      pp.attr = pa;
      pp.gid_index = pp.roce ? choose_gid_index(vc->ctx, pp.port, pa.gid_tbl_len) : 0;
      // Devices cap one message (and so one READ) at 2^31 bytes at most.
      pp.max_read_size = pa.max_msg_sz ? std::min<std::uint32_t>(pa.max_msg_sz, 1u << 30) : 1u << 30;
      pp.max_rd_atom = std::clamp(dattr.max_qp_rd_atom, 1, 16);
      pp.max_init_rd_atom = std::clamp(dattr.max_qp_init_rd_atom, 1, 16);
      warn_about_memlock();
      return std::make_unique<verbs_device>(vc, dev_name, pp);
    }
  }
  if (!name.empty() && tried.empty()) throw std::runtime_error("no RDMA device named " + name + "; links use TCP");
  throw std::runtime_error("no active RDMA port" + tried + "; links use TCP");
}

#endif

}  // namespace corolla::net::rdma
