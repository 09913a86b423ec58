// net/rdma.hpp — RDMA (verbs) availability and the choice between the RDMA
// and TCP transports for a link.
//
// verbs_probe() asks libibverbs (rdma-core) what the kernel exposes; on a
// machine without RDMA devices it says so in one clear sentence and every
// link uses TCP (ZeroMQ). select_transport() is the rule a link applies once
// it knows both ends' NICs (the peer's class arrives in its hello).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "net/nic.hpp"

namespace corolla::net {

/// One port of a verbs device, as ibv_query_port reports it.
struct verbs_port_info {
  int port = 0;               ///< from 1
  std::string link_layer;     ///< "InfiniBand", "Ethernet" (RoCE) or "unspecified"
  std::string state;          ///< "ACTIVE", "DOWN", "INIT", ... (ibv_port_state_str)
  bool active = false;        ///< state == ACTIVE
  int width_lanes = 0;        ///< 1, 2, 4, 8 or 12; 0 = unknown
  std::string speed_name;     ///< "EDR", "HDR", ...; "" = unknown
  double lane_gbps = 0;       ///< nominal signalling rate per lane
  double gbps = 0;            ///< lanes x lane rate, as /sys/.../rate prints it
};

/// One verbs device ("mlx5_0").
struct verbs_device_info {
  std::string name;
  std::vector<verbs_port_info> ports;
};

/// Result of probing libibverbs.
struct verbs_probe_result {
  /// True when at least one device could be opened and queried.
  bool available = false;
  /// Why RDMA is unavailable (or a summary when it is), one sentence, e.g.
  /// "no RDMA devices found (ibv_get_device_list returned 0 devices); links use TCP".
  std::string reason;
  std::vector<verbs_device_info> devices;
};

/// Lists verbs devices with link layer, state, active speed and width. Never
/// throws; failures are described in `reason`.
verbs_probe_result verbs_probe();

/// Nominal Gbit/s per lane of an ibv_port_attr::active_speed value (SDR 2.5,
/// DDR 5, QDR 10, FDR10 10, FDR 14, EDR 25, HDR 50, NDR 100, XDR 200); 0 for
/// values this build does not know.
double ibv_lane_gbps(unsigned active_speed);
/// "SDR", ..., "XDR"; "" for unknown values.
const char* ibv_speed_name(unsigned active_speed);
/// Lanes of an ibv_port_attr::active_width value (1x, 2x, 4x, 8x, 12x); 0 if unknown.
int ibv_width_lanes(unsigned active_width);

/// Which transport a link uses, and why.
struct transport_choice {
  std::string transport;  ///< "rdma" or "tcp"
  std::string reason;     ///< why (always set; e.g. "peer has no active RDMA port (class ethernet)")
};

/// "rdma" only when both ends are active verbs ports of the same link layer
/// (InfiniBand with InfiniBand, RoCE with RoCE); otherwise "tcp" and why.
transport_choice select_transport(const nic_info& local, const nic_info& peer);
/// The same over all of this node's NICs against a peer known by the NIC
/// class from its hello ("ib", "roce", "ethernet", ""): InfiniBand is
/// preferred over RoCE when both would work.
transport_choice select_transport(const std::vector<nic_info>& local,
                                  std::string_view peer_nic_class);

}  // namespace corolla::net
