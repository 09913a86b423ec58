// `corolla info`: the backends built in, the devices seen, and whether the
// device collectives of `train --collectives device` (NCCL) are there.
#include <doctest/doctest.h>

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
  CHECK(r.out.find("cuda: ") != std::string::npos);
#ifdef COROLLA_HAVE_NCCL
  CHECK(std::regex_search(r.out, std::regex("nccl: 2\\.[0-9]+\\.[0-9]+ \\(train --collectives device\\)")));
#else
  CHECK(r.out.find("nccl: not compiled in") != std::string::npos);
#endif
}
