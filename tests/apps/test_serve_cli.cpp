// `corolla serve` with bad input: one "corolla: error: ..." line and status 1,
// before or right after its node starts (never a server left running).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;

namespace {

testing::process_result serve(const std::string& model, std::vector<std::string> extra) {
  std::vector<std::string> args{"serve", "--model", model, "--no-dht", "--log-level", "warn"};
  args.insert(args.end(), extra.begin(), extra.end());
  return testing::run_corolla(args, std::chrono::seconds(30));
}

}  // namespace

TEST_CASE("serve reports bad input with one error line and status 1") {
  testing::temp_dir_guard dir("cli-serve");
  const std::string model = (dir / "model").string();
  testing::write_tiny_model(model, {});  // 2 layers

  SUBCASE("no blocks named without the DHT (with it, --max-memory auto is the default)") {
    testing::check_one_error(serve(model, {}), "without the DHT a server cannot choose its blocks: give --blocks A:B");
  }
  SUBCASE("both --blocks and --num-blocks") {
    testing::check_one_error(serve(model, {"--blocks", "0:1", "--num-blocks", "1"}),
                             "give only one of --blocks A:B, --num-blocks N or --max-memory SIZE|auto");
  }
  SUBCASE("blocks outside the model") {
    testing::check_one_error(serve(model, {"--blocks", "1:3"}), "is not a non-empty part of the model's 2 blocks");
  }
  SUBCASE("blocks that do not parse") {
    testing::check_one_error(serve(model, {"--blocks", "1-2"}), "--blocks must be A:B");
  }
  SUBCASE("a batch wait that is negative or too long") {
    testing::check_one_error(serve(model, {"--blocks", "0:1", "--batch-wait", "-1"}),
                             "--batch-wait must be a fraction >= 0 of the last batch's time, got -1");
    testing::check_one_error(serve(model, {"--blocks", "0:1", "--batch-wait-max-ms", "-5"}),
                             "--batch-wait-max-ms must be between 0 and 10000, got -5");
  }
  SUBCASE("--num-blocks without the DHT") {
    testing::check_one_error(serve(model, {"--num-blocks", "1"}), "it needs the DHT");
  }
  SUBCASE("--max-memory: with --blocks, without the DHT, a bad size, too little for one block") {
    testing::check_one_error(serve(model, {"--blocks", "0:1", "--max-memory", "1GiB"}), "give only one of");
    testing::check_one_error(serve(model, {"--max-memory", "1GiB"}), "--max-memory chooses blocks from the swarm's DHT");
    // With the DHT (no --no-dht), the size is read before anything starts.
    auto with_dht = [&](const std::string& size, std::vector<std::string> more = {}) {
      std::vector<std::string> args{"serve", "--model", model, "--max-memory", size, "--log-level", "warn"};
      args.insert(args.end(), more.begin(), more.end());
      return testing::run_corolla(args, std::chrono::seconds(30));
    };
    testing::check_one_error(with_dht("lots"), "--max-memory must be a size such as 6GiB, 512MiB or 2.5GB, got 'lots'");
    testing::check_one_error(with_dht("-2GB"), "got '-2GB'");
    testing::check_one_error(with_dht("12XB"), "got '12XB'");
    testing::check_one_error(with_dht("64KiB", {"--cache-tokens", "100000"}), "--max-memory 64KiB holds no block: one needs");
  }
  SUBCASE("a bad DHT address") {
    auto r = testing::run_corolla({"serve", "--model", model, "--blocks", "0:1", "--dht-listen", "127.0.0.1:x",
                                   "--log-level", "warn"},
                                  std::chrono::seconds(30));
    testing::check_one_error(r, "--dht-listen must be ADDRESS:PORT");
  }
  SUBCASE("a device this build or machine cannot use, and a bad --weights") {
    testing::check_one_error(serve(model, {"--blocks", "0:1", "--device", "tpu"}), "unknown device 'tpu'");
    testing::check_one_error(serve(model, {"--blocks", "0:1", "--device", "cuda:7"}), "cuda:7");
    testing::check_one_error(serve(model, {"--blocks", "0:1", "--weights", "f16"}),
                             "--weights must be f32, bf16, int8 or nf4, got 'f16'");
    testing::check_one_error(serve(model, {"--blocks", "0:1", "--kv-dtype", "i8"}),
                             "--kv-dtype must be f32, bf16 or f16, got 'i8'");
  }
  SUBCASE("endpoints ZeroMQ would take for another port, or dial for 30 s") {
    testing::check_one_error(serve(model, {"--blocks", "0:1", "--listen", "tcp://127.0.0.1:99999"}),
                             "invalid endpoint 'tcp://127.0.0.1:99999': the port must be in [0, 65535]");
    testing::check_one_error(serve(model, {"--blocks", "0:1", "--no-dht", "--no-listen", "--relay", "garbage"}),
                             "--relay garbage: invalid endpoint 'tcp://garbage' (expected tcp://HOST:PORT)");
    // CLI11's own ranges let NaN through; these flags refuse it (a usage error, status 105).
    const auto nan_rate = serve(model, {"--blocks", "0:1", "--relay-rate", "nan"});
    CHECK(nan_rate.exit_code == 105);
    CHECK(nan_rate.err.find("--relay-rate: must be a finite number >= 0, got 'nan'") != std::string::npos);
    const auto nan_period = serve(model, {"--blocks", "0:1", "--rebalance-period-s", "nan"});
    CHECK(nan_period.exit_code == 105);
    CHECK(nan_period.err.find("--rebalance-period-s: must be a finite number in [0, 86400], got 'nan'") !=
          std::string::npos);
    testing::check_one_error(serve(model, {"--blocks", "0:1", "--metrics-listen", "garbage"}),
                             "--metrics-listen must be HOST:PORT with a port in [0, 65535], got 'garbage'");
  }
  SUBCASE("a missing model directory") {
    testing::check_one_error(serve((dir / "nowhere").string(), {"--blocks", "0:1"}), "nowhere");
  }
}
