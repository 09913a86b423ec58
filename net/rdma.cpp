// net/rdma.cpp — verbs probing and transport selection (see rdma.hpp).
//
// select_transport() decides whether a link may move to RDMA; the RC
// queue-pair path itself is net/rdma_link.hpp (docs/protocol.md, "RDMA
// transport").
#include "net/rdma.hpp"

#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>

#ifdef COROLLA_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

namespace corolla::net {

namespace {

constexpr unsigned speed_codes[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
constexpr const char* speed_names[] = {"SDR", "DDR", "QDR", "FDR10", "FDR", "EDR", "HDR", "NDR", "XDR"};
constexpr double speed_gbps[] = {2.5, 5, 10, 10, 14, 25, 50, 100, 200};

int speed_index(unsigned active_speed) {
  for (int i = 0; i < static_cast<int>(std::size(speed_codes)); ++i)
    if (speed_codes[i] == active_speed) return i;
  return -1;
}

/// Which link layer a NIC's verbs port runs, or "" if it is not a usable
/// RDMA port.
const char* rdma_layer(const nic_info& n) {
  if (n.verbs_device.empty() || !n.active) return "";
  if (n.kind == nic_kind::infiniband) return "InfiniBand";
  if (n.kind == nic_kind::roce) return "RoCE";
  return "";
}

std::string who(const nic_info& n) {
  return n.name.empty() ? std::string(nic_class_name(n.kind))
                        : n.name + " (" + nic_class_name(n.kind) + ")";
}

}  // namespace

double ibv_lane_gbps(unsigned active_speed) {
  const int i = speed_index(active_speed);
  return i < 0 ? 0 : speed_gbps[i];
}

const char* ibv_speed_name(unsigned active_speed) {
  const int i = speed_index(active_speed);
  return i < 0 ? "" : speed_names[i];
}

int ibv_width_lanes(unsigned active_width) {
  switch (active_width) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
    default: return 0;
  }
}

verbs_probe_result verbs_probe() {
  verbs_probe_result r;
#ifndef COROLLA_HAVE_VERBS
  r.reason = "built without libibverbs (rdma-core); links use TCP";
  return r;
#else
  int count = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (!list) {
    const int err = errno;
    r.reason = std::string("no RDMA devices found (ibv_get_device_list failed: ") +
               (err ? std::strerror(err) : "unknown error") +
               (err == ENOSYS ? ", the kernel exposes no RDMA support here" : "") +
               "); links use TCP";
    return r;
  }
  std::string problems;
  for (int d = 0; d < count; ++d) {
    verbs_device_info dev;
    dev.name = ibv_get_device_name(list[d]);
    ibv_context* ctx = ibv_open_device(list[d]);
    if (!ctx) {
      problems += "; cannot open " + dev.name + ": " + std::strerror(errno);
      continue;
    }
    ibv_device_attr attr{};
    if (int rc = ibv_query_device(ctx, &attr); rc != 0) {
      problems += "; ibv_query_device(" + dev.name + ") failed: " + std::strerror(rc);
      ibv_close_device(ctx);
      continue;
    }
    for (int p = 1; p <= attr.phys_port_cnt; ++p) {
      ibv_port_attr pa{};
      if (int rc = ibv_query_port(ctx, static_cast<uint8_t>(p), &pa); rc != 0) {
        problems += "; ibv_query_port(" + dev.name + ", " + std::to_string(p) +
                    ") failed: " + std::strerror(rc);
        continue;
      }
      verbs_port_info port;
      port.port = p;
      port.link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET     ? "Ethernet"
                        : pa.link_layer == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand"
                                                                     : "unspecified";
      port.state = ibv_port_state_str(pa.state);
      port.active = pa.state == IBV_PORT_ACTIVE;
      port.width_lanes = ibv_width_lanes(pa.active_width);
      port.speed_name = ibv_speed_name(pa.active_speed);
      port.lane_gbps = ibv_lane_gbps(pa.active_speed);
      port.gbps = port.lane_gbps * port.width_lanes;
      dev.ports.push_back(std::move(port));
    }
    ibv_close_device(ctx);
    r.devices.push_back(std::move(dev));
  }
  ibv_free_device_list(list);
  r.available = !r.devices.empty();
  if (count == 0) {
    r.reason = "no RDMA devices found (ibv_get_device_list returned 0 devices); links use TCP";
  } else if (!r.available) {
    r.reason = "no usable RDMA device" + problems + "; links use TCP";
  } else {
    int active = 0;
    for (const auto& d : r.devices)
      for (const auto& p : d.ports) active += p.active;
    r.reason = std::to_string(r.devices.size()) + " RDMA device(s), " + std::to_string(active) +
               " active port(s)" + problems;
  }
  return r;
#endif
}

transport_choice select_transport(const nic_info& local, const nic_info& peer) {
  const std::string mine = rdma_layer(local), theirs = rdma_layer(peer);
  if (mine.empty())
    return {"tcp", "this node's " + who(local) + " is not an active RDMA port"};
  if (theirs.empty()) return {"tcp", "peer's " + who(peer) + " is not an active RDMA port"};
  if (mine != theirs)
    return {"tcp", "link layers differ: this node " + mine + ", peer " + theirs};
  return {"rdma", "both ends have active " + mine + " ports (" + local.name + ")"};
}

transport_choice select_transport(const std::vector<nic_info>& local,
                                  std::string_view peer_nic_class) {
  nic_info peer;
  peer.active = true;
  peer.name = "peer";
  if (peer_nic_class == "ib") {
    peer.kind = nic_kind::infiniband;
  } else if (peer_nic_class == "roce") {
    peer.kind = nic_kind::roce;
  } else {
    return {"tcp", "peer has no active RDMA port (class " +
                       (peer_nic_class.empty() ? std::string("unknown") : std::string(peer_nic_class)) +
                       ")"};
  }
  // A peer announces the best class it has; an "ib" peer may not have RoCE
  // too, so only the same class counts.
  peer.verbs_device = "peer";
  const nic_info* best_local_rdma = nullptr;
  for (const auto& n : local) {
    if (!*rdma_layer(n)) continue;
    if (n.kind == peer.kind) return select_transport(n, peer);
    if (!best_local_rdma) best_local_rdma = &n;
  }
  if (best_local_rdma) return select_transport(*best_local_rdma, peer);
  return {"tcp", "this node has no active RDMA port (class " + node_nic_class(local) + ")"};
}

}  // namespace corolla::net
