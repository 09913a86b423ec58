// Hostile command lines a CLI audit found accepted without a word (or
// answered with a message naming no flag): each is now refused at once,
// before any work, with a message that names the flag. Usage errors are
// CLI11's (status 105, "--flag: ..."); the others one "corolla: error: ..."
// line and status 1. Run as real processes.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
namespace fs = std::filesystem;

namespace {

/// A usage error: status 105 and CLI11's "<flag>: <message>" on stderr.
void check_usage_error(const testing::process_result& r, const std::string& expected) {
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  REQUIRE(r.exited());
  CHECK(r.exit_code == 105);
  CHECK(r.err.find(expected) != std::string::npos);
}

}  // namespace

TEST_CASE("flag checks: out-of-range and malformed values are usage errors that name the flag") {
  testing::temp_dir_guard dir("flag-checks");
  testing::write_tiny_model(dir.path(), {});
  const std::string model = dir.path().string();
  struct bad {
    std::vector<std::string> args;
    std::string expected;
  };
  for (const bad& b : std::vector<bad>{
           {{"generate", "--model", model, "--prompt-ids", "1", "--seed", "-1"},
            "--seed: must be a whole number from 0 to 18446744073709551615, got '-1'"},
           {{"generate", "--model", model, "--prompt-ids", "1", "--seed", "1.5"}, "--seed: must be a whole number"},
           {{"train", "--model", model, "--data", "x", "--batch", "2", "--seq", "4", "--lr", "0.1", "--save", ""},
            "--save: must not be empty"},
           {{"train", "--model", model, "--data", "x", "--batch", "2", "--seq", "4", "--lr", "0.1", "--checkpoint-dir",
             ""},
            "--checkpoint-dir: must not be empty"},
           {{"finetune", "--model", model, "--data", "x", "--local", "--save", ""}, "--save: must not be empty"},
           {{"generate", "--model", model, "--prompt-ids", "1", "--threads", "100000"},
            "--threads: must be a whole number in [0, 4096], got '100000'"},
           {{"serve", "--model", model, "--threads", "-2"}, "--threads: must be a whole number in [0, 4096], got '-2'"},
           {{"train", "--model", model, "--data", "x", "--batch", "2", "--seq", "4", "--lr", "0.1", "--pp", "2",
             "--threads", "5000"},
            "--threads: must be a whole number in [0, 4096], got '5000'"},
           {{"serve", "--model", model, "--nic-class", "token-ring"}, "--nic-class: token-ring not in"},
           {{"ping", "--peer", "tcp://127.0.0.1:1", "--size", "-1"}, "--size: must be a whole number in [1, "},
           {{"api", "--model", model, "--local", "--parallel", "100000000"},
            "--parallel: must be a whole number in [1, 4096], got '100000000'"},
           {{"faultlab", "random", "--train", "--model", model, "--faults", "1000"},
            "--faults: must be a whole number in [1, 10], got '1000'"},
           {{"dashboard", "--swarm-dht", "127.0.0.1:1", "--swarm-model", "m", "--blocks", "0"},
            "--blocks: must be a whole number in [1, 1000000], got '0'"},
           {{"node", "--node-id", "a b"}, "--node-id: must be 1 to 64 letters, digits, '.', '_' or '-', got 'a b'"},
           {{"serve", "--model", model, "--node-id", "relay@x"}, "--node-id: must be 1 to 64 letters"},
           {{"demo", "--vocab", "10"}, "--vocab: must be a whole number in [128, 3000], got '10'"},
           {{"train", "--model", model, "--data", "x", "--batch", "2", "--seq", "4", "--lr", "0.1", "--pp", "2",
             "--hang-s", "1e300"},
            "--hang-s: must be a finite number in [0, 604800], got '1e300'"},
           {{"train", "--model", model, "--data", "x", "--batch", "2", "--seq", "4", "--lr", "0.1", "--pp", "2",
             "--timeout-s", "1e300"},
            "--timeout-s: must be a finite number in [0.001, 604800], got '1e300'"},
           {{"bench", "decode", "--repeats", "0"}, "--repeats: must be a whole number in [1, 1000], got '0'"},
           {{"bench", "gemm", "--round-ms", "nan"}, "--round-ms: must be a finite number in [0.01, 10000], got 'nan'"},
           {{"bench", "interleave", "--bulk-mib", "nan"}, "--bulk-mib: must be a finite number in [0.001, 1024]"},
           {{"bench", "train", "--cluster", "x.toml", "--grad-clip", "nan"},
            "--grad-clip: must be a finite number >= 0, got 'nan'"},
       }) {
    CAPTURE(b.expected);
    check_usage_error(testing::run_corolla(b.args), b.expected);
  }
}

