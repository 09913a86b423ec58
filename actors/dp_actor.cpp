// The DP-group actor of a training rank (actors/dp_group.hpp): requests
// taken in order; a request's ring collectives run hop by hop as their
// chunks arrive (inbox_waiter), so the actor never blocks on another rank.
// Reductions and updates of buckets reduced by host rings run side by
// side, up to --rings-at-once of them (one lane and one waiter each);
// anything else runs alone, once the requests before it are done.
#include <algorithm>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/dp_group.hpp"
#include "actors/errors.hpp"
#include "actors/inbox_waiter.hpp"
#include "actors/node.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"

namespace corolla {

namespace {

/// The actor's state: the queue of requests and the lanes running them.
class dp_runner {
 public:
  dp_runner(caf::event_based_actor* self, std::shared_ptr<dp_group> g, std::shared_ptr<stage_beacon> busy)
      : g_(std::move(g)), busy_(std::move(busy)) {
    const int lanes = std::clamp(g_->options().rings_at_once, 1, max_rings_at_once);
    for (int i = 0; i < lanes; ++i) {
      lanes_.emplace_back();
      lanes_.back().waiter =
          std::make_unique<inbox_waiter>(g_->inbox(), g_->comm().timeout(), static_cast<std::uint16_t>(i));
      lanes_.back().waiter->bind(self);
    }
  }

  /// A request: `start` runs it as far as it can without waiting; `finish`
  /// gets its error ("" = done) and, for a job on a ring, how many such
  /// jobs ran side by side when it started (itself included; else 0). A failure is prefixed with `failing` and,
  /// with `fails_rank`, fails the rank's inbox at once (the stage's next
  /// wait ends, and the coordinator hears this reason), not one bucket per
  /// timeout. `work` names its compute for the busy beacon ("" = none).
  /// `side_by_side`: it may run beside others of its kind (a bucket's
  /// reduction or update over host rings). `on_a_ring`: its bucket's ring
  /// has other members (what the side-by-side count counts).
  struct job {
    std::function<dp_step()> start;
    std::function<void(std::string, int)> finish;
    std::string failing;
    bool fails_rank = false;
    const char* work = "";
    bool side_by_side = false;
    bool on_a_ring = false;
  };

  void submit(job j) {
    queue_.push_back(std::move(j));
    next();
  }

  /// Runs `f` (a handler's work for lane `lane`'s job); what it throws ends that job.
  template <class F>
  void guard(std::size_t lane, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      fail(lane, e.what());
    } catch (...) {
      fail(lane, "unknown error");
    }
  }

  /// A waiter's message (a delivery, a failure, a deadline) to the lane
  /// whose waiter made `token_or_timer`: `f(waiter)` runs in that lane's
  /// guard. A lane this actor does not have never made it: logged.
  template <class F>
  void to_lane(std::uint64_t token_or_timer, F&& f) {
    const std::size_t i = inbox_waiter::lane_of(token_or_timer);
    if (i >= lanes_.size()) {
      spdlog::error("{}: a message of DP-group lane {} it does not have (internal error)", g_->label(), i);
      return;
    }
    guard(i, [&] { f(*lanes_[i].waiter); });
  }

 private:
  /// One request being run: the job, what it has left, its waits.
  struct lane {
    std::optional<job> current;
    int side_by_side = 0;  ///< jobs on a ring running when it started, itself included (0: not on a ring)
    dp_step step;
    std::unique_ptr<inbox_waiter> waiter;
  };

