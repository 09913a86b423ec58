// In-memory snapshots of elastic training (actors/train_snapshots.hpp):
// who keeps whose, the wire form, the keeper actor (what it accepts, what
// it keeps, what a flush writes), and the launcher's assembly of the newest
// complete step into a committed checkpoint.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <caf/all.hpp>

#include "actors/capnp_body.hpp"
#include "actors/corolla.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_snapshot_wire.hpp"
#include "actors/train_snapshots.hpp"
#include "actors/train_store.hpp"
#include "model/safetensors.hpp"
#include "net/wire.capnp.h"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
namespace fs = std::filesystem;

namespace {

Tensor values(std::vector<float> v) { return Tensor::from_f32(v, {static_cast<std::int64_t>(v.size())}); }

/// Rank `owner`'s snapshot of a dp = 2, pp = 1 job over buckets block.0 and
/// the head (4 values each): owner r holds moment values [2r, 2r + 2).
rank_snapshot snapshot_of(int owner, int step, std::uint64_t job, float base) {
  rank_snapshot s;
  s.owner = owner;
  s.step = step;
  s.job = job;
  for (const std::string bucket : {"block.0", "head"}) {
    s.tensors.emplace_back("params." + bucket, values({base, base + 1, base + 2, base + 3}));
    s.tensors.emplace_back("m." + bucket, values({base + 10 * owner, base + 10 * owner + 1}));
    s.tensors.emplace_back("v." + bucket, values({base + 20 * owner, base + 20 * owner + 1}));
    s.ranges[bucket] = {2 * owner, 2 * owner + 2, 4};
  }
  return s;
}

std::unique_ptr<node> start_test_node() {
  auto n = node::start(node_options{});
  if (!n) FAIL(error_message(n.error()));
  return std::move(*n);
}

/// The keeper of rank 1 of a 1x2 job (it keeps ranks 0 and 1) on `holder`,
/// of run 42, flushing under `dir`; `peer` is rank 0's node.
caf::actor start_rank1_keeper(node& holder, const node& peer, const fs::path& dir) {
  auto inbox = std::make_shared<train_inbox>();
  inbox->name_peer(peer.id(), "rank 0 (stage 0, replica 0)");
  snapshot_keeper_setup setup;
  setup.holder = 1;
  setup.owners = snapshot_owners(even_layout(2, 1, 2), 1);  // {0, 1}
  setup.inbox = inbox;
  setup.dir = dir;
  auto keeper = start_snapshot_keeper(holder, setup, 42);
  REQUIRE(keeper);
  return *keeper;
}

std::string flush(node& n, const caf::actor& keeper) {
  std::string out = "no answer";
  caf::scoped_actor self{n.system()};
  self->request(keeper, std::chrono::seconds(30), snap_msg::flush_atom::value)
      .receive([&](std::string& e) { out = e; }, [&](caf::error& e) { out = to_string(e); });
  return out;
}

}  // namespace

TEST_CASE("snapshot buddies: the next replica of the stage, else the next stage's first replica") {
  const train_layout l22 = even_layout(4, 2, 2);
  CHECK(snapshot_buddy(l22, 0) == 1);
  CHECK(snapshot_buddy(l22, 1) == 0);
  CHECK(snapshot_buddy(l22, 2) == 3);
  CHECK(snapshot_buddy(l22, 3) == 2);
  CHECK_FALSE(buddy_needs_params(l22, 0));  // the replica holds the same parameters
  const train_layout l13 = even_layout(4, 1, 3);
  CHECK(snapshot_buddy(l13, 2) == 0);
  CHECK(snapshot_owners(l13, 0) == std::set<int>{0, 2});
  const train_layout l31 = even_layout(3, 3, 1);
  CHECK(snapshot_buddy(l31, 0) == 1);
  CHECK(snapshot_buddy(l31, 2) == 0);  // the last stage's copy goes to the first
  CHECK(buddy_needs_params(l31, 2));
  CHECK(snapshot_owners(l31, 1) == std::set<int>{0, 1});
  CHECK(snapshot_buddy(even_layout(2, 1, 1), 0) == -1);
}

