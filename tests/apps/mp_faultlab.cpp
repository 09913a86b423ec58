// `corolla faultlab` end to end: scenarios run against real local swarms
// and training jobs, a scenario whose faults break the job is reported as
// failing (exit 1) with the reason and the seed to replay, and a random
// campaign passes.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/actors/swarm_fixtures.hpp"
#include "tests/apps/train_test_util.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/eventually.hpp"

using namespace corolla;
using namespace corolla::testing;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

/// `corolla faultlab run FILE --json --report DIR`: the report, and the exit status.
std::pair<json, int> faultlab(const fs::path& scenario, const fs::path& report, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"faultlab", "run", scenario.string(), "--json", "--report", report.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const process_result r = run_corolla(args, std::chrono::seconds(180));
  INFO("faultlab stderr: " << r.err);
  REQUIRE(!r.out_lines().empty());
  const json j = json::parse(r.out_lines().back());
  CHECK(fs::exists(report / "report.json"));
  return {j, r.exit_code};
}

/// A scenario that ships in the repository's scenarios/.
fs::path shipped(const std::string& name) { return fs::path(COROLLA_SOURCE_DIR) / "scenarios" / name; }

std::vector<std::string> events(const json& report) { return report["faulted"]["events"].get<std::vector<std::string>>(); }

/// A 2x2 elastic training scenario over `steps` steps of job `j`, with
/// checkpoints every 3 steps, the reference's losses expected, and one
/// fault: `what` on `target` at step 4.
void write_train_scenario(const fs::path& file, const train_test::job& j, int steps, const std::string& what,
                          const std::string& target, int max_stall_s) {
  std::ofstream(file) << "name = \"" << what << " " << target << "\"\n[train]\nmodel = \"" << j.model.string()
                      << "\"\ndata = \"" << j.data.string() << "\"\nargs = \"--batch 12 --seq 8 --steps " << steps
                      << " --lr 0.003 --threads 1 --link-profile lat=2ms\"\nlayout = \"--pp 2 --dp 2\"\n"
                      << "checkpoint_every = 3\n[[fault]]\nat = \"step 4\"\ndo = \"" << what << "\"\ntarget = \""
                      << target << "\"\n[expect]\nsame_losses_as_reference = true\nmax_stall_s = " << max_stall_s << "\n";
}

}  // namespace