  /// Starts queued jobs while they may run: into a free lane, beside the
  /// running ones only when it and they all run side by side.
  void next() {
    while (!queue_.empty()) {
      std::size_t running = 0;
      bool all_side_by_side = true;
      std::optional<std::size_t> free;
      for (std::size_t i = 0; i < lanes_.size(); ++i) {
        if (lanes_[i].current) {
          ++running;
          all_side_by_side = all_side_by_side && lanes_[i].current->side_by_side;
        } else if (!free) {
          free = i;
        }
      }
      if (!free) return;
      if (running > 0 && !(all_side_by_side && queue_.front().side_by_side)) return;
      lane& l = lanes_[*free];
      l.current = std::move(queue_.front());
      queue_.pop_front();
      const std::size_t i = *free;
      l.side_by_side = 0;
      if (l.current->on_a_ring) {
        l.side_by_side = 1;
        for (const lane& other : lanes_)
          if (&other != &l && other.current && other.current->on_a_ring) ++l.side_by_side;
      }
      guard(i, [&] {
        lanes_[i].step = marked(i, [&] { return lanes_[i].current->start(); });
        drive(i);
      });
    }
  }

  /// `f` with lane `i`'s job's compute marked on the beacon.
  dp_step marked(std::size_t i, const std::function<dp_step()>& f) {
    if (!*lanes_[i].current->work) return f();
    beacon_mark w(*busy_, lanes_[i].current->work);
    return f();
  }

  /// Runs lane `i`'s job until it waits for a chunk or is done.
  void drive(std::size_t i) {
    lane& l = lanes_[i];
    for (;;) {
      if (!l.step.pass) return done(i, {});
      ring_pass& pass = *l.step.pass;
      if (pass.done()) {
        std::function<dp_step()> then = std::move(l.step.then);
        l.step = then ? marked(i, then) : dp_step{};
        continue;
      }
      const ring& r = pass.members();
      train_comm& comm = g_->comm();
      comm.send_chunk(r.next(), pass.phase(), l.step.step, l.step.bucket, pass.hop(), pass.outgoing());
      std::string what = train_comm::chunk_what(pass.phase(), l.step.bucket, pass.hop(), r.prev());
      const std::string key = comm.chunk_key(pass.phase(), l.step.step, l.step.bucket, pass.hop());
      auto m = l.waiter->await(key, what, r.prev(), [this, i, what](remote_message m) {
        guard(i, [&] {
          apply(i, m, what);
          drive(i);
        });
      });
      if (!m) return;  // its delivery goes on
      apply(i, *m, what);
    }
  }

  void apply(std::size_t i, const remote_message& m, const std::string& what) {
    ring_pass& pass = *lanes_[i].step.pass;
    pass.apply(train_comm::tensor_of(m, pass.incoming_numel(), what));
  }

  void done(std::size_t i, std::string error) {
    job j = std::move(*lanes_[i].current);
    lanes_[i].current.reset();
    lanes_[i].step = {};
    try {
      j.finish(std::move(error), lanes_[i].side_by_side);
    } catch (...) {  // an answer that cannot be sent must not stall the queue
    }
    next();
  }

  void fail(std::size_t i, const std::string& what) {
    if (!lanes_[i].current) return;
    lanes_[i].waiter->cancel();
    // A lane ending with the failure of another (the inbox's reason) has
    // the prefix already.
    const std::string& failing = lanes_[i].current->failing;
    std::string why = what.rfind(failing, 0) == 0 ? what : failing + what;
    if (lanes_[i].current->fails_rank) g_->inbox()->fail(why);
    done(i, std::move(why));
  }

  std::shared_ptr<dp_group> g_;
  std::shared_ptr<stage_beacon> busy_;
  std::vector<lane> lanes_;
  std::deque<job> queue_;
};

}  // namespace