TEST_CASE("a snapshot round-trips as a train.snap message, and malformed ones are bad_message") {
  rank_snapshot s = snapshot_of(1, 7, 42, 0.5f);
  s.loss_scale = "65536 3 1";
  const remote_message m = encode_snapshot(s);
  CHECK(m.type == train_msg::snap);
  auto back = decode_snapshot(m);
  REQUIRE(back);
  CHECK(back->owner == 1);
  CHECK(back->step == 7);
  CHECK(back->job == 42u);
  CHECK(back->loss_scale == "65536 3 1");
  REQUIRE(back->tensors.size() == s.tensors.size());
  CHECK(back->tensors[1].first == "m.block.0");
  CHECK(back->tensors[1].second.to_vector() == std::vector<float>{10.5f, 11.5f});
  CHECK(back->ranges.at("head").lo == 2);
  CHECK(back->bytes() == s.bytes());
  CHECK(s.without_params().tensors.size() == 4u);

  remote_message fewer = m;
  fewer.tensors.pop_back();  // a name without its tensor
  CHECK_FALSE(decode_snapshot(fewer));
  rank_snapshot bad_name = s;
  bad_name.tensors[0].first = "../../etc/passwd";
  CHECK_FALSE(decode_snapshot(encode_snapshot(bad_name)));
  rank_snapshot bad_range = s;
  bad_range.ranges["head"] = {3, 2, 4};
  CHECK_FALSE(decode_snapshot(encode_snapshot(bad_range)));
  remote_message garbage = m;
  garbage.body.assign(24, 0xff);
  CHECK_FALSE(decode_snapshot(garbage));
}

TEST_CASE("a snapshot larger than a message goes in parts of bounded size, tensors split where a part's room ends, "
          "and parts that lie about their pieces are bad_message") {
  rank_snapshot s = snapshot_of(0, 9, 42, 3);  // 4 + 2 + 2 values per bucket, 16 in all
  s.loss_scale = "1024 0 0";
  // 12 bytes: three values a part, so params.block.0 (4 values) spans two.
  const auto parts = encode_snapshot_parts(s, 12);
  REQUIRE(parts.size() == 6u);
  std::map<std::string, std::vector<float>> rebuilt;
  for (const remote_message& m : parts) {
    std::int64_t in_part = 0;
    auto p = decode_snapshot_part(m);
    REQUIRE(p);
    CHECK(p->parts == 6);
    CHECK_FALSE(p->whole());
    CHECK(p->header.owner == 0);
    CHECK(p->header.step == 9);
    CHECK(p->header.loss_scale == "1024 0 0");
    CHECK(p->header.ranges.at("head").hi == 2);
    for (const snapshot_piece& piece : p->pieces) {
      auto& t = rebuilt[piece.name];
      t.resize(static_cast<std::size_t>(piece.total));
      const auto v = piece.values.to_vector();
      std::copy(v.begin(), v.end(), t.begin() + piece.offset);
      in_part += piece.values.numel();
    }
    CHECK(in_part <= 3);
    CHECK_FALSE(decode_snapshot(m));  // a part is not a snapshot
  }
  REQUIRE(rebuilt.size() == s.tensors.size());
  for (const auto& [name, t] : s.tensors) CHECK(rebuilt.at(name) == t.to_vector());
  // Room for everything: one message, a whole snapshot.
  const auto one = encode_snapshot_parts(s, 1 << 20);
  REQUIRE(one.size() == 1u);
  auto whole = decode_snapshot(one[0]);
  REQUIRE(whole);
  CHECK(whole->tensors.size() == s.tensors.size());

  // The packing itself: a message's room in values and its count of
  // ranges both end a message; nothing to pack is one empty message.
  const auto packed = pack_values({5, 0, 2}, 3, 64);
  REQUIRE(packed.size() == 3u);
  CHECK(packed[0].size() == 1u);
  CHECK(packed[0][0].count == 3);
  CHECK(packed[1].size() == 3u);  // 5's last two, the empty tensor, 2's first
  CHECK(packed[1][0].offset == 3);
  CHECK(packed[1][1].count == 0);
  CHECK(packed[1][2].tensor == 2u);
  CHECK(packed[2][0].offset == 1);
  const auto many = pack_values(std::vector<std::int64_t>(70, 1), 1 << 20, 64);
  REQUIRE(many.size() == 2u);
  CHECK(many[0].size() == 64u);
  CHECK(many[1].size() == 6u);
  const auto none = pack_values({}, 3, 64);
  REQUIRE(none.size() == 1u);
  CHECK(none[0].empty());

  // A piece past its tensor's end, and offsets without totals, are refused.
  auto piece_message = [&](std::int64_t offset, std::int64_t total, bool totals) {
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::TrainSnapshot>();
    r.setOwner(0);
    r.setStep(9);
    r.setJob(42);
    r.initNames(1).set(0, "m.head");
    r.initOffsets(1).set(0, offset);
    if (totals) r.initTotals(1).set(0, total);
    r.setParts(2);
    remote_message m;
    m.type = train_msg::snap;
    m.body = capnp_body::flat(b);
    m.tensors.push_back(values({1, 2}));
    return m;
  };
  CHECK(decode_snapshot_part(piece_message(2, 4, true)));
  CHECK_FALSE(decode_snapshot_part(piece_message(3, 4, true)));
  CHECK_FALSE(decode_snapshot_part(piece_message(-1, 4, true)));
  CHECK_FALSE(decode_snapshot_part(piece_message(0, 4, false)));
}

