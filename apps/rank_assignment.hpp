// apps/rank_assignment.hpp — what a launcher gives a process to run as a
// rank: the command line of that rank and the job description
// (wire::TrainAssign). A joined worker gets it as "train.assign" and runs
// it as a child process (apps/train_lobby.hpp); a rank process holding its
// snapshots between grids gets it as "train.next" and runs the rank in
// itself (apps/rank_hold.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "actors/messages.hpp"

namespace corolla::app {

struct rank_assignment {
  std::vector<std::string> args;  ///< `corolla` arguments of the rank ("train", ..., "--rank", R, ...)
  std::string job;                ///< the job description (apps/train_job_file.hpp), JSON
  std::uint64_t run = 0;          ///< train.next: the run whose snapshots the holder keeps
};

/// `a` as a message of `type` (wire::TrainAssign).
remote_message assignment_message(const std::string& type, const rank_assignment& a);
/// An assignment back; bad_message for a malformed one (no arguments, too
/// many, or texts past their limits).
caf::expected<rank_assignment> decode_assignment(const remote_message& m);
/// The value that follows `flag` in `args` ("" when absent or last).
std::string arg_after(const std::vector<std::string>& args, const std::string& flag);

}  // namespace corolla::app
