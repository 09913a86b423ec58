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
#include "model/error.hpp"
#include "model/safetensors.hpp"
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

/// The number after `prefix` in `name` ("h3", "step-7", "rank-2.safetensors"), or -1.
int number_after(const std::string& name, const std::string& prefix, const std::string& suffix = "") {
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0) return -1;
  if (!suffix.empty() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoi(digits);
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

rank_snapshot rank_snapshot::without_params() const {
  rank_snapshot s;
  s.owner = owner;
  s.step = step;
  s.job = job;
  s.ranges = ranges;
  s.loss_scale = loss_scale;
  for (const auto& [name, t] : tensors)
    if (name.rfind("params.", 0) != 0) s.tensors.emplace_back(name, t);
  return s;
}

remote_message encode_snapshot(const rank_snapshot& s) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainSnapshot>();
  r.setOwner(s.owner);
  r.setStep(s.step);
  r.setJob(s.job);
  auto names = r.initNames(static_cast<unsigned>(s.tensors.size()));
  remote_message m;
  m.type = train_msg::snap;
  for (unsigned i = 0; i < s.tensors.size(); ++i) {
    names.set(i, s.tensors[i].first);
    m.tensors.push_back(s.tensors[i].second);
  }
  auto ranges = r.initRanges(static_cast<unsigned>(s.ranges.size()));
  unsigned i = 0;
  for (const auto& [bucket, range] : s.ranges) {
    ranges[i].setBucket(bucket);
    ranges[i].setLo(range.lo);
    ranges[i].setHi(range.hi);
    ranges[i].setN(range.n);
    ++i;
  }
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
    for (auto x : r.getRanges()) {
      shard_range range{x.getLo(), x.getHi(), x.getN()};
      if (range.lo < 0 || range.hi < range.lo || range.n < range.hi)
        throw std::invalid_argument("a moment range " + std::to_string(range.lo) + ".." + std::to_string(range.hi) +
                                    " of " + std::to_string(range.n));
      s.ranges[text(x.getBucket(), "bucket")] = range;
    }
    s.loss_scale = text(r.getLossScale(), "loss scale");
    return s;
  });
  return head;
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

