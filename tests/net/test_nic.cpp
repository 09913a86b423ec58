// NIC discovery on fake sysfs trees, the node's NIC class, verbs probing on
// this machine and the RDMA/TCP transport choice.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "net/nic.hpp"
#include "net/rdma.hpp"

using namespace corolla::net;
namespace fs = std::filesystem;

namespace {

/// A temporary directory laid out like /sys, removed on destruction.
struct fake_sysfs {
  fs::path root;
  fake_sysfs() {
    root = fs::temp_directory_path() /
           ("corolla-sysfs-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::create_directories(root);
  }
  ~fake_sysfs() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  void write(const fs::path& rel, const std::string& content) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << content << "\n";
  }
  void mkdir(const fs::path& rel) { fs::create_directories(root / rel); }

  void ib_port(const std::string& dev, int port, const std::string& layer, const std::string& rate,
               const std::string& state) {
    const fs::path p = fs::path("class/infiniband") / dev / "ports" / std::to_string(port);
    write(p / "link_layer", layer);
    write(p / "rate", rate);
    write(p / "state", state);
  }
  void netdev(const std::string& name, int type, const std::string& speed,
              const std::string& operstate, bool physical) {
    const fs::path d = fs::path("class/net") / name;
    write(d / "type", std::to_string(type));
    if (!speed.empty()) write(d / "speed", speed);
    write(d / "operstate", operstate);
    if (physical) mkdir(d / "device");
  }
};

const nic_info* find(const std::vector<nic_info>& nics, const std::string& name) {
  for (const auto& n : nics)
    if (n.name == name) return &n;
  return nullptr;
}

/// IB HCA, RoCE port, 25 GbE NIC, NIC with unknown speed, loopback, veth.
void populate(fake_sysfs& s) {
  s.ib_port("mlx5_0", 1, "InfiniBand", "100 Gb/sec (4X EDR)", "4: ACTIVE");
  s.mkdir("class/infiniband/mlx5_0/device/net/ib0");
  s.ib_port("mlx5_1", 1, "Ethernet", "100 Gb/sec (4X EDR)", "4: ACTIVE");
  s.write("class/infiniband/mlx5_1/ports/1/gid_attrs/ndevs/0", "enp65s0f0");
  s.mkdir("class/infiniband/mlx5_1/device/net/enp65s0f0");
  s.netdev("ib0", 32, "100000", "up", true);
  s.netdev("enp65s0f0", 1, "100000", "up", true);
  s.netdev("eno1", 1, "25000", "up", true);
  s.netdev("eno2", 1, "-1", "down", true);
  s.netdev("lo", 772, "", "unknown", false);
  s.write("class/net/lo/carrier", "1");
  s.netdev("veth1234", 1, "10000", "up", false);
}

}  // namespace

