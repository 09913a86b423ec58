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
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "net/membership_impl.hpp"

namespace corolla::net {

namespace {

/// OpenDHT re-announces (expiration - 10 s) after an acknowledgement.
constexpr milliseconds min_dht_expiration{12'000};

caf::error fail(std::string what) {
  return caf::make_error(caf::sec::invalid_argument, "membership: " + std::move(what));
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

}  // namespace

namespace detail {

/// Acknowledgements of a batch of puts (withdraw_offline waits on it).
struct put_batch {
  std::mutex mu;
  std::condition_variable cv;
  std::size_t pending = 0;
  std::size_t acked = 0;
};

}  // namespace detail

std::string membership_key(const std::string& model, int block) { return block_key(model, block).toString(); }

membership::impl::~impl() { shutdown(); }

// ---- start ------------------------------------------------------------

caf::expected<std::string> membership::impl::start(const membership_options& o) {
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

std::size_t membership::impl::count_good_peers() const {
  return runner->getNodesStats(AF_INET).good_nodes + runner->getNodesStats(AF_INET6).good_nodes;
}

// ---- announcing -------------------------------------------------------

void membership::impl::stamp(server_record& r) {
  last_seq_ = std::max(last_seq_ + 1, unix_us_now());
  r.seq = last_seq_;
  r.timestamp_ms = unix_ms_now();
  r.ttl_ms = static_cast<std::uint32_t>(opt.ttl.count());
  r.network_id = opt.network_id;
}

std::vector<membership::impl::pending_put> membership::impl::build_puts(announcement& a) {
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

void membership::impl::issue(const std::vector<pending_put>& puts, const std::shared_ptr<put_batch>& batch) {
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

bool membership::impl::same_server(const server_record& a, const server_record& b) {
  return a.model == b.model && a.node_id == b.node_id;
}

caf::error membership::impl::announce(server_record r) {
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

caf::error membership::impl::update(server_record r) {
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

template <class Match>
std::size_t membership::impl::withdraw(Match match) {
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
        it->record.state = server_state::offline;
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

void membership::impl::refresh_loop() {
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

// ---- stop -------------------------------------------------------------

void membership::impl::shutdown() {
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

// ---- the public functions ---------------------------------------------

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

std::size_t membership::good_peers() const { return impl_->started ? impl_->count_good_peers() : 0; }

}  // namespace corolla::net
