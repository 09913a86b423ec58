// The ring collectives (net/collectives.hpp) over an in-process channel:
// every member a thread, chunks filed by address, so the tests see the
// rings' arithmetic and ownership without any network.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "net/collectives.hpp"

using namespace corolla;

namespace {

/// Chunks in memory, addressed like the training runtime's: (receiver,
/// phase, step, bucket, hop). Records every sender so tests can check who
/// talks to whom, and fails receives from a member marked gone.
class memory_channel_hub {
 public:
  using key = std::tuple<int, int, std::int64_t, int, int>;

  void put(int from, int to, ring_phase phase, std::int64_t step, int bucket, int hop, Tensor chunk) {
    std::lock_guard lock(mu_);
    if (chunk.type() != dtype::f32) throw std::logic_error("chunk is not f32");
    filed_[{to, static_cast<int>(phase), step, bucket, hop}] = {from, chunk};
    sent_values_ += chunk.numel();
    cv_.notify_all();
  }

  Tensor take(int to, int from, ring_phase phase, std::int64_t step, int bucket, int hop, std::int64_t numel) {
    std::unique_lock lock(mu_);
    const key k{to, static_cast<int>(phase), step, bucket, hop};
    if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return filed_.count(k) > 0 || gone_ == from; }))
      throw std::runtime_error("no chunk within 20 s");
    if (gone_ == from && filed_.count(k) == 0) throw std::runtime_error("member " + std::to_string(from) + " is gone");
    auto [sender, t] = filed_.at(k);
    filed_.erase(k);
    if (sender != from) throw std::runtime_error("chunk from the wrong member");
    if (t.numel() != numel) throw std::runtime_error("chunk of the wrong size");
    return t;
  }

  void mark_gone(int member) {
    std::lock_guard lock(mu_);
    gone_ = member;
    cv_.notify_all();
  }

  std::int64_t sent_values() const {
    std::lock_guard lock(mu_);
    return sent_values_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<key, std::pair<int, Tensor>> filed_;
  std::int64_t sent_values_ = 0;
  int gone_ = -1;
};

class memory_channel : public ring_channel {
 public:
  memory_channel(memory_channel_hub& hub, int me) : hub_(hub), me_(me) {}
  void send_chunk(int to, ring_phase phase, std::int64_t step, int bucket, int hop, Tensor chunk) override {
    hub_.put(me_, to, phase, step, bucket, hop, std::move(chunk));
  }
  Tensor receive_chunk(int from, ring_phase phase, std::int64_t step, int bucket, int hop,
                       std::int64_t numel) override {
    return hub_.take(me_, from, phase, step, bucket, hop, numel);
  }

 private:
  memory_channel_hub& hub_;
  int me_;
};

/// A ring over members `ids` (any ids, any order) as seen by position `p`.
ring ring_at(const std::vector<int>& ids, int p) { return ring{ids, p}; }

/// Runs `body(position)` for every member of a ring of `g` on threads;
/// rethrows the first failure.
void on_members(int g, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::mutex mu;
  std::string error;
  for (int p = 0; p < g; ++p)
    threads.emplace_back([&, p] {
      try {
        body(p);
      } catch (const std::exception& e) {
        std::lock_guard lock(mu);
        if (error.empty()) error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  if (!error.empty()) throw std::runtime_error(error);
}

/// Member p's value at element i: distinct per member and element, exact in f32.
float value_of(int p, std::int64_t i) { return static_cast<float>((p + 1) * 1000 + i % 997); }

}  // namespace

TEST_CASE("ring chunks cover the buffer and each member owns a different one") {
  for (int g : {1, 2, 3, 5}) {
    std::int64_t covered = 0;
    for (int c = 0; c < g; ++c) {
      auto [b, e] = chunk_range(101, g, c);
      CHECK(b == covered);
      covered = e;
    }
    CHECK(covered == 101);
    std::vector<int> owned;
    for (int pos = 0; pos < g; ++pos) owned.push_back(owned_chunk(ring{std::vector<int>(static_cast<std::size_t>(g)), pos}));
    std::sort(owned.begin(), owned.end());
    for (int c = 0; c < g; ++c) CHECK(owned[static_cast<std::size_t>(c)] == c);
  }
}

TEST_CASE("ring reduce-scatter leaves each member the sum of the chunk it owns, and all-gather spreads the owners' chunks") {
  // Sizes below, at and above the ring size; ids that are not 0..g-1 (a
  // stage's replicas are ranks s * dp + r).
  for (int g : {1, 2, 3, 4, 5})
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{3}, std::int64_t{4}, std::int64_t{1001}}) {
      CAPTURE(g);
      CAPTURE(n);
      std::vector<int> ids;
      for (int p = 0; p < g; ++p) ids.push_back(10 + 7 * p);
      memory_channel_hub hub;
      std::vector<Tensor> flats(static_cast<std::size_t>(g));
      on_members(g, [&](int p) {
        Tensor& flat = flats[static_cast<std::size_t>(p)];
        flat = Tensor::zeros({n});
        for (std::int64_t i = 0; i < n; ++i) flat.data<float>()[i] = value_of(p, i);
        memory_channel ch(hub, ids[static_cast<std::size_t>(p)]);
        const ring r = ring_at(ids, p);
        ring_reduce_scatter(ch, r, flat, /*step=*/3, /*bucket=*/-1);
        // The owned chunk holds the full sum.
        const auto [lo, hi] = chunk_range(n, g, owned_chunk(r));
        for (std::int64_t i = lo; i < hi; ++i) {
          float sum = 0;
          for (int q = 0; q < g; ++q) sum += value_of(q, i);
          if (flat.data<float>()[i] != sum) throw std::runtime_error("reduced chunk wrong at " + std::to_string(i));
        }
        // The owner "updates" its chunk; the all-gather must spread exactly that.
        for (std::int64_t i = lo; i < hi; ++i) flat.data<float>()[i] = -static_cast<float>(i);
        ring_all_gather(ch, r, flat, 3, -1);
      });
      for (int p = 0; p < g; ++p)
        for (std::int64_t i = 0; i < n; ++i) REQUIRE(flats[static_cast<std::size_t>(p)].data<float>()[i] == -static_cast<float>(i));
      // Bandwidth-optimal: each member sends (g - 1) / g of the buffer per collective.
      CHECK(hub.sent_values() == 2 * (g - 1) * n);
    }
}

