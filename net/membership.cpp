// net/membership.cpp — membership records in OpenDHT: announce, refresh,
// withdraw, read, listen.
//
// Design notes (measured against libopendht 2.4.12):
// - Every put carries a fresh value id. OpenDHT does not notify listeners
//   when a stored value is replaced under the same id, so an update that
//   reused the id would never reach listen(); with fresh ids each refresh is
//   a new value, and the previous one is cancelled in the announcing search
//   (it still sits in storage until the DHT expires it, and readers skip it
//   because a newer seq of the same server exists).
// - The value type's DHT expiration is max(ttl, 12 s): OpenDHT re-announces
//   a value (expiration - 10 s) after each acknowledgement, so an expiration
//   at or below 10 s makes it re-put in a tight loop. The DHT expiry is
//   therefore only garbage collection; the TTL is enforced by readers from
//   the record's own timestamp.
// - DhtRunner runs no get, put or listen of a node that knows peers but has
//   had no answer from any (status "connecting"): it holds them until a peer
//   answers. A node with no search open when peers contact it, typically
//   the first node of a swarm, only probes them with a find_node to one
//   random peer (per routing-table bucket) 1 s after the first contact, then
//   every 5-25 s. When that probe picks a peer that has crashed since, the
//   node reads nothing and stops refreshing its own records for 5-25 s or
//   more, while live peers keep storing records on it. So every node keeps
//   one search open from start(), the keepalive: a listen on its own node
//   id, which nobody writes. OpenDHT adds each peer that contacts us to the
//   open searches it is close enough for and queries it at once, so live
//   peers answer within a round trip, and a crashed one is replaced from
//   the routing table as in any search.
// - Locking: `mu_` guards our state and is taken by OpenDHT callbacks (DHT
//   thread). It is never held while calling into the DhtRunner, which takes
//   its own locks and may run callbacks.
#include "net/membership.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <opendht.h>
#include <spdlog/spdlog.h>

