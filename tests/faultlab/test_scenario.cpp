// faultlab/scenario: the scenario format of `corolla faultlab run`, its
// defaults, and one clear error per mistake (naming the key and its line).
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include "faultlab/scenario.hpp"

using namespace corolla::faultlab;

namespace {

std::string error_of(const std::string& text) {
  try {
    parse_scenario(text, "s.toml");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

const char* kSwarm = R"(
name = "two kills during generation"
seed = 7
[swarm]
model = "DIR"
servers = ["0:3", "3:6", "0:6"]
[swarm.client]
prompt_ids = [1, 2, 3]
new_tokens = 64
[[fault]]
at = "token 10"
do = "kill"
target = "route.hop 1"
[[fault]]
at = "2.5s"
do = "join"
blocks = "0:3"
[expect]
same_output_as_reference = true
max_stall_s = 5
)";

}  // namespace

TEST_CASE("a swarm scenario parses with its servers, client, faults and expectations") {
  const scenario s = parse_scenario(kSwarm, "s.toml");
  CHECK(s.name == "two kills during generation");
  CHECK(s.seed == 7);
  REQUIRE(s.swarm);
  CHECK_FALSE(s.train);
  CHECK(s.swarm->servers == std::vector<std::pair<int, int>>{{0, 3}, {3, 6}, {0, 6}});
  CHECK(s.swarm->prompt_ids == std::vector<std::int32_t>{1, 2, 3});
  CHECK(s.swarm->new_tokens == 64);
  REQUIRE(s.faults.size() == 2u);
  CHECK(s.faults[0].at.k == moment::kind::token);
  CHECK(s.faults[0].at.value == 10);
  CHECK(s.faults[0].what == action::kill);
  CHECK(to_string(s.faults[0].whom) == "route.hop 1");
  CHECK(s.faults[1].at.k == moment::kind::seconds);
  CHECK(s.faults[1].at.value == 2.5);
  CHECK(s.faults[1].what == action::join);
  CHECK(s.faults[1].blocks == "0:3");
  CHECK(s.expect.same_output_as_reference);
  CHECK(s.expect.max_stall_s == 5);
}

TEST_CASE("a training scenario parses, its faults default to a random rank") {
  const scenario s = parse_scenario(R"(
[train]
model = "M"
data = "D"
args = "--batch 4 --seq 32 --steps 24 --lr 0.001"
[[fault]]
at = "step 5"
do = "stop"
[expect]
same_losses_as_reference = true
)", "t.toml");
  REQUIRE(s.train);
  CHECK(s.train->layout == "--pp 2 --dp 2");
  CHECK(s.train->elastic);
  REQUIRE(s.faults.size() == 1u);
  CHECK(s.faults[0].whom.k == target::kind::random_rank);
  CHECK(s.faults[0].what == action::stop);
  CHECK(s.name == "unnamed scenario");
}

TEST_CASE("a training job's join is a worker offered to its elastic launcher: no target, no blocks") {
  const scenario s = parse_scenario("[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 3'\ndo='join'\n", "s.toml");
  REQUIRE(s.faults.size() == 1u);
  CHECK(s.faults[0].what == action::join);
  CHECK(s.faults[0].whom.k == target::kind::none);
  CHECK(s.faults[0].blocks.empty());
}

TEST_CASE("a throttle carries its link profile and a heal needs none") {
  const scenario s = parse_scenario(
      "[swarm]\nmodel='m'\nservers=['0:2', '2:4']\n[[fault]]\nat='token 3'\ndo='throttle'\ntarget='route.hop 1'\n"
      "profile='bw=5Mbit,lat=20ms'\n[[fault]]\nat='token 6'\ndo='heal'\ntarget='route.hop 1'\n",
      "s.toml");
  REQUIRE(s.faults.size() == 2u);
  CHECK(s.faults[0].what == action::throttle);
  CHECK(s.faults[0].profile == "bw=5Mbit,lat=20ms");
  CHECK(s.faults[0].whom.k == target::kind::route_hop);
  CHECK(s.faults[1].what == action::heal);
  CHECK(s.swarm->link.empty());
  CHECK(parse_scenario("[swarm]\nmodel='m'\nservers=['0:2']\nlink='wan,lat=10ms'\n", "s.toml").swarm->link == "wan,lat=10ms");
  CHECK(s.faults[1].profile.empty());
  // Training ranks too.
  const scenario t = parse_scenario(
      "[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 3'\ndo='throttle'\ntarget='rank 1'\nprofile='bw=1Mbit'\n"
      "[[fault]]\nat='step 9'\ndo='heal'\n",
      "t.toml");
  REQUIRE(t.faults.size() == 2u);
  CHECK(t.faults[0].what == action::throttle);
  CHECK(t.faults[0].whom.k == target::kind::rank);
  CHECK(t.faults[1].whom.k == target::kind::random_rank);
}

TEST_CASE("scenario mistakes are one error naming the key") {
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[train]\nmodel='m'\ndata='d'\n").find("exactly one of [swarm] and [train]") != std::string::npos);
  CHECK(error_of("").find("exactly one of") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['2:1']\n").find("swarm.servers: '2:1' is not blocks") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\nspeed=1\n").find("unknown key 'swarm.speed'") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='step 3'\ndo='kill'\n").find("a swarm counts tokens") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='token 3'\ndo='kill'\ntarget='server 4'\n").find("server 4 does not exist") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\nlayout='--pp 2'\n[[fault]]\nat='step 3'\ndo='corrupt'\ntarget='rank 1'\n")
            .find("corrupt is for swarm servers") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='token 3'\ndo='hang'\ntarget='server 0'\n")
            .find("hang is for training ranks") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[swarm.client]\nspot_checks=1.5\n").find("spot_checks") !=
        std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\nlayout='--pp 2'\n[expect]\nwrong_servers_caught=true\n")
            .find("wrong_servers_caught is for [swarm]") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='token 3'\ndo='explode'\n").find("not one of kill, stop") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='token 3'\ndo='throttle'\n").find("a throttle needs the link profile") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\nlink='fast'\n").find("swarm.link: ") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='token 3'\ndo='throttle'\nprofile='bw=fast'\n").find("profile: ") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='token 3'\ndo='kill'\nprofile='bw=1Mbit'\n").find("profile is only for do = \"throttle\"") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 3'\ndo='throttle'\ntarget='rank 1'\n").find("a throttle needs the link profile") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='soon'\ndo='kill'\n").find("'soon' is not") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='token 3'\ndo='join'\n").find("a join needs the new server's blocks") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 3'\ndo='kill'\ntarget='server 1'\n").find("\"rank K\", \"random rank\" or \"launcher\"") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\nargs='--json'\n").find("must not hold --json") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 3'\ndo='join'\nblocks='0:2'\n")
            .find("a training job's join is a whole worker") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\nelastic=false\n[[fault]]\nat='step 3'\ndo='join'\n")
            .find("a join needs an elastic job") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 3'\ndo='kill'\ntarget='rank 1'\nas='n1/0'\n")
            .find("as is only for do = \"join\" in a training job") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='token 3'\ndo='join'\nblocks='0:2'\nas='n1/0'\n")
            .find("as is only for do = \"join\" in a training job") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 3'\ndo='join'\nas='n1/0,n2/0'\n")
            .find("as: a worker name without spaces or commas") != std::string::npos);
  // A training join names the worker it joins as (a --cluster job's absent worker).
  const scenario joins = parse_scenario("[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 3'\ndo='join'\nas='n1/0'\n", "s.toml");
  REQUIRE(joins.faults.size() == 1u);
  CHECK(joins.faults[0].as == "n1/0");
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\nargs='--steps 4 --checkpoint-dir=/tmp/x'\n")
            .find("must not hold --checkpoint-dir") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\nlayout='--pp 2 --resume'\n").find("train.layout must not hold --resume") !=
        std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\n[expect]\nsame_output_as_reference=true\n").find("is for [swarm] scenarios") != std::string::npos);
  // Errors carry the line.
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n\n[[fault]]\nat='token 3'\ndo='kill'\ntarget='server 4'\n").rfind("s.toml:5:", 0) == 0);
}

