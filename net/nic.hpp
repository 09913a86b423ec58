// net/nic.hpp — which network interfaces this node has, read from sysfs.
//
// RDMA ports come from /sys/class/infiniband (link layer InfiniBand = "ib",
// Ethernet = RoCE), plain NICs from /sys/class/net. The node's NIC class
// (the fastest active kind) is announced in the hello so that peers can
// pick a transport and cost links (see docs/protocol.md).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace corolla::net {

/// What kind of link a NIC provides.
enum class nic_kind { infiniband, roce, ethernet, loopback, other };

/// "infiniband", "roce", "ethernet", "loopback", "other".
const char* nic_kind_name(nic_kind k);
/// The NIC class a kind belongs to, as used in hellos and link profiles:
/// "ib", "roce", "ethernet", "loopback", "other".
const char* nic_class_name(nic_kind k);

/// One network port of this node.
struct nic_info {
  /// "mlx5_0:1" (verbs device and port) for RDMA ports, the interface name
  /// ("eth0") otherwise.
  std::string name;
  nic_kind kind = nic_kind::other;
  double bandwidth_bps = 0;   ///< link rate in bits per second; 0 = unknown
  bool active = false;        ///< link up (verbs port ACTIVE / operstate up)
  std::string verbs_device;   ///< "mlx5_0" for RDMA-capable ports, "" otherwise
  int port = 0;               ///< verbs port number (from 1); 0 for plain NICs
  std::string netdev;         ///< kernel interface of the port ("eth2", "ib0"), "" if none
};

/// Every NIC under `sys_root` (normally "/sys"; tests pass fake trees):
/// one entry per verbs port, then one per network interface that is not
/// already the netdev of a verbs port, each list sorted by name. Missing or
/// unreadable files mean "unknown" (bandwidth 0, inactive), never an error.
std::vector<nic_info> discover_nics(const std::filesystem::path& sys_root = "/sys");

/// The node's NIC class: the fastest active kind, "ib" > "roce" >
/// "ethernet"; "ethernet" when there is nothing else (loopback-only hosts
/// still talk TCP).
std::string node_nic_class(const std::vector<nic_info>& nics);

/// Active NICs grouped by class, fastest class first, with the best
/// bandwidth in each (0 = unknown); loopback and other are left out.
struct nic_class_summary {
  std::string nic_class;     ///< "ib", "roce" or "ethernet"
  double bandwidth_bps = 0;  ///< fastest active port of the class
  int ports = 0;             ///< active ports of the class
};
std::vector<nic_class_summary> nic_classes(const std::vector<nic_info>& nics);

/// One line for `corolla info`: "mlx5_0:1  roce  100 Gbit/s  active  (netdev eth2)".
std::string describe(const nic_info& nic);
/// {"name", "kind", "class", "bandwidth_bps", "active", "verbs_device", "port", "netdev"}.
nlohmann::json to_json(const nic_info& nic);
/// {"nic_class": ..., "nics": [...], "classes": [...]} for `corolla info --json`.
nlohmann::json to_json(const std::vector<nic_info>& nics);

}  // namespace corolla::net