namespace corolla::net {

namespace {

using steady = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// OpenDHT value type of membership records (registered on every node).
constexpr dht::ValueType::Id record_value_type = 0xC011;
/// OpenDHT value type of wrong-output reports (net/wrong_output_report.hpp).
constexpr dht::ValueType::Id report_value_type = 0xC012;
/// OpenDHT re-announces (expiration - 10 s) after an acknowledgement.
constexpr milliseconds min_dht_expiration{12'000};

caf::error fail(std::string what) {
  return caf::make_error(caf::sec::invalid_argument, "membership: " + std::move(what));
}

dht::InfoHash block_key(const std::string& model, int block) {
  return dht::InfoHash::get(model + ":block:" + std::to_string(block));
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A value id unique per (server, block, put): fresh ids are what makes
/// listeners see every update (see the file comment).
dht::Value::Id value_id_for(const server_record& r, int block) {
  std::uint64_t h = std::hash<std::string>{}(r.model + '\n' + r.node_id);
  std::uint64_t id = splitmix64(h ^ splitmix64(r.seq) ^ (static_cast<std::uint64_t>(block) << 40));
  return id == dht::Value::INVALID_ID ? 1 : id;
}

std::uint64_t unix_us_now() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

bool is_loopback(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1" || address == "localhost";
}

/// Splits "host:port" / "[v6]:port"; false when malformed.
bool split_host_port(const std::string& s, std::string& host, std::string& port) {
  if (!s.empty() && s.front() == '[') {
    auto close = s.find(']');
    if (close == std::string::npos || close + 2 > s.size() || s[close + 1] != ':') return false;
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string::npos || s.find(':') != colon) return false;
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  if (host.empty() || port.empty() || port.size() > 5) return false;
  if (!std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  return std::stoul(port) > 0 && std::stoul(port) <= 65535;
}

/// Same announcement content, ignoring what changes on every refresh.
bool same_content(server_record a, const server_record& b) {
  a.seq = b.seq;
  a.timestamp_ms = b.timestamp_ms;
  return a == b;
}

/// Values a get() has received so far; shared with OpenDHT's callbacks so a
/// reply arriving after the caller gave up writes into live memory.
struct query_state {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<dht::Value>> values;
  bool done = false;

  /// The values received once the get is done, or whatever came by `deadline`.
  std::vector<std::shared_ptr<dht::Value>> wait(steady::time_point deadline) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait_until(lk, deadline, [&] { return done; });
    return values;
  }
};

/// Acknowledgements of a batch of puts (withdraw_offline waits on it).
struct put_batch {
  std::mutex mu;
  std::condition_variable cv;
  std::size_t pending = 0;
  std::size_t acked = 0;
};

}  // namespace

std::string membership_key(const std::string& model, int block) { return block_key(model, block).toString(); }

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

  ~impl() { shutdown(); }

  // ---- start ------------------------------------------------------------

  caf::expected<std::string> start(const membership_options& o) {
    if (started) return fail("start() called twice");
    if (o.network_id == 0) return fail("network id 0 is OpenDHT's public network; choose another");
    if (o.ttl < milliseconds(min_record_ttl_ms) || o.ttl > milliseconds(max_record_ttl_ms))
      return fail("ttl " + std::to_string(o.ttl.count()) + " ms outside [" + std::to_string(min_record_ttl_ms) +
                  ", " + std::to_string(max_record_ttl_ms) + "] ms");
    refresh = o.refresh_interval.count() > 0 ? o.refresh_interval : o.ttl / 3;
    if (refresh >= o.ttl)
      return fail("refresh interval " + std::to_string(refresh.count()) + " ms is not below the ttl " +
                  std::to_string(o.ttl.count()) + " ms (records would expire between refreshes)");
    opt = o;
    const bool v6 = o.bind_address.find(':') != std::string::npos;

    std::vector<dht::SockAddr> peers;
    for (const auto& b : o.bootstrap) {
      std::string host, port;
      if (!split_host_port(b, host, port))
        return fail("bootstrap entry '" + b + "' is not HOST:PORT");
      std::vector<dht::SockAddr> found;
      try {
        found = dht::SockAddr::resolve(host, port);
      } catch (const std::exception&) {
      }
      std::size_t before = peers.size();
      for (auto& a : found)
        if (a.getFamily() == (v6 ? AF_INET6 : AF_INET)) peers.push_back(a);
      if (peers.size() == before)
        return fail("cannot resolve bootstrap entry '" + b + "' to an " + (v6 ? "IPv6" : "IPv4") + " address");
    }

    dht::DhtRunner::Config cfg;
    cfg.threaded = true;
    cfg.dht_config.node_config.network = o.network_id;
    std::int64_t limit = o.max_peer_requests_per_s;
    if (limit == 0 && is_loopback(o.bind_address)) limit = -1;
    if (limit != 0) cfg.dht_config.node_config.max_peer_req_per_sec = static_cast<ssize_t>(limit);
    try {
      const std::string service = std::to_string(o.port);
      runner->run(v6 ? "" : o.bind_address.c_str(), v6 ? o.bind_address.c_str() : "", service.c_str(), cfg);
    } catch (const std::exception& e) {
      return fail("cannot start the DHT node on " + o.bind_address + ":" + std::to_string(o.port) + ": " + e.what());
    }
    const in_port_t port = runner->getBoundPort(v6 ? AF_INET6 : AF_INET);
    if (port == 0) {
      runner->join();
      return fail("cannot bind the DHT's UDP socket to " + o.bind_address + ":" + std::to_string(o.port));
    }
    endpoint = v6 ? "[" + o.bind_address + "]:" + std::to_string(port) : o.bind_address + ":" + std::to_string(port);

    // Storage nodes keep only well-formed, unexpired records of our type.
    const std::int64_t skew = o.max_clock_skew.count();
    runner->registerType(dht::ValueType(
        record_value_type, "corolla.member", std::max(milliseconds(o.ttl), min_dht_expiration),
        [skew](dht::InfoHash, const std::shared_ptr<dht::Value>& v, const dht::InfoHash&, const dht::SockAddr&) {
          if (!v || v->data.size() > max_record_bytes) return false;
          auto r = decode_record(v->data);
          return r && is_fresh(*r, unix_ms_now(), skew);
        }));
    runner->registerType(dht::ValueType(
        report_value_type, "corolla.wrong", milliseconds(wrong_output_report_ttl_ms),
        [](dht::InfoHash, const std::shared_ptr<dht::Value>& v, const dht::InfoHash&, const dht::SockAddr&) {
          return v && static_cast<bool>(decode_report(v->data));
        }));
    runner->setOnStatusChanged([this](dht::NodeStatus, dht::NodeStatus) {
      std::lock_guard<std::mutex> lk(status_mu_);
      status_cv_.notify_all();
    });

    // The keepalive search (see the file comment). Queued before the
    // bootstrap pings, so a first node opens it while it knows no peer
    // (DhtRunner runs it at once) and a joining node as soon as its
    // bootstrap node has answered.
    auto keepalive = runner->listen(
        runner->getNodeId(), [](const std::vector<std::shared_ptr<dht::Value>>&, bool) { return true; },
        [](const dht::Value&) { return false; });
    const auto deadline = steady::now() + o.bootstrap_timeout;

    if (!peers.empty()) {
      runner->bootstrap(peers);
      while (count_good_peers() == 0) {
        if (steady::now() >= deadline) {
          runner->join();
          std::string list;
          for (const auto& b : o.bootstrap) list += (list.empty() ? "" : ", ") + b;
          return fail("no bootstrap node (" + list + ") answered within " +
                      std::to_string(o.bootstrap_timeout.count()) + " ms on network id " +
                      std::to_string(o.network_id));
        }
        // Woken by status changes; the bound re-checks in case a change
        // happened before we started waiting.
        std::unique_lock<std::mutex> lk(status_mu_);
        status_cv_.wait_for(lk, milliseconds(20));
      }
    }
    // Return only once the search is open: before that, a peer that contacts
    // us would leave us in the state it exists to avoid.
    if (keepalive.wait_until(deadline) != std::future_status::ready)
      spdlog::warn("membership: DHT node {} did not open its keepalive search within {} ms", endpoint,
                   o.bootstrap_timeout.count());

    started = true;
    refresher_ = std::thread([this] { refresh_loop(); });
    dispatcher_ = std::thread([this] { dispatch_loop(); });
    spdlog::debug("membership: DHT node {} up (network {:#x}, ttl {} ms, refresh {} ms, {} bootstrap peers)",
                  endpoint, o.network_id, o.ttl.count(), refresh.count(), peers.size());
    return endpoint;
  }

  std::size_t count_good_peers() const {
    return runner->getNodesStats(AF_INET).good_nodes + runner->getNodesStats(AF_INET6).good_nodes;
  }

  // ---- announcing -------------------------------------------------------

  /// Stamps `r` for a put (caller holds mu_).
  void stamp(server_record& r) {
    last_seq_ = std::max(last_seq_ + 1, unix_us_now());
    r.seq = last_seq_;
    r.timestamp_ms = unix_ms_now();
    r.ttl_ms = static_cast<std::uint32_t>(opt.ttl.count());
    r.network_id = opt.network_id;
  }

  /// Puts for every block of `a` after stamping a new version (mu_ held).
  std::vector<pending_put> build_puts(announcement& a) {
    stamp(a.record);
    auto blob = encode_record(a.record);
    std::vector<pending_put> puts;
    a.value_ids.resize(static_cast<std::size_t>(a.record.span.length()), dht::Value::INVALID_ID);
    for (int b = a.record.span.start; b < a.record.span.end; ++b) {
      auto& last = a.value_ids[static_cast<std::size_t>(b - a.record.span.start)];
      auto id = value_id_for(a.record, b);
      puts.push_back({block_key(a.record.model, b), std::make_shared<dht::Value>(record_value_type, blob, id), last});
      last = id;
    }
    a.next_refresh = steady::now() + refresh;
    return puts;
  }

  void issue(const std::vector<pending_put>& puts, const std::shared_ptr<put_batch>& batch = {}) {
    for (const auto& p : puts) {
      runner->put(p.key, p.value, [batch, key = p.key](bool ok) {
        if (!ok) spdlog::debug("membership: put at {} not acknowledged by any peer", key.toString());
        if (!batch) return;
        std::lock_guard<std::mutex> lk(batch->mu);
        --batch->pending;
        if (ok) ++batch->acked;
        batch->cv.notify_all();
      });
      if (p.cancel != dht::Value::INVALID_ID) runner->cancelPut(p.key, p.cancel);
    }
  }

  static bool same_server(const server_record& a, const server_record& b) {
    return a.model == b.model && a.node_id == b.node_id;
  }

  caf::error announce(server_record r) {
    if (!started) return fail("announce() before start()");
    if (auto e = check_record_fields(r); !e.empty()) return fail("cannot announce: " + e);
    std::lock_guard<std::mutex> put_lk(put_mu_);
    std::vector<pending_put> puts;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) return fail("announce() after stop()");
      announcement* slot = nullptr;
      for (auto& a : active_) {
        if (!same_server(a.record, r)) continue;
        if (a.record.span == r.span) {
          slot = &a;
        } else if (a.record.span.overlaps(r.span)) {
          return fail("cannot announce " + r.node_id + " over [" + std::to_string(r.span.start) + ", " +
                      std::to_string(r.span.end) + ") of " + r.model + ": it overlaps its active span [" +
                      std::to_string(a.record.span.start) + ", " + std::to_string(a.record.span.end) +
                      "); withdraw that one first");
        }
      }
      if (!slot) slot = &active_.emplace_back();
      slot->record = std::move(r);
      puts = build_puts(*slot);
    }
    refresh_cv_.notify_all();
    issue(puts);
    return {};
  }

