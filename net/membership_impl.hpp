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

using steady = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// OpenDHT value type of membership records (registered on every node).
inline constexpr dht::ValueType::Id record_value_type = 0xC011;
/// OpenDHT value type of wrong-output reports (net/wrong_output_report.hpp).
inline constexpr dht::ValueType::Id report_value_type = 0xC012;

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

struct membership::impl {
  struct announcement {
    server_record record;                  // as last put (stamped)
    std::vector<dht::Value::Id> value_ids; // last value id per block of the span
    steady::time_point next_refresh;
  };

  struct subscription {
    listen_id id = 0;
    std::string model;
    membership_callback cb;
    std::vector<std::pair<dht::InfoHash, std::shared_future<size_t>>> tokens;
    std::map<std::pair<int, std::string>, server_record> seen;  // latest per (block, node)
    bool active = true;
  };

  /// One put to issue (built under mu_, issued without it).
  struct pending_put {
    dht::InfoHash key;
    std::shared_ptr<dht::Value> value;
    dht::Value::Id cancel = dht::Value::INVALID_ID;
  };

  membership_options opt;
  milliseconds refresh{0};
  std::unique_ptr<dht::DhtRunner> runner = std::make_unique<dht::DhtRunner>();
  std::atomic<bool> started{false};
  std::string endpoint;

  mutable std::mutex mu_;
  std::condition_variable refresh_cv_;
  std::condition_variable events_cv_;
  bool stopping_ = false;
  std::uint64_t last_seq_ = 0;
  std::vector<announcement> active_;
  std::map<listen_id, std::shared_ptr<subscription>> subs_;
  listen_id next_listen_ = 1;
  std::deque<std::pair<std::shared_ptr<subscription>, membership_event>> events_;
  listen_id delivering_ = 0;  // subscription whose callback runs now
  std::thread::id dispatcher_id_;

  // Serialises stamping and issuing of puts, so puts leave in seq order and
  // each cancels the one before it. Never taken by DHT callbacks.
  std::mutex put_mu_;

  std::mutex status_mu_;
  std::condition_variable status_cv_;

  std::thread refresher_;
  std::thread dispatcher_;
  bool joined_ = false;

  ~impl();

  // ---- start (membership.cpp) ----
  caf::expected<std::string> start(const membership_options& o);
  std::size_t count_good_peers() const;

  // ---- announcing (membership.cpp) ----
  /// Stamps `r` for a put (caller holds mu_).
  void stamp(server_record& r);
  /// Puts for every block of `a` after stamping a new version (mu_ held).
  std::vector<pending_put> build_puts(announcement& a);
  void issue(const std::vector<pending_put>& puts, const std::shared_ptr<put_batch>& batch = {});
  static bool same_server(const server_record& a, const server_record& b);
  caf::error announce(server_record r);
  caf::error update(server_record r);
  /// Withdraws the active announcements `match` selects (defined in
  /// membership.cpp, the only caller).
  template <class Match>
  std::size_t withdraw(Match match);
  void refresh_loop();

  // ---- reading (membership_read.cpp) ----
  std::shared_ptr<query_state> start_query(const dht::InfoHash& key);
  /// Decodes a value found at (model, block); nothing when it is not a
  /// usable record for that key (logged at debug level).
  std::optional<server_record> accept(const dht::Value& v, const std::string& model, int block) const;
  /// Newest fresh record per server from one block's values.
  std::vector<server_record> collect(const std::vector<std::shared_ptr<dht::Value>>& values,
                                     const std::string& model, int block) const;
  std::vector<std::vector<server_record>> query_blocks(const std::string& model, int start, int end);

  // ---- listening (membership_read.cpp) ----
  listen_id listen(const std::string& model, const std::vector<int>& blocks, membership_callback cb);
  /// DHT thread: turns listen values into events for the dispatcher.
  void on_listen_values(const std::shared_ptr<subscription>& sub, int block,
                        const std::vector<std::shared_ptr<dht::Value>>& values, bool expired);
  /// Dispatcher thread: delivers events and reports records that outlived
  /// their TTL (a crashed server's records stay in the DHT longer).
  void dispatch_loop();
  void unlisten(listen_id id);

  // ---- stop (membership.cpp) ----
  void shutdown();
};

}  // namespace corolla::net
