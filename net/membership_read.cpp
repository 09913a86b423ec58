// net/membership_read.cpp — reading membership records and reports in
// OpenDHT: one-shot queries of blocks (get_block/get_span), listening
// for changes with the dispatcher thread that delivers them, and reading
// wrong-output reports. The design notes are in net/membership.cpp.
#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "net/membership_impl.hpp"

namespace corolla::net {

namespace {

/// Same announcement content, ignoring what changes on every refresh.
bool same_content(server_record a, const server_record& b) {
  a.seq = b.seq;
  a.timestamp_ms = b.timestamp_ms;
  return a == b;
}

}  // namespace

namespace detail {

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

}  // namespace detail

// ---- reading ----------------------------------------------------------

std::shared_ptr<query_state> membership::impl::start_query(const dht::InfoHash& key) {
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

std::optional<server_record> membership::impl::accept(const dht::Value& v, const std::string& model, int block) const {
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

std::vector<server_record> membership::impl::collect(const std::vector<std::shared_ptr<dht::Value>>& values,
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

std::vector<std::vector<server_record>> membership::impl::query_blocks(const std::string& model, int start, int end) {
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

listen_id membership::impl::listen(const std::string& model, const std::vector<int>& blocks, membership_callback cb) {
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

void membership::impl::on_listen_values(const std::shared_ptr<subscription>& sub, int block,
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

void membership::impl::dispatch_loop() {
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

void membership::impl::unlisten(listen_id id) {
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

// ---- wrong-output reports ---------------------------------------------

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

}  // namespace corolla::net
