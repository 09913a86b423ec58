// actors/span_server_state.hpp — the span server actor's state
// (actors/span_server.cpp): its queue of one-row steps, the steps waiting
// for a previous server's push, pushes that came early, the sessions' owners
// and idle times, and its statistics. Internal to the span server.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <caf/response_promise.hpp>

#include "actors/span_server.hpp"
#include "actors/swarm_wire.hpp"
#include "model/span_engine.hpp"
#include "actors/step_queue.hpp"

namespace corolla::span_detail {

using clock_type = std::chrono::steady_clock;

/// A one-row step waiting for the batch it will run in.
struct queued_step {
  decode_item item;
  caf::response_promise promise;
  span_step step;  ///< the request (compression, push target)
  /// On a posted route (span_step::trail): what the step sends on and back
  /// after its output.
  std::vector<Tensor> trail;
};

/// A client's step whose input the previous server will push. A session
/// has at most one: any newer step of it ends the older wait.
struct awaited_step {
  span_step step;
  caf::response_promise promise;
  std::uint64_t seq = 0;  ///< tells this wait's timer from an older one's
};

/// A push that arrived before the client's request for it, filed by
/// (session, step id, sending node, the node whose step it is): a
/// stranger's push never displaces the expected one.
using early_key = std::tuple<std::string, std::uint64_t, std::string, std::string>;
struct early_push {
  std::int64_t start = 0;
  Tensor hidden;                   ///< undefined for a failure notice
  std::vector<Tensor> trail;       ///< the tensors after it (posted routes)
  std::string problem;             ///< span_step::upstream_problem
  std::chrono::steady_clock::time_point at;
  std::size_t bytes() const {
    std::size_t n = hidden.defined() ? hidden.nbytes() : 0;
    for (const auto& t : trail) n += t.nbytes();
    return n;
  }
};

/// Early pushes kept at most, by count and by bytes (the oldest go first).
constexpr std::size_t max_early_pushes = 256;
constexpr std::size_t max_early_push_bytes = std::size_t{256} << 20;
/// An early push nobody asked for within this long is dropped.
constexpr std::chrono::seconds early_push_ttl{30};
/// The longest wait for a push a client may ask for.
constexpr std::uint32_t max_push_wait_ms = 600'000;
/// A next server that could not be dialled is tried again after this long;
/// dial records older than forget_dial_after are forgotten, and at most
/// max_dialled are kept (client-named endpoints must not grow the map).
constexpr std::chrono::seconds redial_after{5};
constexpr std::chrono::minutes forget_dial_after{10};
constexpr std::size_t max_dialled = 256;

struct span_server_state {
  std::shared_ptr<span_engine> engine;
  /// The engine before the last move, while sessions opened on it are
  /// still running (they finish there; new sessions open on `engine`).
  std::shared_ptr<span_engine> retiring;
  span_server_options options;
  std::unordered_map<std::string, clock_type::time_point> last_used;
  /// The node that opened each session ("" for this process): only it may
  /// step or close the session. Entries of ended sessions go in expire_idle.
  std::unordered_map<std::string, std::string> owners;
  /// Parked sessions (actors/span_sessions.hpp), the most recently parked
  /// first: open in the engine, but no more steps; the tokens each one's
  /// pages hold, and their sum.
  std::list<std::string> parked;
  std::unordered_map<std::string, std::int64_t> parked_held;
  std::int64_t parked_tokens = 0;
  /// One-row steps waiting for their batch, and when it runs
  /// (actors/step_queue.hpp).
  step_queue<queued_step> queue;
  /// Seconds per block of a one-row step (moving average over batches).
  double step_s_per_block = 0;
  /// The node, for pushing outputs to the next server of a route.
  node* runtime = nullptr;
  std::map<std::string, awaited_step> awaited;  ///< by session
  std::map<early_key, early_push> early;
  std::size_t early_bytes = 0;
  std::uint64_t next_wait_seq = 1;
  /// Endpoints of next servers being dialled, and since when.
  std::map<std::string, clock_type::time_point> dialled;
  /// RTTs to the next block's servers, as the serving program measured them.
  std::map<std::string, double> next_rtt_ms;
  /// Shutting down: no new sessions.
  bool draining = false;
  /// faultlab's `corrupt`: every step and forward answer is wrong on
  /// purpose (actors/fault_corruption.hpp), pushes included.
  bool corrupt = false;
  /// What GET /metrics of `corolla serve` reports (span_server_stats_of).
  span_server_stats stats;
  static inline const char* name = "span_server";
};

}  // namespace corolla::span_detail
