// schedule/process_match.hpp — which held process runs which rank of the
// next grid, so that as little state as possible crosses a link.
//
// After a failure or a drain the processes of the grid before hold their
// snapshots (apps/rank_hold.hpp), and the next grid's local ranks run in
// them. A rank reads the parameters of its buckets from a copy in its own
// process where one is there, and over a link otherwise: a rank run in the
// process that holds most of the bytes it needs moves the least. Pure:
// bucket names and sizes in, a match out.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace corolla::schedule {

/// Bytes of each bucket's parameters, by name (a bucket not named counts
/// 1 byte: without sizes, the match counts buckets).
using bucket_bytes = std::map<std::string, double>;

/// For each new rank, the index of the process (into `holds`) it runs in,
/// or -1 for a new process. `needs[r]`: the buckets (names) new rank r
/// reads the parameters of; `holds[p]`: the buckets process p holds
/// parameters of; `bytes`: their sizes. Greedy: the pair sharing the most
/// bytes first (what would otherwise cross a link; ties: the lower rank,
/// then the lower process), until ranks or processes run out; pairs that
/// share nothing are matched too (a process that runs a rank saves
/// starting one).
std::vector<int> match_processes(const std::vector<std::set<std::string>>& needs,
                                 const std::vector<std::set<std::string>>& holds, const bucket_bytes& bytes = {});

/// The bytes of `needs` that are in `holds`.
double shared_bytes(const std::set<std::string>& needs, const std::set<std::string>& holds,
                    const bucket_bytes& bytes = {});

}  // namespace corolla::schedule