TEST_CASE("a ring collective whose neighbour is gone fails instead of waiting") {
  memory_channel_hub hub;
  const std::vector<int> ids{0, 1, 2};
  hub.mark_gone(2);
  Tensor flat = Tensor::zeros({30});
  memory_channel ch(hub, 0);
  CHECK_THROWS_WITH_AS(ring_reduce_scatter(ch, ring_at(ids, 0), flat, 1, 0), "member 2 is gone", std::runtime_error);
}

TEST_CASE("ring passes stepped by hand in one thread, as an actor runs them, leave what the blocking rings leave") {
  // No channel, no threads: each hop every member's outgoing chunk is
  // handed to its next member, in reverse order of members (arrival order
  // must not matter within a hop), until every pass is done.
  for (int g : {1, 2, 3, 5})
    for (std::int64_t n : {std::int64_t{2}, std::int64_t{1001}}) {
      CAPTURE(g);
      CAPTURE(n);
      std::vector<int> ids;
      for (int p = 0; p < g; ++p) ids.push_back(p);
      std::vector<Tensor> flats;
      for (int p = 0; p < g; ++p) {
        flats.push_back(Tensor::zeros({n}));
        for (std::int64_t i = 0; i < n; ++i) flats.back().data<float>()[i] = value_of(p, i);
      }
      auto run = [&](ring_phase phase) {
        std::vector<ring_pass> passes;
        for (int p = 0; p < g; ++p) passes.emplace_back(phase, ring_at(ids, p), flats[static_cast<std::size_t>(p)]);
        for (int hop = 0; hop < g - 1; ++hop) {
          std::vector<Tensor> out;
          for (ring_pass& pass : passes) {
            REQUIRE_FALSE(pass.done());
            CHECK(pass.hop() == hop);
            out.push_back(pass.outgoing());
          }
          for (int p = g - 1; p >= 0; --p) {
            const int from = (p + g - 1) % g;
            ring_pass& pass = passes[static_cast<std::size_t>(p)];
            CHECK(pass.incoming_numel() == out[static_cast<std::size_t>(from)].numel());
            pass.apply(out[static_cast<std::size_t>(from)]);
          }
        }
        for (ring_pass& pass : passes) {
          CHECK(pass.done());
          CHECK_THROWS_AS(pass.apply(Tensor::zeros({1})), tensor_error);  // nothing after the last hop
        }
      };
      run(ring_phase::reduce_scatter);
      for (int p = 0; p < g; ++p) {
        const auto [lo, hi] = chunk_range(n, g, owned_chunk(ring_at(ids, p)));
        for (std::int64_t i = lo; i < hi; ++i) {
          float sum = 0;
          for (int q = 0; q < g; ++q) sum += value_of(q, i);
          REQUIRE(flats[static_cast<std::size_t>(p)].data<float>()[i] == sum);
          flats[static_cast<std::size_t>(p)].data<float>()[i] = -static_cast<float>(i);
        }
      }
      run(ring_phase::all_gather);
      for (int p = 0; p < g; ++p)
        for (std::int64_t i = 0; i < n; ++i) REQUIRE(flats[static_cast<std::size_t>(p)].data<float>()[i] == -static_cast<float>(i));
    }
  // A chunk of the wrong size is refused, and the pass stays at its hop.
  std::vector<int> two{0, 1};
  ring_pass pass(ring_phase::reduce_scatter, ring_at(two, 0), Tensor::zeros({10}));
  CHECK_THROWS_WITH_AS(pass.apply(Tensor::zeros({4})), "ring_pass: hop 0 expects 5 values, got 4", tensor_error);
  CHECK(pass.hop() == 0);
  CHECK(pass.outgoing().numel() == 5);
}