TEST_CASE("a keeper's index round-trips as a train.snaps message, and malformed ones are bad_message") {
  snapshot_index x;
  x.holder = 2;
  snapshot_listing l;
  l.owner = 1;
  l.step = 7;
  l.job = 42;
  l.tensors = {{"params.head", 4}, {"m.block.0", 2}};
  l.ranges["block.0"] = {0, 2, 4};
  l.loss_scale = "65536 3 1";
  x.snapshots = {l};
  const remote_message m = encode_snapshot_index(x);
  CHECK(m.type == train_msg::snaps);
  auto back = decode_snapshot_index(m);
  REQUIRE(back);
  CHECK(back->holder == 2);
  REQUIRE(back->snapshots.size() == 1u);
  CHECK(back->snapshots[0].owner == 1);
  CHECK(back->snapshots[0].step == 7);
  CHECK(back->snapshots[0].job == 42u);
  CHECK(back->snapshots[0].tensors == l.tensors);
  CHECK(back->snapshots[0].ranges.at("block.0").hi == 2);
  CHECK(back->snapshots[0].loss_scale == "65536 3 1");
  CHECK(back->snapshots[0].bytes() == 6 * sizeof(float));

  auto refused = [](const remote_message& bad) {
    auto r = decode_snapshot_index(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error() == make_error(errc::bad_message, ""));
  };
  remote_message other = m;
  other.type = train_msg::snap;  // not an index
  refused(other);
  remote_message garbage = m;
  garbage.body.assign(24, 0xff);
  refused(garbage);
  auto with = [&](auto change) {
    snapshot_index y = x;
    change(y.snapshots[0]);
    return encode_snapshot_index(y);
  };
  refused(with([](snapshot_listing& y) { y.tensors[0].first = "../../etc/passwd"; }));
  refused(with([](snapshot_listing& y) { y.tensors[1].second = -1; }));
  refused(with([](snapshot_listing& y) { y.step = 0; }));
  refused(with([](snapshot_listing& y) { y.owner = -3; }));
  refused(with([](snapshot_listing& y) { y.ranges["block.0"] = {3, 2, 4}; }));
  // Names and sizes that do not pair up.
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainSnapshotIndex>();
  auto e = r.initSnapshots(1)[0];
  e.setOwner(1);
  e.setStep(7);
  e.initNames(2).set(0, "params.head");
  e.initSizes(1).set(0, 4);
  remote_message unpaired;
  unpaired.type = train_msg::snaps;
  unpaired.body = capnp_body::flat(b);
  refused(unpaired);
}

