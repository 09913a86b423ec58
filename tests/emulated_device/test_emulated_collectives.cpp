// Device collectives (kernels/device_group.hpp) on emulated devices: the
// groups' semantics and the rules NCCL enforces, and pipeline x
// data-parallel ranks whose groups reduce on their devices
// (--collectives device) training as the host rings do. NCCL's own
// arithmetic needs two GPUs (tests/kernels/cuda_ops.cpp has its one-rank
// case).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "kernels/backend.hpp"
#include "kernels/device_group.hpp"
#include "tests/emulated_device/dist_jobs.hpp"
#include "tests/emulated_device/emulated_device.hpp"
#include "tests/model/cached_logits.hpp"
#include "tests/support/tiny_model.hpp"
#include "tests/support/eventually.hpp"
#include "model/whole_file.hpp"

using namespace corolla;
using namespace corolla::testing;

namespace {

/// Runs `body(rank, device, group)` for `n` members on threads, each on
/// emulated cuda:<rank>, and rethrows the first member's error.
void with_group(int n, const std::function<void(int, emulated_device_backend&, device_group&)>& body) {
  std::vector<std::unique_ptr<emulated_device_backend>> devices;
  for (int r = 0; r < n; ++r) devices.push_back(std::make_unique<emulated_device_backend>(r));
  const device_group_id id = devices[0]->new_group_id();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> members;
  for (int r = 0; r < n; ++r)
    members.emplace_back([&, r] {
      try {
        emulated_device_backend& dev = *devices[static_cast<std::size_t>(r)];
        std::unique_ptr<device_group> g = dev.join_group(id, r, n, {});
        body(r, dev, *g);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (std::thread& t : members) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

Tensor device_values(Backend& dev, const std::vector<float>& v) {
  Tensor t = dev.empty({static_cast<std::int64_t>(v.size())});
  Tensor h = Tensor::from_f32(v, {static_cast<std::int64_t>(v.size())});
  dev.copy(h, t);
  return t;
}

std::vector<float> host_values(Backend& dev, const Tensor& t) {
  Tensor h = Tensor::empty(t.shape());
  dev.copy(t, h);
  return h.to_vector();
}

}  // namespace

TEST_CASE("emulated device groups: reduce-scatter and all-gather over three members") {
  with_group(3, [](int r, emulated_device_backend& dev, device_group& g) {
    CHECK(g.rank() == r);
    CHECK(g.size() == 3);
    // Member r holds (r + 1) * [0, 1, ..., 5]: the sum is 6 * [0..5].
    std::vector<float> mine(6);
    for (int i = 0; i < 6; ++i) mine[static_cast<std::size_t>(i)] = static_cast<float>((r + 1) * i);
    Tensor in = device_values(dev, mine), out = dev.empty({2});
    g.reduce_scatter(dev, in, out);
    CHECK(host_values(dev, out) == std::vector<float>{6.0f * (2 * r), 6.0f * (2 * r + 1)});
    // Queued on a companion (the DP group's thread) as well.
    std::unique_ptr<Backend> side = dev.companion();
    Tensor gathered = dev.empty({6});
    g.all_gather(*side, out, gathered);
    CHECK(host_values(dev, gathered) == std::vector<float>{0, 6, 12, 18, 24, 30});
    CHECK(dev.stats().collectives == 1);
  });
}

TEST_CASE("emulated device groups: misuse is a clear error, as NCCL's rules would be broken") {
  SUBCASE("collectives that differ between members") {
    CHECK_THROWS_WITH_AS(with_group(2,
                                    [](int r, emulated_device_backend& dev, device_group& g) {
                                      Tensor in = dev.empty({4}), out = dev.empty({r == 0 ? 2 : 8});
                                      if (r == 0) g.reduce_scatter(dev, in, out);
                                      else g.all_gather(dev, in, out);
                                    }),
                         doctest::Contains("mismatched collectives"), std::runtime_error);
  }
  SUBCASE("shapes, a host tensor, another device's backend") {
    with_group(2, [](int r, emulated_device_backend& dev, device_group& g) {
      Tensor in = dev.empty({4}), wrong = dev.empty({3}), host = Tensor::empty({2});
      CHECK_THROWS_WITH_AS(g.reduce_scatter(dev, in, wrong), doctest::Contains("size() times"), tensor_error);
      CHECK_THROWS_WITH_AS(g.reduce_scatter(dev, in, host), doctest::Contains("cpu"), tensor_error);
      emulated_device_backend other(r + 5);
      Tensor out = dev.empty({2});
      CHECK_THROWS_WITH_AS(g.reduce_scatter(other, in, out), doctest::Contains("backend of that device"), tensor_error);
      CHECK_THROWS_WITH_AS(g.reduce_scatter(cpu_backend(), in, out), doctest::Contains("not cpu"), tensor_error);
      g.reduce_scatter(dev, in, out);  // the group still works
    });
  }
  SUBCASE("two members on one device") {
    // Whichever of the two on cuda:0 comes second is refused; a member on
    // its own device then takes the refused rank and completes the group.
    emulated_device_backend a(0), same(0), other(1);
    const device_group_id id = a.new_group_id();
    std::atomic<int> refused{-1};
    std::string refusal;
    std::unique_ptr<device_group> joined[2];
    auto join = [&](emulated_device_backend& dev, int rank) {
      try {
        joined[rank] = dev.join_group(id, rank, 2, {});
      } catch (const std::runtime_error& e) {
        refusal = e.what();
        refused = rank;
      }
    };
    std::thread t0([&] { join(a, 0); });
    std::thread t1([&] { join(same, 1); });
    REQUIRE(eventually([&] { return refused >= 0; }, std::chrono::seconds(30), std::chrono::milliseconds(1)));
    CHECK(refusal.find("two members on cuda:0") != std::string::npos);
    CHECK(other.join_group(id, refused, 2, {})->size() == 2);
    t0.join();
    t1.join();
    CHECK(joined[1 - refused]->rank() == 1 - refused);
  }
  SUBCASE("a backend without device collectives") {
    CHECK_FALSE(cpu_backend().has_device_groups());
    CHECK_THROWS_WITH_AS(cpu_backend().new_group_id(), doctest::Contains("no device collectives"), tensor_error);
  }
}

TEST_CASE("emulated device groups: a member that is gone is given up on, not waited for") {
  // The give-up function answers once 100 ms have passed, as a rank's does
  // once its inbox has failed (a peer's link went down, the job aborted).
  auto after_100ms = [] {
    const auto start = std::chrono::steady_clock::now();
    return group_give_up([start]() -> std::optional<std::string> {
      if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(100)) return std::nullopt;
      return "rank 1 is down";
    });
  };
  SUBCASE("while joining") {
    emulated_device_backend a(0);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(a.join_group(a.new_group_id(), 0, 2, after_100ms()),
                         doctest::Contains("gave up: rank 1 is down"), std::runtime_error);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  }
  SUBCASE("inside a collective, and every later call") {
    emulated_device_backend a(0), b(1);
    const device_group_id id = a.new_group_id();
    std::unique_ptr<device_group> second;
    // Rank 1 is "down" once it has joined (not 100 ms after this line: its
    // thread may start later than that on a busy machine).
    std::atomic<bool> member_joined{false};
    const group_give_up once_joined([&]() -> std::optional<std::string> {
      if (!member_joined) return std::nullopt;
      return "rank 1 is down";
    });
    std::thread member([&] { second = b.join_group(id, 1, 2, {}); });  // joins, then calls nothing
    std::unique_ptr<device_group> first = a.join_group(id, 0, 2, once_joined);
    member.join();
    member_joined = true;
    Tensor in = a.empty({4}), out = a.empty({2});
    CHECK_THROWS_WITH_AS(first->reduce_scatter(a, in, out), doctest::Contains("gave up: rank 1 is down"),
                         std::runtime_error);
    CHECK_THROWS_WITH_AS(first->synchronize(a), doctest::Contains("aborted"), std::runtime_error);
    Tensor in_b = b.empty({4}), out_b = b.empty({2});
    CHECK_THROWS_WITH_AS(second->reduce_scatter(b, in_b, out_b), doctest::Contains("aborted"), std::runtime_error);
  }
}

TEST_CASE("emulated device groups: a bucket's shards are the host ring's, and all-gather restores every chunk") {
  // 10 values over 3 members: chunks of 3, 3 and 4 values, padded to 4.
  const int g = 3;
  const std::int64_t n = 10;
  CHECK(device_chunk_pad(n, g) == 4);
  with_group(g, [&](int r, emulated_device_backend& dev, device_group& group) {
    ring ring_r;
    ring_r.ranks = {0, 1, 2};
    ring_r.position = r;
    std::vector<float> grads(n), params(n);
    for (std::int64_t i = 0; i < n; ++i) {
      grads[static_cast<std::size_t>(i)] = static_cast<float>((r + 1) * (i + 1));  // sum: 6 * (i + 1)
      params[static_cast<std::size_t>(i)] = -1.0f;                                 // stale but for the owned chunk
    }
    const auto [lo, hi] = chunk_range(n, g, owned_chunk(ring_r));
    for (std::int64_t i = lo; i < hi; ++i) params[static_cast<std::size_t>(i)] = static_cast<float>(100 * r + i);
    Tensor flat_grads = device_values(dev, grads), flat_params = device_values(dev, params);
    Tensor scratch = dev.empty({g * 4 + 5}), shard = dev.empty({4});  // scratch may be longer
    device_reduce_scatter(group, dev, ring_r, flat_grads, scratch, shard);
    const std::vector<float> sums = host_values(dev, shard);
    for (std::int64_t i = lo; i < hi; ++i) CHECK(sums[static_cast<std::size_t>(i - lo)] == 6.0f * static_cast<float>(i + 1));
    device_all_gather(group, dev, ring_r, flat_params, scratch, shard);
    const std::vector<float> all = host_values(dev, flat_params);
    for (int owner = 0; owner < g; ++owner) {  // member `owner` owns chunk owner + 1
      const auto [b, e] = chunk_range(n, g, (owner + 1) % g);
      for (std::int64_t i = b; i < e; ++i) CHECK(all[static_cast<std::size_t>(i)] == static_cast<float>(100 * owner + i));
    }
    Tensor short_shard = dev.empty({3});
    CHECK_THROWS_WITH_AS(device_reduce_scatter(group, dev, ring_r, flat_grads, scratch, short_shard),
                         doctest::Contains("do not match"), tensor_error);
  });
}

TEST_CASE("emulated device: ranks whose groups reduce on their devices train as the host rings do") {
  testing::tiny_model_options tiny = testing::tiny_options_for(architecture::gpt2, 96);  // tied head
  tiny.layers = 4;
  testing::temp_dir_guard dir("emulated-collectives");
  testing::write_tiny_model(dir / "model", tiny);
  const model_config cfg = load_config(dir / "model");
  const auto tokens = some_ids(2000, cfg.vocab_size, 41);

  struct variant {
    int pp, dp;
    float clip;
  };
  for (const variant v : {variant{1, 2, 0.0f}, variant{1, 3, 0.5f}, variant{2, 2, 0.0f}, variant{2, 2, 0.5f},
                          variant{2, 1, 0.0f}}) {
    CAPTURE(v.pp);
    CAPTURE(v.dp);
    CAPTURE(v.clip);
    dist_train_options o = job(cfg, v.pp, v.dp, 3);
    if (v.dp == 3) o.batch = 6;
    o.optimizer.max_grad_norm = v.clip;
    o.save_dir = dir / "host";
    std::filesystem::remove_all(o.save_dir);
    const job_result host = run_job(o, cfg, tokens, false);
    o.collectives = dp_collectives::device;
    o.save_dir = dir / "device";
    std::filesystem::remove_all(o.save_dir);
    const job_result dev = run_job(o, cfg, tokens, true);
    // Two members sum alike in any order; more may round differently from
    // the ring's order (the emulation sums in rank order, as NCCL picks its own).
    const int largest = v.pp == 1 ? v.dp : 2 * v.dp;  // with pp > 1 the head's group spans both ends
    const bool exact = largest <= 2;
    if (exact) {
      check_same_steps(host, dev);
      CHECK(read_whole_file(dir / "device" / "model.safetensors") == read_whole_file(dir / "host" / "model.safetensors"));
    } else {
      check_close_steps(host, dev, 1e-5);
    }
    for (int r = 0; r < o.layout.world(); ++r) {
      CAPTURE(r);
      const auto& s = dev.devices[static_cast<std::size_t>(r)]->stats();
      CHECK(s.host_empties == 0);  // no bucket is staged through the host
      // The DP-group actor owns the buckets: every collective runs on its
      // companion, also the update and all-gather that wait for the global
      // norm when clipping; none on the stage's own instance.
      CHECK(s.collectives == 0);
      CHECK(s.companions >= 1);
    }
  }
}

TEST_CASE("emulated device: a checkpoint of host-ring ranks resumes with device collectives") {
  testing::tiny_model_options tiny = testing::tiny_options_for(architecture::llama, 96);
  testing::temp_dir_guard dir("emulated-collectives-resume");
  testing::write_tiny_model(dir / "model", tiny);
  const model_config cfg = load_config(dir / "model");
  const auto tokens = some_ids(2000, cfg.vocab_size, 43);

  check_resume_matches(job(cfg, 1, 2, 4), cfg, tokens, dir.path(),
                       [](dist_train_options& o) { o.collectives = dp_collectives::device; });
}

TEST_CASE("emulated device: --collectives device refuses ranks on the cpu with the reason") {
  testing::tiny_model_options tiny = testing::tiny_options_for(architecture::llama, 96);
  testing::temp_dir_guard dir("emulated-collectives-cpu");
  testing::write_tiny_model(dir / "model", tiny);
  const model_config cfg = load_config(dir / "model");
  dist_train_options o = job(cfg, 1, 2, 1);
  o.collectives = dp_collectives::device;
  CHECK_THROWS_WITH_AS(run_job(o, cfg, some_ids(500, cfg.vocab_size, 3), false),
                       doctest::Contains("computes on the cpu: --collectives device needs every rank on a device"),
                       std::exception);
}
