// actors/swarm_client.hpp — the client side of swarm serving (Petals' client):
// it knows the servers, routes a session through them, keeps every span's
// inputs, and on a failure replaces exactly the lost span and rebuilds its
// attention cache by replaying those inputs in one prefill.
//
// Calls block the calling thread (they use node::request); run them from a
// program's own thread, not from inside an actor.
//
// Failover, per step: a hop that fails with a transport or server problem
// (peer_down, not_connected, a timeout, send_failed, unknown_session after a
// server restart, cache_full, an internal error) is replaced by a route over
// its blocks that avoids the failed server for this step only (it is never
// banned: a server that comes back is used again). The replacement's
// sessions get the span's stored inputs plus the current rows as one prefill;
// downstream hops keep their caches. A hung server is detected by the link's
// heartbeats (its peer_down fails the requests in flight), not by the
// request timeout. Retries back off (doubling from retry_backoff) and give
// up with a clear error after max_failovers failed attempts at one hop of a
// step. Errors that a retry would only repeat (invalid_argument,
// bad_message, bad_position, duplicate_session) are returned at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "actors/swarm_wire.hpp"
#include "kernels/tensor.hpp"
#include "model/generator.hpp"
#include "model/head.hpp"
#include "schedule/routing.hpp"

namespace corolla {

class node;

/// How a swarm client finds and uses servers.
struct swarm_client_options {
  /// Servers to use, as "tcp://HOST:PORT" (or "HOST:PORT"). A server that
  /// requires CurveZMQ is given with its public key: "HOST:PORT#KEY" (Z85
  /// has no '#').
  std::vector<std::string> servers;
  /// Asked at every refresh() for more servers, in the same form (e.g. read
  /// from the swarm's DHT records, which carry the key); new ones are added
  /// to `servers`. Optional.
  std::function<std::vector<std::string>()> discover;
  /// Model id the servers must announce ("" = accept any).
  std::string model;
  /// The dtype of the linear weights servers must decode from ("f32",
  /// "bf16", "i8"; "" = accept any): quantised weights change the output.
  std::string weights;
  /// The model's blocks and hidden size, when the client knows them (0 =
  /// take them from the first server that answers); servers of another
  /// shape are left out.
  int n_blocks = 0, hidden_size = 0;
  std::chrono::milliseconds connect_timeout{5000};
  /// Longest wait for one server's answer (a hung server is normally
  /// reported down by the link's heartbeats long before).
  std::chrono::milliseconds request_timeout{30000};
  /// A session opened longer than this after the last refresh() refreshes
  /// first (asking `discover` again), so servers that joined since are
  /// routed through; sessions already open keep their route until a
  /// failure.
  std::chrono::milliseconds refresh_period{std::chrono::seconds(30)};
  /// Recovery attempts per step before giving up.
  int max_failovers = 12;
  /// First pause before re-asking the servers when nothing covers a span;
  /// doubles up to 2 s.
  std::chrono::milliseconds retry_backoff{100};
  /// Hidden states travel as blockwise int8 (absmax per block of 4096 values,
  /// about 1/4 of the bytes) both ways; lossy, so greedy output may differ
  /// from local generation. Replays travel uncompressed.
  bool compress = false;
  /// Servers push each step's output straight to the next server of the
  /// route and return it to the client off the critical path (one network
  /// hop per server instead of two). Off: the client carries every hop.
  /// A push that cannot be made (no link between the servers yet, a
  /// failure) falls back to the client carrying the rest of that step.
  bool server_push = true;
  /// Called with one line per route, failure and replay (for logs, the demo).
  std::function<void(const std::string&)> on_event;
};

/// A server as the client sees it.
struct known_server {
  std::string endpoint;
  std::string public_key;  ///< CurveZMQ key of the server ("" = none)
  std::string node_id;  ///< "" until it answered once
  span_info info;
  bool reachable = false;
};

class swarm_session;

/// The servers of one swarm and routes through them.
class swarm_client {
 public:
  /// A client over the servers in `options` (connects lazily: refresh()).
  swarm_client(node& n, swarm_client_options options);

