#include "actors/train_wire.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "actors/capnp_body.hpp"
#include "actors/train_job.hpp"
#include "net/wire.capnp.h"

namespace corolla {

using capnp_body::decode;
using capnp_body::flat;
using capnp_body::text;

namespace {

/// Rosters longer than this are refused (a job of more ranks is not one
/// this runtime launches).
constexpr unsigned max_roster = 4096;
/// Job keys list every stage boundary: they outgrow a plain text field.
constexpr std::size_t max_job_key = 64 * 1024;

}  // namespace

std::vector<std::uint8_t> encode_body(const train_join& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainJoin>();
  r.setRank(v.rank);
  r.setWorld(v.world);
  r.setEndpoint(v.endpoint);
  r.setJobKey(v.job_key);
  return flat(b);
}

std::vector<std::uint8_t> encode_body(const train_roster& roster) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainRoster>();
  r.setJob(roster.job);
  auto peers = r.initPeers(static_cast<unsigned>(roster.peers.size()));
  for (unsigned i = 0; i < roster.peers.size(); ++i) {
    peers[i].setRank(roster.peers[i].rank);
    peers[i].setNodeId(roster.peers[i].node_id);
    peers[i].setEndpoint(roster.peers[i].endpoint);
  }
  return flat(b);
}

std::vector<std::uint8_t> encode_body(const train_packet& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainPacket>();
  r.setStep(v.step);
  r.setIndex(v.index);
  r.setHop(v.hop);
  r.setFrom(v.from);
  r.setJob(v.job);
  r.setLo(v.lo);
  r.setHi(v.hi);
  return flat(b);
}

std::vector<std::uint8_t> encode_body(const train_report& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainReport>();
  r.setRank(v.rank);
  r.setStep(v.step);
  r.setLoss(v.loss);
  r.setSumSquares(v.sum_squares);
  r.setJob(v.job);
  r.setComputeS(v.compute_s);
  r.setRingsSideBySide(v.rings_side_by_side);
  r.setUpdatesSideBySide(v.updates_side_by_side);
  auto links = r.initLinks(static_cast<unsigned>(v.links.size()));
  for (std::size_t i = 0; i < v.links.size(); ++i) {
    links[static_cast<unsigned>(i)].setPeer(v.links[i].to);
    links[static_cast<unsigned>(i)].setBytesPerS(v.links[i].bandwidth);
  }
  return flat(b);
}

std::vector<std::uint8_t> encode_body(const train_step_note& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainStep>();
  r.setStep(v.step);
  r.setRank(v.rank);
  r.setValue(v.value);
  r.setJob(v.job);
  r.setSnapshotEvery(v.snapshot_every);
  return flat(b);
}

std::vector<std::uint8_t> encode_abort_body(const std::string& reason, std::uint64_t job) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainAbort>();
  r.setReason(reason.substr(0, 4096));
  r.setJob(job);
  return flat(b);
}

caf::expected<train_join> decode_train_join(const std::vector<std::uint8_t>& body) {
  return decode<wire::TrainJoin>(body, "TrainJoin", [](wire::TrainJoin::Reader r) {
    return train_join{r.getRank(), r.getWorld(), text(r.getEndpoint(), "endpoint"),
                      text(r.getJobKey(), "job key", max_job_key)};
  });
}

caf::expected<train_roster> decode_train_roster(const std::vector<std::uint8_t>& body) {
  return decode<wire::TrainRoster>(body, "TrainRoster", [](wire::TrainRoster::Reader r) {
    auto peers = r.getPeers();
    if (peers.size() > max_roster)
      throw std::invalid_argument("roster of " + std::to_string(peers.size()) + " ranks");
    train_roster out;
    out.job = r.getJob();
    out.peers.reserve(peers.size());
    for (auto p : peers)
      out.peers.push_back({p.getRank(), text(p.getNodeId(), "node id"), text(p.getEndpoint(), "endpoint")});
    return out;
  });
}

caf::expected<train_packet> decode_train_packet(const std::vector<std::uint8_t>& body) {
  return decode<wire::TrainPacket>(body, "TrainPacket", [](wire::TrainPacket::Reader r) {
    train_packet p{r.getStep(), r.getIndex(), r.getHop(), r.getFrom(), r.getJob(), r.getLo(), r.getHi()};
    if (p.lo < 0 || p.hi < p.lo)
      throw std::invalid_argument("a range of values [" + std::to_string(p.lo) + ", " + std::to_string(p.hi) + ")");
    return p;
  });
}