TEST_CASE("faultlab: a swarm survives two kills on its route and a join, with the reference's output") {
  // The scenario that ships in scenarios/ (its model is built in).
  temp_dir_guard tmp("faultlab-swarm");
  const auto [report, status] = faultlab(shipped("swarm-kills-and-join.toml"), tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["pass"] == true);
  CHECK(report["kind"] == "swarm");
  CHECK(fs::exists(tmp / "report" / "builtin-llama" / "model.safetensors"));
  CHECK(report["faulted"]["tokens"] == report["reference"]["tokens"]);
  CHECK(report["faulted"]["tokens"].size() == 24u);
  CHECK(report["faulted"]["recoveries"].get<int>() >= 2);
  const auto ev = events(report);
  REQUIRE(ev.size() == 3u);
  CHECK(ev[0].find("token 6: kill route.hop 0 (s") == 0);
  CHECK(ev[2].find("join j0 on blocks [0, 4)") != std::string::npos);
  // Every server's log is kept.
  CHECK(fs::exists(tmp / "report" / "faults" / "j0.log"));
  // Each fault's timeline: a killed hop is noticed by the client after it
  // was killed, and the next token follows.
  CHECK(report["held"] == true);
  const json& faults = report["faults"];
  REQUIRE(faults.size() == 3u);
  for (int k : {0, 1}) {
    const json& f = faults[k];
    INFO("fault " << k << ": " << f.dump());
    CHECK(f["do"] == "kill");
    CHECK(f["hit"].get<std::string>().rfind("s", 0) == 0);
    REQUIRE(f["detected_at_s"].is_number());
    CHECK(f["detected_at_s"].get<double>() >= f["injected_at_s"].get<double>());
    REQUIRE(f["recovered_at_s"].is_number());
    CHECK(f["recovered_at_s"].get<double>() >= f["detected_at_s"].get<double>());
    CHECK(f["detected_by"].get<std::string>().rfind("client: server " + f["hit"].get<std::string>() + " failed", 0) == 0);
  }
  CHECK(faults[0]["at"] == "token 6");
  CHECK(faults[2]["do"] == "join");
  CHECK(faults[2]["hit"] == "j0");
  CHECK(faults[2]["injected_at_s"].is_number());
  CHECK(faults[2]["detected_at_s"].is_null());  // a join is no failure
  CHECK(report["faulted"]["progress_s"].size() == 24u);
  // The picture: both runs' lines and every fault marked.
  std::ifstream svg(tmp / "report" / "timeline.svg");
  const std::string picture((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  CHECK(picture.rfind("<svg", 0) == 0);
  CHECK(picture.find("reference (24 tokens") != std::string::npos);
  CHECK(picture.find("kill " + faults[0]["hit"].get<std::string>()) != std::string::npos);
  CHECK(picture.find("join j0") != std::string::npos);
}

TEST_CASE("faultlab: on shaped links, a throttled hop keeps the reference's output, and heals") {
  swarm_test::swarm_model m(architecture::llama);
  temp_dir_guard tmp("faultlab-throttle");
  std::ofstream(tmp / "s.toml") << "name = \"a slow uplink\"\n[swarm]\nmodel = \"" << m.dir.path().string() << R"("
servers = ["0:2", "2:4"]
link = "lat=1ms"
[swarm.client]
prompt_ids = [3, 17, 9]
new_tokens = 14
[[fault]]
at = "token 4"
do = "throttle"
target = "route.hop 1"
profile = "bw=2Mbit,lat=15ms"
[[fault]]
at = "token 9"
do = "heal"
target = "route.hop 1"
[expect]
same_output_as_reference = true
max_stall_s = 20
)";
  const auto [report, status] = faultlab(tmp / "s.toml", tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["pass"] == true);
  CHECK(report["faulted"]["tokens"] == report["reference"]["tokens"]);
  const auto ev = events(report);
  REQUIRE(ev.size() == 2u);
  CHECK(ev[0] == "token 4: throttle route.hop 1 (s1, sends shaped bw=2Mbit,lat=15ms)");
  CHECK(ev[1] == "token 9: heal route.hop 1 (s1, back to its own shaping, no partition)");
  // That the links really carry the new rate is tests/actors/test_link_probe.cpp's.
}

TEST_CASE("faultlab: a partitioned hop is given up on and replaced, with the reference's output") {
  swarm_test::swarm_model m(architecture::llama);
  temp_dir_guard tmp("faultlab-partition");
  std::ofstream(tmp / "s.toml") << "name = \"a server cut off\"\n[swarm]\nmodel = \"" << m.dir.path().string() << R"("
servers = ["0:2", "2:4", "2:4"]
[swarm.client]
prompt_ids = [3, 17, 9]
new_tokens = 12
[[fault]]
at = "token 4"
do = "partition"
target = "route.hop 1"
[expect]
same_output_as_reference = true
max_stall_s = 30
)";
  const auto [report, status] = faultlab(tmp / "s.toml", tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["pass"] == true);
  CHECK(report["faulted"]["tokens"] == report["reference"]["tokens"]);
  const auto ev = events(report);
  REQUIRE(ev.size() == 1u);
  CHECK(ev[0].rfind("token 4: partition route.hop 1 (s", 0) == 0);
  CHECK(ev[0].find("traffic with every peer dropped") != std::string::npos);
  // The cut-off server answered nothing more: the client failed over.
  CHECK(report["faulted"]["recoveries"].get<int>() >= 1);
}

