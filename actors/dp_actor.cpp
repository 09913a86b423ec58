// The DP-group actor of a training rank (actors/dp_group.hpp): requests
// taken one at a time, in order; a request's ring collectives run hop by
// hop as their chunks arrive (inbox_waiter), so the actor never blocks on
// another rank.
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

#include <caf/all.hpp>

#include "actors/dp_group.hpp"
#include "actors/errors.hpp"
#include "actors/inbox_waiter.hpp"
#include "actors/node.hpp"
#include "actors/train_comm.hpp"

namespace corolla {

namespace {

/// The actor's state: the queue of requests and the one being run.
class dp_runner {
 public:
  dp_runner(caf::event_based_actor* self, std::shared_ptr<dp_group> g, std::shared_ptr<stage_beacon> busy)
      : g_(std::move(g)), busy_(std::move(busy)), waiter_(g_->inbox(), g_->comm().timeout()) {
    waiter_.bind(self);
  }

  /// A request: `start` runs it as far as it can without waiting; `finish`
  /// gets its error ("" = done). A failure is prefixed with `failing` and,
  /// with `fails_rank`, fails the rank's inbox at once (the stage's next
  /// wait ends, and the coordinator hears this reason), not one bucket per
  /// timeout. `work` names its compute for the busy beacon ("" = none).
  struct job {
    std::function<dp_step()> start;
    std::function<void(std::string)> finish;
    std::string failing;
    bool fails_rank = false;
    const char* work = "";
  };

  void submit(job j) {
    queue_.push_back(std::move(j));
    next();
  }

  /// Runs `f` (a handler's work for the current job); what it throws ends the job.
  template <class F>
  void guard(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      fail(e.what());
    } catch (...) {
      fail("unknown error");
    }
  }

  inbox_waiter& waiter() { return waiter_; }

 private:
  void next() {
    if (current_ || queue_.empty()) return;
    current_ = std::move(queue_.front());
    queue_.pop_front();
    guard([&] {
      step_ = marked([&] { return current_->start(); });
      drive();
    });
  }

  /// `f` with the job's compute marked on the beacon.
  dp_step marked(const std::function<dp_step()>& f) {
    if (!*current_->work) return f();
    beacon_mark w(*busy_, current_->work);
    return f();
  }

  /// Runs the current job's step until it waits for a chunk or is done.
  void drive() {
    for (;;) {
      if (!step_.pass) return done({});
      ring_pass& pass = *step_.pass;
      if (pass.done()) {
        std::function<dp_step()> then = std::move(step_.then);
        step_ = then ? marked(then) : dp_step{};
        continue;
      }
      const ring& r = pass.members();
      train_comm& comm = g_->comm();
      comm.send_chunk(r.next(), pass.phase(), step_.step, step_.bucket, pass.hop(), pass.outgoing());
      std::string what = train_comm::chunk_what(pass.phase(), step_.bucket, pass.hop(), r.prev());
      const std::string key = comm.chunk_key(pass.phase(), step_.step, step_.bucket, pass.hop());
      auto m = waiter_.await(key, what, r.prev(), [this, what](remote_message m) {
        guard([&] {
          apply(m, what);
          drive();
        });
      });
      if (!m) return;  // its delivery goes on
      apply(*m, what);
    }
  }

  void apply(const remote_message& m, const std::string& what) {
    step_.pass->apply(train_comm::tensor_of(m, step_.pass->incoming_numel(), what));
  }

  void done(std::string error) {
    job j = std::move(*current_);
    current_.reset();
    step_ = {};
    try {
      j.finish(std::move(error));
    } catch (...) {  // an answer that cannot be sent must not stall the queue
    }
    next();
  }

  void fail(const std::string& what) {
    if (!current_) return;
    std::string why = current_->failing + what;
    if (current_->fails_rank) g_->inbox()->fail(why);
    done(std::move(why));
  }

  std::shared_ptr<dp_group> g_;
  std::shared_ptr<stage_beacon> busy_;
  inbox_waiter waiter_;
  std::deque<job> queue_;
  std::optional<job> current_;
  dp_step step_;
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
                   [rp](std::string e) mutable { rp.deliver(std::move(e)); }, "", false, work});
    };
    return {
        [self, g, run, label](reduce_atom, int slot, std::int64_t step, std::int64_t adam_step,
                              std::shared_ptr<queue_marker>& ready) {
          auto to = caf::actor_cast<caf::actor>(self->current_sender());
          run->submit({[g, slot, step, adam_step, ready] { return g->reduce(slot, step, adam_step, ready); },
                       [self, to, slot](std::string e) { self->send(to, reduced_atom::value, slot, std::move(e)); },
                       label + " failed reducing gradients: ", true, ""});
        },
        [self, g, run](norm_atom, std::int64_t step) {
          auto rp = self->make_response_promise();
          auto sum = std::make_shared<caf::expected<double>>(0.0);
          run->submit({[g, sum, step] {
                         *sum = g->reduced_sum_squares(step);
                         return dp_step{};
                       },
                       [rp, sum](std::string e) mutable {
                         if (!e.empty())
                           rp.deliver(make_error(errc::remote_error, e));
                         else if (*sum)
                           rp.deliver(**sum);
                         else
                           rp.deliver(std::move(sum->error()));
                       },
                       "", false, "gradient norm"});
        },
        [self, g, run, label](update_atom, std::int64_t step, std::int64_t adam_step, double coef) {
          auto rp = self->make_response_promise();
          run->submit({[g, step, adam_step, coef] { return g->update(step, adam_step, coef); },
                       [rp](std::string e) mutable { rp.deliver(std::move(e)); },
                       label + " failed updating its shards: ", true, "optimizer update"});
        },
        [g, answer_with](save_atom, int step) {
          answer_with("checkpoint save", [g, step] { return g->save_checkpoint(step); });
        },
        [g, answer_with](publish_atom, int steps) {
          answer_with("parameter publish", [g, steps] { return g->publish_params(steps); });
        },
        [g, answer_with](snapshot_atom, int step, std::string& loss_scale) {
          answer_with("snapshot", [g, step, loss_scale] { return g->snapshot(step, loss_scale); });
        },
        [run](inbox_delivery_atom, std::uint64_t token, remote_message& m) {
          run->guard([&] { run->waiter().on_delivery(token, std::move(m)); });
        },
        [run](inbox_failure_atom, std::uint64_t token, std::string& reason) {
          run->guard([&] { run->waiter().on_failure(token, reason); });
        },
        [run](inbox_deadline_atom, std::uint64_t timer) { run->guard([&] { run->waiter().on_deadline(timer); }); },
    };
  });
}

}  // namespace corolla