TEST_CASE("flag checks: an unknown command names itself and the commands there are") {
  for (const auto& [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"frobnicate"}, "unknown command 'corolla frobnicate'; the commands are info, train, "},
           {{"bench", "frobnicate"}, "unknown command 'corolla bench frobnicate'; the commands are decode, "},
           {{"faultlab", "frobnicate", "--json"}, "unknown command 'corolla faultlab frobnicate'; the commands are run, random"}}) {
    const testing::process_result r = testing::run_corolla(args);
    INFO("stderr: " << r.err);
    REQUIRE(r.exited());
    CHECK(r.exit_code == 109);
    REQUIRE(r.err_lines().size() == 1);
    CHECK(r.err.find("corolla: error: " + expected) == 0);
  }
  // Known commands still parse (their own flags' errors come through).
  const testing::process_result known = testing::run_corolla({"bench", "decode", "--repeats", "0"});
  CHECK(known.exit_code == 105);
}

TEST_CASE("flag checks: flags that do nothing in the way they were combined are errors naming them") {
  testing::temp_dir_guard dir("flag-combos");
  testing::write_tiny_model(dir.path(), {});
  const std::string model = dir.path().string();
  const std::vector<std::string> train{"train", "--model", model, "--data",  "x",  "--batch", "4",
                                       "--seq",   "4",   "--lr",    "0.1", "--steps", "2"};
  const auto with = [](std::vector<std::string> base, const std::vector<std::string>& extra) {
    base.insert(base.end(), extra.begin(), extra.end());
    return base;
  };
  for (const auto& [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"generate", "--model", model, "--prompt-ids", "1", "--swarm-weights", "int8"},
            "--swarm-weights only shapes a swarm: give --swarm or --swarm-dht too, or leave it out"},
           {{"generate", "--model", model, "--prompt-ids", "1", "--spot-checks", "0.5", "--compression", "int8"},
            "--spot-checks, --compression only shape a swarm"},
           {{"finetune", "--model", model, "--data", "x", "--local", "--swarm-timeout-ms", "10"},
            "--swarm-timeout-ms only shapes a swarm"},
           {{"api", "--model", model, "--local", "--curve-keys", (dir.path() / "k").string()}, "--curve-keys only shapes a swarm"},
           {{"generate", "--model", model, "--prompt-ids", "1", "--swarm", "127.0.0.1:1#short"},
            "--swarm entry '127.0.0.1:1#short': the key after '#' must be the server's CurveZMQ public key"},
           {{"generate", "--model", model, "--prompt-ids", "1", "--swarm", "127.0.0.1:99999"},
            "--swarm entry '127.0.0.1:99999': invalid endpoint 'tcp://127.0.0.1:99999': the port must be in"},
           {{"ping", "--peer", "tcp://127.0.0.1:1", "--server-key", "short"}, "--server-key needs --curve-keys"},
           {{"ping", "--peer", "tcp://127.0.0.1:1", "--server-key", "short", "--curve-keys", (dir.path() / "k").string()},
            "--server-key must be the node's CurveZMQ public key (40 Z85 characters"},
           {{"serve", "--model", model, "--no-dht", "--blocks", "0:1", "--announce-endpoint", "garbage"},
            "--announce-endpoint: invalid endpoint 'garbage' (expected tcp://HOST:PORT)"},
           {{"serve", "--model", model, "--no-dht", "--blocks", "0:1", "--announce-endpoint", "tcp://0.0.0.0:7000"},
            "--announce-endpoint tcp://0.0.0.0:7000 is not an address peers can dial"},
           {{"serve", "--model", model, "--num-blocks", "5"}, "--num-blocks 5 is more than the model's 2 blocks"},
           {{"serve", "--model", model, "--no-dht", "--blocks", "0:2", "--cache-tokens", "200000000000"},
            "--cache-tokens 200000000000 needs "},
           {with(train, {"--elastic"}), "--elastic: for pipeline x data-parallel training only"},
           {with(train, {"--min-ranks", "3", "--take-over", "f"}), "--min-ranks, --take-over: for pipeline x data-parallel"},
           {with(train, {"--pp", "2", "--min-ranks", "2"}), "--min-ranks is the fewest ranks an --elastic job goes on with"},
           {with(train, {"--pp", "2", "--take-over", "f"}), "--take-over carries on an --elastic job"},
           {with(train, {"--pp", "2", "--external-coordinator"}), "--external-coordinator is for a rank (--rank)"},
           // Found before the training, not when its result is written.
           {with(train, {"--save", model + "/config.json"}), "--save " + model + "/config.json is a file, not a directory"},
           {with(train, {"--pp", "2", "--save", "/proc/corolla-test"}), "--save /proc/corolla-test cannot be made: "},
           {{"finetune", "--model", model, "--data", "x", "--local", "--save", model},
            "--save " + model + " is a directory: give a file name"},
           {{"finetune", "--model", model, "--data", "x", "--local", "--save", model + "/none/p.safetensors"},
            "--save " + model + "/none/p.safetensors: its folder " + model + "/none does not exist"},
           // A device or a pipe as the data: refused, not read for ever.
           {{"train", "--model", model, "--data", "/dev/zero", "--batch", "2", "--seq", "4", "--lr", "0.1", "--steps", "1"},
            "data file /dev/zero is not a regular file (a device, a pipe or a socket)"},
           {{"plan", "--cluster", "/dev/zero", "--model", model, "--global-batch", "8", "--seq", "16"},
            "/dev/zero is not a regular file (a device or a socket)"},
           {with(train, {"--pp", "2", "--link-profile", "lat=1e12s"}), "a time of at most 1 hour (3600s)"},
           // Found before any rank starts, not once per rank.
           {with(train, {"--pp", "2", "--checkpoint-dir", model + "/config.json"}),
            "--checkpoint-dir " + model + "/config.json is a file, not a directory"},
           {with(train, {"--pp", "2", "--checkpoint-dir", "/proc/corolla-test"}),
            "--checkpoint-dir /proc/corolla-test cannot be made: "},
       }) {
    CAPTURE(expected);
    testing::check_one_error(testing::run_corolla(args), expected);
  }
  // Nothing was dialled, listened on or written: the model directory holds only the model.
  CHECK_FALSE(fs::exists(dir.path() / "k"));
}