TEST_CASE("a fault the job can never reach is an error: past its last token or step, or a target it never has") {
  const std::string swarm = "[swarm]\nmodel='m'\nservers=['0:2', '2:4']\n[swarm.client]\nnew_tokens=8\n";
  // The client's last token is the last moment (the default is 32).
  CHECK(error_of(swarm + "[[fault]]\nat='token 8'\ndo='kill'\n") == "(accepted)");
  CHECK(error_of(swarm + "[[fault]]\nat='token 9'\ndo='kill'\n") ==
        "s.toml:7: fault[0].at: token 9 is never reached: the client generates 8 tokens (swarm.client.new_tokens)");
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='token 33'\ndo='kill'\n")
            .find("the client generates 32 tokens") != std::string::npos);
  // A route has a hop a server at most; a joined server adds one.
  CHECK(error_of(swarm + "[[fault]]\nat='token 3'\ndo='kill'\ntarget='route.hop 1'\n") == "(accepted)");
  CHECK(error_of(swarm + "[[fault]]\nat='token 3'\ndo='kill'\ntarget='route.hop 2'\n") ==
        "s.toml:9: fault[0].target: route.hop 2 is never on a route: the swarm has 2 servers at most (hops count from 0)");
  CHECK(error_of(swarm + "[[fault]]\nat='token 1'\ndo='join'\nblocks='0:1'\n[[fault]]\nat='token 3'\ndo='kill'\n"
                         "target='route.hop 2'\n") == "(accepted)");
  // Training: the steps train.args gives, and the ranks of a --pp/--dp layout.
  const std::string train = "[train]\nmodel='m'\ndata='d'\nargs='--batch 4 --steps=12'\nlayout='--pp 2 --dp 2'\n";
  CHECK(error_of(train + "[[fault]]\nat='step 12'\ndo='kill'\ntarget='rank 3'\n") == "(accepted)");
  CHECK(error_of(train + "[[fault]]\nat='step 13'\ndo='kill'\n") ==
        "s.toml:7: fault[0].at: step 13 is never reached: the job runs 12 steps (--steps in train.args)");
  CHECK(error_of(train + "[[fault]]\nat='step 3'\ndo='kill'\ntarget='rank 4'\n") ==
        "s.toml:9: fault[0].target: rank 4 does not exist: the layout has 4 ranks (from 0)");
  // A joined worker's ranks take the faults sent to a rank's control actor
  // (their numbers only the run knows), never a kill, stop or resume.
  const std::string join = "[[fault]]\nat='step 2'\ndo='join'\n";
  CHECK(error_of(train + join + "[[fault]]\nat='step 3'\ndo='throttle'\ntarget='rank 4'\nprofile='lat=1ms'\n") ==
        "(accepted)");
  CHECK(error_of(train + join + "[[fault]]\nat='step 3'\ndo='stop'\ntarget='rank 4'\n")
            .find("rank 4 does not exist: the layout has 4 ranks") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\nargs='--steps 6'\nlayout='--pp 3'\n[[fault]]\nat='step 7'\n"
                 "do='kill'\n").find("the job runs 6 steps") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\nlayout='--pp 3'\n[[fault]]\nat='step 2'\ndo='kill'\ntarget='rank 3'\n")
            .find("the layout has 3 ranks") != std::string::npos);
  // What only the run can tell is left to it: a --cluster layout's ranks,
  // steps train.args does not give.
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\nlayout='--cluster c.toml'\n[[fault]]\nat='step 99'\ndo='kill'\n"
                 "target='rank 9'\n") == "(accepted)");
  // every_fault_hits: true unless the scenario says otherwise.
  CHECK(parse_scenario(swarm, "s.toml").expect.every_fault_hits);
  CHECK_FALSE(parse_scenario(swarm + "[expect]\nevery_fault_hits=false\n", "s.toml").expect.every_fault_hits);
}

