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
//
// Spot checks (actors/swarm_spot_check.cpp, schedule/spot_check.hpp): some
// steps of a hop are recomputed by another server holding the same blocks
// (a stateless span.forward of the hop's stored inputs) and compared; when
// they disagree, more servers are asked until a majority decides. A server
// outvoted is never routed through again by this client, reported
// (on_wrong_server: the apps put it in the DHT), and the step is redone from
// its hop on a replacement, so a wrong answer caught never reaches the
// caller.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "actors/swarm_wire.hpp"
#include "kernels/tensor.hpp"
#include "schedule/routing.hpp"
#include "schedule/spot_check.hpp"

namespace corolla {

class node;
struct connect_options;

/// A server that a spot check's majority found answering wrong.
struct wrong_server_report {
  std::string server;    ///< its node id
  std::string endpoint;  ///< where the client reached it
  int start = 0, end = 0;  ///< the blocks it was checked on
  /// Its answer's distance to the majority's (relative, per row) and the
  /// tolerance it exceeded.
  double difference = 0, tolerance = 0;
  std::vector<std::string> majority;  ///< node ids of the servers that agreed
};

/// A LoRA adapter as a client names it: NAME, or NAME@DIGEST (its
/// fingerprint, lora_adapter::digest, as `serve` logs it).
struct adapter_ref {
  std::string name;
  std::string digest;  ///< "" = not given (the first server's is pinned)
  /// Splits `spec` at its last '@'. Throws std::invalid_argument for an
  /// empty name, or an '@' with no digest after it.
  static adapter_ref parse(const std::string& spec);
  /// "" when `name` is an adapter name as servers take them (`serve
  /// --adapter NAME=DIR`) and clients send them (a request's model,
  /// NAME@DIGEST); else why not: empty, "." or "..", over
  /// max_adapter_name_bytes, or with a space, control character, '=', ','
  /// or '@'.
  static std::string name_problem(const std::string& name);
};

/// The longest adapter name (bytes).
inline constexpr std::size_t max_adapter_name_bytes = 128;

/// How a swarm client finds and uses servers.
struct swarm_client_options {
  /// Servers to use, as "tcp://HOST:PORT" (or "HOST:PORT"). A server that
  /// requires CurveZMQ is given with its public key: "HOST:PORT#KEY" (the
  /// first '#' ends the endpoint). A server behind NAT is given as
  /// "NODE_ID@HOST:PORT" with its relay's endpoint (and the relay's key):
  /// the client reaches it through the relay (actors/relay.hpp).
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
  /// The LoRA adapter every session and request computes with: NAME (as
  /// servers announce it in span.info: `serve --adapter NAME=DIR`) or
  /// NAME@DIGEST (its fingerprint, lora_adapter::digest, as serve logs
  /// it). Servers that do not hold it are left out, and so are servers
  /// holding an adapter of that name with another digest: the one asked
  /// for, or without one the first a refresh met. "" = the base model.
  std::string adapter;
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
  /// With server_push: once a route's pushes have gone through, its
  /// one-row steps (decode) are posted: every hop but the last gets its
  /// step one-way and answers nothing; the last hop's answer brings every
  /// hop's output (docs/protocol.md "Posted steps"). Off: every hop answers.
  /// Not used with compress (the extra outputs travel f32).
  bool post_steps = true;
  /// Called with one line per route, failure and replay (for logs, the demo).
  std::function<void(const std::string&)> on_event;
  /// Which steps are recomputed by a second server and compared
  /// (schedule/spot_check.hpp); fraction 0 and probation 0 = no checks.
  swarm::spot_check_policy spot_checks{};
  /// Seed of the random choice of steps and checkers (0 = from the OS).
  std::uint64_t spot_check_seed = 0;
  /// Called for every server a spot check found wrong (after it is already
  /// excluded): e.g. to report it in the swarm's DHT.
  std::function<void(const wrong_server_report&)> on_wrong_server;
  /// Asked at every refresh() for the node ids of servers others reported
  /// wrong (e.g. the DHT's reports): every step of theirs is checked.
  /// Optional.
  std::function<std::vector<std::string>()> reported;
};

/// What the spot checks of a client have done so far.
struct spot_check_stats {
  std::uint64_t checks = 0;       ///< hop steps compared with another server
  /// Rows of checked answers over the tolerance but excused: a checker saw
  /// the row's mixture-of-experts routing at a near tie (swarm::compare_rows).
  std::uint64_t excused_rows = 0;
  std::uint64_t unchecked = 0;    ///< steps chosen for a check with no other server to ask
  std::uint64_t disagreements = 0;  ///< checks where some answer differed
  std::uint64_t undecided = 0;    ///< disagreements with no majority (no third server)
  std::vector<wrong_server_report> wrong;  ///< servers found wrong, in order
};

/// A server's opinion in a spot check: the rows it computed for the
/// question and, when it reported them (span.forward with margins), each
/// row's routing margin (span_engine::forward; empty otherwise).
struct spot_opinion {
  Tensor rows;
  std::vector<float> margins;
  /// The rows of the sequence before `rows` (a session's earlier steps,
  /// recomputed with it) and their margins: where one of them was routed
  /// apart from the checked server's, `rows` moved with it.
  Tensor earlier;
  std::vector<float> earlier_margins;
};

/// The opinion in a span.forward answer `r` (hidden [rows, D], then
/// optionally margins [rows]): rows [start, start + n) of both, and rows
/// [0, start) as the earlier ones. A malformed answer is bad_message.
caf::expected<spot_opinion> spot_opinion_of(remote_message r, std::int64_t start, std::int64_t n);

/// A server as the client sees it.
struct known_server {
  std::string endpoint;    ///< the server's, or for a relayed one its relay's
  std::string public_key;  ///< CurveZMQ key of the server (relayed: of its relay) ("" = none)
  std::string node_id;  ///< "" until it answered once (a relayed one is named up front)
  /// Reached through the relay at `endpoint` (actors/relay.hpp): a server
  /// behind NAT, given as "NODE_ID@HOST:PORT".
  bool relayed = false;
  std::string relay_id;  ///< the relay's node id, once dialled
  span_info info;
  bool reachable = false;
};

/// A `servers` entry: "HOST:PORT#KEY" is the server with its endpoint and
/// CurveZMQ key; "NODE_ID@HOST:PORT#KEY" is server NODE_ID behind the relay
/// at HOST:PORT (with the relay's key). The scheme defaults to tcp://.
/// Nothing is checked here (apps/swarm_flags.hpp checks the flag's entries).
known_server server_from_entry(const std::string& entry);

class swarm_session;

/// What a session's servers hold that another session of the same client
/// node may start from (swarm_session::prefix, swarm_client::open_session):
/// its route, its session on each hop's server, and the inputs it sent each
/// hop for positions [0, tokens) or more (kept for replays; immutable, so a
/// copy shares them).
struct swarm_prefix {
  struct hop {
    swarm::route_hop hop;
    std::string session;         ///< the session id on hop.server
    std::vector<Tensor> inputs;  ///< rows from position 0, in position order
  };
  /// Positions [0, tokens) to start on (a caller may lower it to what the
  /// new session's inputs have in common).
  std::int64_t tokens = 0;
  std::vector<hop> hops;
  bool empty() const { return tokens <= 0 || hops.empty(); }
};

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
  /// The adapters the reachable servers (as the last refresh() found them)
  /// hold over the whole model: each NAME@DIGEST whose holders' spans
  /// cover every block, sorted; names failing adapter_ref::name_problem
  /// are left out.
  std::vector<adapter_ref> complete_adapters() const;
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
  /// With a non-empty `share` (no deep prompts), the session is opened on
  /// the same route as the session `share` describes, each server starting
  /// it on that session's KV pages for positions [0, share.tokens)
  /// (span.open shareFrom; the other session must be this node's and open):
  /// length() is then the positions every hop holds (fewer or 0 when a
  /// server could not share), the caller's first step starts there, and a
  /// replay resends share's stored inputs. When that route cannot be
  /// opened, or its servers share nothing (the other session is gone), the
  /// session takes a route of its own from position 0 (share_missed()).
  caf::expected<std::unique_ptr<swarm_session>> open_session(std::int64_t max_length,
                                                             const Tensor& deep_prompts = {},
                                                             const swarm_prefix& share = {});

