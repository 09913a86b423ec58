// net/nic.cpp — NIC discovery from sysfs (see nic.hpp).
//
// Layout read (Linux):
//   <root>/class/infiniband/<dev>/ports/<p>/link_layer   "InfiniBand" | "Ethernet"
//   <root>/class/infiniband/<dev>/ports/<p>/rate         "100 Gb/sec (4X EDR)"
//   <root>/class/infiniband/<dev>/ports/<p>/state        "4: ACTIVE"
//   <root>/class/infiniband/<dev>/ports/<p>/gid_attrs/ndevs/0   netdev of a RoCE port
//   <root>/class/infiniband/<dev>/device/net/<if>[/dev_port]    netdevs of the PCI device
//   <root>/class/net/<if>/{type, speed, operstate, carrier, device}
#include "net/nic.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

namespace corolla::net {

namespace fs = std::filesystem;

namespace {

// ARPHRD_* values of /sys/class/net/<if>/type (linux/if_arp.h).
constexpr int arphrd_ether = 1;
constexpr int arphrd_loopback = 772;

std::string trim(std::string s) {
  auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}

/// First line of a sysfs attribute, trimmed; nullopt when it cannot be read
/// (missing, or a driver refusing the read, e.g. speed of a down link).
std::optional<std::string> read_attr(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::string line;
  if (!std::getline(in, line) && in.bad()) return std::nullopt;
  if (in.bad()) return std::nullopt;
  return trim(line);
}

std::optional<long long> read_int(const fs::path& p) {
  auto s = read_attr(p);
  if (!s || s->empty()) return std::nullopt;
  char* end = nullptr;
  const long long v = std::strtoll(s->c_str(), &end, 0);
  if (end == s->c_str()) return std::nullopt;
  return v;
}

/// Sorted names of the entries of a directory; empty when it does not exist.
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

/// "100 Gb/sec (4X EDR)" -> 100e9; "2.5 Gb/sec" -> 2.5e9; unknown -> 0.
double parse_rate(const std::string& rate) {
  char* end = nullptr;
  const double v = std::strtod(rate.c_str(), &end);
  if (end == rate.c_str() || !(v > 0)) return 0;
  std::string unit = trim(std::string(end));
  if (unit.rfind("Gb", 0) == 0) return v * 1e9;
  if (unit.rfind("Mb", 0) == 0) return v * 1e6;
  if (unit.rfind("Tb", 0) == 0) return v * 1e12;
  return 0;
}

/// "4: ACTIVE" -> true; the numeric prefix is optional.
bool port_active(const std::string& state) {
  const auto colon = state.find(':');
  return trim(colon == std::string::npos ? state : state.substr(colon + 1)) == "ACTIVE";
}

/// The netdev of port `port` of verbs device `dev`: the port's GID table
/// names it for RoCE; otherwise the PCI device's net/ entries, matched by
/// dev_port (0-based) when the device has several.
std::string port_netdev(const fs::path& dev, int port) {
  if (auto nd = read_attr(dev / "ports" / std::to_string(port) / "gid_attrs" / "ndevs" / "0"))
    if (!nd->empty()) return *nd;
  const fs::path net_dir = dev / "device" / "net";
  const auto names = entries(net_dir);
  if (names.size() == 1) return names.front();
  for (const auto& n : names)
    if (auto dp = read_int(net_dir / n / "dev_port"); dp && *dp == port - 1) return n;
  return "";
}

void discover_verbs_ports(const fs::path& root, std::vector<nic_info>& out) {
  const fs::path ib = root / "class" / "infiniband";
  for (const auto& dev_name : entries(ib)) {
    const fs::path dev = ib / dev_name;
    for (const auto& port_name : entries(dev / "ports")) {
      char* end = nullptr;
      const long port = std::strtol(port_name.c_str(), &end, 10);
      if (end == port_name.c_str() || *end != '\0' || port <= 0) continue;
      const fs::path p = dev / "ports" / port_name;
      nic_info nic;
      nic.verbs_device = dev_name;
      nic.port = static_cast<int>(port);
      nic.name = dev_name + ":" + port_name;
      // Kernels before link_layer existed only had InfiniBand.
      const std::string layer = read_attr(p / "link_layer").value_or("InfiniBand");
      if (layer == "InfiniBand") {
        nic.kind = nic_kind::infiniband;
      } else if (layer == "Ethernet") {
        nic.kind = nic_kind::roce;
      } else {
        nic.kind = nic_kind::other;  // e.g. iWARP reports "Unknown"
      }
      nic.bandwidth_bps = parse_rate(read_attr(p / "rate").value_or(""));
      nic.active = port_active(read_attr(p / "state").value_or(""));
      nic.netdev = port_netdev(dev, nic.port);
      out.push_back(std::move(nic));
    }
  }
}

void discover_netdevs(const fs::path& root, const std::set<std::string>& claimed,
                      std::vector<nic_info>& out) {
  const fs::path net = root / "class" / "net";
  for (const auto& name : entries(net)) {
    if (claimed.count(name)) continue;  // listed as its RDMA port
    const fs::path d = net / name;
    nic_info nic;
    nic.name = name;
    nic.netdev = name;
    const long long type = read_int(d / "type").value_or(-1);
    std::error_code ec;
    // Physical NICs link to their bus device; veth, bridges, tunnels do not.
    const bool physical = fs::exists(d / "device", ec);
    if (type == arphrd_loopback) {
      nic.kind = nic_kind::loopback;
    } else if (type == arphrd_ether && physical) {
      nic.kind = nic_kind::ethernet;
    } else {
      nic.kind = nic_kind::other;
    }
    // Mb/s; -1 (or a failing read) while the link is down or unknown.
    if (auto speed = read_int(d / "speed"); speed && *speed > 0)
      nic.bandwidth_bps = static_cast<double>(*speed) * 1e6;
    const std::string oper = read_attr(d / "operstate").value_or("");
    // "unknown" is what loopback and many virtual drivers report while
    // working; trust the carrier then.
    nic.active = oper == "up" || (oper == "unknown" && read_attr(d / "carrier").value_or("") == "1");
    out.push_back(std::move(nic));
  }
}

int class_rank(nic_kind k) {
  switch (k) {
    case nic_kind::infiniband: return 0;
    case nic_kind::roce: return 1;
    case nic_kind::ethernet: return 2;
    default: return 3;
  }
}

std::string format_rate(double bps) {
  char buf[48];
  if (bps <= 0) return "speed unknown";
  if (bps >= 1e9)
    std::snprintf(buf, sizeof buf, "%g Gbit/s", bps / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%g Mbit/s", bps / 1e6);
  return buf;
}

}  // namespace

const char* nic_kind_name(nic_kind k) {
  switch (k) {
    case nic_kind::infiniband: return "infiniband";
    case nic_kind::roce: return "roce";
    case nic_kind::ethernet: return "ethernet";
    case nic_kind::loopback: return "loopback";
    case nic_kind::other: return "other";
  }
  return "other";
}

const char* nic_class_name(nic_kind k) {
  return k == nic_kind::infiniband ? "ib" : nic_kind_name(k);
}

std::vector<nic_info> discover_nics(const fs::path& sys_root) {
  std::vector<nic_info> nics;
  discover_verbs_ports(sys_root, nics);
  std::set<std::string> claimed;
  for (const auto& n : nics)
    if (!n.netdev.empty()) claimed.insert(n.netdev);
  discover_netdevs(sys_root, claimed, nics);
  return nics;
}

std::vector<nic_class_summary> nic_classes(const std::vector<nic_info>& nics) {
  std::vector<nic_class_summary> out;
  for (nic_kind k : {nic_kind::infiniband, nic_kind::roce, nic_kind::ethernet}) {
    nic_class_summary s;
    s.nic_class = nic_class_name(k);
    for (const auto& n : nics)
      if (n.kind == k && n.active) {
        ++s.ports;
        s.bandwidth_bps = std::max(s.bandwidth_bps, n.bandwidth_bps);
      }
    if (s.ports > 0) out.push_back(s);
  }
  return out;
}

std::string node_nic_class(const std::vector<nic_info>& nics) {
  int best = class_rank(nic_kind::ethernet);
  nic_kind kind = nic_kind::ethernet;
  for (const auto& n : nics)
    if (n.active && class_rank(n.kind) < best) best = class_rank(n.kind), kind = n.kind;
  return nic_class_name(kind);
}

std::string describe(const nic_info& nic) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-12s %-10s %-14s %s", nic.name.c_str(), nic_kind_name(nic.kind),
                format_rate(nic.bandwidth_bps).c_str(), nic.active ? "active" : "inactive");
  std::string s = buf;
  if (!nic.verbs_device.empty() && !nic.netdev.empty()) s += "  (netdev " + nic.netdev + ")";
  return s;
}

nlohmann::json to_json(const nic_info& nic) {
  return {{"name", nic.name},
          {"kind", nic_kind_name(nic.kind)},
          {"class", nic_class_name(nic.kind)},
          {"bandwidth_bps", nic.bandwidth_bps},
          {"active", nic.active},
          {"verbs_device", nic.verbs_device},
          {"port", nic.port},
          {"netdev", nic.netdev}};
}

nlohmann::json to_json(const std::vector<nic_info>& nics) {
  auto list = nlohmann::json::array();
  for (const auto& n : nics) list.push_back(to_json(n));
  auto classes = nlohmann::json::array();
  for (const auto& c : nic_classes(nics))
    classes.push_back({{"class", c.nic_class}, {"bandwidth_bps", c.bandwidth_bps}, {"ports", c.ports}});
  return {{"nic_class", node_nic_class(nics)}, {"nics", list}, {"classes", classes}};
}

}  // namespace corolla::net
