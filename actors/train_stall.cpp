// actors/train_stall.cpp — see actors/train_stall.hpp.
#include "actors/train_stall.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

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
/// How long a verdict of silence waits for the silent rank's own report.
constexpr std::chrono::milliseconds late_report{500};

/// The phases of a check (stall_check_atom's third element).
enum check_phase : int { check_due = 0, first_answers = 1, second_sample = 2, second_answers = 3, verdict_due = 4 };

double seconds_between(stall_watch::clock_type::time_point a, stall_watch::clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

stall_watch::clock_type::duration seconds(double s) {
  return std::chrono::duration_cast<stall_watch::clock_type::duration>(std::chrono::duration<double>(s));
}

}  // namespace

std::chrono::milliseconds report_grace(std::chrono::milliseconds timeout) {
  return std::min(timeout / 4, std::chrono::milliseconds(10000));
}

stall_watch::stall_watch(node& n, const train_layout& layout, double hang_s, std::shared_ptr<train_inbox> inbox,
                         std::chrono::milliseconds timeout)
    : node_(n), layout_(layout), hang_s_(hang_s), inbox_(inbox), timeout_(timeout), waiter_(std::move(inbox), timeout) {}

void stall_watch::bind(caf::event_based_actor* self) {
  self_ = self;
  waiter_.bind(self);
}

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

std::optional<remote_message> stall_watch::await(const char* type, std::int64_t step, int slot, int from,
                                                  const std::string& what, delivery later, bool judge, int hop) {
  const std::string full = what + " from " + layout_.label(from);
  ++wait_;  // a check of an earlier wait stops here
  verdict_.reset();
  judged_ = false;
  auto took = [this, later = std::move(later)](remote_message m) {
    ++wait_;
    judged_ = false;
    last_progress_ = clock_type::now();
    later(std::move(m));
  };
  // The ranks wait for each other's messages with the same timeout, most
  // of them since about when this wait began or later: a grace past it
  // lets the rank that waits on what is missing report its own, more
  // precise timeout ("no activations of micro-batch 4 from rank 0") before
  // this one names a victim ("no report of step 4 from rank 1").
  auto m = waiter_.await(train_key(type, run_, step, slot, hop), full, from, std::move(took),
                         timeout_ + report_grace(timeout_));
  if (m) {
    last_progress_ = clock_type::now();
    return m;
  }
  judged_ = judge && hang_s_ > 0;
  step_ = step;
  from_ = from;
  what_ = full;
  schedule_check();
  return std::nullopt;
}

void stall_watch::schedule_check() {
  if (!judged_) return;
  const double t = threshold_s();
  const auto now = clock_type::now();
  const auto due = std::max(last_progress_ + seconds(t), last_check_ + seconds(t / 2));
  const auto after = std::max(std::chrono::ceil<std::chrono::milliseconds>(due - now), std::chrono::milliseconds(20));
  self_->delayed_send(caf::actor_cast<caf::actor>(self_), after, stall_check_atom::value, wait_, int{check_due});
}

void stall_watch::on_check(std::uint64_t wait, int phase) {
  if (wait != wait_ || !judged_ || !waiter_.waiting()) return;  // that wait is over
  switch (phase) {
    case check_due:
      // A rank that reported its own failure meanwhile is the root cause.
      if (auto failure = inbox_->failure()) throw train_error(*failure);
      last_check_ = asked_ = clock_type::now();
      sample(first_answers);
      return;
    case first_answers: {
      before_ = std::move(answers_);
      // The second sample comes sample_gap after the first was asked for
      // (at once when a silent rank already took that long).
      const auto gap = std::chrono::ceil<std::chrono::milliseconds>(asked_ + sample_gap - clock_type::now());
      self_->delayed_send(caf::actor_cast<caf::actor>(self_), std::max(gap, std::chrono::milliseconds(0)),
                          stall_check_atom::value, wait, int{second_sample});
      return;
    }
    case second_sample:
      sample(second_answers);
      return;
    case second_answers:
      judge(answers_);
      return;
    case verdict_due:
      if (verdict_) throw_verdict();
      return;
    default:
      return;
  }
}