TEST_CASE("a keeper holds the two newest snapshots of the owners it keeps, only from the job, and flushes them as "
          "checkpoint shards") {
  testing::temp_dir_guard tmp("snapshot-keeper");
  auto holder = start_test_node();
  auto peer = start_test_node();
  auto keeper = start_rank1_keeper(*holder, *peer, tmp / "memory");
  // Its own snapshot comes from this process.
  caf::anon_send(keeper, encode_snapshot(snapshot_of(1, 3, 42, 1)));

  auto connected = peer->connect(holder->endpoint());
  REQUIRE(connected);
  auto remote = peer->remote_actor(holder->id(), snapshot_keeper_name(42));
  REQUIRE(remote);
  caf::anon_send(*remote, encode_snapshot(snapshot_of(0, 1, 42, 0)));
  caf::anon_send(*remote, encode_snapshot(snapshot_of(1, 2, 42, 0)));   // rank 1's is its own business
  caf::anon_send(*remote, encode_snapshot(snapshot_of(0, 2, 7, 0)));    // another run
  caf::anon_send(*remote, encode_snapshot(snapshot_of(0, 2, 42, 0)));
  caf::anon_send(*remote, encode_snapshot(snapshot_of(0, 3, 42, 0)));   // step 1 goes: two are kept

  const fs::path h = tmp / "memory" / "h1";
  // The peer's messages arrive in order: once step 3 is on disk, all were seen.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!fs::exists(checkpoint_step_dir(h, 3) / shard_file_name(0)) && std::chrono::steady_clock::now() < deadline) {
    CHECK(flush(*holder, keeper) == "");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(fs::exists(checkpoint_step_dir(h, 3) / shard_file_name(0)));
  // What the keeper holds now, alone (a flush above may have caught step 1
  // while it was still among the two newest).
  fs::remove_all(h);
  CHECK(flush(*holder, keeper) == "");
  CHECK(fs::exists(h / "flushed"));
  CHECK(fs::exists(checkpoint_step_dir(h, 3) / shard_file_name(1)));
  CHECK(fs::exists(checkpoint_step_dir(h, 2) / shard_file_name(0)));
  CHECK_FALSE(fs::exists(checkpoint_step_dir(h, 1)));                     // older than the two kept
  CHECK_FALSE(fs::exists(checkpoint_step_dir(h, 2) / shard_file_name(1)));  // a peer cannot speak for the holder
  auto f = safetensors_file::open(checkpoint_step_dir(h, 3) / shard_file_name(0));
  CHECK(f->metadata().at("range.head") == "0 2 4");
  CHECK(f->metadata().at("holder") == "1");
  holder->unpublish(snapshot_keeper_name(42));
  caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
}