  /// (Re)connects to every server not known yet and asks each reachable one
  /// for its span. Servers that do not answer, answer nonsense, serve another
  /// model or another shape are left out (logged). Error (not_connected):
  /// no usable server, naming the first problem.
  caf::error refresh();
  /// Before retry number `retry` (0 = the first): pauses retry_backoff
  /// doubled per retry (at most 2 s), then refreshes. Returns refresh()'s
  /// error only when a retry could not help (not is_recoverable).
  caf::error back_off(int retry);
  /// Sets the model's shape the servers must have (before refresh()).
  void expect_shape(int n_blocks, int hidden_size) {
    if (n_blocks_ == 0) n_blocks_ = n_blocks, hidden_size_ = hidden_size;
  }
  /// Whether refresh() ran at least once.
  bool refreshed() const { return refreshed_; }
  /// Blocks of the model (from the servers' answers; 0 before refresh()).
  int n_blocks() const { return n_blocks_; }
  int hidden_size() const { return hidden_size_; }
  const std::vector<known_server>& servers() const { return servers_; }
  /// The server answering as `node_id`, or null.
  const known_server* server(const std::string& node_id) const;
  /// The swarm as routing sees it: reachable servers, ONLINE.
  swarm::swarm_state state() const;
  /// The lowest-latency route over [start, end) avoiding `excluded`.
  caf::expected<swarm::route> route(int start, int end, const std::set<std::string>& excluded,
                                    std::int64_t session_tokens) const;
  /// A max-throughput route over [start, end) avoiding `excluded` (for
  /// fine-tuning's stateless forward and backward), drawn from `rng`.
  caf::expected<swarm::route> throughput_route(int start, int end, const std::set<std::string>& excluded,
                                               std::mt19937_64& rng) const;
  /// Opens an inference session for up to `max_length` tokens. With deep
  /// prompts (f32 [n_layers, P, D], host), every server's session gets the
  /// slice for its blocks (replacements too) and positions [0, P) are a
  /// prefix: the caller's first step starts with P zero rows.
  caf::expected<std::unique_ptr<swarm_session>> open_session(std::int64_t max_length,
                                                             const Tensor& deep_prompts = {});

  node& runtime() { return node_; }
  const swarm_client_options& options() const { return options_; }
  void event(const std::string& line) const;

 private:
  node& node_;
  swarm_client_options options_;
  std::vector<known_server> servers_;
  int n_blocks_ = 0, hidden_size_ = 0;
  bool refreshed_ = false;
  std::chrono::steady_clock::time_point last_refresh_{};
};

/// One inference session through the swarm.
class swarm_session {
 public:
  ~swarm_session();
  swarm_session(const swarm_session&) = delete;
  swarm_session& operator=(const swarm_session&) = delete;

  /// Runs hidden [n, D] for positions [start, start + n) through every
  /// block and returns the last block's output [n, D]. start below the
  /// session's length rolls back (the stored inputs are cut too).
  caf::expected<Tensor> step(const Tensor& hidden, std::int64_t start);
  /// Closes the servers' sessions (also done by the destructor).
  void close();

  /// The current chain of servers.
  const std::vector<swarm::route_hop>& hops() const;
  /// Failures recovered so far.
  int failovers() const { return failovers_; }
  /// Hop inputs that came by server push, not from the client (a step
  /// through k servers has k - 1).
  std::uint64_t pushed_hops() const { return pushed_hops_; }
  /// Tokens processed (the session's length).
  std::int64_t length() const { return length_; }

 private:
  friend class swarm_client;
  struct hop_state;
  swarm_session(swarm_client& client, std::int64_t max_length, std::string id, Tensor deep_prompts);
  caf::error open_hops(std::vector<swarm::route_hop> hops, std::size_t at);
  caf::expected<Tensor> run_hop(std::size_t i, const Tensor& input, std::int64_t start);
  caf::expected<Tensor> pass(std::size_t i, const Tensor& x, std::int64_t start);
  std::size_t push_step(Tensor& x, std::int64_t start);
  void remember_input(hop_state& h, Tensor sent, std::int64_t start);
  caf::error recover(std::size_t i, const caf::error& cause, std::set<std::string>& excluded, int attempt);

  swarm_client& client_;
  std::int64_t max_length_ = 0;
  std::string id_;
  Tensor deep_prompts_;  ///< [n_layers, P, D] on the host, or undefined
  std::uint64_t next_session_ = 0;  ///< suffix of per-server session ids
  std::uint64_t next_step_ = 1;
  std::uint64_t step_id_ = 0;  ///< the id of the step() call in progress
  std::int64_t length_ = 0;
  int failovers_ = 0;
  std::uint64_t pushed_hops_ = 0;
  std::vector<hop_state> hops_;
  mutable std::vector<swarm::route_hop> hop_view_;
};

/// True for errors after which another server (or the same one, later)
/// may well succeed.
bool is_recoverable(const caf::error& e);

/// What swarm_generate reports besides the tokens.
struct swarm_generation {
  generation_result result;
  std::vector<swarm::route_hop> route;  ///< the chain at the end
  int failovers = 0;                    ///< failures recovered on the way
  std::uint64_t pushed_hops = 0;        ///< hop inputs pushed server to server
};

/// Generates through the swarm: the client embeds and samples with `h`
/// (embeddings, final norm, LM head), the servers run every block. Same
/// loop, validation and stop rules as local generation (generate_tokens),
/// so greedy output equals the local one. With `deep_prompts` (f32
/// [n_layers, P, D], what `corolla finetune` saves) the servers add them
/// over a prefix of P positions, as generator::set_deep_prompts does
/// locally, and failover replays the prefix too. Throws model_error for a
/// bad request and std::runtime_error when the swarm fails for good.
swarm_generation swarm_generate(swarm_client& client, head& h, std::span<const std::int32_t> prompt,
                                const generation_params& p, const token_callback& on_token = {},
                                const Tensor& deep_prompts = {});

}  // namespace corolla