caf::behavior snapshot_keeper(caf::event_based_actor*, std::shared_ptr<keeper_state> st) {
  return {
      [st](remote_message& m) {
        if (m.type != train_msg::snap) return;
        // A snapshot from another process must come from a rank of the job.
        if (!m.from_node.empty() && !st->setup.inbox->named(m.from_node)) {
          spdlog::warn("dropping a snapshot from node {}, which is not part of this job", m.from_node);
          return;
        }
        auto s = decode_snapshot(m);
        if (!s) {
          spdlog::warn("dropping a snapshot from {}: {}", st->setup.inbox->label_of(m.from_node), error_message(s.error()));
          return;
        }
        const bool local = m.from_node.empty();
        if (s->job != st->job || !st->setup.owners.count(s->owner) || local != (s->owner == st->setup.holder)) {
          spdlog::warn("dropping a snapshot of rank {} (step {}) from {}: not one this rank keeps", s->owner, s->step,
                       local ? std::string("this rank") : st->setup.inbox->label_of(m.from_node));
          return;
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
            return;
          }
          remote_message note;
          note.type = train_msg::kept;
          note.body = encode_body(train_step_note{step, owner, static_cast<double>(st->setup.holder), st->job});
          caf::anon_send(*coord, std::move(note));
        }
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
  if (auto err = n.publish("train-snap", a)) {
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

void flush_snapshot_keeper(node& n, const caf::actor& keeper, const std::string& label) {
  caf::scoped_actor self{n.system()};
  self->request(keeper, std::chrono::seconds(60), snap_msg::flush_atom::value)
      .receive(
          [&](std::string& e) {
            if (!e.empty()) spdlog::error("{}: flushing its snapshots failed: {}", label, e);
          },
          [&](caf::error& e) { spdlog::error("{}: flushing its snapshots failed: {}", label, to_string(e)); });
}

// ---- recovery --------------------------------------------------------------------------

fs::path memory_snapshot_dir(const fs::path& checkpoint_dir) { return checkpoint_dir / "memory"; }

bool snapshots_flushed(const fs::path& checkpoint_dir, int holder) {
  std::error_code ec;
  return fs::exists(memory_snapshot_dir(checkpoint_dir) / ("h" + std::to_string(holder)) / "flushed", ec);
}

memory_recovery commit_memory_snapshots(const fs::path& checkpoint_dir, int world, int n_layers, const std::string& job,
                                        const std::string& layout, int newest) {
  memory_recovery out;
  const fs::path mem = memory_snapshot_dir(checkpoint_dir);
  struct remover {
    fs::path p;
    ~remover() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{mem};
  // step -> owner -> files; the owner's own copy first (it holds its parameters).
  std::map<int, std::map<int, std::vector<fs::path>>> found;
  std::error_code ec;
  for (const auto& h : fs::directory_iterator(mem, ec)) {
    const int holder = number_after(h.path().filename().string(), "h");
    if (holder < 0) continue;
    ++out.holders;
    std::error_code ec2;
    for (const auto& sd : fs::directory_iterator(h.path(), ec2)) {
      const int step = number_after(sd.path().filename().string(), "step-");
      if (step < 1) continue;
      std::error_code ec3;
      for (const auto& f : fs::directory_iterator(sd.path(), ec3)) {
        const int owner = number_after(f.path().filename().string(), "rank-", ".safetensors");
        if (owner < 0 || owner >= world) continue;
        auto& files = found[step][owner];
        if (owner == holder)
          files.insert(files.begin(), f.path());
        else
          files.push_back(f.path());
      }
    }
  }
  if (found.empty()) {
    out.why_not = "no rank flushed a snapshot";
    return out;
  }
  const int latest = latest_checkpoint_step(checkpoint_dir);
  const fs::path staging = mem / "assembled";
  std::string why;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    const int step = it->first;
    if (newest >= 0 && step > newest) {
      why += (why.empty() ? "" : "; ") + std::string("step ") + std::to_string(step) + ": after the last step printed, " +
             std::to_string(newest);
      continue;
    }
    if (step <= latest) {
      why += (why.empty() ? "" : "; ") + std::string("the checkpoint of step ") + std::to_string(latest) +
             " is as new as any snapshot left";
      break;
    }
    std::string missing;
    for (int r = 0; r < world; ++r)
      if (!it->second.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    if (!missing.empty()) {
      why += (why.empty() ? "" : "; ") + std::string("step ") + std::to_string(step) + ": no snapshot of rank(s) " + missing;
      continue;
    }
    // Assemble: one shard per rank, the manifest; then check that the
    // pieces tile every bucket and every bucket's parameters are there.
    fs::remove_all(checkpoint_step_dir(staging, step), ec);
    fs::create_directories(checkpoint_step_dir(staging, step), ec);
    if (ec) throw train_error("cannot create " + checkpoint_step_dir(staging, step).string() + ": " + ec.message());
    std::optional<loss_scale_state> scale;
    std::string bad;
    for (const auto& [owner, files] : it->second) {
      const fs::path dst = checkpoint_step_dir(staging, step) / shard_file_name(owner);
      fs::rename(files.front(), dst, ec);
      if (ec) throw train_error("cannot move " + files.front().string() + ": " + ec.message());
      try {
        const auto meta = safetensors_file::open(dst)->metadata();
        if (const auto s = meta.find("loss_scale"); s != meta.end() && !scale) {
          loss_scale_state x;
          std::istringstream in(s->second);
          if (!(in >> x.scale >> x.good_steps >> x.skipped)) throw model_error("a malformed loss_scale '" + s->second + "'");
          scale = x;
        }
      } catch (const model_error& e) {
        bad = e.what();
      }
    }
    if (bad.empty()) {
      commit_checkpoint(staging, step, world, job, layout, scale ? &*scale : nullptr);
      try {
        const checkpoint_shards shards(staging, step);
        for (int b = -1; b < n_layers && bad.empty(); ++b)
          if (!shards.has_params(bucket_name(b == -1 ? head_bucket : b)))
            bad = "no snapshot holds the parameters of " + bucket_name(b == -1 ? head_bucket : b);
      } catch (const train_error& e) {
        bad = e.what();
      }
    }
    if (!bad.empty()) {
      why += (why.empty() ? "" : "; ") + std::string("step ") + std::to_string(step) + ": " + bad;
      continue;
    }
    const fs::path target = checkpoint_step_dir(checkpoint_dir, step);
    fs::remove_all(target, ec);  // shards of a checkpoint of this step that was never committed
    fs::rename(checkpoint_step_dir(staging, step), target, ec);
    if (ec) throw train_error("cannot move the assembled snapshots to " + target.string() + ": " + ec.message());
    commit_checkpoint(checkpoint_dir, step, world, job, layout, scale ? &*scale : nullptr);
    out.step = step;
    out.bytes = checkpoint_shard_bytes(checkpoint_dir, step);
    return out;
  }
  out.why_not = why;
  return out;
}

}  // namespace corolla
