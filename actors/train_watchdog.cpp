// actors/train_watchdog.cpp — see actors/train_watchdog.hpp.
#include "actors/train_watchdog.hpp"

#include <algorithm>
#include <cstdio>
#include <thread>

#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>

#include "actors/errors.hpp"
#include "actors/messages.hpp"
#include "actors/train_wire.hpp"

namespace corolla {

std::int64_t stage_beacon::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void stage_beacon::enter(const char* what) {
  what_.store(what);
  since_ns_.store(now_ns());
  // faultlab's hang: stuck inside the call, as a kernel that never returns.
  while (stalled_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void stage_beacon::leave() {
  const std::int64_t since = since_ns_.exchange(0);
  if (since == 0) return;
  const std::int64_t took = now_ns() - since;
  calls_.fetch_add(1);
  std::int64_t seen = longest_ns_.load();
  while (took > seen && !longest_ns_.compare_exchange_weak(seen, took)) {
  }
}

double stage_beacon::busy_s(const char** what) const {
  const std::int64_t since = since_ns_.load();
  if (what) *what = what_.load();
  return since == 0 ? 0.0 : static_cast<double>(now_ns() - since) * 1e-9;
}

void stage_beacon::add_to(schedule::rank_activity& a) const {
  const char* what = "";
  if (const double busy = busy_s(&what); busy > 0 && a.computing.empty()) {
    a.computing = what;
    a.computing_s = busy;
  }
  a.progress += calls();
}

compute_window::compute_window(stage_beacon& b, const char* what, double& total)
    : beacon_(b), total_(total), t0_(std::chrono::steady_clock::now()) {
  beacon_.enter(what);
}

compute_window::~compute_window() {
  beacon_.leave();
  total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

double hang_threshold_s(double hang_s, double longest_s) { return std::max(hang_s, 10.0 * longest_s); }

std::string hang_reason(const std::string& label, double seconds, const std::string& what, double hang_s,
                        double longest_s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, " for %.1f s (the longest before took %.3g s; --hang-s %g)", seconds, longest_s,
                hang_s);
  return label + " is hung: its stage has been inside one " + what + buf;
}

namespace {

using watch_tick_atom = caf::atom_constant<caf::atom("watchtick")>;
constexpr std::chrono::milliseconds check_every{100};

}  // namespace

caf::actor spawn_train_watchdog(caf::actor_system& system, std::shared_ptr<stage_beacon> beacon, double hang_s,
                                std::function<void(double seconds, const std::string& what)> on_hang,
                                activity_sampler activity) {
  // Detached (its own thread): the checks must not wait for a busy
  // scheduler. on_hang may block (it tells the coordinator, flushes the
  // snapshot keeper), so it runs on a thread of its own.
  return system.spawn<caf::detached>([beacon, hang_s, on_hang,
                                      activity](caf::event_based_actor* self) -> caf::behavior {
    // hang_s 0: no checks, but the harness's stall still works (a job
    // without a watchdog, hung on purpose).
    if (hang_s > 0) self->delayed_send(self, check_every, watch_tick_atom::value);
    return {
        [beacon](stall_atom, bool on) { beacon->stall(on); },
        // The coordinator's question when the job stopped making progress.
        [beacon, activity](remote_message& m) -> caf::result<remote_message> {
          if (m.type != train_msg::waits_query)
            return make_error(errc::bad_message, "the watchdog answers '" + std::string(train_msg::waits_query) +
                                                     "', not '" + m.type + "'");
          auto q = decode_train_step(m.body);
          if (!q) return q.error();
          auto a = activity(q->job);
          if (!a) return a.error();
          beacon->add_to(*a);
          remote_message out;
          out.type = train_msg::waits;
          out.body = encode_body(*a);
          return out;
        },
        [self, beacon, hang_s, on_hang](watch_tick_atom) {
          const char* what = "";
          const double busy = beacon->busy_s(&what);
          if (busy > 0 && busy > hang_threshold_s(hang_s, beacon->longest_s())) {
            // On a thread of its own (it blocks, then ends the process):
            // meanwhile the watchdog still answers the coordinator, which
            // then sees the stage inside its call and waits for the
            // rank's own report rather than calling it silent.
            std::thread([on_hang, busy, w = std::string(what)] { on_hang(busy, w); }).detach();
            return;  // once: the rank is done for
          }
          self->delayed_send(self, check_every, watch_tick_atom::value);
        },
    };
  });
}

}  // namespace corolla