TEST_CASE("flag checks: a bos or eos id outside the vocabulary is refused at load, naming the file") {
  testing::temp_dir_guard dir("eos-beyond");
  testing::write_tiny_model(dir.path(), {});
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir.path() / "config.json"));
  const int vocab = cfg.at("vocab_size").get<int>();
  {
    nlohmann::json bad = cfg;
    bad["eos_token_id"] = vocab;
    std::ofstream(dir.path() / "config.json") << bad.dump();
    testing::check_one_error(testing::run_corolla({"generate", "--model", dir.path().string(), "--prompt-ids", "1"}),
                             "eos_token_id " + std::to_string(vocab) + " is not a token of the vocabulary (vocab_size " +
                                 std::to_string(vocab) + ")");
  }
  {
    nlohmann::json bad = cfg;
    bad["bos_token_id"] = vocab + 5;
    std::ofstream(dir.path() / "config.json") << bad.dump();
    testing::check_one_error(testing::run_corolla({"generate", "--model", dir.path().string(), "--prompt-ids", "1"}),
                             "bos_token_id " + std::to_string(vocab + 5) + " is not a token of the vocabulary");
  }
  std::ofstream(dir.path() / "config.json") << cfg.dump();
  std::ofstream(dir.path() / "generation_config.json") << nlohmann::json{{"eos_token_id", {1, vocab + 1}}}.dump();
  testing::check_one_error(testing::run_corolla({"generate", "--model", dir.path().string(), "--prompt-ids", "1"}),
                           "is not a token of the vocabulary (vocab_size " + std::to_string(vocab) + ") (in " +
                               (dir.path() / "generation_config.json").string() + ")");
  // In range: it loads and generates.
  std::ofstream(dir.path() / "generation_config.json") << nlohmann::json{{"eos_token_id", {1, vocab - 1}}}.dump();
  const testing::process_result ok =
      testing::run_corolla({"generate", "--model", dir.path().string(), "--prompt-ids", "1", "--max-new-tokens", "2"});
  CHECK(ok.exit_code == 0);
}

