// schedule/spot_check.hpp — the decisions of the swarm client's spot checks
// against wrong servers (a bug, a bad GPU, a malicious volunteer): which
// steps of a hop get checked, how far two servers' outputs of the same rows
// may differ, and who is wrong when they disagree. Pure: the client
// (actors/swarm_spot_check.cpp) asks other servers for their opinion and
// feeds the comparisons in here.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace corolla::swarm {

/// How often a client checks the servers it routes through.
struct spot_check_policy {
  /// Fraction of steps of each hop checked at random (0 = only probation).
  double fraction = 0.05;
  /// Every step of a server is checked until this many of its checks agreed
  /// (a server new to the client, or one that failed since): a wrong server
  /// met in its first steps is caught before it gets a chance to matter.
  int probation_steps = 4;
  /// Largest relative difference of two answers that still agree (0 = the
  /// default of the servers' weight format, spot_check_tolerance()).
  double tolerance = 0;
  /// Most opinions asked about one step besides the checked server's own: a
  /// first checker, and more only while no majority is found.
  int max_checkers = 3;
};

/// Whether a step of a server whose checks agreed `agreed` times (since it
/// was new or last failed) is checked, given a uniform draw in [0, 1).
bool should_check(const spot_check_policy& p, int agreed, double draw);

/// The relative difference two honest servers stay under for the same rows,
/// with linear weights of format `weights` ("f32", "bf16", "i8", "nf4") read
/// the same way on both, and int8-compressed hidden states when
/// `compressed`: what separates different summation orders, a session's
/// bf16 or f16 KV cache against an f32 recomputation and wire rounding from
/// a wrong answer. Relative to each row's norm (relative_difference()).
double spot_check_tolerance(const std::string& weights, bool compressed);

/// max over rows r of ||a_r - b_r|| / max(||a_r||, ||b_r||) for row-major
/// [rows, width] values (symmetric; two zero rows differ by 0); infinite
/// when either holds a NaN or an infinity.
double relative_difference(const float* a, const float* b, std::size_t rows, std::size_t width);

/// Who is wrong, from the pairwise agreement of n opinions about the same
/// rows (agree[i][j], symmetric; opinion 0 is the checked server's).
struct spot_verdict {
  /// A strict majority of the opinions agrees with one of them.
  bool decided = false;
  /// The opinions outside that majority (empty when all agree).
  std::vector<std::size_t> wrong;
};

/// The opinion with the most agreeing opinions (itself included) decides
/// when more than half agree with it; else nothing is decided (two servers
/// that disagree, with no third to ask).
spot_verdict judge(const std::vector<std::vector<bool>>& agree);

}  // namespace corolla::swarm
