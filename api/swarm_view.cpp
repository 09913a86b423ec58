#include "api/swarm_view.hpp"

#include <algorithm>
#include <set>
#include <utility>

#include <spdlog/spdlog.h>

#include "actors/swarm_records.hpp"
#include "schedule/swarm.hpp"

namespace corolla::api {

using nlohmann::json;

std::int64_t wall_ms() { return net::unix_ms_now(); }

namespace {

/// One record per (node id, span), the newest.
std::vector<net::server_record> distinct(const std::vector<net::server_record>& records) {
  std::map<std::pair<std::string, std::pair<int, int>>, net::server_record> by;
  for (const auto& r : records) {
    auto key = std::pair{r.node_id, std::pair{r.span.start, r.span.end}};
    auto it = by.find(key);
    if (it == by.end() || net::is_newer(r, it->second)) by[key] = r;
  }
  std::vector<net::server_record> out;
  for (auto& [k, r] : by) out.push_back(std::move(r));
  return out;
}

std::string lower_state(server_state s) {
  std::string t = to_string(s);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return t;
}

std::string span_text(const block_range& b) {
  return "blocks [" + std::to_string(b.start) + ", " + std::to_string(b.end) + ")";
}

}  // namespace

json swarm_view_json(const std::string& model, int n_blocks, const std::vector<net::server_record>& records,
                     std::int64_t now_ms, const std::deque<swarm_event>& events) {
  const std::vector<net::server_record> servers = distinct(records);
  json list = json::array();
  std::vector<net::server_record> online;
  for (const auto& r : servers) {
    json rtt = json::object();
    for (const auto& [peer, ms] : r.rtt_ms) rtt[peer] = ms;
    list.push_back({{"node_id", r.node_id},
                    {"endpoint", r.endpoint},
                    {"span", {r.span.start, r.span.end}},
                    {"state", lower_state(r.state)},
                    {"throughput", r.throughput},
                    {"cache_tokens_left", r.cache_tokens_left},
                    {"step_ms_per_block", r.step_s_per_block * 1e3},
                    {"rtt_ms", rtt},
                    {"dtype", r.dtype},
                    {"weights", r.weights},
                    {"relayed", !r.relay.empty()},
                    {"relay", r.relay},
                    {"relay_service", r.relay_service},
                    {"adapters", r.adapters},
                    {"age_ms", std::max<std::int64_t>(0, now_ms - r.timestamp_ms)},
                    {"public_key", r.public_key}});
    if (r.state == server_state::online) online.push_back(r);
  }
  const swarm::swarm_state state = to_swarm_state(n_blocks, online);
  const std::vector<int> coverage = swarm::online_coverage(state);
  const std::vector<double> throughput = swarm::block_throughputs(state);
  const bool complete = n_blocks > 0 && std::all_of(coverage.begin(), coverage.end(), [](int c) { return c > 0; });
  json ev = json::array();
  for (const swarm_event& e : events)
    ev.push_back({{"at_ms", e.at_ms}, {"kind", e.kind}, {"node_id", e.node_id}, {"detail", e.detail}});
  return {{"model", model},
          {"blocks", n_blocks},
          {"now_ms", now_ms},
          {"servers", list},
          {"coverage", coverage},
          {"block_throughput", throughput},
          {"bottleneck_throughput", complete ? swarm::swarm_throughput(state) : 0.0},
          {"complete", complete},
          {"events", ev}};
}

swarm_watch::swarm_watch(std::string model, int n_blocks, reader read, std::chrono::milliseconds period,
                         std::size_t max_events)
    : model_(std::move(model)), n_blocks_(n_blocks), read_(std::move(read)), period_(period), max_events_(max_events) {
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      refresh();
      lock.lock();
      wake_.wait_for(lock, period_, [this] { return stopping_; });
    }
  });
}

swarm_watch::~swarm_watch() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void swarm_watch::add_event(swarm_event e) {
  events_.push_front(std::move(e));
  while (events_.size() > max_events_) events_.pop_back();
}

void swarm_watch::refresh() {
  std::lock_guard one_at_a_time(reading_);
  std::vector<net::server_record> records;
  try {
    records = distinct(read_());
  } catch (const std::exception& e) {
    spdlog::warn("dashboard: cannot read the swarm's records: {}", e.what());
    return;
  }
  const std::int64_t now = wall_ms();
  std::lock_guard lock(mutex_);
  // A server's state is the best of its records' (a server moving its span
  // has two for a moment).
  std::map<std::string, std::pair<server_state, std::string>> seen;
  for (const auto& r : records) {
    auto it = seen.find(r.node_id);
    if (it == seen.end() || r.state == server_state::online) seen[r.node_id] = {r.state, span_text(r.span)};
  }
  for (const auto& [id, st] : seen) {
    const auto before = last_state_.find(id);
    if (before == last_state_.end())
      add_event({now, st.first == server_state::online ? "online" : "joined", id, st.second});
    else if (before->second != st.first)
      add_event({now, lower_state(st.first), id, st.second});
  }
  for (const auto& [id, st] : last_state_)
    if (!seen.count(id)) add_event({now, "vanished", id, "its record expired (no refresh within its TTL)"});
  last_state_.clear();
  for (const auto& [id, st] : seen) last_state_[id] = st.first;
  records_ = std::move(records);
}

void swarm_watch::note_failover(const std::string& detail) {
  std::lock_guard lock(mutex_);
  add_event({wall_ms(), "failover", "", detail});
}

json swarm_watch::view() const {
  std::lock_guard lock(mutex_);
  return swarm_view_json(model_, n_blocks_, records_, wall_ms(), events_);
}

}  // namespace corolla::api
