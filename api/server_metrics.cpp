#include "api/server_metrics.hpp"

#include <algorithm>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "api/http_bind.hpp"
#include "api/http_framing.hpp"
#include "api/metrics.hpp"

namespace corolla::api {

namespace {

std::vector<double> as_doubles(const std::vector<std::uint64_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

std::string render_server_metrics(const std::string& node, const span_server_stats& s, const node_traffic& traffic,
                                  const std::vector<link_stats>& links) {
  using k = metrics_registry::kind;
  metrics_registry m;
  const metric_labels self = {{"node", node}};
  auto with = [&](const char* key, const std::string& value) {
    metric_labels l = self;
    l.emplace_back(key, value);
    return l;
  };
  m.declare("corolla_server_steps_total", k::counter,
            "Steps answered, by kind: decode (one row, batched across sessions), prefill (several rows), forward and "
            "backward (fine-tuning passes)");
  m.declare("corolla_server_step_seconds", k::histogram,
            "Compute time of one step on this server (the hop's share of a token), by kind; a decode step counts its "
            "batch's time",
            duration_histogram::bounds());
  m.declare("corolla_server_decode_batches_total", k::counter, "Batches the decode steps ran in");
  m.declare("corolla_server_decode_waits_total", k::counter,
            "Decode batches that waited for sessions of the last batches to send their step");
  m.declare("corolla_server_prefill_tokens_total", k::counter, "Rows of the prefill steps");
  m.declare("corolla_server_step_errors_total", k::counter, "Steps and passes answered with an error");
  m.declare("corolla_server_push_timeouts_total", k::counter,
            "Steps whose input the previous server was to push and never did");
  m.declare("corolla_server_sessions_total", k::counter,
            "Sessions by event: opened, closed, expired (idle), shared (opened on another session's KV pages), "
            "parked (closed with keep: pages kept for the node's later sessions), parked_closed (closed by the server)");
  m.declare("corolla_server_sessions_parked", k::gauge, "Parked sessions now (their pages the first to be taken back)");
  m.declare("corolla_server_shared_tokens_total", k::counter,
            "Tokens sessions started with on another session's KV pages (not computed)");
  m.declare("corolla_server_sessions_open", k::gauge, "Sessions open now");
  m.declare("corolla_server_cache_tokens", k::gauge, "Attention-cache capacity in tokens");
  m.declare("corolla_server_cache_tokens_left", k::gauge, "Attention-cache tokens a new session could still get");
  m.declare("corolla_server_step_seconds_per_block", k::gauge, "Moving average of a one-row step per block");
  m.declare("corolla_server_blocks", k::gauge, "The span served: first block and one past the last (label edge)");
  m.declare("corolla_server_draining", k::gauge, "1 while shutting down (no new sessions)");
  m.declare("corolla_node_bytes_total", k::counter,
            "Payload bytes over all links since the node started (direction: sent, received), ended links included");
  m.declare("corolla_node_messages_total", k::counter,
            "Messages over all links since the node started (direction: sent, received), heartbeats included");
  m.add("corolla_node_bytes_total", with("direction", "sent"), double(traffic.bytes_sent));
  m.add("corolla_node_bytes_total", with("direction", "received"), double(traffic.bytes_received));
  m.add("corolla_node_messages_total", with("direction", "sent"), double(traffic.messages_sent));
  m.add("corolla_node_messages_total", with("direction", "received"), double(traffic.messages_received));
  // Link families only with links: an empty family would render as one
  // unlabelled 0.
  bool any_link = false;
  for (const link_stats& l : links) any_link = any_link || !l.peer.empty();
  if (any_link) {
    m.declare("corolla_link_bytes_sent_total", k::counter,
              "Payload bytes sent to a peer over all links to it (a closed link as last scraped; corolla_node_bytes_total has every byte)");
    m.declare("corolla_link_bytes_received_total", k::counter, "Payload bytes received from a peer");
    m.declare("corolla_link_messages_sent_total", k::counter, "Messages sent to a peer, heartbeats included");
    m.declare("corolla_link_messages_received_total", k::counter, "Messages received from a peer, heartbeats included");
    m.declare("corolla_link_rtt_seconds", k::gauge, "Heartbeat round-trip time to a peer (moving average)");
    m.declare("corolla_link_up", k::gauge, "1 while the link to a peer is up");
  }

  const std::pair<const char*, const duration_histogram*> kinds[] = {{"decode", &s.decode_seconds},
                                                                     {"prefill", &s.prefill_seconds},
                                                                     {"forward", &s.forward_seconds},
                                                                     {"backward", &s.backward_seconds}};
  const double counts[] = {double(s.decode_steps), double(s.prefill_steps), double(s.forward_passes),
                           double(s.backward_passes)};
  for (std::size_t i = 0; i < 4; ++i) {
    m.add("corolla_server_steps_total", with("kind", kinds[i].first), counts[i]);
    m.set_histogram("corolla_server_step_seconds", with("kind", kinds[i].first), as_doubles(kinds[i].second->counts),
                    kinds[i].second->sum, double(kinds[i].second->count));
  }
  m.add("corolla_server_decode_batches_total", self, double(s.decode_batches));
  m.add("corolla_server_decode_waits_total", self, double(s.decode_waits));
  m.add("corolla_server_prefill_tokens_total", self, double(s.prefill_tokens));
  m.add("corolla_server_step_errors_total", self, double(s.step_errors));
  m.add("corolla_server_push_timeouts_total", self, double(s.push_timeouts));
  m.add("corolla_server_sessions_total", with("event", "opened"), double(s.sessions_opened));
  m.add("corolla_server_sessions_total", with("event", "closed"), double(s.sessions_closed));
  m.add("corolla_server_sessions_total", with("event", "expired"), double(s.sessions_expired));
  m.add("corolla_server_sessions_total", with("event", "shared"), double(s.sessions_shared));
  m.add("corolla_server_sessions_total", with("event", "parked"), double(s.sessions_parked));
  m.add("corolla_server_sessions_total", with("event", "parked_closed"), double(s.parked_closed));
  m.add("corolla_server_shared_tokens_total", self, double(s.shared_tokens));
  m.set("corolla_server_sessions_parked", self, double(s.sessions_parked_now));
  m.set("corolla_server_sessions_open", self, double(s.sessions_open));
  m.set("corolla_server_cache_tokens", self, double(s.cache_tokens));
  m.set("corolla_server_cache_tokens_left", self, double(s.cache_tokens_left));
  m.set("corolla_server_step_seconds_per_block", self, s.step_s_per_block);
  m.set("corolla_server_blocks", with("edge", "first"), s.first);
  m.set("corolla_server_blocks", with("edge", "last"), s.last);
  m.set("corolla_server_draining", self, s.draining ? 1 : 0);
  for (const link_stats& l : links) {
    if (l.peer.empty()) continue;  // hello pending: no name yet
    const metric_labels peer = with("peer", l.peer);
    m.add("corolla_link_bytes_sent_total", peer, double(l.bytes_sent));
    m.add("corolla_link_bytes_received_total", peer, double(l.bytes_received));
    m.add("corolla_link_messages_sent_total", peer, double(l.messages_sent));
    m.add("corolla_link_messages_received_total", peer, double(l.messages_received));
    m.set("corolla_link_rtt_seconds", peer, l.rtt_us / 1e6);
    m.set("corolla_link_up", peer, l.up ? 1 : 0);
  }
  return m.render();
}

namespace {

void add_counters(link_stats& to, const link_stats& l) {
  to.bytes_sent += l.bytes_sent;
  to.bytes_received += l.bytes_received;
  to.messages_sent += l.messages_sent;
  to.messages_received += l.messages_received;
}

void subtract_counters(link_stats& from, const link_stats& base) {
  auto minus = [](std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; };
  from.bytes_sent = minus(from.bytes_sent, base.bytes_sent);
  from.bytes_received = minus(from.bytes_received, base.bytes_received);
  from.messages_sent = minus(from.messages_sent, base.messages_sent);
  from.messages_received = minus(from.messages_received, base.messages_received);
}

}  // namespace

std::vector<link_stats> link_history::by_peer(const std::vector<link_stats>& now) {
  ++updates_;
  std::map<std::string, std::set<std::uint64_t>> live_now;
  std::set<std::uint64_t> links_now;
  for (const link_stats& l : now) {
    if (l.peer.empty()) continue;
    // A link whose peer changed (a new node behind its endpoint) keeps its
    // counters: what it counted for the old peer is that peer's, and is
    // left out of the new one's from here on.
    auto [was, fresh] = link_peer_.try_emplace(l.link, l.peer);
    if (!fresh && was->second != l.peer) {
      const auto old = peers_.find(was->second);
      if (old != peers_.end())
        if (auto it = old->second.live.find(l.link); it != old->second.live.end()) {
          link_stats base = link_base_[l.link];
          add_counters(base, it->second);
          link_base_[l.link] = base;
        }
      was->second = l.peer;
    }
    link_stats counted = l;
    if (auto base = link_base_.find(l.link); base != link_base_.end()) subtract_counters(counted, base->second);
    peer_links& p = peers_[l.peer];
    p.live[l.link] = counted;
    p.last_seen = updates_;
    live_now[l.peer].insert(l.link);
    links_now.insert(l.link);
  }
  for (auto it = link_peer_.begin(); it != link_peer_.end();) {
    if (links_now.count(it->first)) {
      ++it;
      continue;
    }
    link_base_.erase(it->first);
    it = link_peer_.erase(it);
  }
  // Links gone since the last look: their last counters move to `ended`.
  for (auto& [peer, p] : peers_)
    for (auto it = p.live.begin(); it != p.live.end();) {
      const auto alive = live_now.find(peer);
      if (alive != live_now.end() && alive->second.count(it->first)) {
        ++it;
        continue;
      }
      add_counters(p.ended, it->second);
      it = p.live.erase(it);
    }
  // Too many peers: forget the longest gone first (every live one stays).
  while (peers_.size() > max_peers_) {
    auto oldest = peers_.end();
    for (auto it = peers_.begin(); it != peers_.end(); ++it)
      if (it->second.live.empty() && (oldest == peers_.end() || it->second.last_seen < oldest->second.last_seen))
        oldest = it;
    if (oldest == peers_.end()) break;
    peers_.erase(oldest);
  }
  std::vector<link_stats> out;
  for (const auto& [peer, p] : peers_) {
    link_stats shown = p.ended;
    shown.peer = peer;
    shown.up = false;
    const link_stats* busiest = nullptr;
    for (const auto& [id, l] : p.live) {
      add_counters(shown, l);
      shown.up = shown.up || l.up;
      if (!busiest || l.messages_sent + l.messages_received > busiest->messages_sent + busiest->messages_received)
        busiest = &l;
    }
    if (busiest) {
      shown.link = busiest->link;
      shown.endpoint = busiest->endpoint;
      shown.nic_class = busiest->nic_class;
      shown.transport = busiest->transport;
      shown.rtt_us = busiest->rtt_us;
      shown.rtt_last_us = busiest->rtt_last_us;
      shown.send_bytes_per_s = busiest->send_bytes_per_s;
      shown.recv_bytes_per_s = busiest->recv_bytes_per_s;
    }
    out.push_back(std::move(shown));
  }
  return out;
}

node_traffic link_history::totals(const node_traffic& now) {
  totals_.bytes_sent = std::max(totals_.bytes_sent, now.bytes_sent);
  totals_.bytes_received = std::max(totals_.bytes_received, now.bytes_received);
  totals_.messages_sent = std::max(totals_.messages_sent, now.messages_sent);
  totals_.messages_received = std::max(totals_.messages_received, now.messages_received);
  return totals_;
}

struct metrics_server::impl {
  std::mutex scraping;  ///< one scrape at a time: `scrape` need not be thread-safe
  std::function<std::string()> scrape;
  bool stopped = false;  ///< (under `scraping`) the owner is gone: `scrape` must not run
  http_server server{kPageReadLimit};
  http_listener listener{server};
  std::thread thread;
  std::promise<void> ended;  ///< kept when the listener's thread returns
};

metrics_server::metrics_server(std::function<std::string()> scrape) : impl_(std::make_unique<impl>()) {
  impl_->scrape = std::move(scrape);
  auto* p = impl_.get();
  serve_pages_only(p->server);
  p->server.Get("/metrics", [p](const httplib::Request&, httplib::Response& res) {
    try {
      std::lock_guard lock(p->scraping);
      if (p->stopped) {
        res.status = 503;
        res.set_content("stopping\n", "text/plain");
        return;
      }
      res.set_content(p->scrape(), "text/plain; version=0.0.4; charset=utf-8");
    } catch (const std::exception& e) {
      res.status = 500;
      res.set_content(std::string("cannot collect the metrics: ") + e.what() + "\n", "text/plain");
    }
  });
  p->server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\": \"ok\"}", "application/json");
  });
}

metrics_server::~metrics_server() {
  {
    std::lock_guard lock(impl_->scraping);
    impl_->stopped = true;  // what `scrape` reads may go once this returns
  }
  impl_->listener.stop();
  if (!impl_->thread.joinable()) return;
  // A connection that sends a header line every few seconds holds the
  // listener's thread up to its read limit (30 s, api/http_server.hpp),
  // longer than a stop should wait: past a bound
  // the thread, and the server it serves, are left to the process's end.
  if (impl_->ended.get_future().wait_for(kStopGrace) == std::future_status::ready) {
    impl_->thread.join();
    return;
  }
  spdlog::warn("metrics: connections still open {} s after the stop; leaving them", kStopGrace.count());
  impl_->thread.detach();
  (void)impl_.release();
}

int metrics_server::start(const std::string& host, int port) {
  const int bound = bind_http(impl_->server, host, port);
  impl_->thread = std::thread([p = impl_.get()] {
    p->listener.run();
    p->ended.set_value();
  });
  return bound;
}

}  // namespace corolla::api
