// actors/train_stall.cpp — see actors/train_stall.hpp.
#include "actors/train_stall.hpp"

#include <algorithm>
#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <utility>
#include <thread>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/node.hpp"
#include "actors/train_job.hpp"
#include "actors/train_watchdog.hpp"
#include "actors/train_wire.hpp"

namespace corolla {

namespace {

/// How long a rank has to answer train.waits?, and the gap between the
/// two samples (a rank whose progress counter moved in between moves).
constexpr std::chrono::seconds answer_within{3};
constexpr std::chrono::milliseconds sample_gap{1000};

double seconds_between(stall_watch::clock_type::time_point a, stall_watch::clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

void stall_watch::set_run(std::uint64_t run, std::map<int, std::string> ids) {
  run_ = run;
  ids_ = std::move(ids);
  last_progress_ = clock_type::now();
}

void stall_watch::step_took(int step, int first, double seconds) {
  if (step <= first) return;  // the run's start: building, restoring
  longest_step_s_ = std::max(longest_step_s_, seconds);
}

double stall_watch::threshold_s() const { return hang_threshold_s(hang_s_, longest_step_s_); }

std::chrono::milliseconds report_grace(std::chrono::milliseconds timeout) {
  return std::min(timeout / 4, std::chrono::milliseconds(10000));
}

remote_message stall_watch::take(train_inbox& inbox, const char* type, std::int64_t step, int rank,
                                 const std::string& what, std::chrono::milliseconds timeout, bool judge) {
  return take_from(inbox, type, step, rank, rank, what, timeout, judge);
}

remote_message stall_watch::take_from(train_inbox& inbox, const char* type, std::int64_t step, int slot, int rank,
                                      const std::string& what, std::chrono::milliseconds timeout, bool judge) {
  const std::string key = train_key(type, run_, step, slot);
  const std::string full = what + " from " + layout_.label(rank);
  // The ranks wait for each other's messages with the same timeout, most
  // of them since about when this wait began or later: a grace past it
  // lets the rank that waits on what is missing report its own, more
  // precise timeout ("no activations of micro-batch 4 from rank 0") before
  // this one names a victim ("no report of step 4 from rank 1").
  const auto limit = timeout + report_grace(timeout);
  const auto deadline = clock_type::now() + limit;
  for (;;) {
    const auto now = clock_type::now();
    auto until = deadline;
    const bool checks = judge && hang_s_ > 0;
    const double t = threshold_s();
    const auto next_check =
        std::max(last_progress_ + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(t)),
                 last_check_ + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(t / 2)));
    if (checks) until = std::min(until, std::max(next_check, now + std::chrono::milliseconds(20)));
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(until - now);
    if (auto m = inbox.try_take(key, std::max(wait, std::chrono::milliseconds(1)), full, rank)) {
      last_progress_ = clock_type::now();
      return std::move(*m);
    }
    if (clock_type::now() >= deadline)
      throw train_error("no " + full + " within " + std::to_string(limit.count()) + " ms");
    if (checks && clock_type::now() >= next_check) check(inbox, step, rank, full);
  }
}

std::vector<schedule::rank_activity> stall_watch::sample(train_inbox& inbox, std::int64_t step) {
  // A rank that reported its own failure meanwhile is the root cause.
  if (auto failure = inbox.failure()) throw train_error(*failure);
  // Every rank is asked at once, by an actor of its own, and answers
  // within one answer_within: a host whose ranks all stopped costs one
  // wait, not one per rank. This thread meanwhile watches the inbox: a
  // failure reported while a silent rank is waited for (the launcher
  // found it stopped, a link went down) ends the sample at once.
  struct collected {
    std::vector<schedule::rank_activity> out;
    std::size_t pending = 0;
    std::promise<void> done;
  };
  auto c = std::make_shared<collected>();
  std::vector<std::pair<std::size_t, caf::actor>> targets;
  for (const auto& [rank, id] : ids_) {
    schedule::rank_activity a;
    a.rank = rank;  // unanswered: answered false
    c->out.push_back(std::move(a));
    if (auto target = node_.remote_actor(id, "train-watch")) targets.emplace_back(c->out.size() - 1, *target);
  }
  if (targets.empty()) return c->out;
  c->pending = targets.size();
  auto answered = c->done.get_future();
  const std::vector<std::uint8_t> question = encode_body(train_step_note{step, 0, 0, run_});
  node_.system().spawn([c, targets, question](caf::event_based_actor* self) {
    // Its handlers run one at a time; the actor ends with its last answer.
    auto one_less = [c] {
      if (--c->pending == 0) c->done.set_value();
    };
    for (const auto& [i, target] : targets) {
      remote_message q;
      q.type = train_msg::waits_query;
      q.body = question;
      self->request(target, answer_within, std::move(q))
          .then(
              [c, one_less, i = i](remote_message& m) {
                if (m.type == train_msg::waits)
                  if (auto d = decode_rank_activity(m.body); d && d->rank == c->out[i].rank) c->out[i] = std::move(*d);
                one_less();
              },
              [one_less](caf::error&) { one_less(); });
    }
  });
  while (answered.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready)
    if (auto failure = inbox.failure()) throw train_error(*failure);
  return c->out;
}

void stall_watch::check(train_inbox& inbox, std::int64_t step, int rank, const std::string& what) {
  last_check_ = clock_type::now();
  const double quiet = seconds_between(last_progress_, last_check_);
  // What the coordinator waits for: this message (a victim's, maybe: the
  // graph follows the waits from its sender).
  const std::vector<schedule::party_wait> mine{{what, rank, quiet}};
  const auto asked = clock_type::now();
  const std::vector<schedule::rank_activity> before = sample(inbox, step);
  // The second sample comes sample_gap after the first was asked for (at
  // once when a silent rank already took that long).
  for (auto until = asked + sample_gap; clock_type::now() < until;) {
    if (auto failure = inbox.failure()) throw train_error(*failure);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::vector<schedule::rank_activity> after = sample(inbox, step);
  const schedule::stall_verdict v =
      schedule::diagnose_stall(before, after, mine, [this](int r) { return layout_.label(r); });
  if (!v.stuck()) {
    spdlog::info("training: the coordinator waited {:.1f} s for {}, but the job still moves", quiet, what);
    return;
  }
  // A rank that reports its own failure (its watchdog found its stage
  // hung, and stopped answering while it tells) is the root cause: its
  // abort wins over what the samples suggest.
  if (v.what == schedule::stall_verdict::kind::silent) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  if (auto failure = inbox.failure()) throw train_error(*failure);
  char tail[160];
  std::snprintf(tail, sizeof tail, " (nothing came for %.1f s; the threshold is max(--hang-s %g, 10 x the longest step "
                "%.3g s))", seconds_between(last_progress_, clock_type::now()), hang_s_, longest_step_s_);
  spdlog::error("training: {}{}", v.reason, tail);
  std::vector<int> blamed;
  if (v.what != schedule::stall_verdict::kind::deadlock) blamed = v.ranks;
  throw train_stall(v.reason + tail, std::move(blamed));
}

}  // namespace corolla
