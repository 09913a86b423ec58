#include "actors/train_snapshots.hpp"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <system_error>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/capnp_body.hpp"
#include "actors/node.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_wire.hpp"
#include "model/error.hpp"
#include "net/wire.capnp.h"

namespace corolla {

namespace fs = std::filesystem;

namespace {

/// Snapshots of more tensors than this are refused (three per bucket).
constexpr unsigned max_snapshot_tensors = 3 * 4096;
/// How many steps a keeper holds per owner: the newest may not have reached
/// every holder when the job fails.
constexpr std::size_t kept_steps = 2;

bool valid_name(const std::string& n) {
  return n.rfind("params.", 0) == 0 || n.rfind("m.", 0) == 0 || n.rfind("v.", 0) == 0;
}

}  // namespace

// ---- who keeps whose ------------------------------------------------------------

int snapshot_buddy(const train_layout& l, int rank) {
  if (l.world() < 2) return -1;
  if (l.dp > 1) return l.rank_of(l.stage_of(rank), (l.replica_of(rank) + 1) % l.dp);
  return l.rank_of((l.stage_of(rank) + 1) % l.pp, 0);
}

bool buddy_needs_params(const train_layout& l, int /*rank*/) { return l.dp == 1; }

std::set<int> snapshot_owners(const train_layout& l, int holder) {
  std::set<int> out{holder};
  for (int r = 0; r < l.world(); ++r)
    if (snapshot_buddy(l, r) == holder) out.insert(r);
  return out;
}

// ---- the snapshot ------------------------------------------------------------------

std::size_t rank_snapshot::bytes() const {
  std::size_t n = 0;
  for (const auto& [name, t] : tensors) n += t.nbytes();
  return n;
}

rank_snapshot rank_snapshot::header() const {
  rank_snapshot s;
  s.owner = owner;
  s.step = step;
  s.job = job;
  s.ranges = ranges;
  s.loss_scale = loss_scale;
  return s;
}

rank_snapshot rank_snapshot::without_params() const {
  rank_snapshot s = header();
  for (const auto& [name, t] : tensors)
    if (name.rfind("params.", 0) != 0) s.tensors.emplace_back(name, t);
  return s;
}

namespace {

/// The header every TrainSnapshot form has: whose, which step, which run.
void set_header(wire::TrainSnapshot::Builder r, int owner, std::int64_t step, std::uint64_t job) {
  r.setOwner(owner);
  r.setStep(step);
  r.setJob(job);
}

void set_ranges(wire::TrainSnapshot::Builder r, const std::map<std::string, shard_range>& ranges) {
  auto out = r.initRanges(static_cast<unsigned>(ranges.size()));
  unsigned i = 0;
  for (const auto& [bucket, range] : ranges) {
    out[i].setBucket(bucket);
    out[i].setLo(range.lo);
    out[i].setHi(range.hi);
    out[i].setN(range.n);
    ++i;
  }
}

std::map<std::string, shard_range> get_ranges(wire::TrainSnapshot::Reader r) {
  std::map<std::string, shard_range> out;
  for (auto x : r.getRanges()) {
    shard_range range{x.getLo(), x.getHi(), x.getN()};
    if (range.lo < 0 || range.hi < range.lo || range.n < range.hi)
      throw std::invalid_argument("a moment range " + std::to_string(range.lo) + ".." + std::to_string(range.hi) +
                                  " of " + std::to_string(range.n));
    out[capnp_body::text(x.getBucket(), "bucket")] = range;
  }
  return out;
}

}  // namespace

remote_message encode_snapshot(const rank_snapshot& s) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainSnapshot>();
  set_header(r, s.owner, s.step, s.job);
  auto names = r.initNames(static_cast<unsigned>(s.tensors.size()));
  remote_message m;
  m.type = train_msg::snap;
  for (unsigned i = 0; i < s.tensors.size(); ++i) {
    names.set(i, s.tensors[i].first);
    m.tensors.push_back(s.tensors[i].second);
  }
  set_ranges(r, s.ranges);
  r.setLossScale(s.loss_scale);
  m.body = capnp_body::flat(b);
  return m;
}