TEST_CASE("a keeper holds a snapshot that came in parts once its last part came, and serves it in ranges: a fetch "
          "of small pieces equals the snapshot") {
  auto holder = start_test_node();
  auto peer = start_test_node();
  auto keeper = start_rank1_keeper(*holder, *peer, {});
  REQUIRE(peer->connect(holder->endpoint()));
  auto remote = peer->remote_actor(holder->id(), snapshot_keeper_name(42));
  REQUIRE(remote);
  const auto timeout = std::chrono::seconds(30);
  auto index_of = [&] {
    auto x = fetch_snapshot_index(*peer, holder->id(), 42, timeout);
    REQUIRE(x);
    return *x;
  };
  const rank_snapshot s = snapshot_of(0, 5, 42, 7);
  auto parts = encode_snapshot_parts(s, 12);  // six parts
  REQUIRE(parts.size() == 6u);
  // All but the last: not held yet (the peer's messages arrive in order,
  // so an index asked after a later whole snapshot saw them).
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) caf::anon_send(*remote, parts[i]);
  caf::anon_send(*remote, encode_snapshot(snapshot_of(0, 4, 42, 1)));
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (index_of().snapshots.empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(index_of().snapshots.size() == 1u);
  CHECK(index_of().snapshots[0].step == 4);
  caf::anon_send(*remote, parts.back());
  deadline = std::chrono::steady_clock::now() + timeout;
  while (index_of().snapshots.size() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const snapshot_index x = index_of();
  REQUIRE(x.snapshots.size() == 2u);
  CHECK(x.snapshots[1].step == 5);
  CHECK(x.snapshots[1].bytes() == s.bytes());

  // Fetched in requests of 8 bytes (two values): the same tensors.
  auto fetched = fetch_snapshot(*peer, holder->id(), 42, 0, 5, {}, timeout, 8);
  REQUIRE(fetched);
  REQUIRE(fetched->tensors.size() == s.tensors.size());
  for (std::size_t i = 0; i < s.tensors.size(); ++i) {
    CHECK(fetched->tensors[i].first == s.tensors[i].first);
    CHECK(fetched->tensors[i].second.to_vector() == s.tensors[i].second.to_vector());
  }
  CHECK(fetched->ranges.at("head").hi == 2);
  auto one = fetch_snapshot(*peer, holder->id(), 42, 0, 5, {"params.head"}, timeout, 12);
  REQUIRE(one);
  REQUIRE(one->tensors.size() == 1u);
  CHECK(one->tensors[0].second.to_vector() == std::vector<float>{7, 8, 9, 10});
  // A ranged request past a tensor's end is refused by the keeper.
  snapshot_wanted past{0, 5, 42, {"params.head"}, {{2, 3}}};
  auto refused = peer->request(holder->id(), snapshot_keeper_name(42), encode_wanted(past), timeout);
  REQUIRE_FALSE(refused);
  CHECK(error_message(refused.error()).find("of params.head, which has 4") != std::string::npos);

  // Parts that disagree on how many there are: dropped, nothing held.
  auto six = encode_snapshot_parts(snapshot_of(0, 6, 42, 2), 12);
  auto two = encode_snapshot_parts(snapshot_of(0, 6, 42, 2), 32);
  REQUIRE(two.size() == 2u);
  caf::anon_send(*remote, six[0]);
  caf::anon_send(*remote, two[1]);
  for (std::size_t i = 1; i < six.size(); ++i) caf::anon_send(*remote, six[i]);
  caf::anon_send(*remote, two[0]);
  // Two parts whose pieces overlap (m.head's values 0..1 twice, 2..3
  // never): as many values as the tensor has, but not all of them; dropped.
  rank_snapshot head8 = snapshot_of(0, 8, 42, 1).header();
  caf::anon_send(*remote, encode_snapshot_pieces(head8, {{"m.head", 0, 4, values({1, 2})}}, 2));
  caf::anon_send(*remote, encode_snapshot_pieces(head8, {{"m.head", 0, 4, values({1, 2})}}, 2));
  caf::anon_send(*remote, encode_snapshot(snapshot_of(0, 7, 42, 1)));  // seen once these were
  deadline = std::chrono::steady_clock::now() + timeout;
  auto steps_held = [&] {
    std::set<std::int64_t> out;
    for (const snapshot_listing& l : index_of().snapshots) out.insert(l.step);
    return out;
  };
  while (!steps_held().count(7) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(steps_held() == std::set<std::int64_t>{5, 7});
  holder->unpublish(snapshot_keeper_name(42));
  caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
}

TEST_CASE("the launcher commits the newest step every rank's snapshot survived, and falls back when none is complete") {
  testing::temp_dir_guard tmp("snapshot-commit");
  const fs::path ck = tmp / "ck";
  const fs::path mem = memory_snapshot_dir(ck);
  // n_layers = 1: buckets block.0 and the head. Holder 0 flushed steps 4
  // and 5 of itself and step 4 of rank 1 (rank 1 died before its step-5
  // copy arrived); holder 1 is gone.
  auto flushed = [&](int holder, int owner, int step, bool params, const std::string& scale = "") {
    rank_snapshot s = snapshot_of(owner, step, 1, static_cast<float>(step));
    if (!params) s = s.without_params();
    std::map<std::string, std::string> meta;
    if (!scale.empty()) meta["loss_scale"] = scale;
    write_shard(mem / ("h" + std::to_string(holder)), step, owner, s.tensors, s.ranges, meta);
  };
  flushed(0, 0, 4, true, "1024 5 2");
  flushed(0, 0, 5, true);
  flushed(0, 1, 4, false);
  const memory_recovery rec = commit_memory_snapshots(ck, 2, {"head", "block.0"}, "job-key", "1x2 [0,1)");
  CHECK(rec.step == 4);
  CHECK(rec.holders == 1);
  CHECK(rec.bytes > 0);
  CHECK(latest_checkpoint_step(ck) == 4);
  CHECK(checkpoint_layout(ck, 4) == "1x2 [0,1)");
  check_manifest(ck, 4, "job-key");
  const auto scale = checkpoint_loss_scale(ck, 4);
  REQUIRE(scale);
  CHECK(scale->scale == 1024);
  CHECK(scale->skipped == 2);
  {
    const checkpoint_shards shards(ck, 4);
    Tensor m = Tensor::zeros({4});
    shards.read_moment("m", "head", 0, 4, m);
    CHECK(m.to_vector() == std::vector<float>{4, 5, 14, 15});  // rank 1's half from its buddy's copy
    Tensor p = Tensor::zeros({4});
    shards.read_params("block.0", p);
    CHECK(p.to_vector() == std::vector<float>{4, 5, 6, 7});
  }
  CHECK_FALSE(fs::exists(mem));  // flushed files go either way

  // Both copies of rank 1 lost: nothing newer than the checkpoint is complete.
  flushed(0, 0, 6, true);
  const memory_recovery none = commit_memory_snapshots(ck, 2, {"head", "block.0"}, "job-key", "1x2 [0,1)");
  CHECK(none.step == 0);
  CHECK(none.why_not.find("step 6: no snapshot of rank(s) 1") != std::string::npos);
  CHECK(latest_checkpoint_step(ck) == 4);
  // Moments of every rank but no parameters of the head anywhere.
  flushed(0, 1, 7, false);
  {
    rank_snapshot s = snapshot_of(0, 7, 1, 7).without_params();
    s.tensors.emplace_back("params.block.0", values({1, 2, 3, 4}));
    write_shard(mem / "h0", 7, 0, s.tensors, s.ranges);
  }
  const memory_recovery partial = commit_memory_snapshots(ck, 2, {"head", "block.0"}, "job-key", "1x2 [0,1)");
  CHECK(partial.step == 0);
  CHECK(partial.why_not.find("parameters of head") != std::string::npos);
  CHECK(latest_checkpoint_step(ck) == 4);
  // Steps 9 and 10 complete, but only step 9 was printed: 10 is not used
  // (its loss was never shown, the next grid would start after it).
  for (int step : {9, 10}) {
    flushed(0, 0, step, true);
    flushed(0, 1, step, false);
  }
  const memory_recovery printed = commit_memory_snapshots(ck, 2, {"head", "block.0"}, "job-key", "1x2 [0,1)", 9);
  CHECK(printed.step == 9);
  CHECK(latest_checkpoint_step(ck) == 9);
  // No snapshots at all.
  CHECK(commit_memory_snapshots(ck, 2, {"head", "block.0"}, "job-key", "1x2 [0,1)").why_not == "no rank flushed a snapshot");
}

TEST_CASE("in-memory snapshots of one step read as that step's checkpoint would, by a rank of any layout") {
  // Rank 0's own copy (with the parameters) and rank 1's buddy copy.
  const snapshot_shards shards({snapshot_of(0, 6, 1, 6), snapshot_of(1, 6, 1, 6).without_params()});
  CHECK(shards.step() == 6);
  CHECK(shards.has_params("head"));
  Tensor p = Tensor::zeros({4});
  shards.read_params("block.0", p);
  CHECK(p.to_vector() == std::vector<float>{6, 7, 8, 9});
  // A 1x4 rank's moment shard [1, 2) and a 1x1 rank's whole [0, 4), across both owners.
  Tensor one = Tensor::zeros({1});
  shards.read_moment("v", "head", 1, 4, one);
  CHECK(one.to_vector() == std::vector<float>{7});
  Tensor all = Tensor::zeros({4});
  shards.read_moment("m", "block.0", 0, 4, all);
  CHECK(all.to_vector() == std::vector<float>{6, 7, 16, 17});
  auto error_of = [](std::vector<rank_snapshot> s) {
    try {
      snapshot_shards x(std::move(s));
    } catch (const train_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error_of({snapshot_of(0, 6, 1, 6), snapshot_of(1, 7, 1, 6)}).find("steps 6 and 7") != std::string::npos);
  CHECK(error_of({snapshot_of(0, 6, 1, 6), snapshot_of(0, 6, 1, 6)}).find("two in-memory snapshots of rank 0") !=
        std::string::npos);
  CHECK(error_of({snapshot_of(0, 6, 1, 6)}).find("hold values [0, 2) of the 4 of the optimizer state") !=
        std::string::npos);
  // A model of another size.
  const snapshot_shards one_owner({snapshot_of(0, 6, 1, 6), snapshot_of(1, 6, 1, 6)});
  Tensor wrong = Tensor::zeros({5});
  CHECK_THROWS_WITH_AS(one_owner.read_params("head", wrong),
                       "the in-memory snapshots of step 6: 4 parameters of head, this model has 5", train_error);
}

TEST_CASE("a keeper serves what it holds over the network, memory to memory, to whoever knows the run, and what a "
          "rank of another layout reads from the fetched copies equals the snapshots") {
  auto holder = start_test_node();
  auto peer = start_test_node();
  auto keeper = start_rank1_keeper(*holder, *peer, {});
  caf::anon_send(keeper, encode_snapshot(snapshot_of(1, 5, 42, 5)));  // its own, with parameters
  REQUIRE(peer->connect(holder->endpoint()));
  auto remote = peer->remote_actor(holder->id(), snapshot_keeper_name(42));
  REQUIRE(remote);
  caf::anon_send(*remote, encode_snapshot(snapshot_of(0, 5, 42, 5).without_params()));  // its buddy's copy
  const auto timeout = std::chrono::seconds(30);

  // The index, once both have arrived.
  caf::expected<snapshot_index> index = make_error(errc::unknown_actor, "not asked");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  do {
    index = fetch_snapshot_index(*peer, holder->id(), 42, timeout);
    REQUIRE(index);
  } while (index->snapshots.size() < 2 && std::chrono::steady_clock::now() < deadline);
  REQUIRE(index->snapshots.size() == 2u);
  CHECK(index->holder == 1);
  const snapshot_listing& zero = index->snapshots[0];
  CHECK(zero.owner == 0);
  CHECK(zero.step == 5);
  CHECK(zero.tensors.size() == 4u);  // m and v of two buckets: no parameters in a buddy's copy
  CHECK(zero.bytes() == 4 * 2 * sizeof(float));
  CHECK(zero.ranges.at("head").lo == 0);
  const snapshot_listing& one = index->snapshots[1];
  CHECK(one.owner == 1);
  CHECK(one.tensors.size() == 6u);
  CHECK(one.bytes() == (2 * 4 + 4 * 2) * sizeof(float));

  // Only the tensors asked for travel.
  auto params = fetch_snapshot(*peer, holder->id(), 42, 1, 5, {"params.head"}, timeout);
  REQUIRE(params);
  REQUIRE(params->tensors.size() == 1u);
  CHECK(params->tensors[0].second.to_vector() == std::vector<float>{5, 6, 7, 8});
  auto whole0 = fetch_snapshot(*peer, holder->id(), 42, 0, 5, {}, timeout);
  auto whole1 = fetch_snapshot(*peer, holder->id(), 42, 1, 5, {}, timeout);
  REQUIRE(whole0);
  REQUIRE(whole1);
  const snapshot_shards shards({*whole0, *whole1});
  Tensor m = Tensor::zeros({4});
  shards.read_moment("m", "block.0", 0, 4, m);
  CHECK(m.to_vector() == std::vector<float>{5, 6, 15, 16});

  // Another run's question (no keeper by that name; and the keeper itself,
  // asked about another run, refuses), a snapshot not held, a tensor it
  // lacks.
  auto stranger = fetch_snapshot_index(*peer, holder->id(), 7, timeout);
  REQUIRE_FALSE(stranger);
  CHECK(stranger.error() == make_error(errc::unknown_actor, ""));
  auto stolen = fetch_snapshot(*peer, holder->id(), 7, 1, 5, {}, timeout);
  REQUIRE_FALSE(stolen);
  CHECK(stolen.error() == make_error(errc::unknown_actor, ""));
  remote_message other_run;
  other_run.type = train_msg::snaps_query;
  other_run.body = encode_body(train_step_note{0, 0, 0, 7});
  auto refused = peer->request(holder->id(), snapshot_keeper_name(42), other_run, timeout);
  REQUIRE_FALSE(refused);
  CHECK(refused.error() == make_error(errc::auth_refused, ""));
  CHECK(error_message(refused.error()).find("not of the run") != std::string::npos);
  auto old = fetch_snapshot(*peer, holder->id(), 42, 1, 4, {}, timeout);
  REQUIRE_FALSE(old);
  CHECK(error_message(old.error()).find("holds no snapshot of rank 1 of step 4") != std::string::npos);
  auto lacking = fetch_snapshot(*peer, holder->id(), 42, 0, 5, {"params.head"}, timeout);
  REQUIRE_FALSE(lacking);
  CHECK(error_message(lacking.error()).find("has no params.head") != std::string::npos);
  // Malformed requests: an error each, and the keeper serves on.
  auto escaping = fetch_snapshot(*peer, holder->id(), 42, 1, 5, {"../params.head"}, timeout);
  REQUIRE_FALSE(escaping);
  CHECK(escaping.error() == make_error(errc::bad_message, ""));
  remote_message garbage;
  garbage.type = train_msg::snap_get;
  garbage.body.assign(40, 0xff);
  auto answer = peer->request(holder->id(), snapshot_keeper_name(42), garbage, timeout);
  REQUIRE_FALSE(answer);
  CHECK(answer.error() == make_error(errc::bad_message, ""));
  garbage.type = train_msg::snaps_query;
  answer = peer->request(holder->id(), snapshot_keeper_name(42), garbage, timeout);
  REQUIRE_FALSE(answer);
  CHECK(answer.error() == make_error(errc::bad_message, ""));
  auto still = fetch_snapshot(*peer, holder->id(), 42, 1, 5, {"params.head"}, timeout);
  REQUIRE(still);
  CHECK(still->tensors.size() == 1u);

  // train.snapdrop naming another run changes nothing; naming its own, the
  // keeper ends and is gone from the node.
  auto drop = [&](std::uint64_t job) {
    remote_message d;
    d.type = train_msg::snap_drop;
    d.body = encode_body(train_step_note{0, 0, 0, job});
    caf::anon_send(*remote, std::move(d));
  };
  drop(7);
  REQUIRE(fetch_snapshot_index(*peer, holder->id(), 42, timeout));
  drop(42);
  caf::scoped_actor waiter{holder->system()};
  waiter->wait_for(keeper);
  CHECK_FALSE(holder->local_actor(snapshot_keeper_name(42)));
  auto gone = fetch_snapshot_index(*peer, holder->id(), 42, timeout);
  CHECK_FALSE(gone);
}
