// net/membership_impl.hpp — membership's state (membership::impl) and the
// pieces its translation units share: membership.cpp (start, announcing,
// refreshing, withdrawing, stop; the public functions) and
// membership_read.cpp (queries, listening, wrong-output report reads).
// Internal: nothing outside net/ includes this header, and it keeps OpenDHT
// out of the public one.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <opendht.h>

#include "net/membership.hpp"

namespace corolla::net {

namespace detail {

/// The clock of refresh times and query deadlines.
using steady = std::chrono::steady_clock;
/// The unit of the options' durations (ttl, refresh, timeouts).
using std::chrono::milliseconds;

/// OpenDHT value type of membership records (registered on every node).
inline constexpr dht::ValueType::Id record_value_type = 0xC011;
/// OpenDHT value type of wrong-output reports (net/wrong_output_report.hpp).
inline constexpr dht::ValueType::Id report_value_type = 0xC012;

/// The DHT key of one block of `model`: InfoHash::get(model + ":block:" +
/// block) (membership_key() is its hex).
inline dht::InfoHash block_key(const std::string& model, int block) {
  return dht::InfoHash::get(model + ":block:" + std::to_string(block));
}

/// Values a get() has received so far (defined in membership_read.cpp).
struct query_state;
/// Acknowledgements of a batch of puts (defined in membership.cpp).
struct put_batch;

}  // namespace detail

// membership.cpp and membership_read.cpp (and only they) name these unqualified.
using detail::block_key;
using detail::milliseconds;
using detail::put_batch;
using detail::query_state;
using detail::record_value_type;
using detail::report_value_type;
using detail::steady;

/// Membership's state. `mu_` guards what the calling threads, the DHT's
/// callbacks, the refresh thread and the dispatcher share; it is never held
/// while calling into the DhtRunner (net/membership.cpp, design notes).
struct membership::impl {
  /// One active announcement and its latest puts.
  struct announcement {
    server_record record;                  ///< as last put (stamped)
    std::vector<dht::Value::Id> value_ids; ///< last value id per block of the span
    steady::time_point next_refresh;  ///< when refresh_loop() puts it again
  };

  /// One listen(): its DHT listens and the records it has reported.
  struct subscription {
    listen_id id = 0;  ///< as listen() returned it
    std::string model;  ///< whose blocks it watches
    membership_callback cb;  ///< the caller's, run on the dispatcher thread
    std::vector<std::pair<dht::InfoHash, std::shared_future<size_t>>> tokens;  ///< a DHT listen per block key
    std::map<std::pair<int, std::string>, server_record> seen;  ///< latest per (block, node)
    bool active = true;  ///< false once unlistened or stopping: no more events
  };

  /// One put to issue (built under mu_, issued without it).
  struct pending_put {
    dht::InfoHash key;  ///< the block's key
    std::shared_ptr<dht::Value> value;  ///< the record, under a fresh value id
    dht::Value::Id cancel = dht::Value::INVALID_ID;  ///< the block's previous put, cancelled
  };

  membership_options opt;  ///< as given to start()
  milliseconds refresh{0};  ///< the refresh interval in use (or ttl / 3)
  std::unique_ptr<dht::DhtRunner> runner = std::make_unique<dht::DhtRunner>();  ///< the DHT node
  std::atomic<bool> started{false};  ///< start() succeeded
  std::string endpoint;  ///< what start() returned (set before `started`)

  mutable std::mutex mu_;  ///< guards the members below, up to put_mu_
  std::condition_variable refresh_cv_;  ///< wakes refresh_loop() (announce, update, stop)
  std::condition_variable events_cv_;  ///< wakes the dispatcher; unlisten() waits on it
  bool stopping_ = false;  ///< shutdown() has begun
  std::uint64_t last_seq_ = 0;  ///< the last seq stamped (stamp())
  std::vector<announcement> active_;  ///< announced and not withdrawn
  std::map<listen_id, std::shared_ptr<subscription>> subs_;  ///< live subscriptions
  listen_id next_listen_ = 1;  ///< the next listen_id (from 1: 0 is listen()'s failure)
  std::deque<std::pair<std::shared_ptr<subscription>, membership_event>> events_;  ///< for the dispatcher, in order
  listen_id delivering_ = 0;  ///< subscription whose callback runs now
  std::thread::id dispatcher_id_;  ///< the dispatcher thread (set when it starts)

