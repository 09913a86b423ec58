#include "actors/train_comm.hpp"

#include <algorithm>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "kernels/backend.hpp"

namespace corolla {

std::string train_key(const std::string& type, std::uint64_t job, std::int64_t step, int index, int hop) {
  return type + "/" + std::to_string(job) + "/" + std::to_string(step) + "/" + std::to_string(index) + "/" +
         std::to_string(hop);
}

bool is_vague_failure(const std::string& reason) {
  return reason.find("said goodbye") != std::string::npos || reason.find("exited (exit status") != std::string::npos;
}

// ---- inbox ----------------------------------------------------------------------

void train_inbox::put(const std::string& key, remote_message m) {
  caf::actor to;
  std::uint64_t token = 0;
  {
    std::lock_guard lock(mu_);
    if (auto lose = to_lose_.find(m.type); lose != to_lose_.end() && lose->second > 0) {
      --lose->second;
      spdlog::warn("losing training message {} on purpose (faultlab's lose)", key);
      return;
    }
    // An actor awaits this key: the message goes straight to it.
    auto p = std::find_if(parked_.begin(), parked_.end(), [&](const parked_take& t) { return t.key == key; });
    if (p == parked_.end()) {
      filed_[key].push_back(std::move(m));
    } else {
      to = std::move(p->who);
      token = p->token;
      waiting_.erase(p->id);
      parked_.erase(p);
      ++taken_;
    }
  }
  if (to) {
    caf::anon_send(to, inbox_delivery_atom::value, token, std::move(m));
    return;
  }
  cv_.notify_all();
}

std::optional<remote_message> train_inbox::take_filed(const std::string& key) {
  auto it = filed_.find(key);
  if (it == filed_.end() || it->second.empty()) return std::nullopt;
  remote_message m = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) filed_.erase(it);
  ++taken_;
  return m;
}

std::optional<remote_message> train_inbox::await(const std::string& key, const std::string& what, int from,
                                                 caf::actor who, std::uint64_t token) {
  std::lock_guard lock(mu_);
  if (failure_) throw train_error(*failure_);
  if (auto m = take_filed(key)) return m;
  const std::uint64_t id = ++takes_;
  waiting_.emplace(id, pending_take{what, from, std::chrono::steady_clock::now()});
  parked_.push_back({key, std::move(who), token, id});
  return std::nullopt;
}

bool train_inbox::cancel(const caf::actor& who, std::uint64_t token) {
  std::lock_guard lock(mu_);
  auto p = std::find_if(parked_.begin(), parked_.end(),
                        [&](const parked_take& t) { return t.token == token && t.who == who; });
  if (p == parked_.end()) return false;
  waiting_.erase(p->id);
  parked_.erase(p);
  return true;
}

std::optional<remote_message> train_inbox::try_take(const std::string& key, std::chrono::milliseconds timeout,
                                                    const std::string& what, int from) {
  std::unique_lock lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  const auto deadline = now + timeout;
  // Registered while it waits: waits() tells the coordinator what for.
  const std::uint64_t id = ++takes_;
  waiting_.emplace(id, pending_take{what, from, now});
  struct unregister {
    std::map<std::uint64_t, pending_take>& w;
    std::uint64_t id;
    ~unregister() { w.erase(id); }
  } done{waiting_, id};
  for (;;) {
    if (failure_) throw train_error(*failure_);
    if (auto m = take_filed(key)) return m;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      if (failure_) throw train_error(*failure_);
      // One last look: a put may have come with the deadline.
      if (auto again = filed_.find(key); again != filed_.end() && !again->second.empty()) continue;
      return std::nullopt;
    }
  }
}

remote_message train_inbox::take(const std::string& key, std::chrono::milliseconds timeout, const std::string& what,
                                 int from) {
  auto m = try_take(key, timeout, what, from);
  if (!m) throw train_error("no " + what + " within " + std::to_string(timeout.count()) + " ms");
  return std::move(*m);
}

std::vector<schedule::party_wait> train_inbox::waits() const {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  std::vector<schedule::party_wait> out;
  for (const auto& [id, w] : waiting_)
    out.push_back({w.what, w.from, std::chrono::duration<double>(now - w.since).count()});
  return out;
}

std::uint64_t train_inbox::taken() const {
  std::lock_guard lock(mu_);
  return taken_;
}

caf::expected<schedule::rank_activity> train_inbox::activity(int rank, std::uint64_t job) const {
  // Only the coordinator of this run knows its id.
  if (job == 0 || job != this->job()) return make_error(errc::auth_refused, "not this rank's run");
  schedule::rank_activity a;
  a.rank = rank;
  a.answered = true;
  a.progress = taken();
  a.waits = waits();
  return a;
}

void train_inbox::lose(const std::string& type, int count) {
  std::lock_guard lock(mu_);
  to_lose_[type] = count;
}