TEST_CASE("faultlab: a corrupted hop is caught by spot checks and replaced with the reference's output, and unchecked it "
          "changes the output") {
  // The scenario that ships in scenarios/, with every step checked.
  temp_dir_guard tmp("faultlab-corrupt");
  const auto [report, status] = faultlab(shipped("swarm-corrupt.toml"), tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["pass"] == true);
  CHECK(report["faulted"]["tokens"] == report["reference"]["tokens"]);
  const auto ev = events(report);
  REQUIRE(ev.size() == 1u);
  CHECK(ev[0].rfind("token 5: corrupt route.hop 1 (s", 0) == 0);
  const auto corrupted = report["faulted"]["corrupted"].get<std::vector<std::string>>();
  REQUIRE(corrupted.size() == 1u);
  CHECK(report["faulted"]["wrong_servers"].get<std::vector<std::string>>() == corrupted);
  CHECK(report["faulted"]["recoveries"].get<int>() == 1);
  CHECK(report["reference"]["wrong_servers"].get<std::vector<std::string>>().empty());
  CHECK(report["faults"][0]["detected_by"].get<std::string>().find("client: spot check: " + corrupted[0]) == 0);

  // Without spot checks the wrong activations reach the output: the
  // scenario fails, naming the first token that differs.
  std::ifstream in(shipped("swarm-corrupt.toml"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto replace = [&](const std::string& from, const std::string& to) {
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
  };
  replace("spot_checks = 1.0", "spot_checks = 0");
  std::ofstream(tmp / "unchecked.toml") << text;
  const auto [bad, bad_status] = faultlab(tmp / "unchecked.toml", tmp / "report-unchecked");
  INFO(bad.dump(2));
  CHECK(bad_status == 1);
  CHECK(bad["pass"] == false);
  CHECK(bad["faulted"]["tokens"] != bad["reference"]["tokens"]);
  CHECK(bad["faulted"]["wrong_servers"].get<std::vector<std::string>>().empty());
}

TEST_CASE("faultlab: the scenarios that ship in scenarios/ hold") {
  // Every shipped scenario runs in some test: this one here, the others
  // in the tests above.
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(fs::path(COROLLA_SOURCE_DIR) / "scenarios")) files.insert(e.path().filename());
  CHECK(files == std::set<std::string>{"swarm-corrupt.toml", "swarm-kill-relay.toml", "swarm-kills-and-join.toml",
                                       "swarm-partition-and-stop.toml", "train-hang-rank.toml",
                                       "train-join-worker.toml", "train-kill-launcher.toml", "train-kill-rank.toml",
                                       "train-lose-message.toml"});
  temp_dir_guard tmp("faultlab-shipped");
  const auto [report, status] = faultlab(shipped("swarm-partition-and-stop.toml"), tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["held"] == true);
  REQUIRE(report["faults"].size() == 2u);
  for (const json& f : report["faults"]) {
    CHECK(f["injected_at_s"].is_number());
    CHECK(f["detected_at_s"].is_number());  // the client gave up on each hop
    CHECK(f["recovered_at_s"].is_number());
  }
}

TEST_CASE("faultlab: the relay of a server behind NAT is killed, the server moves to the other relay, same output") {
  temp_dir_guard tmp("faultlab-relay");
  const auto [report, status] = faultlab(shipped("swarm-kill-relay.toml"), tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["held"] == true);
  CHECK(report["faulted"]["tokens"] == report["reference"]["tokens"]);
  CHECK(report["faulted"]["recoveries"].get<int>() >= 1);
  REQUIRE(report["faults"].size() == 1u);
  const json& f = report["faults"][0];
  CHECK(f["target"] == "relay 0");
  CHECK(f["injected_at_s"].is_number());
  // The client noticed through the server it reached through r0, and went on.
  CHECK(f["detected_at_s"].is_number());
  CHECK(f["recovered_at_s"].is_number());
  // Both relays ran; the NAT server's log says it left the dead one.
  CHECK(fs::exists(tmp / "report" / "faults" / "r1.log"));
  std::ifstream log(tmp / "report" / "faults" / "s1.log");
  const std::string s1((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  CHECK(s1.find("relay r0 at ") != std::string::npos);
  CHECK(s1.find("looking for another") != std::string::npos);
}

TEST_CASE("faultlab: the relay of a server behind NAT partitioned: the server and the client move to the other relay") {
  // The shipped scenario with a partition instead of a kill: the relay
  // process lives on but answers nobody, and the client must be sent to
  // where the server goes, not to the partitioned relay.
  std::ifstream in(shipped("swarm-kill-relay.toml"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find("do = \"kill\"");
  REQUIRE(at != std::string::npos);
  text.replace(at, 11, "do = \"partition\"");
  temp_dir_guard tmp("faultlab-relay-partition");
  std::ofstream(tmp / "partition-relay.toml") << text;
  const auto [report, status] = faultlab(tmp / "partition-relay.toml", tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["held"] == true);
  const auto ev = events(report);
  REQUIRE(ev.size() == 1u);
  CHECK(ev[0].find("partition relay 0 (r0, traffic with every peer dropped)") != std::string::npos);
  CHECK(report["faulted"]["recoveries"].get<int>() >= 1);
}

TEST_CASE("faultlab: stop, resume, kill and restart each take effect: a resumed and a restarted server serve alone") {
  // Two servers of the whole model. The one serving is hung (stop), then
  // resumed; the other, serving now, is killed, so the resumed one must
  // serve alone; the killed one is restarted (a new process) and the
  // resumed one killed, so the restarted one must serve alone. The output
  // is the reference's only if each fault did what it says.
  temp_dir_guard tmp("faultlab-stop-resume-restart");
  std::ofstream(tmp / "s.toml")
      << "name = \"stop, resume, kill, restart\"\nseed = 3\n[swarm]\nmodel = \"builtin:llama\"\n"
      << "servers = [\"0:4\", \"0:4\"]\n[swarm.client]\nprompt_ids = [4, 9, 2]\nnew_tokens = 24\n"
      << "[[fault]]\nat = \"token 4\"\ndo = \"stop\"\ntarget = \"route.hop 0\"\n"
      << "[[fault]]\nat = \"token 8\"\ndo = \"resume\"\ntarget = \"random server\"\n"
      << "[[fault]]\nat = \"token 12\"\ndo = \"kill\"\ntarget = \"route.hop 0\"\n"
      << "[[fault]]\nat = \"token 16\"\ndo = \"restart\"\ntarget = \"random server\"\n"
      << "[[fault]]\nat = \"token 20\"\ndo = \"kill\"\ntarget = \"route.hop 0\"\n"
      << "[expect]\nsame_output_as_reference = true\nmax_stall_s = 60\n";
  const auto [report, status] = faultlab(tmp / "s.toml", tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["held"] == true);
  CHECK(report["faulted"]["tokens"] == report["reference"]["tokens"]);
  const json& faults = report["faults"];
  REQUIRE(faults.size() == 5u);
  std::vector<std::string> hit;
  for (const json& f : faults) hit.push_back(f["hit"].get<std::string>());
  REQUIRE(hit.size() == 5u);
  CHECK(hit[0] != hit[2]);  // the hung server was not serving when the other was killed
  CHECK(hit[1] == hit[0]);  // the hung one resumed
  CHECK(hit[3] == hit[2]);  // the killed one restarted
  CHECK(hit[4] == hit[0]);  // the resumed one served alone until killed
  CHECK(faults[0]["detected_at_s"].is_number());  // the client gave up on the hung hop
  CHECK(faults[3]["outcome"].get<std::string>().find("a new process") != std::string::npos);
  CHECK(report["faulted"]["recoveries"].get<int>() >= 3);
}

TEST_CASE("faultlab: a server behind NAT corrupted through its relay is caught by spot checks, the reference's output") {
  // Every server of blocks [2, 4) is behind NAT: the harness reaches the
  // corrupted one's control actor through the relay, as the client does.
  temp_dir_guard tmp("faultlab-nat-corrupt");
  std::ofstream(tmp / "nat-corrupt.toml")
      << "name = \"corrupt behind NAT\"\nseed = 11\n[swarm]\nmodel = \"builtin:llama\"\n"
      << "servers = [\"0:2\", \"2:4\", \"2:4\", \"2:4\"]\nrelays = 1\nnat = [1, 2, 3]\n[swarm.client]\n"
      << "prompt_ids = [3, 17, 9]\nnew_tokens = 12\nspot_checks = 1.0\nspot_check_probation = 0\n"
      << "[[fault]]\nat = \"token 4\"\ndo = \"corrupt\"\ntarget = \"route.hop 1\"\n"
      << "[expect]\nsame_output_as_reference = true\nwrong_servers_caught = true\n";
  const auto [report, status] = faultlab(tmp / "nat-corrupt.toml", tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["held"] == true);
  const auto ev = events(report);
  REQUIRE(ev.size() == 1u);
  CHECK(ev[0].find("wrong outputs from now on") != std::string::npos);
  const auto corrupted = report["faulted"]["corrupted"].get<std::vector<std::string>>();
  REQUIRE(corrupted.size() == 1u);
  CHECK(corrupted[0] != "s0");
  CHECK(report["faulted"]["wrong_servers"].get<std::vector<std::string>>() == corrupted);
}

namespace {

/// Processes whose command line mentions `needle`.
int processes_mentioning(const std::string& needle) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "cmdline");
    const std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (cmd.find(needle) != std::string::npos) ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("faultlab: interrupted with SIGINT, a run leaves no process of its own behind") {
  temp_dir_guard tmp("faultlab-sigint");
  const std::string report = (tmp / "report").string();
  child_process run = child_process::corolla({"faultlab", "run", shipped("swarm-kills-and-join.toml").string(),
                                              "--report", report});
  // Its servers load the built-in model from the report directory: wait
  // until they run.
  corolla::testing::eventually([&] { return processes_mentioning(report + "/builtin-llama") > 0; },
                               std::chrono::seconds(60), std::chrono::milliseconds(20));
  REQUIRE_MESSAGE(processes_mentioning(report + "/builtin-llama") > 0, "no server started; stderr:\n" << run.err());
  run.signal(SIGINT);
  REQUIRE(run.wait(std::chrono::seconds(20)));
  // Its servers die with it (they are its children, with a parent-death signal).
  CHECK(corolla::testing::eventually([&] { return processes_mentioning(report + "/builtin-llama") == 0; },
                                     std::chrono::seconds(10), std::chrono::milliseconds(50)));
}

TEST_CASE("faultlab: killing the only server of some blocks fails the scenario with the reason and the seed") {
  swarm_test::swarm_model m(architecture::llama);
  temp_dir_guard tmp("faultlab-broken");
  std::ofstream(tmp / "s.toml") << "name = \"no spare\"\n[swarm]\nmodel = \"" << m.dir.path().string() << R"("
servers = ["0:2", "2:4"]
[swarm.client]
new_tokens = 16
[[fault]]
at = "token 4"
do = "kill"
target = "server 1"
[expect]
same_output_as_reference = true
)";
  const auto [report, status] = faultlab(tmp / "s.toml", tmp / "report", {"--seed", "11"});
  CHECK(status == 1);
  CHECK(report["pass"] == false);
  CHECK(report["seed"] == 11);
  CHECK(report["reference"]["completed"] == true);
  CHECK(report["faulted"]["completed"] == false);
  CHECK(report["faulted"]["error"].get<std::string>().find("gave up on blocks [2, 4)") != std::string::npos);
  // The text report says FAIL and how to replay.
  const process_result text = run_corolla({"faultlab", "run", (tmp / "s.toml").string(), "--seed", "11"},
                                          std::chrono::seconds(120));
  CHECK(text.exit_code == 1);
  CHECK(text.out.find("FAIL  faulted run completed") != std::string::npos);
  CHECK(text.out.find("replay: corolla faultlab run " + (tmp / "s.toml").string() + " --seed 11") != std::string::npos);
  // Without --report the report goes to a temporary folder it names, which
  // stays for the user to read (and goes here, not to pile up in /tmp).
  const std::string named = "report and logs in ";
  const auto at = text.out.find(named);
  REQUIRE(at != std::string::npos);
  const std::filesystem::path dir = text.out.substr(at + named.size(), text.out.find('\n', at) - at - named.size());
  CHECK(std::filesystem::exists(dir / "report.json"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("faultlab: an elastic training job loses a rank and keeps the reference's losses, a random campaign passes") {
  temp_dir_guard tmp("faultlab-train");
  const auto [report, status] = faultlab(shipped("train-kill-rank.toml"), tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["pass"] == true);
  CHECK(report["faulted"]["losses"].size() == 16u);
  CHECK(report["faulted"]["recoveries"] == 1);
  REQUIRE(events(report).size() == 1u);
  CHECK(events(report)[0].find("kill rank 2 (rank 2, pid ") != std::string::npos);
  // The launcher's re-plan is when the job noticed; the next step is its recovery.
  const json& f = report["faults"][0];
  REQUIRE(f["detected_at_s"].is_number());
  CHECK(f["detected_at_s"].get<double>() >= f["injected_at_s"].get<double>());
  CHECK(f["detected_by"].get<std::string>().rfind("launcher: re-plan", 0) == 0);
  REQUIRE(f["recovered_at_s"].is_number());
  CHECK(f["recovered_at_s"].get<double>() >= f["detected_at_s"].get<double>());
  CHECK(fs::exists(tmp / "report" / "timeline.svg"));

  swarm_test::swarm_model m(architecture::llama);
  const process_result r = run_corolla({"faultlab", "random", "--swarm", "--model", m.dir.path().string(), "--faults",
                                        "2", "--seed", "5", "--report", (tmp / "random").string()},
                                       std::chrono::seconds(180));
  INFO("random: " << r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("random swarm campaign (seed 5)") != std::string::npos);
  CHECK(r.out.find("PASS") != std::string::npos);
}

TEST_CASE("faultlab: an elastic training job loses its launcher, a rank process takes over, a rank killed later is "
          "re-planned around by the new launcher, the reference's losses") {
  temp_dir_guard tmp("faultlab-train-launcher");
  const auto [report, status] = faultlab(shipped("train-kill-launcher.toml"), tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["pass"] == true);
  CHECK(report["faulted"]["losses"].size() == 16u);
  CHECK(report["faulted"]["recoveries"] == 2);
  REQUIRE(events(report).size() == 2u);
  CHECK(events(report)[0].find("kill launcher (pid ") != std::string::npos);
  CHECK(events(report)[1].find("kill rank 1 (rank 1, pid ") != std::string::npos);
  const json& f = report["faults"][0];
  REQUIRE(f["detected_at_s"].is_number());
  CHECK(f["detected_by"].get<std::string>().rfind("launcher: takeover", 0) == 0);
  REQUIRE(f["recovered_at_s"].is_number());
  REQUIRE(report["faults"][1]["recovered_at_s"].is_number());
}

namespace {

/// A shipped training scenario of one fault on a rank whose node stays up
/// (hang, lose): `event` in its one event line, found within seconds by
/// --hang-s (not a peer timeout or --timeout-s), the reference's losses.
void check_stuck_rank_scenario(const char* file, const std::string& event) {
  temp_dir_guard tmp("faultlab-train-stuck");
  const auto [report, status] = faultlab(shipped(file), tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["pass"] == true);
  CHECK(report["faulted"]["losses"].size() == 16u);
  CHECK(report["faulted"]["recoveries"] == 1);
  REQUIRE(events(report).size() == 1u);
  CHECK(events(report)[0].find(event) != std::string::npos);
  const json& f = report["faults"][0];
  REQUIRE(f["detected_at_s"].is_number());
  CHECK(f["detected_at_s"].get<double>() - f["injected_at_s"].get<double>() < 30);
  REQUIRE(f["recovered_at_s"].is_number());
}

}  // namespace

TEST_CASE("faultlab: a training rank whose stage hangs with its node up is reported by its watchdog, and the elastic "
          "job keeps the reference's losses") {
  check_stuck_rank_scenario("train-hang-rank.toml", "hang rank 1 (rank 1, its stage stalls inside its next compute call)");
}

TEST_CASE("faultlab: an activation lost on the way deadlocks two ranks, the coordinator's stall check names them and "
          "the elastic job starts again with every rank and the reference's losses") {
  check_stuck_rank_scenario("train-lose-message.toml", "lose rank 3 (rank 3 loses its next train.act message)");
}

TEST_CASE("faultlab: a random swarm campaign with a server answering wrong keeps the reference's output") {
  temp_dir_guard tmp("faultlab-random-corrupt");
  swarm_test::swarm_model m(architecture::llama);
  // Seed 1 draws a corrupt half-model server (server 0) and one more fault.
  const process_result r = run_corolla({"faultlab", "random", "--swarm", "--model", m.dir.path().string(), "--faults",
                                        "2", "--seed", "1", "--json", "--report", (tmp / "random").string()},
                                       std::chrono::seconds(180));
  INFO("random: " << r.out << r.err);
  CHECK(r.exit_code == 0);
  const json report = json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  CHECK(report["pass"] == true);
  bool corrupt = false;
  for (const json& f : report["faults"]) corrupt = corrupt || f.dump().find("corrupt") != std::string::npos;
  CHECK(corrupt);
}

TEST_CASE("faultlab: a random training campaign mixes lost messages, joins and hung stages, and the same seed gives "
          "the same campaign") {
  temp_dir_guard tmp("faultlab-random-train");
  train_test::job j = train_test::fresh_gpt2_job(tmp);
  // Seed 4's four faults: a message lost (whatever the rank receives: rank 3
  // of 2x2 loses an activation, a deadlock the stall check must find at the
  // campaign's --hang-s 3), two workers join, a stage hangs.
  auto campaign = [&](const char* report) {
    const process_result r =
        run_corolla({"faultlab", "random", "--train", "--model", j.model.string(), "--data", j.data.string(), "--faults",
                     "4", "--seed", "4", "--json", "--report", (tmp / report).string()},
                    std::chrono::seconds(240));
    INFO("random: " << r.out << r.err);
    CHECK(r.exit_code == 0);
    REQUIRE(!r.out_lines().empty());
    return json::parse(r.out_lines().back());
  };
  // Each fault as "<do> <at>".
  auto kinds_of = [](const json& report) {
    std::multiset<std::string> out;
    for (const json& f : report["faults"]) out.insert(f["do"].get<std::string>() + " " + f["at"].get<std::string>());
    return out;
  };
  const json first = campaign("a");
  CHECK(first["pass"] == true);
  CHECK(first.dump().find("loses its next train.act message") != std::string::npos);
  CHECK(first["scenario"] == "random train campaign");
  const std::multiset<std::string> kinds = kinds_of(first);
  CHECK(kinds == std::multiset<std::string>{"lose step 2", "join step 3", "join step 3", "hang step 10"});
  for (const json& f : first["faults"]) {
    INFO(f.dump());
    CHECK(f["detected_at_s"].is_number());  // every fault noticed by the job
  }
  CHECK(first["faulted"]["losses"].size() == 24u);  // the losses equal the reference's: "pass" above
  CHECK(first["faulted"]["recoveries"].get<int>() >= 2);
  CHECK(kinds_of(campaign("b")) == kinds);
}

TEST_CASE("faultlab: a training rank cut off by a partition, the elastic job re-plans and keeps the reference's losses") {
  temp_dir_guard tmp("faultlab-train-partition");
  train_test::job j = train_test::fresh_gpt2_job(tmp);
  write_train_scenario(tmp / "t.toml", j, 12, "partition", "rank 3", 90);
  const auto [report, status] = faultlab(tmp / "t.toml", tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["pass"] == true);
  CHECK(report["faulted"]["losses"].size() == 12u);
  CHECK(report["faulted"]["recoveries"].get<int>() >= 1);  // its peers saw it go silent, the job re-planned
  REQUIRE(events(report).size() == 1u);
  CHECK(events(report)[0] == "step 4: partition rank 3 (rank 3, traffic with every peer dropped)");
}

TEST_CASE("faultlab: a training rank throttled through its control actor, the elastic job re-plans on the measured "
          "link and keeps the reference's losses") {
  temp_dir_guard tmp("faultlab-train-throttle");
  train_test::job j = train_test::fresh_gpt2_job(tmp);
  std::ofstream(tmp / "three.toml") << train_test::three_nodes_toml;  // the planner runs 1x2 on n0/0, n1/0
  std::ofstream(tmp / "t.toml") << "name = \"a slow uplink\"\n[train]\nmodel = \"" << j.model.string() << "\"\ndata = \""
                                << j.data.string() << "\"\nlayout = \"--cluster " << (tmp / "three.toml").string() << R"("
args = "--batch 4 --seq 8 --steps 40 --lr 0.003 --threads 1 --probe-every 2"
checkpoint_every = 0
[[fault]]
at = "step 4"
do = "throttle"
target = "rank 1"
profile = "bw=1Mbit,lat=200us"
[expect]
same_losses_as_reference = true
max_stall_s = 60
)";
  const auto [report, status] = faultlab(tmp / "t.toml", tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["pass"] == true);
  CHECK(report["faulted"]["losses"].size() == 40u);
  CHECK(report["faulted"]["recoveries"] == 1);  // the re-plan on the measured link
  REQUIRE(events(report).size() == 1u);
  CHECK(events(report)[0].find("throttle rank 1 (rank 1, sends shaped bw=1Mbit,lat=200us)") != std::string::npos);
}

TEST_CASE("faultlab: a worker joins an elastic training job, which grows onto it, then loses a rank, and keeps the "
          "reference's losses") {
  temp_dir_guard tmp("faultlab-train-join");
  const auto [report, status] = faultlab(shipped("train-join-worker.toml"), tmp / "report");
  INFO(report.dump(2));
  CHECK(status == 0);
  CHECK(report["pass"] == true);
  CHECK(report["faulted"]["losses"].size() == 80u);
  CHECK(report["faulted"]["recoveries"].get<int>() == 2);  // grown onto the worker, re-planned without rank 0
  REQUIRE(events(report).size() == 2u);
  CHECK(events(report)[0].find("join (worker j1, pid") != std::string::npos);
  CHECK(events(report)[1].find("kill rank 0 (rank 0, pid") != std::string::npos);
}

TEST_CASE("faultlab: bad scenarios and flags are one error line") {
  temp_dir_guard tmp("faultlab-bad");
  std::ofstream(tmp / "bad.toml") << "[swarm]\nmodel = 'm'\nservers = ['0:2']\n[[fault]]\nat = 'step 2'\ndo = 'kill'\n";
  check_one_error(run_corolla({"faultlab", "run", (tmp / "bad.toml").string()}), "a swarm counts tokens, not steps");
  const std::string missing = (tmp / "missing.toml").string();
  check_one_error(run_corolla({"faultlab", "run", missing}), "scenario " + missing + " does not exist");
  check_one_error(run_corolla({"faultlab", "random", "--model", tmp.path().string()}), "exactly one of --swarm and --train");
  std::ofstream(tmp / "builtin.toml") << "[swarm]\nmodel = 'builtin:falcon'\nservers = ['0:2']\n";
  check_one_error(run_corolla({"faultlab", "run", (tmp / "builtin.toml").string(), "--report", (tmp / "r").string()}),
                  "'builtin:falcon' is not a built-in model (builtin:llama, builtin:gpt2)");
  // What the scenario asks of its model: one error naming the key, before
  // any process starts (the built-in llama has 4 blocks).
  const std::string file = (tmp / "model.toml").string();
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {"[swarm]\nmodel = '" + (tmp / "none").string() + "'\nservers = ['0:2']\n",
            file + ": swarm.model: model directory " + (tmp / "none").string() + " does not exist"},
           {"[swarm]\nmodel = 'builtin:llama'\nservers = ['0:2', '3:4']\n",
            file + ": swarm.servers: no server holds block 2 of the model's 4 (the client could not generate)"},
           {"[swarm]\nmodel = 'builtin:llama'\nservers = ['0:6']\n",
            file + ": swarm.servers: \"0:6\" runs past the model's 4 blocks"},
           {"[swarm]\nmodel = 'builtin:llama'\nservers = ['0:4']\n[swarm.client]\nprompt_ids = [1, 999999]\n",
            file + ": swarm.client.prompt_ids: 999999 is not a token of the model"},
           {"[swarm]\nmodel = 'builtin:llama'\nservers = ['0:4']\n[[fault]]\nat = 'token 2'\ndo = 'join'\nblocks = '2:5'\n",
            file + ": fault[0].blocks: \"2:5\" runs past the model's 4 blocks"},
           {"[train]\nmodel = 'builtin:gpt2'\ndata = '" + (tmp / "none.bin").string() + "'\n",
            file + ": train.data: " + (tmp / "none.bin").string() + " is not a file"},
       }) {
    CAPTURE(expected);
    std::ofstream(file) << text;
    check_one_error(run_corolla({"faultlab", "run", file, "--report", (tmp / "r").string()}), expected);
  }
}

TEST_CASE("faultlab: a fault that finds no target fails the scenario, unless every_fault_hits = false allows it") {
  temp_dir_guard tmp("faultlab-missed");
  // Server 0 is never stopped, so resuming it does nothing; a heal of a
  // server never throttled or partitioned does nothing either.
  const std::string body = R"(name = "faults that miss"
[swarm]
model = "builtin:llama"
servers = ["0:2", "2:4"]
[swarm.client]
new_tokens = 6
[[fault]]
at = "token 2"
do = "resume"
target = "server 0"
[[fault]]
at = "token 3"
do = "heal"
target = "server 1"
[expect]
same_output_as_reference = true
)";
  std::ofstream(tmp / "s.toml") << body;
  const auto [strict, status] = faultlab(tmp / "s.toml", tmp / "report");
  CHECK(status == 1);
  CHECK(strict["pass"] == false);
  bool found = false;
  for (const json& c : strict["checks"])
    if (c["name"] == "every fault fired on its target") {
      found = true;
      CHECK(c["ok"] == false);
      CHECK(c["detail"].get<std::string>().find("fault[0]: resume server 0: s0 is not stopped (skipped)") !=
            std::string::npos);
      CHECK(c["detail"].get<std::string>().find("fault[1]: heal server 1: s1 is neither throttled nor partitioned") !=
            std::string::npos);
    }
  CHECK(found);
  REQUIRE(strict["faults"].size() == 2);
  CHECK(strict["faults"][0]["landed"] == false);
  // Allowed: the same run passes.
  std::ofstream(tmp / "s.toml") << body << "every_fault_hits = false\n";
  const auto [lenient, lenient_status] = faultlab(tmp / "s.toml", tmp / "report");
  CHECK(lenient_status == 0);
  CHECK(lenient["pass"] == true);
}
