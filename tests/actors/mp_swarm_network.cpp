// The network side of what a `corolla serve` process announces, with real
// processes on 127.0.0.1: a server whose link speed it cannot read
// measures it against another server of the swarm (actors/link_probe.hpp)
// once there is one, and announces min(compute, network) from then on; an
// uplink slower than the NIC can be given.
#include <doctest/doctest.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include "net/membership.hpp"
#include "tests/actors/swarm_fixtures.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/process.hpp"

namespace corolla {
using namespace swarm_test;

TEST_CASE("a server that cannot read its link speed measures it against the next server to join and announces it") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  // s-a's link carries 20 Mbit/s, but it is told to measure (as a server
  // whose NIC speed is unknown does): alone in the swarm it has nothing to
  // measure against and announces the compute figure.
  sw.start(m, "s-a", 0, 2,
           {"--dht", "--dht-ttl-s", "3", "--link-profile", "bw=20Mbit,lat=0ms", "--network-speed", "measure",
            "--log-level", "info"});
  child_process& a = sw.procs.at("s-a");
  CHECK(a.err().find("link speed not known yet") != std::string::npos);
  // s-b's uplink is given.
  sw.start(m, "s-b", 2, 4,
           {"--initial-peers", sw.dht.at("s-a"), "--dht-ttl-s", "3", "--network-speed", "50Mbit", "--log-level", "info"});
  CHECK(sw.procs.at("s-b").err().find("link 50 Mbit/s: announcing") != std::string::npos);
  // Its log says how long loading took, and on how many threads (--threads 1).
  CHECK(sw.procs.at("s-b").err().find("serve: loaded blocks [2, 4) in ") != std::string::npos);
  CHECK(sw.procs.at("s-b").err().find("on 1 thread(s)") != std::string::npos);

  // s-a measures its link against s-b at its next record update.
  const std::regex measured(R"(serve: measured ([0-9.]+) Mbit/s to s-b)");
  std::smatch match;
  std::string err;
  testing::eventually(
      [&] {
        err = a.err();
        return std::regex_search(err, match, measured) && err.find("serve: link ") != std::string::npos;
      },
      40s, 100ms);
  REQUIRE_MESSAGE(!match.empty(), "s-a never measured its link; its log:\n" << err);
  const double mbit = std::stod(match[1].str());
  MESSAGE("s-a measured " << mbit << " Mbit/s on its 20 Mbit/s link");
  CHECK(mbit <= 20 * 1.15);  // a loaded machine only makes it look slower
  CHECK(mbit >= 20 * 0.3);

  // Its DHT record now carries at most what that link carries in hidden
  // states (32 floats of 32 bits each), and more than nothing. The log
  // rounds the measurement to whole Mbit/s: the record's may be up to half
  // a Mbit/s more (19.5 logged as 19 failed a bound of 1 % over 19).
  const double bound = (mbit + 0.5) * 1e6 / (32.0 * 32.0) * 1.01;
  net::membership reader;
  net::membership_options mo;
  mo.bootstrap = {sw.dht.at("s-a")};
  mo.ttl = 3s;
  REQUIRE(reader.start(mo));
  const std::string model = m.dir.path().filename().string();
  double throughput = -1;
  testing::eventually(
      [&] {
        for (const auto& r : reader.get_span(model, 0, 1))
          if (r.node_id == "s-a") throughput = r.throughput;
        return throughput > 0 && throughput <= bound;
      },
      15s, 200ms);
  CHECK(throughput > 0);
  CHECK(throughput <= bound);
}

TEST_CASE("a server without --threads computes on every core but one, and says so") {
  swarm_model m(architecture::llama);
  child_process p = child_process::corolla({"serve", "--model", m.dir.path().string(), "--blocks", "0:2", "--no-dht",
                                            "--listen", "tcp://127.0.0.1:0", "--log-level", "info"});
  REQUIRE_MESSAGE(p.wait_line(std::regex(R"(corolla serve \S+ blocks \[0, 2\))"), 30s), p.err());
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int want = std::max(1, cores - 1);
  INFO(p.err());
  CHECK(p.err().find("serve: loaded blocks [0, 2) in ") != std::string::npos);
  CHECK(p.err().find("on " + std::to_string(want) + " thread(s)") != std::string::npos);
}

TEST_CASE("a bad --network-speed is one clear error") {
  swarm_model m(architecture::llama);
  const auto r = testing::run_corolla({"serve", "--model", m.dir.path().string(), "--blocks", "0:2", "--no-dht",
                              "--network-speed", "fast"});
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("--network-speed") != std::string::npos);
}

}  // namespace corolla