caf::expected<rank_snapshot> decode_snapshot(const remote_message& m) {
  using capnp_body::text;
  auto head = capnp_body::decode<wire::TrainSnapshot>(m.body, "TrainSnapshot", [&](wire::TrainSnapshot::Reader r) {
    rank_snapshot s;
    s.owner = r.getOwner();
    s.step = r.getStep();
    s.job = r.getJob();
    if (s.owner < 0 || s.step < 1) throw std::invalid_argument("owner " + std::to_string(s.owner) + ", step " + std::to_string(s.step));
    auto names = r.getNames();
    if (names.size() > max_snapshot_tensors || names.size() != m.tensors.size())
      throw std::invalid_argument(std::to_string(names.size()) + " names for " + std::to_string(m.tensors.size()) +
                                  " tensors");
    for (unsigned i = 0; i < names.size(); ++i) {
      std::string name = text(names[i], "tensor name");
      const Tensor& t = m.tensors[i];
      if (!valid_name(name)) throw std::invalid_argument("tensor name '" + name + "'");
      if (t.type() != dtype::f32 || t.dev().kind != device_kind::cpu)
        throw std::invalid_argument(name + " is not an f32 host tensor");
      s.tensors.emplace_back(std::move(name), t);
    }
    s.ranges = get_ranges(r);
    s.loss_scale = text(r.getLossScale(), "loss scale");
    return s;
  });
  return head;
}

// ---- what a keeper holds, and fetching from it ------------------------------------------------

std::size_t snapshot_listing::bytes() const {
  std::size_t n = 0;
  for (const auto& [name, values] : tensors) n += static_cast<std::size_t>(values) * sizeof(float);
  return n;
}

namespace {

/// A train.snapget request: which tensors of whose snapshot of which step.
struct snapshot_wanted {
  int owner = 0;
  std::int64_t step = 0;
  std::uint64_t job = 0;
  std::vector<std::string> names;
};

remote_message encode_wanted(const snapshot_wanted& w) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainSnapshot>();
  set_header(r, w.owner, w.step, w.job);
  auto names = r.initNames(static_cast<unsigned>(w.names.size()));
  for (unsigned i = 0; i < w.names.size(); ++i) names.set(i, w.names[i]);
  remote_message m;
  m.type = train_msg::snap_get;
  m.body = capnp_body::flat(b);
  return m;
}

caf::expected<snapshot_wanted> decode_wanted(const remote_message& m) {
  return capnp_body::decode<wire::TrainSnapshot>(m.body, "TrainSnapshot", [](wire::TrainSnapshot::Reader r) {
    snapshot_wanted w;
    w.owner = r.getOwner();
    w.step = r.getStep();
    w.job = r.getJob();
    if (r.getNames().size() > max_snapshot_tensors) throw std::invalid_argument("too many names");
    for (auto n : r.getNames()) {
      std::string name = capnp_body::text(n, "tensor name");
      if (!valid_name(name)) throw std::invalid_argument("tensor name '" + name + "'");
      w.names.push_back(std::move(name));
    }
    return w;
  });
}

}  // namespace

remote_message encode_snapshot_index(const snapshot_index& x) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainSnapshotIndex>();
  r.setHolder(x.holder);
  auto list = r.initSnapshots(static_cast<unsigned>(x.snapshots.size()));
  for (unsigned i = 0; i < x.snapshots.size(); ++i) {
    const snapshot_listing& l = x.snapshots[i];
    auto e = list[i];
    set_header(e, l.owner, l.step, l.job);
    auto names = e.initNames(static_cast<unsigned>(l.tensors.size()));
    auto sizes = e.initSizes(static_cast<unsigned>(l.tensors.size()));
    for (unsigned t = 0; t < l.tensors.size(); ++t) {
      names.set(t, l.tensors[t].first);
      sizes.set(t, l.tensors[t].second);
    }
    set_ranges(e, l.ranges);
    e.setLossScale(l.loss_scale);
  }
  remote_message m;
  m.type = train_msg::snaps;
  m.body = capnp_body::flat(b);
  return m;
}

std::string snapshot_keeper_name(std::uint64_t job) { return "train-snap/" + std::to_string(job); }

bool is_snapshot_keeper_name(const std::string& name) { return name.rfind("train-snap/", 0) == 0; }