TEST_CASE("what a swarm scenario asks of its model is checked once the model is known") {
  const auto error_with = [](const std::string& text, int layers, int vocab, int context) {
    try {
      check_against_model(parse_scenario(text, "s.toml"), layers, vocab, context, "s.toml");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::string swarm = "[swarm]\nmodel='m'\nservers=['0:2', '2:4']\n";
  CHECK(error_with(swarm, 4, 100, 64) == "(accepted)");
  CHECK(error_with(swarm, 3, 100, 64) == "s.toml: swarm.servers: \"2:4\" runs past the model's 3 blocks");
  CHECK(error_with(swarm, 5, 100, 64) ==
        "s.toml: swarm.servers: no server holds block 4 of the model's 5 (the client could not generate)");
  CHECK(error_with(swarm + "[swarm.client]\nprompt_ids=[1, 100]\n", 4, 100, 64) ==
        "s.toml: swarm.client.prompt_ids: 100 is not a token of the model (vocab_size 100)");
  // The default prompt (3 ids) and 32 new tokens need a context of 35.
  CHECK(error_with(swarm, 4, 100, 35) == "(accepted)");
  CHECK(error_with(swarm, 4, 100, 34) ==
        "s.toml: swarm.client.new_tokens: the prompt's 3 ids and 32 new tokens pass the model's context of 34");
  CHECK(error_with(swarm + "[[fault]]\nat='token 2'\ndo='join'\nblocks='1:5'\n", 4, 100, 64) ==
        "s.toml: fault[0].blocks: \"1:5\" runs past the model's 4 blocks");
  // A training scenario's model is the training job's to check.
  CHECK(error_with("[train]\nmodel='m'\ndata='d'\n", 1, 2, 3) == "(accepted)");
}

TEST_CASE("servers behind NAT and their relays: parsed, and their mistakes named") {
  const scenario s = parse_scenario(
      "[swarm]\nmodel='m'\nservers=['0:2', '2:4']\nrelays=2\nnat=[1]\n[[fault]]\nat='token 3'\ndo='kill'\n"
      "target='relay 1'\n[[fault]]\nat='token 5'\ndo='stop'\ntarget='relay 0'\n",
      "s.toml");
  CHECK(s.swarm->relays == 2);
  CHECK(s.swarm->nat == std::vector<int>{1});
  REQUIRE(s.faults.size() == 2u);
  CHECK(s.faults[0].whom.k == target::kind::relay);
  CHECK(s.faults[0].whom.index == 1);
  CHECK(to_string(s.faults[1].whom) == "relay 0");
  CHECK(parse_scenario("[swarm]\nmodel='m'\nservers=['0:2']\n", "s.toml").swarm->relays == 0);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\nnat=[0]\n").find("servers behind NAT need a relay") !=
        std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\nrelays=1\nnat=[1]\n").find("swarm.nat: servers are numbered") !=
        std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\nrelays=1\nnat='all'\n").find("swarm.nat holds the indices") !=
        std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\nrelays=-1\n").find("relays") != std::string::npos);
  const std::string base = "[swarm]\nmodel='m'\nservers=['0:2']\nrelays=1\n[[fault]]\nat='token 3'\n";
  CHECK(error_of(base + "do='kill'\ntarget='relay 1'\n").find("relay 1 does not exist (swarm.relays = 1)") !=
        std::string::npos);
  CHECK(error_of(base + "do='restart'\ntarget='relay 0'\n").find("a relay is not restarted") != std::string::npos);
  CHECK(error_of(base + "do='corrupt'\ntarget='relay 0'\n").find("a relay computes nothing") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 3'\ndo='kill'\ntarget='relay 0'\n")
            .find("\"rank K\", \"random rank\" or \"launcher\"") != std::string::npos);
}

TEST_CASE("a training job's launcher is killed (only killed, only in an elastic job, never a swarm's)") {
  const scenario s =
      parse_scenario("[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 4'\ndo='kill'\ntarget='launcher'\n", "s.toml");
  REQUIRE(s.faults.size() == 1u);
  CHECK(s.faults[0].whom.k == target::kind::launcher);
  CHECK(to_string(s.faults[0].whom) == "launcher");
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 4'\ndo='stop'\ntarget='launcher'\n")
            .find("the launcher is only killed") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\nelastic=false\n[[fault]]\nat='step 4'\ndo='kill'\ntarget='launcher'\n")
            .find("only an elastic job (elastic = true) outlives its launcher") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='token 3'\ndo='kill'\ntarget='launcher'\n")
            .find("a swarm's faults hit") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 4'\ndo='kill'\ntarget='launchers'\n")
            .find("or \"launcher\"") != std::string::npos);
}

TEST_CASE("a lose drops a training message type (train.act by default), only on training ranks") {
  const std::string train = "[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 3'\ndo='lose'\ntarget='rank 1'\n";
  const scenario s = parse_scenario(train, "s.toml");
  REQUIRE(s.faults.size() == 1u);
  CHECK(s.faults[0].what == action::lose);
  CHECK(s.faults[0].message == "train.act");
  CHECK(parse_scenario(train + "message='train.rs'\n", "s.toml").faults[0].message == "train.rs");
  CHECK(parse_scenario(train + "message='any'\n", "s.toml").faults[0].message == "any");  // whatever the rank receives
  CHECK(error_of(train + "message='train.report'\n").find("a lose drops \"train.act\"") != std::string::npos);
  CHECK(error_of("[train]\nmodel='m'\ndata='d'\n[[fault]]\nat='step 3'\ndo='kill'\nmessage='train.act'\n")
            .find("message is only for do = \"lose\"") != std::string::npos);
  CHECK(error_of("[swarm]\nmodel='m'\nservers=['0:2']\n[[fault]]\nat='token 3'\ndo='lose'\ntarget='server 0'\n")
            .find("lose is for training ranks") != std::string::npos);
}

TEST_CASE("moments, actions, targets and blocks in their text form") {
  CHECK(to_string(parse_moment("token 12")) == "token 12");
  CHECK(to_string(parse_moment("step 3")) == "step 3");
  CHECK(parse_moment("0.5s").value == 0.5);
  // Every moment reads back from its text, large and fractional ones too.
  for (const char* text : {"token 1000000", "step 123456789", "0.1s", "2.5s", "604799.125s", "0s"}) {
    CAPTURE(text);
    CHECK(to_string(parse_moment(text)) == text);
  }
  CHECK(parse_moment(to_string(moment{moment::kind::seconds, 1.0 / 3})).value == 1.0 / 3);
  CHECK_THROWS_AS(parse_moment("token -1"), std::invalid_argument);
  CHECK_THROWS_AS(parse_moment("token 1.5"), std::invalid_argument);
  // Seconds: at most a week, and a finite number.
  CHECK(parse_moment("604800s").value == 604800);
  for (const char* text : {"604800.5s", "1e300s", "infs", "nans", "-1s"}) {
    CAPTURE(text);
    CHECK_THROWS_AS(parse_moment(text), std::invalid_argument);
  }
  CHECK(std::string(to_string(parse_action("restart"))) == "restart");
  CHECK(std::string(to_string(parse_action("hang"))) == "hang");
  CHECK(std::string(to_string(parse_action("lose"))) == "lose");
  CHECK(to_string(parse_target("random rank")) == "random rank");
  CHECK(parse_target("server 2").index == 2);
  CHECK(to_string(parse_target("relay 3")) == "relay 3");
  CHECK_THROWS_AS(parse_target("server x"), std::invalid_argument);
  CHECK(parse_blocks("3:6") == std::pair{3, 6});
  CHECK_THROWS_AS(parse_blocks("3"), std::invalid_argument);
}