caf::actor spawn_dp_group(node& n, std::shared_ptr<dp_group> g, std::shared_ptr<stage_beacon> busy) {
  using namespace dp_msg;
  return n.system().spawn<caf::detached>([g, busy](caf::event_based_actor* self) -> caf::behavior {
    auto run = std::make_shared<dp_runner>(self, g, busy);
    const std::string label = g->label();
    // A request answered with an error string, whose work waits for
    // nothing: its error ends the job with that answer.
    auto answer_with = [self, run](const char* work, std::function<std::string()> f) {
      auto rp = self->make_response_promise();
      run->submit({[f] {
                     if (std::string e = f(); !e.empty()) throw train_error(e);
                     return dp_step{};
                   },
                   [rp](std::string e, int) mutable { rp.deliver(std::move(e)); }, "", false, work, false, false});
    };
    return {
        [self, g, run, label](reduce_atom, int slot, std::int64_t step, std::int64_t adam_step,
                              std::shared_ptr<queue_marker>& ready) {
          auto to = caf::actor_cast<caf::actor>(self->current_sender());
          run->submit({[g, slot, step, adam_step, ready] { return g->reduce(slot, step, adam_step, ready); },
                       [self, to, slot](std::string e, int side_by_side) {
                         self->send(to, reduced_atom::value, slot, std::move(e), side_by_side);
                       },
                       label + " failed reducing gradients: ", true, "", g->rings_on_host(slot),
                       g->rings_on_host(slot) && g->has_ring(slot)});
        },
        [self, g, run](norm_atom, std::int64_t step) {
          auto rp = self->make_response_promise();
          auto sum = std::make_shared<caf::expected<double>>(0.0);
          run->submit({[g, sum, step] {
                         *sum = g->reduced_sum_squares(step);
                         return dp_step{};
                       },
                       [rp, sum](std::string e, int) mutable {
                         if (!e.empty())
                           rp.deliver(make_error(errc::remote_error, e));
                         else if (*sum)
                           rp.deliver(**sum);
                         else
                           rp.deliver(std::move(sum->error()));
                       },
                       "", false, "gradient norm", false, false});
        },
        [self, g, run, label](update_atom, std::int64_t step, std::int64_t adam_step, double coef) {
          // One job per bucket, in bucket order on every member (so the
          // lane cap cannot deadlock a group, as for reductions); the
          // answer, once the last is done: the first error or "", and the
          // most jobs on rings that ran at once (as a reduction's).
          struct updates {
            caf::response_promise rp;
            int left = 0;
            std::string error;
            int side_by_side = 0;
          };
          auto all = std::make_shared<updates>(updates{self->make_response_promise(), g->size(), {}, 0});
          if (all->left == 0) {
            all->rp.deliver(std::string(), 0);
            return;
          }
          for (int slot = 0; slot < g->size(); ++slot)
            run->submit({[g, all, slot, step, adam_step, coef] {
                           // After a bucket failed, the rest do not start (the answer is that failure).
                           if (!all->error.empty()) throw train_error(all->error);
                           return g->update(slot, step, adam_step, coef);
                         },
                         [all](std::string e, int side_by_side) {
                           if (all->error.empty()) all->error = std::move(e);
                           all->side_by_side = std::max(all->side_by_side, side_by_side);
                           if (--all->left == 0) all->rp.deliver(std::move(all->error), all->side_by_side);
                         },
                         label + " failed updating its shards: ", true, "optimizer update", g->rings_on_host(slot),
                         g->rings_on_host(slot) && g->has_ring(slot)});
        },
        [g, answer_with](save_atom, int step) {
          answer_with("checkpoint save", [g, step] { return g->save_checkpoint(step); });
        },
        [g, answer_with](publish_atom, int steps, int id, int ask, std::int64_t lo, std::int64_t hi) {
          answer_with("parameter publish", [g, steps, id, ask, lo, hi] { return g->publish_params(steps, id, ask, lo, hi); });
        },
        [g, answer_with](snapshot_atom, int step, std::string& loss_scale) {
          answer_with("snapshot", [g, step, loss_scale] { return g->snapshot(step, loss_scale); });
        },
        // Each lane's waiter's messages, to that lane.
        [run](inbox_delivery_atom, std::uint64_t token, remote_message& m) {
          run->to_lane(token, [&](inbox_waiter& w) { w.on_delivery(token, std::move(m)); });
        },
        [run](inbox_failure_atom, std::uint64_t token, std::string& reason) {
          run->to_lane(token, [&](inbox_waiter& w) { w.on_failure(token, reason); });
        },
        [run](inbox_deadline_atom, std::uint64_t timer) {
          run->to_lane(timer, [&](inbox_waiter& w) { w.on_deadline(timer); });
        },
    };
  });
}

}  // namespace corolla
