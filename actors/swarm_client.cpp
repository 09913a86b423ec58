// actors/swarm_client.cpp — the swarm client (actors/swarm_client.hpp): its
// table of servers (discovery, relays, what each serves), routes over them,
// and opening sessions. A session's steps, failover and replay are in
// swarm_session.cpp.
#include "actors/swarm_client.hpp"
#include "actors/swarm_hop_state.hpp"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "model/error.hpp"

namespace corolla {

bool is_recoverable(const caf::error& e) {
  const std::string code = error_code(e);
  return !(code == "invalid_argument" || code == "bad_message" || code == "bad_position" ||
           code == "duplicate_session");
}

using swarm_detail::request_of;

namespace {

std::string with_scheme(const std::string& endpoint) {
  return endpoint.find("://") == std::string::npos ? "tcp://" + endpoint : endpoint;
}

/// The same server: by endpoint, or for a relayed one by its id (several
/// share their relay's endpoint, and it may move to another relay).
bool same_server(const known_server& a, const known_server& b) {
  if (a.relayed != b.relayed) return false;
  return a.relayed ? a.node_id == b.node_id : a.endpoint == b.endpoint;
}

}  // namespace

known_server server_from_entry(const std::string& entry) {
  known_server s;
  const auto hash = entry.find('#');
  std::string where = entry.substr(0, hash);
  if (const auto at = where.find('@'); at != std::string::npos) {
    s.node_id = where.substr(0, at);
    s.relayed = true;
    where = where.substr(at + 1);
  }
  s.endpoint = with_scheme(where);
  if (hash != std::string::npos) s.public_key = entry.substr(hash + 1);
  return s;
}

remote_message swarm_detail::request_of(const char* type, std::vector<std::uint8_t> body, std::vector<Tensor> tensors) {
  remote_message m;
  m.type = type;
  m.body = std::move(body);
  m.tensors = std::move(tensors);
  return m;
}

// ---- swarm_client ---------------------------------------------------------------

swarm_client::swarm_client(node& n, swarm_client_options options)
    : node_(n),
      options_(std::move(options)),
      spot_rng_(options_.spot_check_seed ? options_.spot_check_seed : std::random_device{}()),
      n_blocks_(options_.n_blocks),
      hidden_size_(options_.hidden_size) {
  for (const auto& e : options_.servers) servers_.push_back(server_from_entry(e));
  if (!options_.adapter.empty()) {
    adapter_ref a = adapter_ref::parse(options_.adapter);
    adapter_name_ = std::move(a.name);
    adapter_digest_ = std::move(a.digest);
  }
}

adapter_ref adapter_ref::parse(const std::string& spec) {
  const auto at = spec.rfind('@');
  adapter_ref a{spec.substr(0, at), at == std::string::npos ? std::string() : spec.substr(at + 1)};
  if (a.name.empty() || (at != std::string::npos && a.digest.empty()))
    throw std::invalid_argument("adapter '" + spec + "': give NAME or NAME@DIGEST");
  return a;
}

std::string adapter_ref::name_problem(const std::string& name) {
  if (name.empty()) return "the adapter needs a name";
  if (name.size() > max_adapter_name_bytes)
    return "a name of " + std::to_string(name.size()) + " bytes (at most " + std::to_string(max_adapter_name_bytes) +
           ")";
  for (const char c : name)
    if (static_cast<unsigned char>(c) <= ' ' || c == '=' || c == ',' || c == '@' || c == 0x7f)
      return "the name '" + name + "' has a space, control character, '=', ',' or '@' (clients write NAME@DIGEST)";
  if (name == "." || name == "..") return "'" + name + "' is no name";
  return {};
}

void swarm_client::event(const std::string& line) const {
  spdlog::info("swarm: {}", line);
  if (options_.on_event) options_.on_event(line);
}

caf::error swarm_client::refresh() {
  refreshed_ = true;
  last_refresh_ = std::chrono::steady_clock::now();
  if (options_.discover)
    for (const auto& e : options_.discover()) {
      known_server found = server_from_entry(e);
      auto known = std::find_if(servers_.begin(), servers_.end(),
                                [&](const known_server& s) { return same_server(s, found); });
      if (known == servers_.end()) {
        servers_.push_back(std::move(found));
      } else if (found.relayed && (known->endpoint != found.endpoint || known->public_key != found.public_key)) {
        // A server behind NAT moved to another relay.
        event(known->node_id + " is now reached through " + found.endpoint);
        known->endpoint = found.endpoint;
        known->public_key = found.public_key;
        known->relay_id.clear();
      }
    }
  if (options_.reported) {
    auto ids = options_.reported();
    reported_ = {ids.begin(), ids.end()};
  }
  std::string first_problem;
  int reachable = 0;
  for (auto& s : servers_) {
    connect_options c;
    c.timeout = options_.connect_timeout;
    c.server_key = s.public_key;
    if (s.relayed) {
      if (auto err = reach_through_relay(s, c)) {
        s.reachable = false;
        if (first_problem.empty()) first_problem = s.node_id + " via " + s.endpoint + ": " + error_message(err);
        continue;
      }
    }
    // A known server keeps its link, which reconnects by itself: only
    // servers never reached are dialled (again). A server restarted without
    // a fixed node id answers its endpoint under a new id: adopt it.
    if (!s.relayed && !s.node_id.empty() && !node_.peer_is_up(s.node_id))
      for (const auto& peer : node_.peers())
        if (auto st = node_.stats(peer); st && st->up && st->endpoint == s.endpoint && peer != s.node_id) {
          spdlog::info("swarm: {} now answers as {} (was {})", s.endpoint, peer, s.node_id);
          s.node_id = peer;
          break;
        }
    if (!s.node_id.empty() && !node_.peer_is_up(s.node_id)) {
      s.reachable = false;
      if (first_problem.empty()) first_problem = s.endpoint + ": " + s.node_id + " is down";
      continue;
    }
    auto peer = s.node_id.empty() ? node_.connect(s.endpoint, c) : caf::expected<std::string>(s.node_id);
    if (!peer) {
      s.reachable = false;
      if (first_problem.empty()) first_problem = s.endpoint + ": " + error_message(peer.error());
      continue;
    }
    s.node_id = *peer;
    auto reply = node_.request(s.node_id, "span", request_of(span_request::info, {}), options_.request_timeout);
    if (!reply) {
      s.reachable = false;
      if (first_problem.empty()) first_problem = s.endpoint + ": " + error_message(reply.error());
      continue;
    }
    // A server that answers nonsense or serves another model is left out
    // (and said so); the others still serve.
    auto unusable = [&](const std::string& why, spdlog::level::level_enum level = spdlog::level::warn) {
      s.reachable = false;
      spdlog::log(level, "swarm: not using {}: {}", s.endpoint, why);
      if (first_problem.empty()) first_problem = s.endpoint + ": " + why;
    };
    auto info = decode_span_info(reply->body);
    if (!info) {
      unusable(error_message(info.error()));
      continue;
    }
    if (!options_.model.empty() && info->model != options_.model) {
      unusable("serves model '" + info->model + "', not '" + options_.model + "'");
      continue;
    }
    if (!options_.weights.empty() && info->weights != options_.weights) {
      unusable("decodes from " + (info->weights.empty() ? std::string("unannounced") : info->weights) +
               " weights, not " + options_.weights);
      continue;
    }
    std::string pin;  // the adapter's digest this server would fix, once it passed every check
    if (!adapter_name_.empty()) {
      const auto it = std::find(info->adapters.begin(), info->adapters.end(), adapter_name_);
      if (it == info->adapters.end()) {
        std::string held;
        for (std::size_t i = 0; i < info->adapters.size() && i < 4; ++i) held += (i ? ", " : "") + info->adapters[i];
        if (info->adapters.size() > 4) held += ", ...";
        unusable("holds no adapter '" + adapter_name_ + "' (" + (held.empty() ? "it holds none" : "it holds " + held) +
                 ")");
        continue;
      }
      const std::string& digest = info->adapter_digests[static_cast<std::size_t>(it - info->adapters.begin())];
      if (adapter_digest_.empty()) {
        pin = digest;  // the first usable server's, kept (below): one adapter per client
      } else if (digest != adapter_digest_) {
        unusable("holds another adapter named '" + adapter_name_ + "' (" + adapter_name_ + "@" + digest + ", not @" +
                 adapter_digest_ + ")");
        continue;
      }
    }
    if (n_blocks_ == 0 && options_.n_blocks == 0) {
      n_blocks_ = info->n_blocks;  // the first answer defines the model's shape
      hidden_size_ = info->hidden_size;
    }
    if (info->n_blocks != n_blocks_ || info->hidden_size != hidden_size_) {
      unusable("serves a model of " + std::to_string(info->n_blocks) + " blocks and width " +
               std::to_string(info->hidden_size) + ", not " + std::to_string(n_blocks_) + " and " +
               std::to_string(hidden_size_));
      continue;
    }
    if (info->draining) {  // normal for a server that is leaving: not a warning
      unusable("it is shutting down (draining its sessions)", spdlog::level::info);
      continue;
    }
    if (info->first < 0 || info->last > info->n_blocks || info->first >= info->last) {
      unusable("announces blocks [" + std::to_string(info->first) + ", " + std::to_string(info->last) + ") of " +
               std::to_string(info->n_blocks));
      continue;
    }
    if (!pin.empty()) {
      adapter_digest_ = pin;
      spdlog::info("swarm: adapter '{}' is {}@{} (from {})", adapter_name_, adapter_name_, pin, s.endpoint);
    }
    s.info = *info;
    s.reachable = true;
    ++reachable;
  }
  if (reachable == 0)
    return make_error(errc::not_connected, "no usable swarm server" +
                                               (first_problem.empty() ? std::string() : " (" + first_problem + ")"));
  return {};
}

caf::error swarm_client::reach_through_relay(known_server& s, const connect_options& c) {
  if (node_.peer_is_up(s.node_id)) return {};
  if (s.relay_id.empty() || !node_.peer_is_up(s.relay_id)) {
    s.relay_id.clear();
    // The relay is often a server of the swarm this client uses already,
    // or the relay of another server behind NAT: one link to it serves all.
    for (const auto& other : servers_) {
      if (&other == &s || other.endpoint != s.endpoint) continue;
      const std::string& id = other.relayed ? other.relay_id : other.node_id;
      if (!id.empty() && node_.peer_is_up(id)) s.relay_id = id;
    }
  }
  if (s.relay_id.empty()) {
    auto relay = node_.connect(s.endpoint, c);
    if (!relay) return relay.error();
    s.relay_id = *relay;
  }
  auto peer = node_.connect_via(s.relay_id, s.node_id, c);
  if (!peer) return peer.error();
  spdlog::debug("swarm: reached {} through relay {}", s.node_id, s.relay_id);
  return {};
}

const known_server* swarm_client::server(const std::string& node_id) const {
  for (const auto& s : servers_)
    if (s.node_id == node_id) return &s;
  return nullptr;
}

swarm::swarm_state swarm_client::state() const {
  swarm::swarm_state st;
  st.n_blocks = n_blocks_;
  for (const auto& s : servers_) {
    if (!s.reachable || !node_.peer_is_up(s.node_id) || distrusted(s.node_id)) continue;
    swarm::server_record r;
    r.id = s.node_id;
    r.span = {s.info.first, s.info.last};
    r.state = server_state::online;
    r.cache_tokens_left = s.info.cache_tokens_left;
    r.step_s_per_block = s.info.step_s_per_block;
    r.relayed = s.relayed;
    for (const auto& [peer, ms] : s.info.rtt_ms) r.rtt_s[peer] = ms / 1000.0;
    st.servers.push_back(std::move(r));
  }
  return st;
}

std::vector<adapter_ref> swarm_client::complete_adapters() const {
  // Per NAME@DIGEST, the blocks its holders cover.
  std::map<std::pair<std::string, std::string>, std::vector<bool>> covered;
  for (const auto& s : servers_) {
    if (!s.reachable || distrusted(s.node_id)) continue;
    const span_info& i = s.info;
    for (std::size_t k = 0; k < i.adapters.size() && k < i.adapter_digests.size(); ++k) {
      if (!adapter_ref::name_problem(i.adapters[k]).empty()) continue;
      auto& blocks = covered[{i.adapters[k], i.adapter_digests[k]}];
      blocks.resize(static_cast<std::size_t>(n_blocks_), false);
      for (int b = std::max(i.first, 0); b < std::min(i.last, n_blocks_); ++b) blocks[static_cast<std::size_t>(b)] = true;
    }
  }
  std::vector<adapter_ref> out;
  for (const auto& [ref, blocks] : covered)
    if (n_blocks_ > 0 && std::all_of(blocks.begin(), blocks.end(), [](bool b) { return b; }))
      out.push_back({ref.first, ref.second});
  return out;
}

caf::expected<swarm::route> swarm_client::route(int start, int end, const std::set<std::string>& excluded,
                                                std::int64_t session_tokens) const {
  swarm::route_request req;
  req.start = start;
  req.end = end;
  req.excluded = excluded;
  req.session_tokens = session_tokens;
  for (const auto& s : servers_)
    if (s.reachable)
      if (auto st = node_.stats(s.node_id); st && st->rtt_samples > 0) req.client_rtt_s[s.node_id] = st->rtt_us * 1e-6;
  auto r = swarm::min_latency_route(state(), req);
  if (!r) return make_error(errc::not_connected, r.error().message);
  return r.value();
}

caf::error swarm_client::back_off(int retry) {
  std::this_thread::sleep_for(
      std::min(options_.retry_backoff * (1 << std::min(retry, 5)), std::chrono::milliseconds(2000)));
  if (auto e = refresh(); e && !is_recoverable(e)) return e;
  return {};
}

caf::expected<swarm::route> swarm_client::throughput_route(int start, int end, const std::set<std::string>& excluded,
                                                           std::mt19937_64& rng) const {
  swarm::throughput_route_request req;
  req.start = start;
  req.end = end;
  req.excluded = excluded;
  auto r = swarm::max_throughput_route(state(), req, rng);
  if (!r) return make_error(errc::not_connected, r.error().message);
  return r.value();
}

bool swarm_client::shares_route(const swarm_prefix& share) const {
  // Every hop's server is still one this client routes through (reachable,
  // not found wrong), and the hops cover the model's blocks in order.
  int next = 0;
  for (const auto& h : share.hops) {
    const known_server* s = server(h.hop.server);
    if (!s || !s->reachable || distrusted(h.hop.server) || h.hop.start != next || h.hop.end <= h.hop.start) return false;
    next = h.hop.end;
  }
  return next == n_blocks_;
}

caf::expected<std::unique_ptr<swarm_session>> swarm_client::open_session(std::int64_t max_length,
                                                                       const Tensor& deep_prompts,
                                                                       const swarm_prefix& share) {
  // Membership changes reach new sessions: a stale view is refreshed first.
  if (!refreshed_ || std::chrono::steady_clock::now() - last_refresh_ > options_.refresh_period)
    if (auto err = refresh()) return err;
  std::mt19937_64 rng(std::random_device{}());
  char id[24];
  std::snprintf(id, sizeof id, "s-%016llx", static_cast<unsigned long long>(rng()));
  if (deep_prompts.defined() &&
      (deep_prompts.type() != dtype::f32 || deep_prompts.rank() != 3 || deep_prompts.dim(0) != n_blocks_ ||
       deep_prompts.dim(2) != hidden_size_ || deep_prompts.dim(1) < 1))
    return make_error(errc::bad_message, "deep prompts must be f32 [" + std::to_string(n_blocks_) + ", P, " +
                                             std::to_string(hidden_size_) + "], got " + shape_str(deep_prompts.shape()));
  std::unique_ptr<swarm_session> s(new swarm_session(*this, max_length, id, deep_prompts));
  if (!share.empty() && !deep_prompts.defined()) {
    std::vector<swarm::route_hop> hops;
    for (const auto& h : share.hops) hops.push_back(h.hop);
    caf::error err = shares_route(share) ? s->open_hops(hops, 0, &share)
                                         : make_error(errc::not_connected, "a server of that route is not usable");
    if (!err && s->length() > 0) {
      event("route " + swarm::to_string(swarm::route{hops}) + " (on another session's first " +
            std::to_string(s->length()) + " tokens)");
      return s;
    }
    // Nothing shared: this session routes like any other (the other
    // session's route is not necessarily the best one for it).
    s->close();
    s->share_missed_ = true;
    event("starting on another session's route failed (" + (err ? error_message(err) : std::string("it is gone")) +
          "); routing anew");
  }
  std::set<std::string> excluded;
  for (int attempt = 0;; ++attempt) {
    auto r = route(0, n_blocks_, excluded, max_length);
    caf::error err;
    if (r) {
      event("route " + swarm::to_string(*r));
      err = s->open_hops(r->hops, 0);
      if (!err) return s;
    } else {
      err = r.error();
    }
    if (!is_recoverable(err) || attempt + 1 >= options_.max_failovers) return err;
    event("opening the session failed (" + error_message(err) + "); retrying");
    if (auto e = back_off(attempt)) return e;
  }
}

}  // namespace corolla