void train_inbox::fail(const std::string& reason) {
  std::deque<parked_take> answer;
  {
    std::lock_guard lock(mu_);
    if (closing_) return;
    // A peer that said goodbye usually stopped because of another failure,
    // whose own reason may come a moment later: that one is kept instead.
    if (failure_ && !(is_vague_failure(*failure_) && !is_vague_failure(reason))) return;
    failure_ = reason;
    answer.swap(parked_);
    for (const parked_take& p : answer) waiting_.erase(p.id);
  }
  cv_.notify_all();
  for (parked_take& p : answer) caf::anon_send(p.who, inbox_failure_atom::value, p.token, reason);
}

std::optional<std::string> train_inbox::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

void train_inbox::close() {
  std::lock_guard lock(mu_);
  closing_ = true;
}

bool train_inbox::closing() const {
  std::lock_guard lock(mu_);
  return closing_;
}

void train_inbox::drain(const std::string& keep) {
  std::lock_guard lock(mu_);
  draining_keep_ = keep;
}

void train_inbox::peer_down(const std::string& node_id, const std::string& reason) {
  std::string label;
  {
    std::lock_guard lock(mu_);
    if (closing_) return;
    // Only the job's own peers matter: a rank of an earlier job on the same
    // port may reconnect here while it shuts down.
    auto it = labels_.find(node_id);
    if (it == labels_.end()) return;
    if (draining_keep_ && *draining_keep_ != node_id) return;
    label = it->second;
  }
  fail(label + " is down: " + reason);
}

void train_inbox::name_peer(const std::string& node_id, std::string label) {
  std::lock_guard lock(mu_);
  labels_[node_id] = std::move(label);
}

void train_inbox::set_job(std::uint64_t job) {
  std::lock_guard lock(mu_);
  job_ = job;
}

std::uint64_t train_inbox::job() const {
  std::lock_guard lock(mu_);
  return job_;
}

std::vector<std::string> train_inbox::named_peers() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [id, label] : labels_) out.push_back(id);
  return out;
}

bool train_inbox::named(const std::string& node_id) const {
  std::lock_guard lock(mu_);
  return labels_.count(node_id) > 0;
}

std::string train_inbox::label_of(const std::string& node_id) const {
  std::lock_guard lock(mu_);
  auto it = labels_.find(node_id);
  return it != labels_.end() ? it->second : "node " + node_id;
}

// ---- mailbox actor ----------------------------------------------------------------

namespace {

/// The key `m` is filed under, or an error for a malformed or unknown message.
caf::expected<std::string> key_of(const remote_message& m) {
  const std::string& t = m.type;
  if (t == train_msg::act || t == train_msg::grad || t == train_msg::rs || t == train_msg::ag ||
      t == train_msg::params || t == train_msg::group) {
    auto p = decode_train_packet(m.body);
    if (!p) return p.error();
    return train_key(t, p->job, p->step, p->index, p->hop);
  }
  if (t == train_msg::params_ask) {
    // Filed by the ask's number (hop) at this rank, which is what the rank
    // awaits: it cannot know which bucket comes next.
    auto p = decode_train_packet(m.body);
    if (!p) return p.error();
    return train_key(t, p->job, p->step, 0, p->hop);
  }
  if (t == train_msg::join) {
    auto j = decode_train_join(m.body);
    if (!j) return j.error();
    return train_key(t, 0, 0, j->rank);
  }
  if (t == train_msg::roster) return train_key(t, 0, 0, 0);
  if (t == train_msg::report) {
    auto r = decode_train_report(m.body);
    if (!r) return r.error();
    return train_key(t, r->job, r->step, r->rank);
  }
  if (t == train_msg::norm || t == train_msg::finish || t == train_msg::saved || t == train_msg::done ||
      t == train_msg::drain || t == train_msg::kept) {
    auto s = decode_train_step(m.body);
    if (!s) return s.error();
    const bool per_rank = t == train_msg::saved || t == train_msg::done || t == train_msg::kept;
    return train_key(t, s->job, s->step, per_rank ? s->rank : 0);
  }
  return make_error(errc::bad_message, "unknown training message type '" + t + "'");
}

caf::behavior train_mailbox(caf::event_based_actor*, std::shared_ptr<train_inbox> inbox, bool strict) {
  return {
      [inbox, strict](remote_message& m) {
        if (strict && m.type != train_msg::join && !inbox->named(m.from_node)) {
          spdlog::warn("dropping training message '{}' from node {}, which has not joined this job", m.type,
                       m.from_node);
          return;
        }
        if (m.type == train_msg::abort) {
          auto a = decode_train_abort(m.body);
          if (!a) {
            inbox->fail("the job was aborted (" + error_message(a.error()) + ")");
            return;
          }
          if (a->job != 0 && inbox->job() != 0 && a->job != inbox->job()) {
            spdlog::warn("ignoring an abort of another run from node {}: {}", m.from_node, a->reason);
            return;
          }
          inbox->fail(a->reason);
          return;
        }
        // A rank resends its join until the roster comes: a copy arriving
        // after the coordinator gave it its full label keeps that label.
        if (strict && m.type == train_msg::join && !inbox->named(m.from_node))
          if (auto j = decode_train_join(m.body)) inbox->name_peer(m.from_node, "rank " + std::to_string(j->rank));
        auto key = key_of(m);
        if (!key) {
          spdlog::warn("dropping training message '{}' from {}: {}", m.type, inbox->label_of(m.from_node),
                       error_message(key.error()));
          return;
        }
        inbox->put(*key, std::move(m));
      },
      [inbox](const peer_down& d) { inbox->peer_down(d.peer, d.reason); },
      // faultlab's lose, from the node's control actor (control.lose).
      [inbox](lose_atom, const std::string& type, int count) { inbox->lose(type, count); },
      [](const peer_up&) {},
  };
}

}  // namespace

