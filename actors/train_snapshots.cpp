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
#include "actors/train_snapshot_wire.hpp"
#include "actors/train_job.hpp"
#include "actors/train_wire.hpp"
#include "model/error.hpp"
#include "net/wire.capnp.h"

namespace corolla {

namespace fs = std::filesystem;

namespace {

/// How many steps a keeper holds per owner: the newest may not have reached
/// every holder when the job fails.
constexpr std::size_t kept_steps = 2;

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

// ---- what a keeper holds, and fetching from it ------------------------------------------------

std::size_t snapshot_listing::bytes() const {
  std::size_t n = 0;
  for (const auto& [name, values] : tensors) n += static_cast<std::size_t>(values) * sizeof(float);
  return n;
}

std::string snapshot_keeper_name(std::uint64_t job) { return "train-snap/" + std::to_string(job); }

bool is_snapshot_keeper_name(const std::string& name) { return name.rfind("train-snap/", 0) == 0; }

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
                                            std::chrono::milliseconds timeout, std::int64_t max_bytes) {
  for (const std::string& name : names)
    if (!valid_snapshot_tensor_name(name)) return make_error(errc::bad_message, "tensor name '" + name + "'");
  // The sizes first: what the keeper holds.
  auto x = fetch_snapshot_index(n, peer, job, timeout);
  if (!x) return x.error();
  const auto listing = std::find_if(x->snapshots.begin(), x->snapshots.end(),
                                    [&](const snapshot_listing& l) { return l.owner == owner && l.step == step; });
  if (listing == x->snapshots.end())
    return make_error(errc::unknown_actor, "rank " + std::to_string(x->holder) + " holds no snapshot of rank " +
                                               std::to_string(owner) + " of step " + std::to_string(step));
  std::vector<std::pair<std::string, std::int64_t>> wanted;  // name, values
  if (names.empty()) wanted = listing->tensors;
  for (const std::string& name : names) {
    const auto t = std::find_if(listing->tensors.begin(), listing->tensors.end(),
                                [&](const auto& l) { return l.first == name; });
    if (t == listing->tensors.end())
      return make_error(errc::invalid_argument, "rank " + std::to_string(owner) + "'s snapshot of step " +
                                                    std::to_string(step) + " has no " + name);
    wanted.push_back(*t);
  }
  // Requests of at most max_bytes of values each: whole tensors while they
  // fit, a larger one in ranges.
  std::vector<std::int64_t> sizes;
  for (const auto& [name, total] : wanted) sizes.push_back(total);
  const auto requests =
      pack_values(sizes, max_bytes / static_cast<std::int64_t>(sizeof(float)), max_snapshot_message_tensors);
  rank_snapshot out;
  out.owner = owner;
  out.step = step;
  out.job = job;
  out.ranges = listing->ranges;
  out.loss_scale = listing->loss_scale;
  for (const std::vector<value_range>& ranges : requests) {
    if (ranges.empty()) continue;
    snapshot_wanted w{owner, step, job, {}, {}};
    for (const value_range& r : ranges) {
      w.names.push_back(wanted[r.tensor].first);
      w.ranges.emplace_back(r.offset, r.count);
    }
    auto r = n.request(peer, snapshot_keeper_name(job), encode_wanted(w), timeout);
    if (!r) return r.error();
    if (r->type != train_msg::snap)
      return make_error(errc::bad_message, "the keeper of " + peer + " answered '" + r->type + "'");
    auto part = decode_snapshot_part(*r);
    if (!part) return part.error();
    const rank_snapshot& h = part->header;
    if (h.owner != owner || h.step != step || h.job != job)
      return make_error(errc::bad_message, "the keeper of " + peer + " answered with rank " + std::to_string(h.owner) +
                                               "'s snapshot of step " + std::to_string(h.step) + ", not the one asked for");
    if (part->pieces.size() != w.names.size())
      return make_error(errc::bad_message, "the keeper of " + peer + " answered " +
                                               std::to_string(part->pieces.size()) + " tensors for " +
                                               std::to_string(w.names.size()) + " asked for");
    for (std::size_t i = 0; i < w.names.size(); ++i) {
      snapshot_piece& p = part->pieces[i];
      const auto [lo, count] = w.ranges[i];
      // The ranges asked for tile each tensor in order: checked piece by
      // piece, every value of the result was written.
      if (p.name != w.names[i] || p.offset != lo || p.values.numel() != count ||
          p.total != wanted[ranges[i].tensor].second)
        return make_error(errc::bad_message, "the keeper of " + peer + " answered " + p.name + " values " +
                                                 std::to_string(p.offset) + "+" + std::to_string(p.values.numel()) +
                                                 " for " + w.names[i] + " values " + std::to_string(lo) + "+" +
                                                 std::to_string(count));
      if (p.whole()) {
        out.tensors.emplace_back(std::move(p.name), std::move(p.values));
        continue;
      }
      if (lo == 0) out.tensors.emplace_back(p.name, Tensor::empty({p.total}));
      Tensor& t = out.tensors.back().second;
      if (out.tensors.back().first != p.name || t.numel() != p.total)
        return make_error(errc::bad_message, "the keeper of " + peer + " answered " + p.name + " of " +
                                                 std::to_string(p.total) + " values");
      t.slice(lo, lo + count).copy_from(p.values);
    }
  }
  return out;
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

/// A snapshot coming in parts: what came so far.
struct snapshot_assembly {
  rank_snapshot s;                    ///< its tensors made whole as pieces come
  int parts = 0, came = 0;
  std::vector<std::int64_t> filled;   ///< per tensor of s, its values written so far (in order)
};

struct keeper_state {
  snapshot_keeper_setup setup;
  node* n = nullptr;
  std::uint64_t job = 0;
  /// owner -> step -> snapshot (at most kept_steps steps per owner)
  std::map<int, std::map<std::int64_t, rank_snapshot>> held;
  /// (owner, step) -> a snapshot whose parts are still coming
  std::map<std::pair<int, std::int64_t>, snapshot_assembly> assembling;
  /// owner -> the newest step whose parts began to come: a part of it or
  /// of an older step that finds no assembly (dropped, or stale) starts none.
  std::map<int, std::int64_t> begun;
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
  const std::size_t asked = w->names.empty() ? s.tensors.size() : w->names.size();
  if (asked > max_snapshot_message_tensors)
    return make_error(errc::invalid_argument, "an answer of " + std::to_string(asked) + " tensors: ask for at most " +
                                                  std::to_string(max_snapshot_message_tensors) + " at a time");
  if (w->names.empty()) return encode_snapshot(s);
  std::vector<snapshot_piece> pieces;
  for (std::size_t i = 0; i < w->names.size(); ++i) {
    const std::string& name = w->names[i];
    const auto t = std::find_if(s.tensors.begin(), s.tensors.end(), [&](const auto& x) { return x.first == name; });
    if (t == s.tensors.end())
      return make_error(errc::invalid_argument, "rank " + std::to_string(w->owner) + "'s snapshot of step " +
                                                    std::to_string(w->step) + " has no " + name);
    const Tensor flat = t->second.view({t->second.numel()});
    const std::int64_t total = flat.numel();
    const auto [lo, n] = w->ranges.empty() ? std::pair<std::int64_t, std::int64_t>{0, total} : w->ranges[i];
    if (lo > total - n)
      return make_error(errc::invalid_argument, "values " + std::to_string(lo) + ".." + std::to_string(lo + n) +
                                                    " of " + name + ", which has " + std::to_string(total));
    pieces.push_back({name, lo, total, flat.slice(lo, lo + n)});
  }
  return encode_snapshot_pieces(s.header(), pieces);
}

/// Places a part of a snapshot coming in parts; the snapshot once its
/// last part came (nothing before, or when the parts disagree: logged and
/// dropped). Each tensor's pieces must come in order, so a snapshot kept
/// has every value written.
std::optional<rank_snapshot> assemble(keeper_state& st, snapshot_part part) {
  const int owner = part.header.owner;
  const std::int64_t step = part.header.step;
  const auto key = std::make_pair(owner, step);
  auto drop = [&st, owner, step, key](const std::string& why) {
    spdlog::warn("rank {}: dropping rank {}'s snapshot of step {}: {}", st.setup.holder, owner, step, why);
    st.assembling.erase(key);
    return std::nullopt;
  };
  auto found = st.assembling.find(key);
  if (found == st.assembling.end()) {
    // Parts of one owner come in order, step after step: a part that finds
    // no assembly of a step already begun belongs to a dropped snapshot
    // (its rest follows) or a stale one.
    if (auto b = st.begun.find(owner); b != st.begun.end() && step <= b->second) {
      spdlog::debug("rank {}: ignoring a part of rank {}'s snapshot of step {} (dropped or stale)", st.setup.holder,
                    owner, step);
      return std::nullopt;
    }
    st.begun[owner] = step;
    // At most kept_steps snapshots of an owner in the making: the oldest
    // (whose parts stopped coming) goes.
    const auto first = st.assembling.lower_bound({owner, 0});
    std::size_t of_owner = 0;
    for (auto x = first; x != st.assembling.end() && x->first.first == owner; ++x) ++of_owner;
    if (of_owner >= kept_steps) st.assembling.erase(first);
    found = st.assembling.emplace(key, snapshot_assembly{part.header, part.parts, 0, {}}).first;
  }
  snapshot_assembly& a = found->second;
  if (a.parts != part.parts)
    return drop("its parts say " + std::to_string(a.parts) + " and " + std::to_string(part.parts) + " parts");
  try {
    for (snapshot_piece& p : part.pieces) {
      auto t = std::find_if(a.s.tensors.begin(), a.s.tensors.end(), [&](const auto& x) { return x.first == p.name; });
      if (t == a.s.tensors.end()) {
        if (p.offset != 0) return drop(p.name + " starts at value " + std::to_string(p.offset));
        if (a.s.tensors.size() >= max_snapshot_tensors)
          return drop("more than " + std::to_string(max_snapshot_tensors) + " tensors");
        a.s.tensors.emplace_back(p.name, Tensor::empty({p.total}));
        a.filled.push_back(0);
        t = std::prev(a.s.tensors.end());
      }
      const auto i = static_cast<std::size_t>(t - a.s.tensors.begin());
      if (t->second.numel() != p.total || a.filled[i] != p.offset)
        return drop(p.name + " values " + std::to_string(p.offset) + ".." +
                    std::to_string(p.offset + p.values.numel()) + " of " + std::to_string(p.total) + " after " +
                    std::to_string(a.filled[i]) + " of " + std::to_string(t->second.numel()));
      t->second.slice(p.offset, p.offset + p.values.numel()).copy_from(p.values);
      a.filled[i] += p.values.numel();
    }
  } catch (const std::exception& e) {  // room for a tensor refused
    return drop(e.what());
  }
  if (++a.came < a.parts) return std::nullopt;
  for (std::size_t i = 0; i < a.s.tensors.size(); ++i)
    if (a.filled[i] != a.s.tensors[i].second.numel())
      return drop("its " + std::to_string(a.parts) + " parts left " + a.s.tensors[i].first + " at value " +
                  std::to_string(a.filled[i]) + " of " + std::to_string(a.s.tensors[i].second.numel()));
  rank_snapshot whole = std::move(a.s);
  st.assembling.erase(found);
  return whole;
}

/// Holds `s` (the newest kept_steps steps of its owner); a buddy's copy
/// is told to the coordinator, which prints the step once every rank's is in.
void keep(keeper_state& st, rank_snapshot s, bool local) {
  auto& steps = st.held[s.owner];
  const std::int64_t step = s.step;
  const int owner = s.owner;
  steps[step] = std::move(s);
  while (steps.size() > kept_steps) steps.erase(steps.begin());
  if (local || st.setup.coordinator.empty()) return;
  auto coord = st.n->remote_actor(st.setup.coordinator, "train-coord");
  if (!coord) {
    spdlog::warn("rank {}: cannot tell the coordinator of rank {}'s snapshot of step {}: {}", st.setup.holder, owner,
                 step, error_message(coord.error()));
    return;
  }
  remote_message note;
  note.type = train_msg::kept;
  note.body = encode_body(train_step_note{step, owner, static_cast<double>(st.setup.holder), st.job});
  caf::anon_send(*coord, std::move(note));
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
        auto part = decode_snapshot_part(m);
        if (!part) {
          spdlog::warn("dropping a snapshot from {}: {}", st->setup.inbox->label_of(m.from_node),
                       error_message(part.error()));
          return remote_message{};
        }
        const rank_snapshot& h = part->header;
        const bool local = m.from_node.empty();
        if (h.job != st->job || !st->setup.owners.count(h.owner) || local != (h.owner == st->setup.holder)) {
          spdlog::warn("dropping a snapshot of rank {} (step {}) from {}: not one this rank keeps", h.owner, h.step,
                       local ? std::string("this rank") : st->setup.inbox->label_of(m.from_node));
          return remote_message{};
        }
        if (part->whole()) {
          keep(*st, std::move(*part).snapshot(), local);
        } else if (auto s = assemble(*st, std::move(*part))) {
          keep(*st, std::move(*s), local);
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
