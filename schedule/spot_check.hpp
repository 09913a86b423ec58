// schedule/spot_check.hpp — the decisions of the swarm client's spot checks
// against wrong servers (a bug, a bad GPU, a malicious volunteer): which
// steps of a hop get checked, how far two servers' outputs of the same rows
// may differ, and who is wrong when they disagree. Pure: the client
// (actors/swarm_spot_check.cpp) asks other servers for their opinion and
// feeds the comparisons in here.
#pragma once

#include <cstddef>
#include <span>
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

/// The relative router logit gap under which two honest servers may route
/// a row of a mixture-of-experts model to different experts, for answers
/// compared with tolerance `tol`: their hidden states differ by less than
/// `tol` relative to the row, and so do the router logits computed from
/// them, relative to the logits' spread. A quarter of the tolerance: honest
/// differences stay well below it (spot_check_tolerance leaves about ten
/// times their size).
double routing_tie(double tol);

/// How two answers for the same rows compare, row by row.
struct row_comparison {
  bool agree = true;         ///< every row within the tolerance, or excused
  double worst = 0;          ///< the largest relative difference of a row not excused
  std::size_t excused = 0;   ///< rows over the tolerance excused as routing near-ties
};

/// Compares two answers [rows, width] row by row (relative_difference's
/// measure of each row) against `tol`. A mixture of experts routes each row
/// by a top-k choice that two honest servers can make differently when a
/// row's k-th and (k+1)-th router logits nearly tie; the answers of such a
/// row may differ by far more than `tol`. `margins` (one per row, or empty
/// when nobody reported them) are the smallest such gap of each row over
/// the span's blocks, relative to that block's logit spread, as a server
/// that recomputed the rows reported it (the lower of two reports); a row
/// over the tolerance whose margin is below `tie` is excused rather than
/// counted. A NaN or an infinity is never excused. Margins are only taken
/// from the checkers, never from the server under check: a wrong server
/// cannot excuse itself.
///
/// A row attends to the rows of its sequence before it, so a row routed
/// the other way moves every later row of its sequence too: once a row is
/// excused, later rows of its sequence (`seq` rows each; 0 = all rows are
/// one sequence) over the tolerance are excused as well. `flipped`: the
/// first sequence already holds such a row before these rows
/// (compare_earlier_rows), so its rows over the tolerance are excused from
/// the start.
row_comparison compare_rows(const float* a, const float* b, std::size_t rows, std::size_t width, double tol,
                            std::span<const float> margins = {}, double tie = 0, std::size_t seq = 0,
                            bool flipped = false);

/// How two versions of a sequence's earlier rows compare (compare_rows
/// with the checker's margins): the same; routed apart (they differ only
/// from a row excused as a near tie on: later rows may differ too); or
/// different where no near tie explains it (one of them was wrong then).
/// `b` null (the other version is not known): routed apart when any
/// margin is below `tie`, else the same. `a`, `b`: [rows, width].
enum class earlier_rows { same, routed_apart, differ };
earlier_rows compare_earlier_rows(const float* a, const float* b, std::size_t rows, std::size_t width, double tol,
                                  std::span<const float> margins, double tie);

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
