// apps/rank_hold.cpp — see rank_hold.hpp.
#include "apps/rank_hold.hpp"

#include <exception>
#include <optional>
#include <thread>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "actors/train_snapshots.hpp"
#include "apps/train_job_file.hpp"
#include "kernels/backend.hpp"

namespace corolla::app {

namespace {

/// The rank an assignment names, or why it is malformed.
caf::expected<next_rank> parse_assignment(const remote_message& m) {
  auto a = decode_assignment(m);
  if (!a) return a.error();
  next_rank next;
  try {
    next.rank = std::stoi(arg_after(a->args, "--rank"));
    next.coordinator = arg_after(a->args, "--coordinator");
    if (next.coordinator.empty()) throw std::invalid_argument("no --coordinator");
    next.job = job_from_json_text(a->job, "job description of train.next");
    if (next.job.from_memory.run != a->run) throw std::invalid_argument("the job reads another run's snapshots");
    if (next.rank < 0 || next.rank >= next.job.layout.world())
      throw std::invalid_argument("rank " + std::to_string(next.rank) + " outside a job of " +
                                  std::to_string(next.job.layout.world()) + " ranks");
  } catch (const std::exception& e) {
    return make_error(errc::bad_message, std::string("a bad assignment: ") + e.what());
  }
  return next;
}

/// "train-next": takes the first assignment naming a run whose keeper
/// this node holds, hands it to `waiter` and ends.
caf::behavior next_rank_door(caf::event_based_actor* self, node* n, caf::actor waiter) {
  return {
      [=](remote_message& m) -> caf::result<remote_message> {
        if (m.type != next_rank_type)
          return make_error(errc::invalid_argument, "'" + m.type + "' is not " + next_rank_type);
        auto a = decode_assignment(m);
        if (!a) return a.error();
        if (a->run == 0 || !n->local_actor(snapshot_keeper_name(a->run)))
          return make_error(errc::auth_refused, "this process holds no snapshots of the run named");
        auto next = parse_assignment(m);
        if (!next) return next.error();
        n->unpublish("train-next");
        self->send(waiter, std::move(m));
        self->quit();
        return remote_message{};
      },
  };
}

}  // namespace

next_rank hold_for_next_rank(node& n, Backend* compute, const std::string& label, const std::string& why) {
  // The runtime is gone (its model and buffers freed): what the allocator
  // keeps cached goes back to the device, for the next grid's ranks.
  try {
    if (compute) compute->release_cached_memory();
  } catch (const std::exception& e) {
    spdlog::warn("{}: could not release cached device memory: {}", label, e.what());
  }
  spdlog::info("{}: {}; holding its in-memory snapshots for the next grid", label, why);
  caf::scoped_actor self{n.system()};
  auto door = n.system().spawn(next_rank_door, &n, caf::actor_cast<caf::actor>(self));
  if (auto err = n.publish("train-next", door)) {
    // Nobody can hand this process a rank: it only holds.
    spdlog::warn("{}: cannot publish train-next: {}", label, error_message(err));
    caf::anon_send_exit(door, caf::exit_reason::user_shutdown);
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  for (;;) {
    std::optional<next_rank> next;
    self->receive([&](remote_message& m) {
      if (auto parsed = parse_assignment(m)) next = std::move(*parsed);  // the door took it: it parses
    });
    if (!next) continue;
    // Only the run the next grid reads stays held.
    const std::string kept = snapshot_keeper_name(next->job.from_memory.run);
    for (const std::string& name : n.published_names())
      if (is_snapshot_keeper_name(name) && name != kept) {
        caf::anon_send_exit(n.local_actor(name), caf::exit_reason::user_shutdown);
        n.unpublish(name);
      }
    spdlog::info("{} runs {} of the next grid ({}) in this process", label, next->job.layout.label(next->rank),
                 next->job.layout.describe());
    return std::move(*next);
  }
}

caf::error assign_next_rank(node& n, const std::string& node_id, const std::string& endpoint, const rank_assignment& a,
                            std::chrono::milliseconds timeout) {
  if (!n.peer_is_up(node_id)) {
    connect_options co;
    co.timeout = timeout;
    auto c = n.connect(endpoint, co);
    if (!c) return c.error();
    if (*c != node_id)
      return make_error(errc::invalid_argument, "the node at " + endpoint + " is " + *c + ", not " + node_id);
  }
  auto r = n.request(node_id, "train-next", assignment_message(next_rank_type, a), timeout);
  if (!r) return r.error();
  return {};
}

}  // namespace corolla::app
