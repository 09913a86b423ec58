// `corolla bench elastic`: its modes' refusals (each mode's runs are real
// elastic jobs of many seconds, measured in docs/benchmarks.md; the paths
// they drive are tested in tests/apps/mp_train_elastic.cpp).
#include <doctest/doctest.h>

#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"

using corolla::testing::check_one_error;
using corolla::testing::run_corolla;

TEST_CASE("bench elastic refuses two modes at once and too few steps after the event, with one clear error") {
  check_one_error(run_corolla({"bench", "elastic", "--kill", "--join"}),
                  "bench elastic: one of --kill, --hang, --lose, --stop, --launcher, --join and --drain");
  check_one_error(run_corolla({"bench", "elastic", "--launcher", "--kill"}),
                  "bench elastic: one of --kill, --hang, --lose, --stop, --launcher, --join and --drain");
  check_one_error(run_corolla({"bench", "elastic", "--stop", "--drain"}),
                  "bench elastic: one of --kill, --hang, --lose, --stop, --launcher, --join and --drain");
  check_one_error(run_corolla({"bench", "elastic", "--drain", "--steps", "20", "--join-step", "12"}),
                  "--steps must leave at least 10 steps after --join-step");
  check_one_error(run_corolla({"bench", "elastic", "--join", "--steps", "20", "--join-step", "12"}),
                  "--steps must leave at least 10 steps after --join-step");
  check_one_error(run_corolla({"bench", "elastic", "--steps", "20", "--throttle-step", "12"}),
                  "--steps must leave at least 10 steps after --throttle-step");
  for (const char* mode : {"--kill", "--hang", "--lose", "--stop", "--launcher"})
    check_one_error(run_corolla({"bench", "elastic", mode, "--steps", "20", "--kill-step", "18"}),
                    "--steps must leave at least 5 steps after --kill-step");
}