caf::expected<train_report> decode_train_report(const std::vector<std::uint8_t>& body) {
  return decode<wire::TrainReport>(body, "TrainReport", [](wire::TrainReport::Reader r) {
    auto links = r.getLinks();
    if (links.size() > max_roster) throw std::invalid_argument("report of " + std::to_string(links.size()) + " links");
    train_report out{r.getRank(), r.getStep(), r.getLoss(), r.getSumSquares(), r.getJob()};
    for (auto l : links) {
      const double rate = l.getBytesPerS();
      if (!std::isfinite(rate) || rate < 0) throw std::invalid_argument("a link rate of " + std::to_string(rate));
      out.links.push_back({out.rank, l.getPeer(), rate});
    }
    out.compute_s = r.getComputeS();
    if (!std::isfinite(out.compute_s) || out.compute_s < 0)
      throw std::invalid_argument("compute seconds of " + std::to_string(out.compute_s));
    out.rings_side_by_side = r.getRingsSideBySide();
    if (out.rings_side_by_side < 0 || out.rings_side_by_side > max_rings_at_once)
      throw std::invalid_argument(std::to_string(out.rings_side_by_side) + " rings side by side");
    out.updates_side_by_side = r.getUpdatesSideBySide();
    if (out.updates_side_by_side < 0 || out.updates_side_by_side > max_rings_at_once)
      throw std::invalid_argument(std::to_string(out.updates_side_by_side) + " updates side by side");
    return out;
  });
}

caf::expected<train_step_note> decode_train_step(const std::vector<std::uint8_t>& body) {
  return decode<wire::TrainStep>(body, "TrainStep", [](wire::TrainStep::Reader r) {
    return train_step_note{r.getStep(), r.getRank(), r.getValue(), r.getJob(), r.getSnapshotEvery()};
  });
}

caf::expected<train_abort> decode_train_abort(const std::vector<std::uint8_t>& body) {
  return decode<wire::TrainAbort>(body, "TrainAbort", [](wire::TrainAbort::Reader r) {
    std::string reason = r.getReason().cStr();
    return train_abort{reason.substr(0, 4096), r.getJob()};
  });
}

std::vector<std::uint8_t> encode_body(const schedule::rank_activity& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainWaits>();
  r.setRank(v.rank);
  r.setComputing(v.computing.substr(0, 256));
  r.setComputingS(v.computing_s);
  r.setProgress(v.progress);
  const std::size_t n = std::min<std::size_t>(v.waits.size(), max_roster);
  auto waits = r.initWaits(static_cast<unsigned>(n));
  for (std::size_t i = 0; i < n; ++i) {
    auto w = waits[static_cast<unsigned>(i)];
    w.setWhat(v.waits[i].what.substr(0, 512));
    w.setFrom(v.waits[i].from);
    w.setSeconds(v.waits[i].seconds);
  }
  return flat(b);
}

caf::expected<schedule::rank_activity> decode_rank_activity(const std::vector<std::uint8_t>& body) {
  return decode<wire::TrainWaits>(body, "TrainWaits", [](wire::TrainWaits::Reader r) {
    auto seconds = [](double s, const char* what) {
      if (!std::isfinite(s) || s < 0) throw std::invalid_argument(std::string(what) + " of " + std::to_string(s) + " s");
      return s;
    };
    schedule::rank_activity out;
    out.rank = r.getRank();
    out.answered = true;
    out.computing = text(r.getComputing(), "compute call", 256);
    out.computing_s = seconds(r.getComputingS(), "a compute call");
    out.progress = r.getProgress();
    auto waits = r.getWaits();
    if (waits.size() > max_roster) throw std::invalid_argument(std::to_string(waits.size()) + " waits");
    for (auto w : waits) {
      if (w.getFrom() < schedule::from_coordinator) throw std::invalid_argument("a wait from " + std::to_string(w.getFrom()));
      out.waits.push_back({text(w.getWhat(), "wait", 512), w.getFrom(), seconds(w.getSeconds(), "a wait")});
    }
    return out;
  });
}

}  // namespace corolla