caf::expected<snapshot_index> decode_snapshot_index(const remote_message& m) {
  if (m.type != train_msg::snaps)
    return make_error(errc::bad_message, "expected " + std::string(train_msg::snaps) + ", got '" + m.type + "'");
  return capnp_body::decode<wire::TrainSnapshotIndex>(
      m.body, "TrainSnapshotIndex", [](wire::TrainSnapshotIndex::Reader r) {
        snapshot_index x;
        x.holder = r.getHolder();
        for (auto e : r.getSnapshots()) {
          snapshot_listing l;
          l.owner = e.getOwner();
          l.step = e.getStep();
          l.job = e.getJob();
          if (l.owner < 0 || l.step < 1) throw std::invalid_argument("owner " + std::to_string(l.owner) + ", step " +
                                                                     std::to_string(l.step));
          auto names = e.getNames();
          auto sizes = e.getSizes();
          if (names.size() > max_snapshot_tensors || names.size() != sizes.size())
            throw std::invalid_argument(std::to_string(names.size()) + " names for " + std::to_string(sizes.size()) +
                                        " sizes");
          for (unsigned t = 0; t < names.size(); ++t) {
            std::string name = capnp_body::text(names[t], "tensor name");
            if (!valid_name(name) || sizes[t] < 0) throw std::invalid_argument("tensor '" + name + "'");
            l.tensors.emplace_back(std::move(name), sizes[t]);
          }
          l.ranges = get_ranges(e);
          l.loss_scale = capnp_body::text(e.getLossScale(), "loss scale");
          x.snapshots.push_back(std::move(l));
        }
        return x;
      });
}

caf::expected<snapshot_index> fetch_snapshot_index(node& n, const std::string& peer, std::uint64_t job,
                                                   std::chrono::milliseconds timeout) {
  remote_message q;
  q.type = train_msg::snaps_query;
  q.body = encode_body(train_step_note{0, 0, 0, job});
  auto r = n.request(peer, snapshot_keeper_name(job), std::move(q), timeout);
  if (!r) return r.error();
  return decode_snapshot_index(*r);
}

caf::expected<rank_snapshot> fetch_snapshot(node& n, const std::string& peer, std::uint64_t job, int owner,
                                            std::int64_t step, const std::vector<std::string>& names,
                                            std::chrono::milliseconds timeout) {
  auto r = n.request(peer, snapshot_keeper_name(job), encode_wanted({owner, step, job, names}), timeout);
  if (!r) return r.error();
  if (r->type != train_msg::snap)
    return make_error(errc::bad_message, "the keeper of " + peer + " answered '" + r->type + "'");
  auto s = decode_snapshot(*r);
  if (!s) return s.error();
  if (s->owner != owner || s->step != step || s->job != job)
    return make_error(errc::bad_message, "the keeper of " + peer + " answered with rank " + std::to_string(s->owner) +
                                             "'s snapshot of step " + std::to_string(s->step) + ", not the one asked for");
  return s;
}

// ---- snapshots read as a checkpoint ------------------------------------------------------

snapshot_shards::snapshot_shards(std::vector<rank_snapshot> snapshots, bool whole) : snaps_(std::move(snapshots)) {
  std::set<int> owners;
  for (std::size_t i = 0; i < snaps_.size(); ++i) {
    const rank_snapshot& x = snaps_[i];
    if (x.step != snaps_.front().step || x.job != snaps_.front().job)
      throw train_error("in-memory snapshots of steps " + std::to_string(snaps_.front().step) + " and " +
                        std::to_string(x.step) + " (or of two runs) cannot be read as one step");
    if (!owners.insert(x.owner).second)
      throw train_error("two in-memory snapshots of rank " + std::to_string(x.owner) + " of step " +
                        std::to_string(x.step));
    for (const auto& [name, t] : x.tensors)
      if (name.rfind("params.", 0) == 0) add_params(name.substr(7), i);
    for (const auto& [bucket, range] : x.ranges) add_piece(bucket, i, range);
  }
  if (whole) check_tiling();
}