  node& runtime() { return node_; }
  const swarm_client_options& options() const { return options_; }
  /// The adapter's name (options().adapter without @DIGEST), what requests
  /// name; "" = the base model.
  const std::string& adapter_name() const { return adapter_name_; }
  /// Its digest: the one asked for (NAME@DIGEST), else the first server's
  /// that refresh() met holding it ("" before).
  const std::string& adapter_digest() const { return adapter_digest_; }
  void event(const std::string& line) const;

  /// Spot checks so far (all sessions of this client).
  const spot_check_stats& spot_checks() const { return spot_stats_; }
  /// Whether a spot check found `node_id` wrong (it is routed around).
  bool distrusted(const std::string& node_id) const { return distrusted_.count(node_id) > 0; }
  /// A server that failed a step goes back on probation: its next steps
  /// are all checked again.
  void on_probation(const std::string& node_id) { agreed_[node_id] = 0; }
  /// Whether `node_id`'s next answer gets a spot check: on probation,
  /// reported by others, or drawn with options().spot_checks.fraction.
  bool should_spot_check(const std::string& node_id);
  /// Spot-checks `answer` (f32 [rows, width]) that `hop.server` gave for
  /// blocks [hop.start, hop.end): `ask(other)` must return what server
  /// `other` computes for the same request (with the rows' routing margins
  /// where it can: rows a checker saw at a routing near tie are excused,
  /// swarm::compare_rows), and is called for servers holding all those
  /// blocks with the same weights, until two answers agree or a majority
  /// decides. Returns false when the majority found `hop.server` wrong;
  /// every server it outvotes (the checked one or a checker) is distrusted,
  /// counted and reported (on_wrong_server). A row attends to the earlier
  /// rows of its sequence (`seq` rows each, 0 = one sequence), so rows
  /// after one excused are excused too; `history`: what `hop.server`
  /// answered for the sequence's earlier rows (the checkers' opinions hold
  /// theirs), where a row routed apart before would excuse these (unknown:
  /// any near tie there does).
  bool spot_check(const swarm::route_hop& hop, const Tensor& answer,
                  const std::function<caf::expected<spot_opinion>(const std::string& server)>& ask,
                  const Tensor& history = Tensor(), std::size_t seq = 0);

