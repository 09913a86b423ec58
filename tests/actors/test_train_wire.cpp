// Pure parts of distributed training: message bodies (round trips and
// malformed input), the layout rules, ring chunking, the inbox's failure
// semantics and the checkpoint commit protocol.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <thread>

#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_store.hpp"
#include "actors/train_wire.hpp"
#include "model/config.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
namespace fs = std::filesystem;

TEST_CASE("training message bodies round-trip and malformed ones are bad_message") {
  auto j = decode_train_join(encode_body(train_join{3, 4, "tcp://127.0.0.1:5", "layers=4"}));
  REQUIRE(j);
  CHECK(j->rank == 3);
  CHECK(j->world == 4);
  CHECK(j->endpoint == "tcp://127.0.0.1:5");
  CHECK(j->job_key == "layers=4");

  auto roster = decode_train_roster(encode_body(train_roster{99, {{0, "n-a", "tcp://x:1"}, {1, "n-b", "tcp://x:2"}}}));
  REQUIRE(roster);
  CHECK(roster->job == 99u);
  REQUIRE(roster->peers.size() == 2u);
  CHECK(roster->peers[1].node_id == "n-b");

  auto p = decode_train_packet(encode_body(train_packet{7, -1, 2, 5, 99}));
  REQUIRE(p);
  CHECK(p->step == 7);
  CHECK(p->index == -1);
  CHECK(p->hop == 2);
  CHECK(p->from == 5);
  CHECK(p->job == 99u);
  CHECK(p->lo == 0);
  CHECK(p->hi == 0);
  // An ask for a piece of parameters (train.paramsask) carries its range;
  // a range that ends before it starts, or starts below 0, is malformed.
  auto ask = decode_train_packet(encode_body(train_packet{7, 3, 1, -1, 99, 4096, 8192}));
  REQUIRE(ask);
  CHECK(ask->lo == 4096);
  CHECK(ask->hi == 8192);
  CHECK_FALSE(decode_train_packet(encode_body(train_packet{7, 3, 1, -1, 99, 8192, 4096})));
  CHECK_FALSE(decode_train_packet(encode_body(train_packet{7, 3, 1, -1, 99, -1, 4096})));

  auto r = decode_train_report(encode_body(train_report{2, 9, 1.5, 0.25}));
  REQUIRE(r);
  CHECK(r->loss == 1.5);
  CHECK(r->sum_squares == 0.25);
  CHECK(r->links.empty());
  CHECK(r->compute_s == 0);
  // A probe step's report: measured links (0 = too fast to tell) and compute seconds.
  train_report probed{2, 10, 1.25, 0, 99, {{2, 3, 125e3}, {2, 5, 0}}, 0.0125};
  auto pr = decode_train_report(encode_body(probed));
  REQUIRE(pr);
  REQUIRE(pr->links.size() == 2u);
  CHECK(pr->links[0].from == 2);  // the reporting rank: the wire carries only the peer
  CHECK(pr->links[0].to == 3);
  CHECK(pr->links[0].bandwidth == 125e3);
  CHECK(pr->links[1].to == 5);
  CHECK(pr->links[1].bandwidth == 0);
  CHECK(pr->compute_s == 0.0125);
  // Rates and times that cannot be are refused, not passed on to the scheduler.
  probed.links[0].bandwidth = -1;
  CHECK_FALSE(decode_train_report(encode_body(probed)));
  probed.links[0].bandwidth = std::numeric_limits<double>::quiet_NaN();
  CHECK_FALSE(decode_train_report(encode_body(probed)));
  probed.links[0].bandwidth = 1;
  probed.compute_s = -0.5;
  CHECK_FALSE(decode_train_report(encode_body(probed)));
  probed.compute_s = std::numeric_limits<double>::infinity();
  CHECK_FALSE(decode_train_report(encode_body(probed)));
  probed.compute_s = 0;
  // Lanes: reductions and (the step before's) updates side by side, up to 64.
  probed.rings_side_by_side = 3;
  probed.updates_side_by_side = 4;
  auto lanes = decode_train_report(encode_body(probed));
  REQUIRE(lanes);
  CHECK(lanes->rings_side_by_side == 3);
  CHECK(lanes->updates_side_by_side == 4);
  for (int bad : {-1, 65}) {
    probed.updates_side_by_side = bad;
    CHECK_FALSE(decode_train_report(encode_body(probed)));
    probed.updates_side_by_side = 0;
    probed.rings_side_by_side = bad;
    CHECK_FALSE(decode_train_report(encode_body(probed)));
    probed.rings_side_by_side = 0;
  }

  auto s = decode_train_step(encode_body(train_step_note{4, 1, 3.0}));
  REQUIRE(s);
  CHECK(s->value == 3.0);
  auto a = decode_train_abort(encode_abort_body("rank 1 died", 99));
  REQUIRE(a);
  CHECK(a->reason == "rank 1 died");
  CHECK(a->job == 99u);

  CHECK_FALSE(decode_train_packet({}));
  CHECK_FALSE(decode_train_packet({1, 2, 3}));
  std::vector<std::uint8_t> garbage(64, 0xff);
  CHECK_FALSE(decode_train_roster(garbage));
  CHECK_FALSE(decode_train_join(garbage));
  // A text over the limit is refused.
  CHECK_FALSE(decode_train_join(encode_body(train_join{0, 1, std::string(300, 'x'), ""})));
}

