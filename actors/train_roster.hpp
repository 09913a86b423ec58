// actors/train_roster.hpp — a rank joining a training job: its rings (the
// stage's data-parallel ring and the head's), the ranks it exchanges
// messages with, the join / roster exchange with the coordinator, the links
// to its neighbours, and its device groups. The coordinator's side of the
// roster is in train_job.cpp.
#pragma once

#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "net/collectives.hpp"

namespace corolla {

/// The rings of one rank.
struct rank_rings {
  /// The replicas of the rank's stage (stage-major ranks: s * dp + r).
  ring dp;
  /// On the first and last stage: every holder of the head (the first
  /// stage's replicas, then the last stage's). Empty elsewhere.
  ring head;
};

/// Rank `rank`'s rings in layout `l`.
rank_rings rings_of(const train_layout& l, int rank);
/// The ranks rank `rank` exchanges messages with: its pipeline neighbours
/// of the same replica and its neighbours in both rings.
std::set<int> neighbours_of(const train_layout& l, int rank, const rank_rings& rings);

/// Joins the job for rank `rank`: sends its join to the coordinator (the
/// node `joining` talks to, already connected; `joining` is the rank's
/// provisional comm, which knows no peers yet) until the roster comes, checks it,
/// names every rank in `inbox`, links to every neighbour (the lower rank of
/// each pair connects with the job's link profile, the other waits), and
/// returns the rank's comm, stamped with the run's id. Throws train_error.
std::unique_ptr<train_comm> join_train_job(node& n, const dist_train_options& o, const model_config& cfg, int rank,
                                           const std::shared_ptr<train_inbox>& inbox, train_comm& joining,
                                           const rank_rings& rings);

/// Joins the device group of ring `r` (tag 0: data-parallel, 1: the head):
/// the ring's first member makes the group's id, which travels along the
/// ring, then every member joins on `be`. Null for a ring of one. A peer
/// that dies (its link fails the inbox) stops the join and every later wait
/// on the group.
std::unique_ptr<device_group> join_device_group(Backend& be, train_comm& comm,
                                                const std::shared_ptr<train_inbox>& inbox,
                                                const dist_train_options& o, const ring& r, int tag);

}  // namespace corolla
