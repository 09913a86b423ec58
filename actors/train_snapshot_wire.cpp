// actors/train_snapshot_wire.cpp — in-memory snapshots on the wire
// (actors/train_snapshot_wire.hpp).
#include "actors/train_snapshot_wire.hpp"

#include <algorithm>
#include <stdexcept>

#include "actors/capnp_body.hpp"
#include "net/codec.hpp"
#include "net/wire.capnp.h"

namespace corolla {

namespace {

/// A snapshot in more parts than this is refused.
constexpr int max_snapshot_parts = 1 << 20;
static_assert(max_snapshot_message_tensors == net::decode_limits{}.max_tensors,
              "a snapshot message carries as many tensors as a node takes");
/// A piece of a tensor larger than this (values) is refused: its keeper
/// would make room for the whole tensor.
constexpr std::int64_t max_tensor_values = std::int64_t{1} << 40;

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

/// The header every TrainSnapshot form has, read back.
rank_snapshot get_header(wire::TrainSnapshot::Reader r) {
  rank_snapshot s;
  s.owner = r.getOwner();
  s.step = r.getStep();
  s.job = r.getJob();
  if (s.owner < 0 || s.step < 1) throw std::invalid_argument("owner " + std::to_string(s.owner) + ", step " + std::to_string(s.step));
  return s;
}

}  // namespace

bool valid_snapshot_tensor_name(const std::string& n) {
  return n.rfind("params.", 0) == 0 || n.rfind("m.", 0) == 0 || n.rfind("v.", 0) == 0;
}

remote_message encode_snapshot_pieces(const rank_snapshot& s, const std::vector<snapshot_piece>& pieces, int parts) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainSnapshot>();
  set_header(r, s.owner, s.step, s.job);
  const auto n = static_cast<unsigned>(pieces.size());
  auto names = r.initNames(n);
  remote_message m;
  m.type = train_msg::snap;
  const bool whole = std::all_of(pieces.begin(), pieces.end(), [](const snapshot_piece& p) { return p.whole(); });
  for (unsigned i = 0; i < n; ++i) {
    names.set(i, pieces[i].name);
    m.tensors.push_back(pieces[i].values);
  }
  if (!whole) {
    auto offsets = r.initOffsets(n);
    auto totals = r.initTotals(n);
    for (unsigned i = 0; i < n; ++i) {
      offsets.set(i, pieces[i].offset);
      totals.set(i, pieces[i].total);
    }
  }
  set_ranges(r, s.ranges);
  r.setLossScale(s.loss_scale);
  r.setParts(parts);
  m.body = capnp_body::flat(b);
  return m;
}

bool snapshot_part::whole() const {
  return parts == 1 && std::all_of(pieces.begin(), pieces.end(), [](const snapshot_piece& p) { return p.whole(); });
}

rank_snapshot snapshot_part::snapshot() && {
  rank_snapshot s = std::move(header);
  for (snapshot_piece& p : pieces) s.tensors.emplace_back(std::move(p.name), std::move(p.values));
  return s;
}

remote_message encode_snapshot(const rank_snapshot& s) {
  std::vector<snapshot_piece> pieces;
  for (const auto& [name, t] : s.tensors) pieces.push_back({name, 0, t.numel(), t});
  return encode_snapshot_pieces(s, pieces);
}

std::vector<std::vector<value_range>> pack_values(const std::vector<std::int64_t>& sizes, std::int64_t room,
                                                  std::size_t max_ranges) {
  room = std::max<std::int64_t>(1, room);
  std::vector<std::vector<value_range>> out(1);
  std::int64_t left = room;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    std::int64_t at = 0;
    do {
      if (left == 0 || out.back().size() >= max_ranges) {
        out.emplace_back();
        left = room;
      }
      const std::int64_t take = std::min(left, sizes[t] - at);
      out.back().push_back({t, at, take});
      at += take;
      left -= take;
    } while (at < sizes[t]);
  }
  return out;
}

std::vector<remote_message> encode_snapshot_parts(const rank_snapshot& s, std::int64_t max_bytes) {
  std::vector<std::int64_t> sizes;
  std::int64_t values = 0;
  for (const auto& [name, t] : s.tensors) {
    sizes.push_back(t.numel());
    values += t.numel();
  }
  // A part's room, grown where the snapshot would need more parts than a
  // keeper takes.
  const std::int64_t room = std::max(max_bytes / static_cast<std::int64_t>(sizeof(float)),
                                     (values + max_snapshot_parts / 2 - 1) / (max_snapshot_parts / 2));
  const auto parts = pack_values(sizes, room, max_snapshot_message_tensors);
  const rank_snapshot header = s.header();
  std::vector<remote_message> out;
  for (const auto& ranges : parts) {
    std::vector<snapshot_piece> pieces;
    for (const value_range& r : ranges) {
      const auto& [name, t] = s.tensors[r.tensor];
      pieces.push_back({name, r.offset, t.numel(), t.view({t.numel()}).slice(r.offset, r.offset + r.count)});
    }
    out.push_back(encode_snapshot_pieces(header, pieces, static_cast<int>(parts.size())));
  }
  return out;
}