void stall_watch::sample(int answered) {
  // Every rank is asked at once and answers within one answer_within: a
  // host whose ranks all stopped costs one wait, not one per rank. The
  // wait stays open meanwhile: the message coming, or a failure reported
  // while a silent rank is waited for (the launcher found it stopped, a
  // link went down), ends the check at once. The last answer is announced
  // to the actor as a message, so that what follows runs in its handlers.
  answers_.clear();
  std::vector<std::pair<std::size_t, caf::actor>> targets;
  for (const auto& [rank, id] : ids_) {
    schedule::rank_activity a;
    a.rank = rank;  // unanswered: answered false
    answers_.push_back(std::move(a));
    if (auto target = node_.remote_actor(id, "train-watch")) targets.emplace_back(answers_.size() - 1, *target);
  }
  const caf::actor me = caf::actor_cast<caf::actor>(self_);
  const std::uint64_t wait = wait_;
  auto pending = std::make_shared<std::size_t>(targets.size());
  auto one_less = [this, me, wait, answered, pending] {
    if (--*pending == 0 && wait == wait_) self_->send(me, stall_check_atom::value, wait, answered);
  };
  if (targets.empty()) {
    self_->send(me, stall_check_atom::value, wait, answered);
    return;
  }
  const std::vector<std::uint8_t> question = encode_body(train_step_note{step_, 0, 0, run_});
  for (const auto& [i, target] : targets) {
    remote_message q;
    q.type = train_msg::waits_query;
    q.body = question;
    self_->request(target, answer_within, std::move(q))
        .then(
            [this, one_less, wait, i = i](remote_message& m) {
              if (wait == wait_ && m.type == train_msg::waits)
                if (auto d = decode_rank_activity(m.body); d && d->rank == answers_[i].rank) answers_[i] = std::move(*d);
              one_less();
            },
            [one_less](caf::error&) { one_less(); });
  }
}

void stall_watch::judge(const std::vector<schedule::rank_activity>& after) {
  const double quiet = seconds_between(last_progress_, last_check_);
  // What the coordinator waits for: this message (a victim's, maybe: the
  // graph follows the waits from its sender).
  const std::vector<schedule::party_wait> mine{{what_, from_, quiet}};
  const schedule::stall_verdict v =
      schedule::diagnose_stall(before_, after, mine, [this](int r) { return layout_.label(r); });
  if (!v.stuck()) {
    spdlog::info("training: the coordinator waited {:.1f} s for {}, but the job still moves", quiet, what_);
    schedule_check();
    return;
  }
  std::vector<int> blamed;
  if (v.what != schedule::stall_verdict::kind::deadlock) blamed = v.ranks;
  verdict_ = pending_verdict{v.reason, std::move(blamed)};
  // A rank that reports its own failure (its watchdog found its stage
  // hung, and stopped answering while it tells) is the root cause: its
  // abort wins over what the samples suggest.
  if (v.what != schedule::stall_verdict::kind::silent) throw_verdict();
  self_->delayed_send(caf::actor_cast<caf::actor>(self_), late_report, stall_check_atom::value, wait_,
                      int{verdict_due});
}

void stall_watch::throw_verdict() {
  if (auto failure = inbox_->failure()) throw train_error(*failure);
  pending_verdict v = std::move(*verdict_);
  verdict_.reset();
  char tail[160];
  std::snprintf(tail, sizeof tail, " (nothing came for %.1f s; the threshold is max(--hang-s %g, 10 x the longest step "
                "%.3g s))", seconds_between(last_progress_, clock_type::now()), hang_s_, longest_step_s_);
  spdlog::error("training: {}{}", v.reason, tail);
  throw train_stall(v.reason + tail, std::move(v.blamed));
}

}  // namespace corolla
