// actors/span_stats.hpp — what a span server counts while it serves: steps
// by kind with their durations, sessions, errors, and a snapshot of its
// cache, for `corolla serve --metrics-listen` (apps/serve_metrics.cpp renders
// them in Prometheus' format). The server actor owns the counters; a
// snapshot travels in a message (span_server_stats_of).
#pragma once

#include <cstdint>
#include <vector>

namespace corolla {

/// Durations in seconds: counts per bucket (not cumulative; the last bucket
/// is +Inf), their sum and number.
struct duration_histogram {
  /// Upper bounds of the buckets, 100 µs to 10 s.
  static const std::vector<double>& bounds();
  std::vector<std::uint64_t> counts = std::vector<std::uint64_t>(bounds().size() + 1, 0);
  double sum = 0;
  std::uint64_t count = 0;
  void observe(double seconds);
};

/// A span server's counters since it started, and its state now.
struct span_server_stats {
  // Work, by kind: one-row decode steps (batched across sessions),
  // multi-row steps (prefill), and the stateless passes of fine-tuning.
  std::uint64_t decode_steps = 0;    ///< one-row steps answered
  std::uint64_t decode_batches = 0;  ///< batches they ran in
  std::uint64_t decode_waits = 0;    ///< batches that waited for sessions of the last batches
  std::uint64_t prefill_steps = 0;
  std::uint64_t prefill_tokens = 0;
  std::uint64_t forward_passes = 0, backward_passes = 0;
  /// Wall time of each step on this server (the hop's compute): a decode
  /// step counts its batch's time.
  duration_histogram decode_seconds, prefill_seconds, forward_seconds, backward_seconds;
  std::uint64_t step_errors = 0;  ///< steps and passes answered with an error
  std::uint64_t push_timeouts = 0;  ///< steps whose previous server's push never came
  std::uint64_t sessions_opened = 0, sessions_closed = 0, sessions_expired = 0;
  /// Sessions opened on another session's KV pages (span.open with
  /// shareFrom), and the tokens they did not compute.
  std::uint64_t sessions_shared = 0, shared_tokens = 0;
  /// Sessions closed with `keep` (parked: their pages kept for later
  /// sessions of the same node), and parked sessions the server closed
  /// itself (it needed their pages, drained or moved).
  std::uint64_t sessions_parked = 0, parked_closed = 0;

  // Now.
  std::uint64_t sessions_open = 0;  ///< parked ones not counted
  std::uint64_t sessions_parked_now = 0;
  std::int64_t cache_tokens = 0, cache_tokens_left = 0;
  double step_s_per_block = 0;  ///< moving average of a one-row step
  int first = 0, last = 0;      ///< the blocks served
  bool draining = false;
};

}  // namespace corolla
