// faultlab/scenario.hpp — a fault-injection scenario (`corolla faultlab
// run SCENARIO.toml`): the job to run (a swarm of servers with a client
// generating, or a training job), the faults to inject at named moments,
// and what must hold. Pure: TOML text in, a checked description out, every
// error naming the key. docs/faultlab.md has the format.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace corolla::faultlab {

/// When a fault fires.
struct moment {
  /// What `value` counts: generated tokens (swarm), training steps, or seconds.
  enum class kind { token, step, seconds } k = kind::seconds;
  double value = 0;  ///< the token or step number, or seconds after the start
};

/// "token N" | "step N" | "2.5s" (at most a week: 604800s). Throws
/// std::invalid_argument naming the text.
moment parse_moment(const std::string& text);
/// "token 10", "step 3", "2.5s": text parse_moment() reads back as `m`.
std::string to_string(const moment& m);

/// throttle: the target's sends are shaped with the fault's profile from
/// then on (a slow uplink; its links stay up); partition: every message to
/// and from the target's peers is dropped, both ways (faultlab's own node
/// keeps its control link); heal: back to the shaping it started with, and
/// no partition; corrupt: the target server returns wrong activations from
/// then on (its steps, pushes and forwards; a broken GPU or a malicious
/// volunteer), until it is restarted; hang: the target rank's stage stalls
/// inside its next forward or backward while its process, node and
/// heartbeats stay up (a kernel that never returns; stop freezes the whole
/// process instead); lose: the target rank's mailbox drops the next
/// message of the fault's `message` type (a message lost on the way, with
/// every process and link up: the coordinator's stall check finds it;
/// "any": one of the types the rank receives in the grid of that moment).
enum class action { kill, stop, resume, restart, join, throttle, heal, partition, corrupt, hang, lose };
/// "kill" ...; throws std::invalid_argument listing the known actions.
action parse_action(const std::string& text);
/// The action's name as a scenario writes it ("kill" ...).
const char* to_string(action a);

/// Whom a fault hits.
struct target {
  /// launcher: a training job's launcher process (its coordinator and
  /// scheduler), which an elastic job outlives (apps/launcher_takeover.hpp).
  enum class kind { server, rank, route_hop, random_server, random_rank, relay, launcher, none } k = kind::none;
  int index = 0;  ///< server K (in `servers` order), rank K, route hop K or relay K
};
/// "server K" | "rank K" | "route.hop K" | "random server" | "random rank" |
/// "relay K" | "launcher".
target parse_target(const std::string& text);
/// The text parse_target() reads ("" for kind none).
std::string to_string(const target& t);

/// One [[fault]]: when, what, whom, and the keys of its action.
struct fault {
  moment at;  ///< when it fires
  action what = action::kill;  ///< what it does
  target whom;  ///< whom it hits (kind none for a join)
  std::string blocks;   ///< join: the new server's blocks, "A:B"
  std::string profile;  ///< throttle: the link profile (net/shaping.hpp syntax)
  /// join (training): the worker's --join-name ("" = j1, j2, ...); joining
  /// a --cluster job, the absent worker of its file it is.
  std::string as;
  std::string message;  ///< lose: the training message type dropped ("train.act" by default, or "any")
};

/// [swarm]: servers on this machine and a client generating through them.
struct swarm_job {
  std::string model;                ///< a HuggingFace directory, or builtin:llama / builtin:gpt2
  std::vector<std::pair<int, int>> servers;  ///< each server's blocks [first, last)
  std::vector<std::int32_t> prompt_ids;  ///< the client's prompt (default 1, 2, 3)
  int new_tokens = 32;  ///< tokens the client generates
  /// The client's spot checks: the fraction of steps per hop recomputed by
  /// another server, and the checks a new server must pass first
  /// (schedule/spot_check.hpp).
  double spot_checks = 0.05;
  int spot_check_probation = 4;  ///< checks a new server must pass first
  /// The shaping of every link, servers' and client's (net/shaping.hpp
  /// syntax; "" = none): what a heal goes back to.
  std::string link;
  /// Dedicated relays (`corolla node --relay-service`), "relay 0" ... in
  /// faults, and the servers (indices into `servers`) behind NAT: started
  /// with no listening socket and every relay, in order, as their --relay
  /// list; the client reaches them through the first relay alive.
  int relays = 0;
  std::vector<int> nat;  ///< the servers behind NAT, indices into `servers`
};

/// [train]: a `corolla train` job, run as a child process.
struct train_job {
  std::string model, data;  ///< its --model and --data
  std::string args;    ///< extra `corolla train` flags, e.g. "--batch 4 --seq 32 --steps 24 --lr 0.001"
  std::string layout;  ///< "--pp 2 --dp 2" (or "--cluster FILE")
  bool elastic = true;  ///< runs with --elastic (joins and launcher kills need it)
  /// Checkpoints every this many steps (0 = none: a lost rank restarts the
  /// job from step 1), in a directory of each run's own.
  int checkpoint_every = 5;
};

/// [expect]: what the faulted run must show; what is unset is not checked.
struct expectations {
  bool same_output_as_reference = false;  ///< swarm: greedy ids equal the failure-free run's
  bool same_losses_as_reference = false;  ///< train: every step's loss within 1e-5 relative
  double max_stall_s = 0;                 ///< no token / step waits longer (0 = not checked)
  /// swarm: every corrupted server was found wrong by the client's spot
  /// checks (and nobody else was).
  bool wrong_servers_caught = false;
  /// Every fault fired on a target that existed at its moment (true by
  /// default: a kill of "rank 3" after the job shrank to three ranks, or a
  /// heal of a server killed before, did nothing, and the run tested less
  /// than the scenario says). A fault whose moment the run never reached
  /// always fails the scenario.
  bool every_fault_hits = true;
};

/// A checked scenario: exactly one of `swarm` and `train` is set.
struct scenario {
  std::string name;  ///< for reports ("unnamed scenario" by default)
  std::uint64_t seed = 1;  ///< seeds the random choices; faultlab's --seed overrides it
  std::optional<swarm_job> swarm;  ///< [swarm] (or `train`)
  std::optional<train_job> train;  ///< [train] (or `swarm`)
  std::vector<fault> faults;  ///< in the file's order
  expectations expect;  ///< [expect]
};

/// Parses and checks a scenario; `origin` (a file name) starts every error.
/// Throws std::invalid_argument naming the key and what is wrong: neither or
/// both of [swarm] and [train], a fault whose moment does not fit the job
/// (tokens for a swarm, steps for training) or lies past its end (a token
/// after the client's last, a step after `--steps` in train.args), a
/// target of the wrong kind or out of range (a server, relay or route hop
/// the swarm can never have, a rank past a `--pp P --dp D` layout's P x
/// D), a join without blocks, an unknown key.
scenario parse_scenario(const std::string& text, const std::string& origin);

/// What a swarm scenario asks of its model, once the model is known (a
/// model of `n_layers` blocks, `vocab_size` ids and a context of
/// `max_positions`): every server's and joined server's blocks inside the
/// model, every block held by a server at the start, the prompt's ids in
/// the vocabulary, the prompt and the new tokens inside the context (else
/// generation ends early and later faults are never reached). Throws
/// std::invalid_argument starting with `origin` and naming the key.
void check_against_model(const scenario& s, int n_layers, int vocab_size, int max_positions,
                         const std::string& origin);

/// "0:3" -> {0, 3}; throws std::invalid_argument for anything else.
std::pair<int, int> parse_blocks(const std::string& text);

}  // namespace corolla::faultlab