TEST_CASE("layouts split blocks evenly, label ranks, and refuse impossible splits") {
  train_layout l = even_layout(5, 2, 3);
  CHECK(l.boundaries == std::vector<int>{0, 3, 5});
  CHECK(l.world() == 6);
  CHECK(l.stage_of(4) == 1);
  CHECK(l.replica_of(4) == 1);
  CHECK(l.rank_of(1, 2) == 5);
  CHECK(l.label(4) == "rank 4 (stage 1, replica 1, blocks 3..4)");
  CHECK(l.describe() == "2x3 [0,3) [3,5)");
  CHECK_THROWS_AS(even_layout(2, 3, 1), std::invalid_argument);
  CHECK_THROWS_AS(even_layout(2, 0, 1), std::invalid_argument);
  train_layout v = even_layout(8, 2, 1, 2);
  CHECK(v.boundaries == std::vector<int>{0, 2, 4, 6, 8});
  CHECK(v.virtual_stage(1, 1) == 3);
  CHECK(v.label(1) == "rank 1 (stage 1, replica 0, blocks 2..3, 6..7)");
  CHECK(v.describe() == "2x1 v2 [0,2) [2,4) [4,6) [6,8)");
  CHECK_THROWS_AS(even_layout(3, 2, 1, 2), std::invalid_argument);
  CHECK_NOTHROW(check_layout(v, 8));
  train_layout bad = l;
  bad.boundaries = {0, 5, 5};
  CHECK_THROWS_AS(check_layout(bad, 5), std::invalid_argument);
  bad.boundaries = {0, 2, 4};
  CHECK_THROWS_AS(check_layout(bad, 5), std::invalid_argument);

  dist_train_options o;
  o.layout = even_layout(4, 2, 2);
  o.batch = 8;
  o.seq = 16;
  CHECK(o.micro_batch_size() == 1);
  CHECK(o.micro_batches() == 4);
  o.micro_batch = 3;
  CHECK_THROWS_AS(o.micro_batch_size(), std::invalid_argument);
  o.micro_batch = 0;
  o.layout = even_layout(4, 1, 2);
  CHECK(o.micro_batch_size() == 4);  // one micro-batch per replica without a pipeline
  o.batch = 7;
  CHECK_THROWS_AS(o.micro_batch_size(), std::invalid_argument);
}

TEST_CASE("the inbox hands out messages by key, times out, and fails with the most specific reason") {
  train_inbox inbox;
  remote_message m;
  m.type = "x";
  inbox.put("k", m);
  CHECK(inbox.take("k", std::chrono::milliseconds(10), "k").type == "x");
  CHECK_THROWS_WITH_AS(inbox.take("k", std::chrono::milliseconds(10), "the thing"), "no the thing within 10 ms",
                       train_error);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    inbox.put("later", m);
  });
  CHECK_NOTHROW(inbox.take("later", std::chrono::seconds(5), "later"));
  late.join();

  inbox.fail("rank 2 (stage 1) is down: peer said goodbye (node stopping)");
  inbox.fail("rank 3 (stage 1) is down: connection lost");
  inbox.fail("rank 1 is down: something else");
  CHECK(*inbox.failure() == "rank 3 (stage 1) is down: connection lost");
  CHECK_THROWS_WITH_AS(inbox.take("k", std::chrono::seconds(5), "k"), "rank 3 (stage 1) is down: connection lost",
                       train_error);
  // Peers outside the job are ignored; after drain only the kept one counts.
  train_inbox draining;
  draining.name_peer("n-coord", "the coordinator");
  draining.name_peer("n-r1", "rank 1");
  draining.peer_down("n-stranger", "connection lost");
  CHECK_FALSE(draining.failure());
  draining.drain("n-coord");
  draining.peer_down("n-r1", "peer said goodbye");
  CHECK_FALSE(draining.failure());
  draining.peer_down("n-coord", "connection lost");
  CHECK(*draining.failure() == "the coordinator is down: connection lost");

  // A launcher's "exited" gives way to a specific reason, like a goodbye.
  train_inbox exited;
  exited.fail("rank 2 (stage 1) exited (exit status 1)");
  exited.fail("rank 2 (stage 1) failed: cannot open data.bin");
  CHECK(*exited.failure() == "rank 2 (stage 1) failed: cannot open data.bin");
  CHECK(is_vague_failure("peer n-1 is down: peer said goodbye (node stopping)"));
  CHECK_FALSE(is_vague_failure("rank 3 is down: connection lost"));

  train_inbox closed;
  closed.close();
  closed.fail("after the end");
  CHECK_FALSE(closed.failure());
}

