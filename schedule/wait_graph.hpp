// schedule/wait_graph.hpp — who a stalled training job waits on. A job
// whose steps stop coming while every process and node is up is either
// slow (some rank still computes or takes messages), or stuck: a rank that
// neither computes nor waits for anything others wait on, a rank that does
// not answer at all, or a cycle of waits (a message lost or never sent:
// rank 1 waits for rank 0's activations while rank 0 waits for rank 1's
// gradient). A waiting rank is a victim; the coordinator's own error names
// only the first message it misses, which may be a victim's.
//
// The coordinator asks every rank what it is doing twice, a second or so
// apart (actors/train_watchdog.hpp answers), adds what it waits for
// itself, and diagnose_stall follows the waits from the coordinator.
// Pure: descriptions in, a verdict out.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace corolla::schedule {

/// `from` of a wait on the coordinator, and of one whose sender is unknown.
inline constexpr int from_coordinator = -2;
inline constexpr int from_unknown = -1;

/// One message a party waits for.
struct party_wait {
  std::string what;       ///< "activations of micro-batch 0 from rank 0 (stage 0, replica 0)"
  int from = from_unknown;  ///< the rank it comes from, or from_coordinator
  double seconds = 0;     ///< waited so far
};

/// One rank's answer to "what are you doing?".
struct rank_activity {
  int rank = 0;
  bool answered = false;        ///< false: no answer in time
  std::string computing;        ///< the compute call it is inside ("" = none)
  double computing_s = 0;
  std::uint64_t progress = 0;   ///< compute calls ended + messages taken so far
  std::vector<party_wait> waits;
};

struct stall_verdict {
  enum class kind {
    progressing,  ///< something the coordinator waits on still moves: keep waiting
    silent,       ///< `ranks` do not answer (their nodes are up)
    frozen,       ///< `ranks` neither compute, take messages nor wait for any
    deadlock,     ///< `ranks` (from_coordinator for the coordinator) wait on each other, in order
  };
  kind what = kind::progressing;
  std::vector<int> ranks;
  std::string reason;  ///< one line, naming every party involved
  /// Whether the job is stuck (not progressing).
  bool stuck() const { return what != kind::progressing; }
};

/// `before` and `after`: every rank's activity, sampled twice (a rank
/// whose progress counter moved between them, or that computes, is
/// moving). `coordinator`: what the coordinator waits for (`from` = the
/// rank). `label(rank)`: "rank 3 (stage 1, replica 1)".
stall_verdict diagnose_stall(const std::vector<rank_activity>& before, const std::vector<rank_activity>& after,
                             const std::vector<party_wait>& coordinator, const std::function<std::string(int)>& label);

}  // namespace corolla::schedule