  /// Serialises stamping and issuing of puts, so puts leave in seq order and
  /// each cancels the one before it. Never taken by DHT callbacks.
  std::mutex put_mu_;

  std::mutex status_mu_;  ///< with status_cv_: start() waits for a bootstrap node
  std::condition_variable status_cv_;  ///< notified on every change of the DHT node's status

  std::thread refresher_;  ///< runs refresh_loop()
  std::thread dispatcher_;  ///< runs dispatch_loop()
  bool joined_ = false;  ///< shutdown() has run (it runs once)

  /// Runs shutdown() (nothing left to do after stop()).
  ~impl();

  // ---- start (membership.cpp) ----
  /// membership::start(): checks the options, starts the DHT node, waits for
  /// a bootstrap node and the keepalive search, then starts the threads.
  caf::expected<std::string> start(const membership_options& o);
  /// DHT peers the node considers good, IPv4 and IPv6.
  std::size_t count_good_peers() const;

  // ---- announcing (membership.cpp) ----
  /// Stamps `r` for a put (caller holds mu_).
  void stamp(server_record& r);
  /// Puts for every block of `a` after stamping a new version (mu_ held).
  std::vector<pending_put> build_puts(announcement& a);
  /// Puts each value and cancels the put it replaces; with `batch`, counts
  /// their acknowledgements into it. Callers hold put_mu_, not mu_.
  void issue(const std::vector<pending_put>& puts, const std::shared_ptr<put_batch>& batch = {});
  /// Whether two records are of one server: the same model and node id.
  static bool same_server(const server_record& a, const server_record& b);
  /// membership::announce(): records it, puts it at once, wakes the refresher.
  caf::error announce(server_record r);
  /// membership::update(): replaces the record, puts it at once, wakes the refresher.
  caf::error update(server_record r);
  /// Withdraws the active announcements `match` selects (defined in
  /// membership.cpp, the only caller).
  template <class Match>
  std::size_t withdraw(Match match);
  /// Refresh thread: puts every announcement again when its next_refresh
  /// comes, until stopping_.
  void refresh_loop();

  // ---- reading (membership_read.cpp) ----
  /// Starts a DHT get of `key`; the state collects its values as they come.
  std::shared_ptr<query_state> start_query(const dht::InfoHash& key);
  /// Decodes a value found at (model, block); nothing when it is not a
  /// usable record for that key (logged at debug level).
  std::optional<server_record> accept(const dht::Value& v, const std::string& model, int block) const;
  /// Newest fresh record per server from one block's values.
  std::vector<server_record> collect(const std::vector<std::shared_ptr<dht::Value>>& values,
                                     const std::string& model, int block) const;
  /// collect() of every block of [start, end), queried in parallel and waited
  /// for up to query_timeout in all; empty before start() or for a bad range.
  std::vector<std::vector<server_record>> query_blocks(const std::string& model, int start, int end);

  // ---- listening (membership_read.cpp) ----
  /// membership::listen(): 0 before start(), after stop() or without `cb`.
  listen_id listen(const std::string& model, const std::vector<int>& blocks, membership_callback cb);
  /// DHT thread: turns listen values into events for the dispatcher.
  void on_listen_values(const std::shared_ptr<subscription>& sub, int block,
                        const std::vector<std::shared_ptr<dht::Value>>& values, bool expired);
  /// Dispatcher thread: delivers events and reports records that outlived
  /// their TTL (a crashed server's records stay in the DHT longer).
  void dispatch_loop();
  /// membership::unlisten(): ends the subscription, waits for its running
  /// callback (unless called on the dispatcher thread), cancels its listens.
  void unlisten(listen_id id);

  // ---- stop (membership.cpp) ----
  /// Stops the threads and the DHT node and ends every subscription; runs
  /// once (stop() and ~impl).
  void shutdown();
};

}  // namespace corolla::net