TEST_CASE("NIC discovery parses InfiniBand, RoCE, Ethernet and loopback from sysfs") {
  fake_sysfs s;
  populate(s);
  auto nics = discover_nics(s.root);
  for (const auto& n : nics) MESSAGE(describe(n));
  REQUIRE(nics.size() == 6);  // ib0 and enp65s0f0 appear as their RDMA ports

  const nic_info* ib = find(nics, "mlx5_0:1");
  REQUIRE(ib);
  CHECK(ib->kind == nic_kind::infiniband);
  CHECK(ib->bandwidth_bps == doctest::Approx(100e9));
  CHECK(ib->active);
  CHECK(ib->verbs_device == "mlx5_0");
  CHECK(ib->port == 1);
  CHECK(ib->netdev == "ib0");

  const nic_info* roce = find(nics, "mlx5_1:1");
  REQUIRE(roce);
  CHECK(roce->kind == nic_kind::roce);
  CHECK(roce->bandwidth_bps == doctest::Approx(100e9));
  CHECK(roce->active);
  CHECK(roce->netdev == "enp65s0f0");

  const nic_info* eth = find(nics, "eno1");
  REQUIRE(eth);
  CHECK(eth->kind == nic_kind::ethernet);
  CHECK(eth->bandwidth_bps == doctest::Approx(25e9));
  CHECK(eth->active);
  CHECK(eth->verbs_device.empty());
  CHECK(eth->port == 0);

  const nic_info* down = find(nics, "eno2");
  REQUIRE(down);
  CHECK(down->kind == nic_kind::ethernet);
  CHECK(down->bandwidth_bps == 0);  // speed -1 = unknown
  CHECK_FALSE(down->active);

  const nic_info* lo = find(nics, "lo");
  REQUIRE(lo);
  CHECK(lo->kind == nic_kind::loopback);
  CHECK(lo->active);

  const nic_info* veth = find(nics, "veth1234");
  REQUIRE(veth);
  CHECK(veth->kind == nic_kind::other);  // no device link: virtual

  CHECK(node_nic_class(nics) == "ib");
  auto classes = nic_classes(nics);
  REQUIRE(classes.size() == 3);
  CHECK(classes[0].nic_class == "ib");
  CHECK(classes[1].nic_class == "roce");
  CHECK(classes[2].nic_class == "ethernet");
  CHECK(classes[2].bandwidth_bps == doctest::Approx(25e9));
  CHECK(classes[2].ports == 1);

  auto j = to_json(nics);
  CHECK(j["nic_class"] == "ib");
  CHECK(j["nics"].size() == 6);
  CHECK(j["nics"][0]["kind"] == "infiniband");
  CHECK(j["nics"][0]["class"] == "ib");
}

TEST_CASE("node NIC class is the fastest active kind, ethernet when there is nothing else") {
  fake_sysfs s;
  SUBCASE("inactive IB port does not count") {
    s.ib_port("mlx5_0", 1, "InfiniBand", "200 Gb/sec (4X HDR)", "1: DOWN");
    s.ib_port("mlx5_1", 1, "Ethernet", "25 Gb/sec (1X EDR)", "4: ACTIVE");
    auto nics = discover_nics(s.root);
    REQUIRE(nics.size() == 2);
    CHECK_FALSE(nics[0].active);
    CHECK(nics[0].bandwidth_bps == doctest::Approx(200e9));
    CHECK(node_nic_class(nics) == "roce");
    CHECK(nics[1].netdev.empty());  // no netdev information at all
  }
  SUBCASE("plain ethernet") {
    s.netdev("eth0", 1, "10000", "up", true);
    CHECK(node_nic_class(discover_nics(s.root)) == "ethernet");
  }
  SUBCASE("loopback only") {
    s.netdev("lo", 772, "", "unknown", false);
    s.write("class/net/lo/carrier", "1");
    auto nics = discover_nics(s.root);
    REQUIRE(nics.size() == 1);
    CHECK(node_nic_class(nics) == "ethernet");
    CHECK(nic_classes(nics).empty());
  }
  SUBCASE("empty or missing sysfs") {
    CHECK(discover_nics(s.root / "nothing-here").empty());
    CHECK(node_nic_class({}) == "ethernet");
  }
  SUBCASE("dual-port HCA: netdevs matched by dev_port, missing link_layer means InfiniBand") {
    const fs::path dev = "class/infiniband/mlx4_0";
    for (int p : {1, 2}) {
      s.write(dev / "ports" / std::to_string(p) / "rate", "40 Gb/sec (4X QDR)");
      s.write(dev / "ports" / std::to_string(p) / "state", "4: ACTIVE");
    }
    s.write(dev / "device/net/ib0/dev_port", "0");
    s.write(dev / "device/net/ib1/dev_port", "1");
    auto nics = discover_nics(s.root);
    REQUIRE(nics.size() == 2);
    CHECK(nics[0].kind == nic_kind::infiniband);
    CHECK(nics[0].netdev == "ib0");
    CHECK(nics[1].netdev == "ib1");
    CHECK(nics[1].bandwidth_bps == doctest::Approx(40e9));
  }
  SUBCASE("unreadable or odd attribute values are unknown, not errors") {
    s.ib_port("hfi1_0", 1, "InfiniBand", "garbage", "ACTIVE_DEFER");
    s.netdev("eth0", 1, "not-a-number", "dormant", true);
    auto nics = discover_nics(s.root);
    REQUIRE(nics.size() == 2);
    CHECK(nics[0].bandwidth_bps == 0);
    CHECK_FALSE(nics[0].active);
    CHECK(nics[1].bandwidth_bps == 0);
    CHECK_FALSE(nics[1].active);
  }
}