  caf::error update(server_record r) {
    if (!started) return fail("update() before start()");
    if (auto e = check_record_fields(r); !e.empty()) return fail("cannot update: " + e);
    std::lock_guard<std::mutex> put_lk(put_mu_);
    std::vector<pending_put> puts;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = std::find_if(active_.begin(), active_.end(), [&](const announcement& a) {
        return same_server(a.record, r) && a.record.span == r.span;
      });
      if (it == active_.end())
        return fail("no active announcement of " + r.node_id + " over [" + std::to_string(r.span.start) + ", " +
                    std::to_string(r.span.end) + ") of " + r.model + " to update; announce() it first");
      it->record = std::move(r);
      puts = build_puts(*it);
    }
    refresh_cv_.notify_all();
    issue(puts);
    return {};
  }

  /// Withdraws the active announcements `match` selects.
  template <class Match>
  std::size_t withdraw(Match match) {
    if (!started) return 0;
    auto batch = std::make_shared<put_batch>();
    {
      std::lock_guard<std::mutex> put_lk(put_mu_);
      std::vector<pending_put> puts;
      {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto it = active_.begin(); it != active_.end();) {
          if (!match(it->record)) {
            ++it;
            continue;
          }
          it->record.state = member_state::offline;
          auto p = build_puts(*it);
          puts.insert(puts.end(), p.begin(), p.end());
          it = active_.erase(it);
        }
      }
      batch->pending = puts.size();
      issue(puts, batch);
    }
    std::unique_lock<std::mutex> lk(batch->mu);
    batch->cv.wait_for(lk, opt.put_timeout, [&] { return batch->pending == 0; });
    return batch->acked;
  }

  void refresh_loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stopping_) {
      auto now = steady::now();
      auto next = now + refresh;
      bool due = false;
      for (const auto& a : active_) {
        if (a.next_refresh <= now) due = true;
        next = std::min(next, a.next_refresh);
      }
      if (!due) {
        refresh_cv_.wait_until(lk, next);
        continue;
      }
      // Stamp and issue under put_mu_ (taken before mu_, like everywhere).
      lk.unlock();
      {
        std::lock_guard<std::mutex> put_lk(put_mu_);
        std::vector<pending_put> puts;
        {
          std::lock_guard<std::mutex> lk2(mu_);
          now = steady::now();
          for (auto& a : active_) {
            if (a.next_refresh > now) continue;
            auto p = build_puts(a);
            puts.insert(puts.end(), p.begin(), p.end());
          }
        }
        issue(puts);
      }
      lk.lock();
    }
  }

  // ---- reading ----------------------------------------------------------

  std::shared_ptr<query_state> start_query(const dht::InfoHash& key) {
    auto q = std::make_shared<query_state>();
    runner->get(
        key,
        [q](const std::vector<std::shared_ptr<dht::Value>>& values) {
          std::lock_guard<std::mutex> lk(q->mu);
          q->values.insert(q->values.end(), values.begin(), values.end());
          return true;
        },
        [q](bool) {
          std::lock_guard<std::mutex> lk(q->mu);
          q->done = true;
          q->cv.notify_all();
        });
    return q;
  }

  /// Decodes a value found at (model, block); nothing when it is not a
  /// usable record for that key (logged at debug level).
  std::optional<server_record> accept(const dht::Value& v, const std::string& model, int block) const {
    if (v.type != record_value_type) {
      spdlog::debug("membership: ignored value {:x} of type {} at {} block {}", v.id, v.type, model, block);
      return std::nullopt;
    }
    auto r = decode_record(v.data);
    if (!r) {
      spdlog::debug("membership: ignored malformed value {:x} at {} block {}: {}", v.id, model, block,
                    caf::to_string(r.error()));
      return std::nullopt;
    }
    if (r->model != model || !r->span.contains(block) || r->network_id != opt.network_id) {
      spdlog::debug("membership: ignored record of {} ({} [{}, {}), network {:#x}) found at {} block {}",
                    r->node_id, r->model, r->span.start, r->span.end, r->network_id, model, block);
      return std::nullopt;
    }
    return std::move(*r);
  }

  /// Newest fresh record per server from one block's values.
  std::vector<server_record> collect(const std::vector<std::shared_ptr<dht::Value>>& values,
                                     const std::string& model, int block) const {
    std::vector<server_record> records;
    for (const auto& v : values)
      if (v)
        if (auto r = accept(*v, model, block)) records.push_back(std::move(*r));
    // Newest first, freshness second: an expired newest record must not let
    // an older one of the same server through.
    auto newest = newest_per_server(std::move(records));
    const auto now = unix_ms_now();
    std::erase_if(newest, [&](const server_record& r) { return !is_fresh(r, now, opt.max_clock_skew.count()); });
    return newest;
  }

  std::vector<std::vector<server_record>> query_blocks(const std::string& model, int start, int end) {
    std::vector<std::vector<server_record>> per_block;
    if (!started || start < 0 || end <= start || end > max_block_index) return per_block;
    std::vector<std::shared_ptr<query_state>> queries;
    for (int b = start; b < end; ++b) queries.push_back(start_query(block_key(model, b)));
    const auto deadline = steady::now() + opt.query_timeout;
    for (int b = start; b < end; ++b) {
      per_block.push_back(collect(queries[static_cast<std::size_t>(b - start)]->wait(deadline), model, b));
    }
    return per_block;
  }

  // ---- listening --------------------------------------------------------

  listen_id listen(const std::string& model, const std::vector<int>& blocks, membership_callback cb) {
    if (!started || !cb) return 0;
    auto sub = std::make_shared<subscription>();
    sub->model = model;
    sub->cb = std::move(cb);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) return 0;
      sub->id = next_listen_++;
      subs_.emplace(sub->id, sub);
    }
    std::set<int> unique(blocks.begin(), blocks.end());
    std::vector<std::pair<dht::InfoHash, std::shared_future<size_t>>> tokens;
    for (int b : unique) {
      if (b < 0 || b >= max_block_index) continue;
      auto key = block_key(model, b);
      auto token = runner->listen(
          key, [this, sub, b](const std::vector<std::shared_ptr<dht::Value>>& values, bool expired) {
            on_listen_values(sub, b, values, expired);
            return true;
          });
      tokens.emplace_back(key, token.share());
    }
    std::lock_guard<std::mutex> lk(mu_);
    sub->tokens = std::move(tokens);
    return sub->id;
  }

  /// DHT thread: turns listen values into events for the dispatcher.
  void on_listen_values(const std::shared_ptr<subscription>& sub, int block,
                        const std::vector<std::shared_ptr<dht::Value>>& values, bool expired) {
    std::vector<server_record> records;
    for (const auto& v : values)
      if (v)
        if (auto r = accept(*v, sub->model, block)) records.push_back(std::move(*r));
    const auto now = unix_ms_now();
    std::lock_guard<std::mutex> lk(mu_);
    if (!sub->active || stopping_) return;
    for (auto& r : records) {
      auto key = std::pair{block, r.node_id};
      auto it = sub->seen.find(key);
      if (expired) {
        // Only the expiry of the record we report counts; older versions
        // expire all the time after refreshes.
        if (it != sub->seen.end() && it->second.seq == r.seq) {
          events_.emplace_back(sub, membership_event{block, it->second, true});
          sub->seen.erase(it);
        }
        continue;
      }
      if (!is_fresh(r, now, opt.max_clock_skew.count())) continue;
      if (it == sub->seen.end()) {
        events_.emplace_back(sub, membership_event{block, r, false});
        sub->seen.emplace(std::move(key), std::move(r));
      } else if (is_newer(r, it->second)) {
        // A refresh changes only seq and timestamp: remember it, no event.
        if (!same_content(r, it->second)) events_.emplace_back(sub, membership_event{block, r, false});
        it->second = std::move(r);
      }
    }
    events_cv_.notify_all();
  }

  /// Dispatcher thread: delivers events and reports records that outlived
  /// their TTL (a crashed server's records stay in the DHT longer).
  void dispatch_loop() {
    const auto sweep_every = std::clamp(refresh / 2, milliseconds(50), milliseconds(1000));
    auto next_sweep = steady::now() + sweep_every;
    std::unique_lock<std::mutex> lk(mu_);
    dispatcher_id_ = std::this_thread::get_id();
    while (!stopping_) {
      if (steady::now() >= next_sweep) {
        const auto now = unix_ms_now();
        for (auto& [id, sub] : subs_) {
          for (auto it = sub->seen.begin(); it != sub->seen.end();) {
            if (is_fresh(it->second, now, opt.max_clock_skew.count())) {
              ++it;
              continue;
            }
            events_.emplace_back(sub, membership_event{it->first.first, it->second, true});
            it = sub->seen.erase(it);
          }
        }
        next_sweep = steady::now() + sweep_every;
      }
      if (events_.empty()) {
        events_cv_.wait_until(lk, next_sweep);
        continue;
      }
      auto [sub, ev] = std::move(events_.front());
      events_.pop_front();
      if (!sub->active) continue;
      delivering_ = sub->id;
      lk.unlock();
      try {
        sub->cb(ev);
      } catch (const std::exception& e) {
        spdlog::warn("membership: listen callback threw: {}", e.what());
      }
      lk.lock();
      delivering_ = 0;
      events_cv_.notify_all();
    }
  }

  void unlisten(listen_id id) {
    std::shared_ptr<subscription> sub;
    {
      std::unique_lock<std::mutex> lk(mu_);
      auto it = subs_.find(id);
      if (it == subs_.end()) return;
      sub = it->second;
      sub->active = false;
      subs_.erase(it);
      if (std::this_thread::get_id() != dispatcher_id_)
        events_cv_.wait(lk, [&] { return delivering_ != id; });
    }
    for (auto& [key, token] : sub->tokens) runner->cancelListen(key, token);
  }

  // ---- stop -------------------------------------------------------------

  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (joined_) return;
      joined_ = true;
      stopping_ = true;
      for (auto& [id, sub] : subs_) sub->active = false;
    }
    refresh_cv_.notify_all();
    events_cv_.notify_all();
    if (refresher_.joinable()) refresher_.join();
    if (dispatcher_.joinable()) dispatcher_.join();
    // After join() OpenDHT calls none of our callbacks any more.
    runner->join();
    std::lock_guard<std::mutex> lk(mu_);
    subs_.clear();
    events_.clear();
  }
};