caf::expected<snapshot_part> decode_snapshot_part(const remote_message& m) {
  using capnp_body::text;
  return capnp_body::decode<wire::TrainSnapshot>(m.body, "TrainSnapshot", [&](wire::TrainSnapshot::Reader r) {
    snapshot_part p;
    p.header = get_header(r);
    auto names = r.getNames();
    if (names.size() > max_snapshot_tensors || names.size() != m.tensors.size())
      throw std::invalid_argument(std::to_string(names.size()) + " names for " + std::to_string(m.tensors.size()) +
                                  " tensors");
    auto offsets = r.getOffsets();
    auto totals = r.getTotals();
    const bool ranged = offsets.size() > 0 || totals.size() > 0;
    if (ranged && (offsets.size() != names.size() || totals.size() != names.size()))
      throw std::invalid_argument(std::to_string(offsets.size()) + " offsets and " + std::to_string(totals.size()) +
                                  " totals for " + std::to_string(names.size()) + " tensors");
    for (unsigned i = 0; i < names.size(); ++i) {
      std::string name = text(names[i], "tensor name");
      const Tensor& t = m.tensors[i];
      if (!valid_snapshot_tensor_name(name)) throw std::invalid_argument("tensor name '" + name + "'");
      if (t.type() != dtype::f32 || t.dev().kind != device_kind::cpu)
        throw std::invalid_argument(name + " is not an f32 host tensor");
      snapshot_piece piece{std::move(name), ranged ? offsets[i] : 0, ranged ? totals[i] : t.numel(), t};
      if (piece.offset < 0 || piece.total > max_tensor_values || piece.offset > piece.total - t.numel())
        throw std::invalid_argument("values " + std::to_string(piece.offset) + ".." +
                                    std::to_string(piece.offset + t.numel()) + " of " + piece.name + " of " +
                                    std::to_string(piece.total));
      p.pieces.push_back(std::move(piece));
    }
    p.header.ranges = get_ranges(r);
    p.header.loss_scale = text(r.getLossScale(), "loss scale");
    p.parts = std::max(1, static_cast<int>(r.getParts()));
    if (r.getParts() > max_snapshot_parts) throw std::invalid_argument(std::to_string(r.getParts()) + " parts");
    return p;
  });
}

caf::expected<rank_snapshot> decode_snapshot(const remote_message& m) {
  auto p = decode_snapshot_part(m);
  if (!p) return p.error();
  if (!p->whole())
    return make_error(errc::bad_message, "a part of rank " + std::to_string(p->header.owner) + "'s snapshot of step " +
                                             std::to_string(p->header.step) + " where a whole one was expected");
  return std::move(*p).snapshot();
}

remote_message encode_wanted(const snapshot_wanted& w) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainSnapshot>();
  set_header(r, w.owner, w.step, w.job);
  auto names = r.initNames(static_cast<unsigned>(w.names.size()));
  for (unsigned i = 0; i < w.names.size(); ++i) names.set(i, w.names[i]);
  if (!w.ranges.empty()) {
    auto offsets = r.initOffsets(static_cast<unsigned>(w.ranges.size()));
    auto sizes = r.initSizes(static_cast<unsigned>(w.ranges.size()));
    for (unsigned i = 0; i < w.ranges.size(); ++i) {
      offsets.set(i, w.ranges[i].first);
      sizes.set(i, w.ranges[i].second);
    }
  }
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
      if (!valid_snapshot_tensor_name(name)) throw std::invalid_argument("tensor name '" + name + "'");
      w.names.push_back(std::move(name));
    }
    auto offsets = r.getOffsets();
    auto sizes = r.getSizes();
    if (offsets.size() > 0 || sizes.size() > 0) {
      if (offsets.size() != w.names.size() || sizes.size() != w.names.size())
        throw std::invalid_argument(std::to_string(offsets.size()) + " offsets and " + std::to_string(sizes.size()) +
                                    " sizes for " + std::to_string(w.names.size()) + " names");
      for (unsigned i = 0; i < offsets.size(); ++i) {
        if (offsets[i] < 0 || sizes[i] < 0 || sizes[i] > max_tensor_values - offsets[i])
          throw std::invalid_argument("values " + std::to_string(offsets[i]) + " + " + std::to_string(sizes[i]));
        w.ranges.emplace_back(offsets[i], sizes[i]);
      }
    }
    return w;
  });
}

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
            if (!valid_snapshot_tensor_name(name) || sizes[t] < 0) throw std::invalid_argument("tensor '" + name + "'");
            l.tensors.emplace_back(std::move(name), sizes[t]);
          }
          l.ranges = get_ranges(e);
          l.loss_scale = capnp_body::text(e.getLossScale(), "loss scale");
          x.snapshots.push_back(std::move(l));
        }
        return x;
      });
}


}  // namespace corolla