TEST_CASE("a checkpoint becomes the latest only once committed, and other jobs cannot resume it") {
  testing::temp_dir_guard tmp("train-store");
  const fs::path dir = tmp.path() / "ck";
  CHECK(latest_checkpoint_step(dir) == 0);
  Tensor t = Tensor::from_f32(std::vector<float>{1, 2, 3}, {3});
  write_shard(dir, 5, 0, {{"m.head", t}});
  CHECK(latest_checkpoint_step(dir) == 0);  // shards alone are not a checkpoint
  commit_checkpoint(dir, 5, 1, "job-a");
  CHECK(latest_checkpoint_step(dir) == 5);
  CHECK_NOTHROW(check_manifest(dir, 5, "job-a"));
  CHECK_THROWS_AS(check_manifest(dir, 5, "job-b"), train_error);
  write_shard(dir, 10, 0, {{"m.head", t}});
  commit_checkpoint(dir, 10, 1, "job-a");
  write_shard(dir, 15, 0, {{"m.head", t}});
  commit_checkpoint(dir, 15, 1, "job-a");
  CHECK(latest_checkpoint_step(dir) == 15);
  CHECK(fs::exists(dir / "step-10"));  // the one before stays
  CHECK_FALSE(fs::exists(dir / "step-5"));
  // A pointer that names a missing checkpoint, is garbage or is gone
  // never hides the complete ones: a fresh job must not write over them,
  // and --resume finds the newest (its manifest is written last).
  std::ofstream(dir / "latest") << "step-99\n";
  CHECK(latest_checkpoint_step(dir) == 15);
  std::ofstream(dir / "latest") << "\x01garbage";
  CHECK(latest_checkpoint_step(dir) == 15);
  fs::remove(dir / "latest");
  CHECK(latest_checkpoint_step(dir) == 15);
  write_shard(dir, 20, 0, {{"m.head", t}});  // shards of a step never committed
  CHECK(latest_checkpoint_step(dir) == 15);
}

TEST_CASE("optimizer state is read across shard boundaries, and shards that overlap or leave a gap are refused") {
  testing::temp_dir_guard tmp("train-store-tiles");
  const fs::path dir = tmp.path() / "ck";
  auto values = [](std::vector<float> v) { return Tensor::from_f32(v, {static_cast<std::int64_t>(v.size())}); };
  auto checkpoint = [&](int step, shard_range a, std::vector<float> va, shard_range b, std::vector<float> vb) {
    write_shard(dir, step, 0, {{"m.head", values(va)}}, {{"head", a}});
    write_shard(dir, step, 1, {{"m.head", values(vb)}}, {{"head", b}});
    commit_checkpoint(dir, step, 2, "job");
  };
  // Two ranks hold [0, 3) and [3, 5) of 5: a reader of [2, 5) takes one
  // value from the first and two from the second.
  checkpoint(1, {0, 3, 5}, {0, 1, 2}, {3, 5, 5}, {3, 4});
  {
    const checkpoint_shards shards(dir, 1);
    Tensor dst = Tensor::zeros({3});
    shards.read_moment("m", "head", 2, 5, dst);
    CHECK(dst.to_vector() == std::vector<float>{2, 3, 4});
    CHECK_THROWS_AS(shards.read_moment("m", "head", 0, 6, dst), train_error);  // another model's size
  }
  auto error_of = [&](int step) {
    try {
      checkpoint_shards shards(dir, step);
    } catch (const train_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  checkpoint(2, {0, 3, 5}, {0, 1, 2}, {2, 5, 5}, {2, 3, 4});  // [2, 3) twice
  CHECK(error_of(2).find("do not tile the optimizer state of head") != std::string::npos);
  checkpoint(3, {0, 2, 5}, {0, 1}, {3, 5, 5}, {3, 4});  // [2, 3) missing
  CHECK(error_of(3).find("do not tile") != std::string::npos);
  checkpoint(4, {0, 2, 5}, {0, 1}, {2, 4, 5}, {2, 3});  // [4, 5) missing
  CHECK(error_of(4).find("hold values [0, 4) of the 5") != std::string::npos);
}