 private:
  /// Whether a new session can open on share's route: every server still
  /// routed through, the hops covering the model's blocks in order.
  bool shares_route(const swarm_prefix& share) const;
  /// Dials a relayed server's relay (once) and opens the relayed link.
  caf::error reach_through_relay(known_server& s, const connect_options& c);

  node& node_;
  swarm_client_options options_;
  std::vector<known_server> servers_;
  std::map<std::string, int> agreed_;  ///< checks each server passed since it was new or failed
  std::set<std::string> distrusted_;   ///< servers a spot check found wrong
  std::set<std::string> reported_;     ///< servers others reported wrong (options_.reported)
  spot_check_stats spot_stats_;
  std::mt19937_64 spot_rng_;
  int n_blocks_ = 0, hidden_size_ = 0;
  /// options_.adapter split; adapter_digest_ is the one asked for, else the
  /// first a server announced for that name (then kept).
  std::string adapter_name_, adapter_digest_;
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
  /// Closes the servers' sessions (also done by the destructor). With
  /// `keep` they are parked instead (span.close keep): no more steps, but
  /// the servers keep their pages for this node's later sessions to start
  /// on (open_session with this session's prefix()) until they need them.
  void close(bool keep = false);

  /// The current chain of servers.
  const std::vector<swarm::route_hop>& hops() const;
  /// Failures recovered so far.
  int failovers() const { return failovers_; }
  /// Hop inputs that came by server push, not from the client (a step
  /// through k servers has k - 1).
  std::uint64_t pushed_hops() const { return pushed_hops_; }
  /// Steps posted (swarm_client_options::post_steps): only the last hop
  /// answered.
  std::uint64_t posted_steps() const { return posted_steps_; }
  /// Tokens processed (the session's length).
  std::int64_t length() const { return length_; }
  /// Opened with a share (swarm_client::open_session) that gave nothing:
  /// its route was no longer usable, or its servers no longer held the
  /// other session (the session took a route of its own).
  bool share_missed() const { return share_missed_; }
  /// What another session may start on (swarm_client::open_session): this
  /// session's route, its server sessions and stored inputs for its
  /// length() positions. Empty while a replacement is being rebuilt, with
  /// deep prompts, or before a step.
  swarm_prefix prefix() const;