Tensor snapshot_shards::tensor(std::size_t shard, const std::string& name) const {
  const rank_snapshot& x = snaps_.at(shard);
  for (const auto& [n, t] : x.tensors)
    if (n == name) {
      if (t.type() != dtype::f32) throw train_error(shard_label(shard) + ": " + name + " is not f32");
      return t;
    }
  throw train_error(shard_label(shard) + " has no tensor " + name);
}

std::string snapshot_shards::what() const { return "the in-memory snapshots of step " + std::to_string(step()); }

std::string snapshot_shards::shard_label(std::size_t shard) const {
  return "the snapshot of rank " + std::to_string(snaps_.at(shard).owner);
}

// ---- the keeper ---------------------------------------------------------------------

namespace {

struct keeper_state {
  snapshot_keeper_setup setup;
  node* n = nullptr;
  std::uint64_t job = 0;
  /// owner -> step -> snapshot (at most kept_steps steps per owner)
  std::map<int, std::map<std::int64_t, rank_snapshot>> held;
};

/// Writes every snapshot held; "" or the first error.
std::string flush(const keeper_state& st) {
  const fs::path dir = st.setup.dir / ("h" + std::to_string(st.setup.holder));
  std::string error;
  int written = 0;
  for (const auto& [owner, steps] : st.held)
    for (const auto& [step, s] : steps) {
      try {
        std::map<std::string, std::string> meta = {{"holder", std::to_string(st.setup.holder)}};
        if (!s.loss_scale.empty()) meta["loss_scale"] = s.loss_scale;
        // Not synced: the launcher reads them back on this machine at once.
        write_shard(dir, static_cast<int>(step), owner, s.tensors, s.ranges, meta, false);
        ++written;
      } catch (const std::exception& e) {
        if (error.empty()) error = e.what();
      }
    }
  // Last: the launcher goes on once every survivor's marker is there
  // (the process's exit, its node's goodbyes, would take longer).
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::ofstream(dir / "flushed") << written << "\n";
  spdlog::info("rank {} flushed {} in-memory snapshot(s) to {}", st.setup.holder, written, dir.string());
  return error;
}

/// train.snaps?: what the keeper holds of its run.
caf::result<remote_message> answer_index(const keeper_state& st, const remote_message& m) {
  auto q = decode_train_step(m.body);
  if (!q) return q.error();
  if (q->job != st.job) return make_error(errc::auth_refused, "these snapshots are not of the run asked about");
  snapshot_index x;
  x.holder = st.setup.holder;
  for (const auto& [owner, steps] : st.held)
    for (const auto& [step, s] : steps) {
      snapshot_listing l;
      l.owner = owner;
      l.step = step;
      l.job = s.job;
      for (const auto& [name, t] : s.tensors) l.tensors.emplace_back(name, t.numel());
      l.ranges = s.ranges;
      l.loss_scale = s.loss_scale;
      x.snapshots.push_back(std::move(l));
    }
  return encode_snapshot_index(x);
}

/// train.snapget: the tensors asked for of one snapshot held.
caf::result<remote_message> answer_get(const keeper_state& st, const remote_message& m) {
  auto w = decode_wanted(m);
  if (!w) return w.error();
  if (w->job != st.job) return make_error(errc::auth_refused, "these snapshots are not of the run asked about");
  const rank_snapshot* held = nullptr;
  if (const auto owner = st.held.find(w->owner); owner != st.held.end())
    if (const auto it = owner->second.find(w->step); it != owner->second.end()) held = &it->second;
  if (!held)
    return make_error(errc::unknown_actor, "rank " + std::to_string(st.setup.holder) + " holds no snapshot of rank " +
                                               std::to_string(w->owner) + " of step " + std::to_string(w->step));
  const rank_snapshot& s = *held;
  rank_snapshot out = s.header();
  for (const std::string& name : w->names) {
    const auto t = std::find_if(s.tensors.begin(), s.tensors.end(), [&](const auto& x) { return x.first == name; });
    if (t == s.tensors.end())
      return make_error(errc::invalid_argument, "rank " + std::to_string(w->owner) + "'s snapshot of step " +
                                                    std::to_string(w->step) + " has no " + name);
    out.tensors.push_back(*t);
  }
  if (w->names.empty()) out.tensors = s.tensors;
  return encode_snapshot(out);
}

caf::behavior snapshot_keeper(caf::event_based_actor* self, std::shared_ptr<keeper_state> st) {
  return {
      [self, st](remote_message& m) -> caf::result<remote_message> {
        if (m.type == train_msg::snaps_query) return answer_index(*st, m);
        if (m.type == train_msg::snap_get) return answer_get(*st, m);
        if (m.type == train_msg::snap_drop) {
          // Whoever knows the run: the launcher, once the grid that read
          // these snapshots has its own.
          if (auto q = decode_train_step(m.body); q && q->job == st->job) {
            st->n->unpublish(snapshot_keeper_name(st->job));
            self->quit();
          }
          return remote_message{};
        }
        // One-way from here on: the (empty) answer goes nowhere.
        if (m.type != train_msg::snap) return remote_message{};
        // A snapshot from another process must come from a rank of the job.
        if (!m.from_node.empty() && !st->setup.inbox->named(m.from_node)) {
          spdlog::warn("dropping a snapshot from node {}, which is not part of this job", m.from_node);
          return remote_message{};
        }
        auto s = decode_snapshot(m);
        if (!s) {
          spdlog::warn("dropping a snapshot from {}: {}", st->setup.inbox->label_of(m.from_node), error_message(s.error()));
          return remote_message{};
        }
        const bool local = m.from_node.empty();
        if (s->job != st->job || !st->setup.owners.count(s->owner) || local != (s->owner == st->setup.holder)) {
          spdlog::warn("dropping a snapshot of rank {} (step {}) from {}: not one this rank keeps", s->owner, s->step,
                       local ? std::string("this rank") : st->setup.inbox->label_of(m.from_node));
          return remote_message{};
        }
        auto& steps = st->held[s->owner];
        const std::int64_t step = s->step;
        const int owner = s->owner;
        steps[step] = std::move(*s);
        while (steps.size() > kept_steps) steps.erase(steps.begin());
        // A buddy's copy: the coordinator prints the step once every rank's is in.
        if (!local && !st->setup.coordinator.empty()) {
          auto coord = st->n->remote_actor(st->setup.coordinator, "train-coord");
          if (!coord) {
            spdlog::warn("rank {}: cannot tell the coordinator of rank {}'s snapshot of step {}: {}", st->setup.holder,
                         owner, step, error_message(coord.error()));
            return remote_message{};
          }
          remote_message note;
          note.type = train_msg::kept;
          note.body = encode_body(train_step_note{step, owner, static_cast<double>(st->setup.holder), st->job});
          caf::anon_send(*coord, std::move(note));
        }
        return remote_message{};
      },
      [st](snap_msg::flush_atom) { return flush(*st); },
  };
}

}  // namespace

