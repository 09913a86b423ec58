// schedule/process_match.hpp — which held process runs which rank of the
// next grid, so that as little state as possible crosses a link.
//
// After a failure or a drain the processes of the grid before hold their
// snapshots (apps/rank_hold.hpp), and the next grid's local ranks run in
// them. A rank reads the parameters of its buckets from a copy in its own
// process where one is there, and over a link otherwise: a rank run in the
// process that holds most of the buckets it needs moves the least. Pure:
// bucket names in, a match out.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace corolla::schedule {

/// For each new rank, the index of the process (into `holds`) it runs in,
/// or -1 for a new process. `needs[r]`: the buckets (names) new rank r
/// reads the parameters of; `holds[p]`: the buckets process p holds
/// parameters of. Greedy: the pair sharing the most buckets first (ties:
/// the lower rank, then the lower process), until ranks or processes run
/// out; pairs that share nothing are matched too (a process that runs a
/// rank saves starting one).
std::vector<int> match_processes(const std::vector<std::set<std::string>>& needs,
                                 const std::vector<std::set<std::string>>& holds);

/// How many of `needs` are in `holds`.
int shared_buckets(const std::set<std::string>& needs, const std::set<std::string>& holds);

}  // namespace corolla::schedule