 private:
  friend class swarm_client;
  struct hop_state;
  swarm_session(swarm_client& client, std::int64_t max_length, std::string id, Tensor deep_prompts);
  /// Opens sessions on `hops` and inserts them at `at`. With `share`
  /// (hop for hop the same route), each starts on share's session there and
  /// the session's length becomes what every hop holds.
  caf::error open_hops(std::vector<swarm::route_hop> hops, std::size_t at, const swarm_prefix* share = nullptr);
  caf::expected<Tensor> run_hop(std::size_t i, const Tensor& input, std::int64_t start);
  caf::expected<Tensor> pass(std::size_t i, const Tensor& x, std::int64_t start);
  /// A step with servers pushing to each other: posted (post_step) once the
  /// route's pushes have gone through, else by request (request_step).
  /// Returns the hop from which the client carries the step itself.
  std::size_t push_step(const Tensor& x, std::int64_t start, std::vector<Tensor>& outs);
  /// Nothing when the step could not be posted (nothing went out).
  std::optional<std::size_t> post_step(const Tensor& x, std::int64_t start, std::vector<Tensor>& outs);
  std::size_t request_step(const Tensor& x, std::int64_t start, std::vector<Tensor>& outs);
  /// Hop i's span.step of a pushed step (posted: with the trail).
  span_step pushed_step(std::size_t i, std::int64_t start, std::chrono::milliseconds timeout, bool posted) const;
  caf::error run_hops(std::size_t from, const Tensor& x, std::int64_t start, std::vector<Tensor>& outs);
  /// Spot-checks hops [from, end) of this step (outs: their outputs);
  /// returns the first hop a majority found wrong, or hops_.size().
  std::size_t check_hops(std::size_t from, const std::vector<Tensor>& outs, std::int64_t start, std::int64_t n);
  /// Rows [start, start + n) of `server`'s stateless forward of `inputs`
  /// through the hop's blocks, with their routing margins.
  caf::expected<spot_opinion> recompute(const std::string& server, const swarm::route_hop& hop, const Tensor& inputs,
                                        std::int64_t start, std::int64_t n);
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
  std::uint64_t posted_steps_ = 0;
  /// The route's last pushed step went through every hop: the next one-row
  /// step is posted.
  bool route_pushes_ = false;
  bool share_missed_ = false;
  std::vector<hop_state> hops_;
  mutable std::vector<swarm::route_hop> hop_view_;
};

/// Closes, for good, the server sessions `parked` names (sessions of this
/// node that swarm_session::close(true) parked), best effort.
void close_parked(node& n, const swarm_prefix& parked);

/// True for errors after which another server (or the same one, later)
/// may well succeed.
bool is_recoverable(const caf::error& e);

}  // namespace corolla