membership::membership() : impl_(std::make_unique<impl>()) {}
membership::~membership() = default;

caf::expected<std::string> membership::start(const membership_options& opt) { return impl_->start(opt); }

std::string membership::endpoint() const { return impl_->started ? impl_->endpoint : std::string{}; }

caf::error membership::announce(server_record r) { return impl_->announce(std::move(r)); }

caf::error membership::update(server_record r) { return impl_->update(std::move(r)); }

std::size_t membership::withdraw_offline() {
  return impl_->withdraw([](const server_record&) { return true; });
}

std::size_t membership::withdraw_offline(const std::string& model, const std::string& node_id, block_range span) {
  return impl_->withdraw([&](const server_record& r) {
    return r.model == model && r.node_id == node_id && r.span == span;
  });
}

std::vector<server_record> membership::get_block(const std::string& model, int block) {
  auto per_block = impl_->query_blocks(model, block, block + 1);
  return per_block.empty() ? std::vector<server_record>{} : std::move(per_block.front());
}

std::vector<server_record> membership::get_span(const std::string& model, int start, int end) {
  return merge_spans(impl_->query_blocks(model, start, end));
}

listen_id membership::listen(const std::string& model, const std::vector<int>& blocks, membership_callback cb) {
  return impl_->listen(model, blocks, std::move(cb));
}

