// `corolla bench link`: raw ZeroMQ vs the runtime's transport, and with
// --rdma the RDMA path (here on the in-process fake fabric), in one run.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "net/rdma_verbs.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"

using corolla::testing::run_corolla;

TEST_CASE("bench link measures raw, corolla and the RDMA path on the fake fabric and reports each size") {
  auto r = run_corolla({"bench", "link", "--sizes", "4096,1048576", "--count", "20", "--seconds", "0.2",
                        "--rounds", "2", "--rdma", "fake", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  CHECK(j["bench"] == "link");
  CHECK(j["rounds"] == 2);
  CHECK(j["busy_poll_us"] == 50);
  CHECK(j["rdma"].get<std::string>().find("fake fabric") != std::string::npos);
  REQUIRE(j["results"].size() == 2);
  for (const auto& s : j["results"]) {
    CAPTURE(s.dump());
    for (const char* path : {"raw", "corolla", "rdma"}) {
      CHECK(s[path]["mb_per_s"].get<double>() > 0);
      CHECK(s[path]["latency_p50_us"].get<double>() > 0);
      CHECK(s[path]["latency_samples"].get<int>() >= 10);  // 5 or more per round
    }
    CHECK(s["rdma"]["throughput_ratio"].get<double>() > 0);
  }
  CHECK(j.contains("target_added_latency_50us_met"));
}

TEST_CASE("bench link: a verbs device that is not there and bad options are one clear error each") {
  bool have_rdma = true;
  try {
    corolla::net::rdma::open_verbs_device();
  } catch (const std::exception&) {
    have_rdma = false;
  }
  if (!have_rdma)
    corolla::testing::check_one_error(run_corolla({"bench", "link", "--rdma", "auto", "--count", "5"}),
                                      "links use TCP");
  corolla::testing::check_one_error(run_corolla({"bench", "link", "--sizes", "4097"}),
                                    "is not a byte count that is a multiple of 4");
}
