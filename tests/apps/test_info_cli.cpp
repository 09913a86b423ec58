// `corolla info`: the backends built in, the devices seen, and whether the
// device collectives of `train --collectives device` (NCCL) are there, and
// the memory `serve --max-memory auto` would take.
#include <doctest/doctest.h>

#include <cmath>
#include <regex>
#include <string>

#include "kernels/backend.hpp"
#include "tests/support/process.hpp"

using corolla::testing::run_corolla;

TEST_CASE("corolla info lists the backends, the cpu threads, the cuda devices and NCCL") {
  auto r = run_corolla({"info"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("backends: cpu") != std::string::npos);
  CHECK(std::regex_search(r.out, std::regex("cpu: [0-9]+ threads")));
  // What serve --max-memory auto would take: half of the host's available memory.
  std::smatch m;
  REQUIRE(std::regex_search(
      r.out, m,
      std::regex(R"(memory: cpu ([0-9.]+) GiB available of ([0-9.]+) GiB \(serve --max-memory auto: ([0-9.]+) GiB\))")));
  CHECK(std::stod(m[1].str()) <= std::stod(m[2].str()));
  CHECK(std::abs(std::stod(m[3].str()) - std::stod(m[1].str()) / 2) <= 0.1);  // both printed to 0.1 GiB
  CHECK(r.out.find("cuda: ") != std::string::npos);
#ifdef COROLLA_HAVE_NCCL
  CHECK(std::regex_search(r.out, std::regex("nccl: 2\\.[0-9]+\\.[0-9]+ \\(train --collectives device\\)")));
#else
  CHECK(r.out.find("nccl: not compiled in") != std::string::npos);
#endif
}