caf::expected<caf::actor> start_train_mailbox(node& n, std::shared_ptr<train_inbox> inbox, const std::string& name,
                                              bool joins_only_from_strangers) {
  caf::actor a = n.system().spawn(train_mailbox, std::move(inbox), joins_only_from_strangers);
  if (auto err = n.publish(name, a)) {
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    return err;
  }
  n.monitor_peer("", a);
  return a;
}

// ---- sends and receives ----------------------------------------------------------

train_comm::train_comm(node& n, std::shared_ptr<train_inbox> inbox, int rank, std::vector<std::string> peers,
                       std::string coordinator_node, std::chrono::milliseconds timeout)
    : node_(&n),
      inbox_(std::move(inbox)),
      rank_(rank),
      peers_(std::move(peers)),
      coordinator_(std::move(coordinator_node)),
      proxies_(peers_.size()),
      timeout_(timeout) {}

caf::actor train_comm::mailbox_of(int rank) {
  if (rank < 0 || rank >= static_cast<int>(peers_.size()))
    throw train_error("no rank " + std::to_string(rank) + " in a job of " + std::to_string(peers_.size()));
  // The stage and the DP-group actor send from their own threads.
  std::lock_guard lock(mu_);
  caf::actor& p = proxies_[static_cast<std::size_t>(rank)];
  if (!p) {
    auto a = node_->remote_actor(peers_[static_cast<std::size_t>(rank)], "train");
    if (!a) throw train_error("cannot reach rank " + std::to_string(rank) + ": " + error_message(a.error()));
    p = *a;
  }
  return p;
}

caf::actor train_comm::actor_of(int to, const std::string& name) {
  if (to < 0 || to >= static_cast<int>(peers_.size()))
    throw train_error("no rank " + std::to_string(to) + " in a job of " + std::to_string(peers_.size()));
  auto a = node_->remote_actor(peers_[static_cast<std::size_t>(to)], name);
  if (!a) throw train_error("cannot reach " + name + " on rank " + std::to_string(to) + ": " + error_message(a.error()));
  return *a;
}

void train_comm::send(int to, const char* type, const train_packet& p, const Tensor& t) {
  train_packet stamped = p;
  stamped.job = job_;
  remote_message m;
  m.type = type;
  m.body = encode_body(stamped);
  if (t.defined()) m.tensors.push_back(t);
  caf::anon_send(mailbox_of(to), std::move(m));
}

void train_comm::send_coordinator(const char* type, std::vector<std::uint8_t> body, std::vector<Tensor> tensors) {
  std::unique_lock lock(mu_);
  if (!coordinator_proxy_) {
    auto a = node_->remote_actor(coordinator_, "train-coord");
    if (!a) throw train_error("cannot reach the coordinator: " + error_message(a.error()));
    coordinator_proxy_ = *a;
  }
  caf::actor target = coordinator_proxy_;
  lock.unlock();
  remote_message m;
  m.type = type;
  m.body = std::move(body);
  m.tensors = std::move(tensors);
  caf::anon_send(target, std::move(m));
}

Tensor train_comm::tensor_of(const remote_message& m, std::int64_t numel, const std::string& what) {
  if (m.tensors.size() != 1)
    throw train_error(what + " came with " + std::to_string(m.tensors.size()) + " tensors (expected 1)");
  const Tensor& t = m.tensors[0];
  if (t.type() != dtype::f32 || t.numel() != numel)
    throw train_error(what + " is " + std::string(dtype_name(t.type())) + " " + shape_str(t.shape()) + ", expected " +
                      std::to_string(numel) + " f32 values");
  return t;
}

void train_comm::send_chunk(int to, ring_phase phase, std::int64_t step, int bucket, int hop, Tensor chunk) {
  send(to, phase == ring_phase::reduce_scatter ? train_msg::rs : train_msg::ag, {step, bucket, hop, rank_}, chunk);
}

std::string train_comm::chunk_key(ring_phase phase, std::int64_t step, int bucket, int hop) const {
  return key(phase == ring_phase::reduce_scatter ? train_msg::rs : train_msg::ag, step, bucket, hop);
}

std::string train_comm::chunk_what(ring_phase phase, int bucket, int hop, int from) {
  return std::string(phase == ring_phase::reduce_scatter ? "gradient" : "parameter") + " chunk of bucket " +
         std::to_string(bucket) + " (hop " + std::to_string(hop) + ") from rank " + std::to_string(from);
}

}  // namespace corolla
