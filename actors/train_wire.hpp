// actors/train_wire.hpp — the bodies of pipeline x data-parallel training
// messages (net/wire.capnp: TrainJoin, TrainRoster, TrainPacket,
// TrainReport, TrainStep, TrainAbort) as plain structs, and their Cap'n
// Proto encoding. Decoding validates: a malformed body is a bad_message
// error, never an exception.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "schedule/cluster.hpp"
#include "schedule/wait_graph.hpp"

namespace corolla {

/// Message types of training (all one-way sends).
namespace train_msg {
inline constexpr const char* join = "train.join";      ///< rank -> coordinator
inline constexpr const char* roster = "train.roster";  ///< coordinator -> ranks
inline constexpr const char* act = "train.act";        ///< stage s -> s+1, activations
inline constexpr const char* grad = "train.grad";      ///< stage s -> s-1, their gradient
inline constexpr const char* rs = "train.rs";          ///< ring reduce-scatter chunk
inline constexpr const char* ag = "train.ag";          ///< ring all-gather chunk
inline constexpr const char* group = "train.group";    ///< a device group's id, along its ring
inline constexpr const char* params = "train.params";  ///< a bucket's parameters for the final save
inline constexpr const char* params_ask = "train.paramsask";  ///< coordinator -> a rank: send one bucket's parameters (--save)
inline constexpr const char* report = "train.report";  ///< rank -> coordinator, per step
inline constexpr const char* norm = "train.norm";      ///< coordinator -> ranks, per step
inline constexpr const char* saved = "train.saved";    ///< rank -> coordinator, checkpoint shard written
inline constexpr const char* done = "train.done";      ///< rank -> coordinator, last step finished
inline constexpr const char* finish = "train.finish";  ///< coordinator -> ranks, everyone is done
inline constexpr const char* drain = "train.drain";    ///< coordinator -> ranks at probe steps: go on, or stop (re-plan)
inline constexpr const char* kept = "train.kept";      ///< a buddy's keeper -> coordinator: it holds rank R's snapshot of step N
inline constexpr const char* abort = "train.abort";    ///< coordinator -> ranks (the job failed), or a failing rank -> coordinator (why)
inline constexpr const char* waits_query = "train.waits?";  ///< coordinator -> a rank's train-watch (request): what are you doing?
inline constexpr const char* waits = "train.waits";    ///< its answer (wire::TrainWaits)
}  // namespace train_msg

/// wire::TrainJoin.
struct train_join {
  int rank = 0, world = 0;
  std::string endpoint, job_key;
};

/// One entry of wire::TrainRoster.
struct train_peer {
  int rank = 0;
  std::string node_id, endpoint;
};

/// wire::TrainPacket.
struct train_packet {
  std::int64_t step = 0;
  int index = 0, hop = 0, from = 0;
  std::uint64_t job = 0;  ///< the run's id (train_comm stamps it)
  /// train.paramsask: the bucket's flat values [lo, hi) wanted.
  std::int64_t lo = 0, hi = 0;
};

/// wire::TrainReport.
struct train_report {
  int rank = 0;
  std::int64_t step = 0;
  double loss = 0, sum_squares = 0;
  std::uint64_t job = 0;
  /// Probe steps only: from = `rank`, to = the neighbour (wire::TrainReport.LinkRate).
  std::vector<schedule::link_measurement> links{};
  double compute_s = 0;  ///< seconds in the stage's forward and backward this step (0 = not measured)
  /// The most of this step's bucket reductions over host rings of two or
  /// more ranks the rank's DP group ran at once (--rings-at-once; 0: none).
  int rings_side_by_side = 0;
  /// The same of the step before's update jobs (clipping or loss scaling:
  /// one per bucket, after the coordinator's norm; a step's report leaves
  /// before its update) (0: none).
  int updates_side_by_side = 0;
};

/// wire::TrainStep (norm, saved, done, finish, drain).
struct train_step_note {
  std::int64_t step = 0;
  int rank = 0;
  double value = 0;
  std::uint64_t job = 0;
  /// train.drain: the in-memory snapshot interval from the next step on
  /// (--snapshot-every auto); 0 = unchanged.
  int snapshot_every = 0;
};

/// wire::TrainRoster.
struct train_roster {
  std::uint64_t job = 0;  ///< a random id the coordinator draws for this run
  std::vector<train_peer> peers;
};

std::vector<std::uint8_t> encode_body(const train_join& v);
std::vector<std::uint8_t> encode_body(const train_roster& roster);
std::vector<std::uint8_t> encode_body(const train_packet& v);
std::vector<std::uint8_t> encode_body(const train_report& v);
std::vector<std::uint8_t> encode_body(const train_step_note& v);
/// wire::TrainAbort with `reason`, for run `job` (0 = before a roster).
std::vector<std::uint8_t> encode_abort_body(const std::string& reason, std::uint64_t job = 0);
/// wire::TrainAbort.
struct train_abort {
  std::string reason;
  std::uint64_t job = 0;
};

caf::expected<train_join> decode_train_join(const std::vector<std::uint8_t>& body);
caf::expected<train_roster> decode_train_roster(const std::vector<std::uint8_t>& body);
caf::expected<train_packet> decode_train_packet(const std::vector<std::uint8_t>& body);
caf::expected<train_report> decode_train_report(const std::vector<std::uint8_t>& body);
caf::expected<train_step_note> decode_train_step(const std::vector<std::uint8_t>& body);
caf::expected<train_abort> decode_train_abort(const std::vector<std::uint8_t>& body);

/// wire::TrainWaits: a rank's answer to train.waits? (`answered` is not
/// sent: a decoded answer is one).
std::vector<std::uint8_t> encode_body(const schedule::rank_activity& v);
caf::expected<schedule::rank_activity> decode_rank_activity(const std::vector<std::uint8_t>& body);

}  // namespace corolla