caf::expected<caf::actor> start_snapshot_keeper(node& n, snapshot_keeper_setup s, std::uint64_t job) {
  auto st = std::make_shared<keeper_state>();
  st->setup = std::move(s);
  st->n = &n;
  st->job = job;
  caf::actor a = n.system().spawn(snapshot_keeper, st);
  if (auto err = n.publish(snapshot_keeper_name(job), a)) {
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    return err;
  }
  return a;
}

std::string loss_scale_text(const loss_scaler& s) {
  if (!s.dynamic()) return {};
  const loss_scale_state& st = s.state();
  std::ostringstream out;
  out.precision(17);
  out << st.scale << ' ' << st.good_steps << ' ' << st.skipped;
  return out.str();
}

std::optional<loss_scale_state> parse_loss_scale_text(const std::string& text) {
  if (text.empty()) return std::nullopt;
  loss_scale_state st;
  std::istringstream in(text);
  if (!(in >> st.scale >> st.good_steps >> st.skipped))
    throw std::invalid_argument("a malformed loss scale '" + text + "'");
  return st;
}

void flush_snapshot_keeper(node& n, const caf::actor& keeper, const std::string& label) {
  caf::scoped_actor self{n.system()};
  self->request(keeper, std::chrono::seconds(60), snap_msg::flush_atom::value)
      .receive(
          [&](std::string& e) {
            if (!e.empty()) spdlog::error("{}: flushing its snapshots failed: {}", label, e);
          },
          [&](caf::error& e) { spdlog::error("{}: flushing its snapshots failed: {}", label, to_string(e)); });
}

}  // namespace corolla