TEST_CASE("flag checks: the second audit's leftovers, each refused at once with the flag or the file named") {
  testing::temp_dir_guard dir("flag-leftovers");
  testing::write_tiny_model(dir.path(), {});
  const std::string model = dir.path().string();
  const std::string file = model + "/config.json";
  // CLI11's own: a value out of range (105), a flag that needs another
  // (107), flags that exclude each other (108).
  struct usage {
    std::vector<std::string> args;
    int status;
    std::string expected;
  };
  for (const usage& u : std::vector<usage>{
           {{"generate", "--model", model, "--prompt-ids", "1", "--top-p", "1e-300"},
            105,
            "--top-p: must be a finite number in [1e-30, 1], got '1e-300'"},
           {{"generate", "--model", model, "--prompt-ids", "1", "--top-k", "-1"}, 105, "--top-k: must be a whole number"},
           {{"plan", "--cluster", "/dev/null", "--model", model, "--global-batch", "0"},
            105,
            "--global-batch: must be a whole number in [1, 1073741824], got '0'"},
           {{"plan", "--cluster", "/dev/null", "--model", model, "--memory-headroom", "1"},
            105,
            "--memory-headroom: must be a finite number in [0, 0.99], got '1'"},
           {{"bench", "api", "--local", "--servers", "3"}, 108, "--servers excludes --local"},
           {{"bench", "api", "--turns", "2", "--local"}, 108, "--local excludes --turns"},
           {{"bench", "swarm", "--wan-profiles", "bw=1Gbit;bogus"},
            105,
            "--wan-profiles: link profile: 'bogus': unknown profile"},
           {{"bench", "api", "--device", "cuda"}, 107, "--device requires --local"},
           {{"bench", "api", "--clients", "1,100000"}, 105, "--clients: must be a whole number in [1, 1024], got '100000'"},
           {{"node", "--relay-rate", "5"}, 107, "--relay-rate requires --relay-service"},
           {{"bench", "attention", "--precisions", ""}, 105, "--precisions: must not be empty"},
           {{"bench", "link", "--fragment-kib", "99999999999"},
            105,
            "--fragment-kib: must be 0 or a whole number from 4 to 1048576 (1 GiB), got '99999999999'"},
           {{"bench", "train", "--seq", "1"}, 105, "--seq: must be a whole number in [2, "},
           {{"bench", "loss", "--vocab", "99999999999"}, 105, "--vocab: must be a whole number in [2, 16777216]"},
       }) {
    CAPTURE(u.expected);
    const testing::process_result r = testing::run_corolla(u.args);
    INFO("stderr: " << r.err);
    REQUIRE(r.exited());
    CHECK(r.exit_code == u.status);
    CHECK(r.err.find(u.expected) != std::string::npos);
  }

  // A cluster file with a worker of absurd memory, and one of a worker so
  // slow that the emulated bench would sleep for centuries.
  const auto cluster = [&](const std::string& name, const std::string& worker) {
    const fs::path path = dir.path() / name;
    std::ofstream(path) << "[[cluster]]\nname = \"c\"\n  [[cluster.node]]\n  name = \"n\"\n  count = 2\n  nic = \"ib\"\n"
                           "    [[cluster.node.worker]]\n" << worker;
    return path.string();
  };
  const std::string huge = cluster("huge.toml", "    tflops = 10\n    memory_gib = 1e300\n");
  const std::string slow = cluster("slow.toml", "    tflops = 1e-12\n    memory_gib = 8\n");
  // A Llama config deeper than the planner splits.
  const fs::path deep = dir.path() / "deep";
  fs::create_directories(deep);
  {
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(file));
    cfg["num_hidden_layers"] = 2000;
    std::ofstream(deep / "config.json") << cfg.dump();
  }
  // A tokenizer.model that is not one.
  const fs::path garbled = dir.path() / "garbled";
  fs::create_directories(garbled);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(dir.path() / f, garbled / f);
  std::ofstream(garbled / "tokenizer.model") << "not a protobuf at all";
  const std::string scenario = (dir.path() / "s.toml").string();
  std::ofstream(scenario) << "[swarm]\nmodel = \"builtin:llama\"\nservers = [\"0:2\"]\n";

  for (const auto& [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"plan", "--cluster", huge, "--model", model},
            "'memory_gib' must be at most 1048576 (GiB), got 1e+300"},
           {{"plan", "--cluster", slow, "--model", deep.string()}, "the planner splits models of at most 1024 layers; "
                                                                    "this one has 2000"},
           {{"bench", "train", "--cluster", slow, "--steps", "1"}, "bench train --cluster: the cost model predicts "},
           {{"bench", "train", "--device", "cpu", "--matmul", "bf16"},
            "bench train: the CPU backend computes in f32; --matmul bf16 is for GPUs"},
           {{"faultlab", "random", "--swarm", "--model", model, "--data", file},
            "--data is for --train campaigns"},
           {{"faultlab", "run", scenario, "--report", file}, "--report " + file + " is a file, not a directory"},
           {{"generate", "--model", file, "--prompt-ids", "1"},
            file + " is a file, not a model directory (give the folder that holds config.json and the weights)"},
           {{"generate", "--model", garbled.string(), "--prompt", "hi"},
            "tokenizer.model: the file is not a SentencePiece model (it does not parse as one)"},
           {{"train", "--model", model, "--data", "x", "--batch", "2", "--seq", "4", "--lr", "0.1", "--steps", "1",
             "--pp", "2", "--link-profile", "lat=1ms,latency=2ms"},
            "'lat' is given twice"},
           // ZeroMQ binds no host names: said so, without its errno or CAF's code name.
           {{"node", "--listen", "tcp://localhost:0"},
            "cannot start the transport on 'tcp://localhost:0': cannot listen: invalid endpoint 'tcp://localhost:0' to "
            "listen on: 'localhost' is not an IP address or a network interface of this machine"},
       }) {
    CAPTURE(expected);
    testing::check_one_error(testing::run_corolla(args), expected);
  }
  // With ids, a broken tokenizer only costs the text: said once, ids shown.
  const testing::process_result ids = testing::run_corolla(
      {"generate", "--model", garbled.string(), "--prompt-ids", "1", "--max-new-tokens", "2", "--print-ids"});
  INFO("stderr: " << ids.err);
  CHECK(ids.exit_code == 0);
  CHECK(ids.err.find("generate: cannot load SentencePiece model") != std::string::npos);
  CHECK(ids.err.find("the output is shown as ids only") != std::string::npos);
}