void membership::unlisten(listen_id id) { impl_->unlisten(id); }

void membership::stop() { impl_->shutdown(); }

caf::error membership::report_wrong_output(wrong_output_report r) {
  if (!impl_->started) return fail("a report before start()");
  r.timestamp_ms = unix_ms_now();
  r.network_id = impl_->opt.network_id;
  auto blob = encode_report(r);
  if (auto back = decode_report(blob); !back) return back.error();
  std::uint64_t id = splitmix64(std::hash<std::string>{}(r.reporter + '\n' + r.server) ^ unix_us_now());
  if (id == dht::Value::INVALID_ID) id = 1;
  impl_->runner->put(dht::InfoHash(wrong_output_key(r.model)),
                     std::make_shared<dht::Value>(report_value_type, blob, id), [](bool ok) {
                       if (!ok) spdlog::debug("membership: a wrong-output report was not acknowledged by any peer");
                     });
  return {};
}

std::vector<wrong_output_report> membership::wrong_output_reports(const std::string& model) {
  std::vector<wrong_output_report> out;
  if (!impl_->started) return out;
  const auto values =
      impl_->start_query(dht::InfoHash(wrong_output_key(model)))->wait(steady::now() + impl_->opt.query_timeout);
  const std::int64_t now = unix_ms_now(), skew = impl_->opt.max_clock_skew.count();
  for (const auto& v : values) {
    if (!v || v->type != report_value_type) continue;
    auto r = decode_report(v->data);
    if (!r || r->model != model || r->network_id != impl_->opt.network_id || r->timestamp_ms > now + skew ||
        now - r->timestamp_ms > wrong_output_report_ttl_ms + skew)
      continue;
    // One report per (server, reporter, span): the newest.
    auto same = std::find_if(out.begin(), out.end(), [&](const wrong_output_report& o) {
      return o.server == r->server && o.reporter == r->reporter && o.span == r->span;
    });
    if (same == out.end())
      out.push_back(std::move(*r));
    else if (same->timestamp_ms < r->timestamp_ms)
      *same = std::move(*r);
  }
  return out;
}

std::size_t membership::good_peers() const { return impl_->started ? impl_->count_good_peers() : 0; }

}  // namespace corolla::net