TEST_CASE("NIC discovery on this machine works and verbs report unavailability clearly") {
  auto nics = discover_nics();
  for (const auto& n : nics) MESSAGE(describe(n));
  MESSAGE("node NIC class: " << node_nic_class(nics));
  CHECK_FALSE(node_nic_class(nics).empty());

  auto probe = verbs_probe();
  MESSAGE("verbs: " << probe.reason);
  CHECK_FALSE(probe.reason.empty());
  if (!probe.available) {
    CHECK(probe.devices.empty());
    CHECK(probe.reason.find("links use TCP") != std::string::npos);
  }
}

TEST_CASE("ibv speed and width codes decode to lanes and Gbit/s") {
  CHECK(ibv_lane_gbps(32) == 25);  // EDR
  CHECK(std::string(ibv_speed_name(32)) == "EDR");
  CHECK(ibv_lane_gbps(64) == 50);  // HDR
  CHECK(ibv_lane_gbps(128) == 100);
  CHECK(ibv_lane_gbps(1) == 2.5);
  CHECK(ibv_lane_gbps(3) == 0);
  CHECK(std::string(ibv_speed_name(3)).empty());
  CHECK(ibv_width_lanes(2) == 4);
  CHECK(ibv_width_lanes(8) == 12);
  CHECK(ibv_width_lanes(16) == 2);
  CHECK(ibv_width_lanes(3) == 0);
  CHECK(ibv_width_lanes(2) * ibv_lane_gbps(32) == 100);  // "100 Gb/sec (4X EDR)"
}

TEST_CASE("transport selection uses RDMA only between active verbs ports of the same link layer") {
  nic_info ib{"mlx5_0:1", nic_kind::infiniband, 100e9, true, "mlx5_0", 1, "ib0"};
  nic_info ib_peer{"mlx5_3:1", nic_kind::infiniband, 200e9, true, "mlx5_3", 1, "ib0"};
  nic_info roce{"mlx5_1:1", nic_kind::roce, 100e9, true, "mlx5_1", 1, "eth2"};
  nic_info eth{"eno1", nic_kind::ethernet, 25e9, true, "", 0, "eno1"};
  nic_info ib_down = ib;
  ib_down.active = false;

  auto c = select_transport(ib, ib_peer);
  CHECK(c.transport == "rdma");
  CHECK(c.reason.find("InfiniBand") != std::string::npos);
  CHECK(select_transport(roce, roce).transport == "rdma");

  c = select_transport(ib, roce);
  CHECK(c.transport == "tcp");
  CHECK(c.reason == "link layers differ: this node InfiniBand, peer RoCE");
  c = select_transport(eth, ib);
  CHECK(c.transport == "tcp");
  CHECK(c.reason == "this node's eno1 (ethernet) is not an active RDMA port");
  c = select_transport(ib, eth);
  CHECK(c.reason == "peer's eno1 (ethernet) is not an active RDMA port");
  CHECK(select_transport(ib_down, ib_peer).transport == "tcp");

  // Against a peer known only by its hello's NIC class.
  CHECK(select_transport({eth, roce, ib}, "ib").transport == "rdma");
  CHECK(select_transport({eth, roce, ib}, "roce").transport == "rdma");
  c = select_transport({eth, ib}, "ethernet");
  CHECK(c.transport == "tcp");
  CHECK(c.reason == "peer has no active RDMA port (class ethernet)");
  c = select_transport({eth}, "ib");
  CHECK(c.transport == "tcp");
  CHECK(c.reason == "this node has no active RDMA port (class ethernet)");
  c = select_transport({ib}, "roce");
  CHECK(c.transport == "tcp");
  CHECK(c.reason == "link layers differ: this node InfiniBand, peer RoCE");
  CHECK(select_transport({ib}, "").reason == "peer has no active RDMA port (class unknown)");
}
