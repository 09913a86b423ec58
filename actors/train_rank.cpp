// One rank of a pipeline x data-parallel training job (actors/train_job.hpp).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_store.hpp"
#include "model/error.hpp"
#include "model/head.hpp"
#include "model/stage.hpp"
#include "model/token_data.hpp"
#include "model/transformer.hpp"
#include "schedule/pipeline.hpp"

namespace corolla {

namespace {

namespace fs = std::filesystem;
using schedule::pipeline_op;
using reduce_atom = caf::atom_constant<caf::atom("reduce")>;

/// A flat parameter buffer reduced and updated as one unit: a block, or the head.
struct bucket {
  int id = 0;  ///< block index, or head_bucket
  param_set* params = nullptr;
  param_set* grads = nullptr;
  const ring* group = nullptr;
  std::int64_t lo = 0, hi = 0;  ///< the shard this rank owns
  /// With a device backend: the parameters, gradients and AdamW moments
  /// live on the device, and the update runs there.
  bool device = false;
  Tensor m, v;  ///< AdamW moments of the shard (on the device with `device`)
  /// With a device backend and a DP group of more than one: host copies of
  /// the flat parameters and gradients, which the group's collectives work
  /// on (they run over the actor runtime, in host memory). The gradients
  /// come down, are reduce-scattered, this rank's reduced shard goes up and
  /// is updated on the device, the updated shard comes back down, is
  /// all-gathered, and the other shards go up. Undefined otherwise.
  Tensor host_params, host_grads;
  /// With a device backend: the compute queue's point after the bucket's
  /// last backward, recorded by the stage thread as it hands the bucket
  /// over; the DP actor's download (or its update) waits for it and nothing
  /// later.
  std::shared_ptr<queue_marker> grads_ready;
  /// With device collectives (--collectives device, a group of more than
  /// one): the group, and this rank's chunk of the reduce-scatter on the
  /// device, as long as the longest shard: first the reduced gradient shard
  /// (its first hi - lo values), then the updated parameter shard the
  /// all-gather sends. Null / undefined otherwise.
  device_group* coll = nullptr;
  Tensor shard;

  bool staged() const { return host_params.defined(); }
  /// What the collectives and the optimiser work on.
  Tensor& comm_params() { return staged() ? host_params : params->flat(); }
  Tensor& comm_grads() { return staged() ? host_grads : grads->flat(); }
  const Tensor& comm_params() const { return staged() ? host_params : params->flat(); }
};

/// Tensors of one micro-batch kept between its forward and backward.
struct in_flight {
  Tensor x, y, dy, dx;
  stage_activations acts;
};

class rank_runtime {
 public:
  rank_runtime(node& n, const dist_train_options& o, int rank, const rank_weights& weights, token_dataset& data,
               Backend* compute)
      : node_(n),
        o_(o),
        rank_(rank),
        weights_(weights),
        data_(data),
        cfg_(weights.cfg),
        be_(compute ? *compute : *weights.be),
        on_device_(be_.dev().kind != device_kind::cpu),
        scaler_(o.optimizer.loss_scale) {
    if (on_device_) {
      dp_be_ = be_.companion();
      if (!dp_be_)
        throw train_error("the " + be_.name() + " backend gives no second instance for the data-parallel " +
                          "group's optimiser thread");
    }
    const train_layout& l = o_.layout;
    stage_ = l.stage_of(rank);
    replica_ = l.replica_of(rank);
    first_ = stage_ == 0;
    last_ = stage_ == l.pp - 1;
    mb_ = o_.micro_batch_size();
    m_ = o_.micro_batches();
  }

  /// Joins the job, links to the ranks it exchanges with, trains, leaves.
  void run(const std::string& coordinator) {
    inbox_ = std::make_shared<train_inbox>();
    auto mailbox = start_train_mailbox(node_, inbox_, "train");
    if (!mailbox) throw train_error("cannot publish the training mailbox: " + error_message(mailbox.error()));
    mailbox_ = *mailbox;
    // Ranks of a multi-host job may start well before rank 0 listens.
    connect_options co;
    co.timeout = o_.timeout;
    auto coord = node_.connect(coordinator, co);
    if (!coord) throw train_error("cannot reach the coordinator at " + coordinator + ": " + error_message(coord.error()));
    inbox_->name_peer(*coord, "the coordinator");
    coordinator_id_ = *coord;
    try {
      join(*coord);
      if (o_.collectives == dp_collectives::device) join_device_groups();
      build_model();
      if (o_.resume) {
        restore();
        for (stage& part : parts_) part.params_changed();  // 16-bit compute copies follow the restored weights
      }
      run_actors();
      finish();
    } catch (const std::exception& e) {
      // The coordinator hears why before this node's goodbye reaches it
      // (node::stop hands sent messages to the link first), and names the
      // root cause.
      if (comm_ && !inbox_->closing())
        try {
          comm_->send_coordinator(train_msg::abort,
                                  encode_abort_body(o_.layout.label(rank_) + " failed: " + e.what(), comm_->job()));
        } catch (const std::exception&) {
        }
      throw;
    }
  }

  ~rank_runtime() {
    if (inbox_) inbox_->close();
    if (mailbox_) {
      node_.unpublish("train");
      caf::anon_send_exit(mailbox_, caf::exit_reason::user_shutdown);
    }
  }

 private:
  // ---- joining ------------------------------------------------------------------

  /// Sends the join, again every second, until the roster comes (or
  /// o_.timeout passes): a join that reaches the coordinator's node before
  /// its mailbox is published there is dropped ("no actor named
  /// 'train-coord'"), which a rank started before rank 0 (torchrun style)
  /// hit when the join was sent once. The coordinator takes the first join
  /// of each rank; later copies stay filed unread.
  remote_message join_until_roster() {
    const auto body = encode_body(train_join{rank_, o_.layout.world(), node_.endpoint(), join_key(o_, cfg_)});
    const auto deadline = std::chrono::steady_clock::now() + o_.timeout;
    for (;;) {
      comm_->send_coordinator(train_msg::join, body);
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      try {
        return inbox_->take(train_key(train_msg::roster, 0, 0, 0), std::clamp(left, std::chrono::milliseconds(0),
                                                                               std::chrono::milliseconds(1000)),
                            "roster from the coordinator");
      } catch (const train_error&) {
        if (inbox_->failure()) throw;
        if (std::chrono::steady_clock::now() >= deadline)
          throw train_error("no roster from the coordinator within " + std::to_string(o_.timeout.count()) + " ms");
      }
    }
  }

  void join(const std::string& coord) {
    comm_ = std::make_unique<train_comm>(node_, inbox_, rank_, std::vector<std::string>{}, coord, o_.timeout);
    remote_message r = join_until_roster();
    auto roster = decode_train_roster(r.body);
    if (!roster) throw train_error("bad roster from the coordinator: " + error_message(roster.error()));
    const int world = o_.layout.world();
    if (static_cast<int>(roster->peers.size()) != world)
      throw train_error("the coordinator's roster has " + std::to_string(roster->peers.size()) + " ranks, expected " +
                        std::to_string(world));
    std::vector<std::string> ids(static_cast<std::size_t>(world));
    std::vector<std::string> endpoints(static_cast<std::size_t>(world));
    for (const train_peer& p : roster->peers) {
      if (p.rank < 0 || p.rank >= world) throw train_error("roster names rank " + std::to_string(p.rank));
      ids[static_cast<std::size_t>(p.rank)] = p.node_id;
      endpoints[static_cast<std::size_t>(p.rank)] = p.endpoint;
      inbox_->name_peer(p.node_id, o_.layout.label(p.rank));
    }
    make_rings();
    // Links: the lower rank of each pair connects, the higher one waits for
    // it, so no pair ever has two connections.
    for (int q : neighbours()) {
      const std::string& id = ids[static_cast<std::size_t>(q)];
      if (q > rank_) {
        connect_options co;
        const auto world = static_cast<std::size_t>(o_.layout.world());
        if (!o_.link_profiles.empty()) co.link_profile = o_.link_profiles.at(static_cast<std::size_t>(rank_) * world + static_cast<std::size_t>(q));
        if (co.link_profile.empty()) co.link_profile = "none";
        auto c = node_.connect(endpoints[static_cast<std::size_t>(q)], co);
        if (!c) throw train_error("cannot connect to " + o_.layout.label(q) + " at " + endpoints[static_cast<std::size_t>(q)] +
                                  ": " + error_message(c.error()));
      } else {
        const auto deadline = std::chrono::steady_clock::now() + o_.timeout;
        while (!node_.peer_is_up(id)) {
          if (auto f = inbox_->failure()) throw train_error(*f);
          if (std::chrono::steady_clock::now() > deadline)
            throw train_error(o_.layout.label(q) + " did not connect within " + std::to_string(o_.timeout.count()) + " ms");
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      }
    }
    comm_ = std::make_unique<train_comm>(node_, inbox_, rank_, ids, coord, o_.timeout);
    comm_->set_job(roster->job);
    inbox_->set_job(roster->job);
  }

  void make_rings() {
    const train_layout& l = o_.layout;
    for (int r = 0; r < l.dp; ++r) dp_ring_.ranks.push_back(l.rank_of(stage_, r));
    dp_ring_.position = replica_;
    if (first_ || last_) {
      for (int r = 0; r < l.dp; ++r) head_ring_.ranks.push_back(l.rank_of(0, r));
      if (l.pp > 1)
        for (int r = 0; r < l.dp; ++r) head_ring_.ranks.push_back(l.rank_of(l.pp - 1, r));
      head_ring_.position = static_cast<int>(std::find(head_ring_.ranks.begin(), head_ring_.ranks.end(), rank_) -
                                             head_ring_.ranks.begin());
    }
  }

  std::set<int> neighbours() const {
    std::set<int> n;
    const train_layout& l = o_.layout;
    if (stage_ > 0) n.insert(l.rank_of(stage_ - 1, replica_));
    if (stage_ + 1 < l.pp) n.insert(l.rank_of(stage_ + 1, replica_));
    for (const ring* r : {&dp_ring_, &head_ring_})
      if (r->size() > 1) {
        n.insert(r->next());
        n.insert(r->prev());
      }
    n.erase(rank_);
    return n;
  }

  // ---- device collectives -------------------------------------------------------

  /// Joins this rank's device groups: the data-parallel group, then the
  /// head's where it differs (every rank joins in that order: a join blocks
  /// until the whole group is in).
  void join_device_groups() {
    const std::string me = o_.layout.label(rank_);
    if (!on_device_)
      throw train_error(me + " computes on the cpu: --collectives device needs every rank on a device (--device cuda)");
    if (!be_.has_device_groups())
      throw train_error("--collectives device: the " + be_.name() + " backend of " + me +
                        " has no device collectives (corolla was built without NCCL)");
    dp_group_ = join_device_group(dp_ring_, 0);
    if (head_ring_.ranks != dp_ring_.ranks) head_group_ = join_device_group(head_ring_, 1);
  }

  /// The ring's first member makes the group's id; it travels along the
  /// ring (neighbours are linked), then every member joins. Null for a ring
  /// of one.
  std::unique_ptr<device_group> join_device_group(const ring& r, int tag) {
    if (r.size() < 2) return nullptr;
    const std::string group = tag == 0 ? "data-parallel" : "head";
    device_group_id id{};
    if (r.position == 0) {
      id = be_.new_group_id();
    } else {
      const std::string what = "the " + group + " group's device id from " + o_.layout.label(r.prev());
      remote_message m = inbox_->take(train_key(train_msg::group, comm_->job(), 0, tag), o_.timeout, what);
      if (m.tensors.size() != 1 || m.tensors[0].type() != dtype::i8 ||
          m.tensors[0].numel() != static_cast<std::int64_t>(id.size()))
        throw train_error(what + " is malformed (expected one i8 tensor of " + std::to_string(id.size()) + " values)");
      std::memcpy(id.data(), m.tensors[0].raw(), id.size());
    }
    if (r.position + 1 < r.size()) {
      Tensor t = Tensor::empty({static_cast<std::int64_t>(id.size())}, dtype::i8);
      std::memcpy(t.raw(), id.data(), id.size());
      comm_->send(r.next(), train_msg::group, {0, tag, 0, rank_}, t);
    }
    spdlog::debug("{} joins the {} device group as member {} of {}", o_.layout.label(rank_), group, r.position,
                  r.size());
    // A peer that dies (its link fails the inbox) or a failed job stops the
    // join and every later wait on the group, instead of hanging them.
    return be_.join_group(id, r.position, r.size(), [inbox = inbox_]() { return inbox->failure(); });
  }

  /// The device group of `r` (null: a group of one, or host collectives).
  device_group* group_of(const ring* r) const {
    if (r->size() < 2) return nullptr;
    if (r == &dp_ring_) return dp_group_.get();
    return head_group_ ? head_group_.get() : dp_group_.get();  // the head's ring is the DP ring's (pp = 1)
  }

  // ---- model ------------------------------------------------------------------

  void build_model() {
    // One part per chunk (one without interleaving): virtual stage
    // c * pp + stage runs blocks [boundaries[v], boundaries[v+1]).
    parts_.reserve(static_cast<std::size_t>(o_.layout.chunks));
    for (int c = 0; c < o_.layout.chunks; ++c) {
      const auto v = static_cast<std::size_t>(o_.layout.virtual_stage(stage_, c));
      const int first = o_.layout.boundaries[v];
      const int last = o_.layout.boundaries[v + 1];
      std::vector<param_set> blocks = weights_.blocks(first, last);
      if (static_cast<int>(blocks.size()) != last - first)
        throw train_error("the weights gave " + std::to_string(blocks.size()) + " blocks for blocks " +
                          std::to_string(first) + ".." + std::to_string(last - 1));
      for (param_set& b : blocks) place_params(b, be_);  // no-op where they already are
      parts_.emplace_back(cfg_, first, std::move(blocks), be_);
      parts_.back().grads();
      parts_.back().set_compute_dtype(o_.compute);
    }
    if (first_ || last_) {
      param_set h = weights_.head();
      place_params(h, be_);
      head_part_.emplace(cfg_, std::move(h), be_);
      head_part_->grads();
    }
    for (stage& part : parts_)
      for (int i = 0; i < part.size(); ++i)
        add_bucket(part.first() + i, &part.params()[static_cast<std::size_t>(i)],
                   &part.grads()[static_cast<std::size_t>(i)], &dp_ring_);
    if (head_part_) add_bucket(head_bucket, &head_part_->params(), &head_part_->grads(), &head_ring_);
  }

  void add_bucket(int id, param_set* p, param_set* g, const ring* group) {
    bucket b;
    b.id = id;
    b.params = p;
    b.grads = g;
    b.group = group;
    std::tie(b.lo, b.hi) = chunk_range(p->size(), group->size(), owned_chunk(*group));
    b.device = on_device_;
    if (b.device) {
      b.m = be_.empty({b.hi - b.lo});
      b.v = be_.empty({b.hi - b.lo});
      b.m.zero();
      b.v.zero();
    } else {
      b.m = Tensor::zeros({b.hi - b.lo});
      b.v = Tensor::zeros({b.hi - b.lo});
    }
    b.coll = o_.collectives == dp_collectives::device ? group_of(group) : nullptr;
    if (b.coll) {  // the longest chunk, for every member (the collectives' layout)
      const std::int64_t pad = device_chunk_pad(p->size(), group->size());
      b.shard = be_.empty({pad});
      b.shard.zero();
      if (pad * group->size() > coll_scratch_.numel()) {
        coll_scratch_ = be_.empty({pad * group->size()});
        coll_scratch_.zero();
      }
    } else if (b.device && group->size() > 1) {  // page-locked: the copies run asynchronously at full bus speed
      b.host_params = be_.host_empty({p->size()});
      be_.copy(p->flat(), b.host_params);
      b.host_grads = be_.host_empty({p->size()});
    }
    slot_of_[id] = static_cast<int>(buckets_.size());
    buckets_.push_back(std::move(b));
  }

  // ---- checkpoints -----------------------------------------------------------------

  /// Restores the latest checkpoint, whatever layout wrote it: this rank's
  /// blocks' parameters from the shard that holds them, its moment shards
  /// assembled from the pieces of the writers' shards.
  void restore() {
    const int step = latest_checkpoint_step(o_.checkpoint_dir);
    if (step == 0) throw train_error("no checkpoint in " + o_.checkpoint_dir.string() + " to resume from");
    check_manifest(o_.checkpoint_dir, step, checkpoint_key(o_, cfg_));
    const checkpoint_shards shards(o_.checkpoint_dir, step);
    for (bucket& b : buckets_) {
      const std::string name = bucket_name(b.id);
      const std::int64_t n = b.params->size();
      Tensor& params = b.comm_params();
      with_host(params, [&](Tensor& host) { shards.read_params(name, host); });
      if (b.staged()) upload_params(b, be_.mark().get());  // after the model's own initial copies
      with_host(b.m, [&](Tensor& host) { shards.read_moment("m", name, b.lo, n, host); });
      with_host(b.v, [&](Tensor& host) { shards.read_moment("v", name, b.lo, n, host); });
    }
    steps_done_ = step;
    // Also without scaling now: its skipped steps keep AdamW's count right.
    if (const auto st = checkpoint_loss_scale(o_.checkpoint_dir, step)) scaler_.set_state(*st);
    std::vector<std::int32_t> ids, targets;
    for (int s = 0; s < step; ++s) data_.next_batch(o_.batch, o_.seq, ids, targets);
    const std::string from = checkpoint_layout(o_.checkpoint_dir, step);
    spdlog::info("{} resumed from {} (step {}{})", o_.layout.label(rank_), checkpoint_step_dir(o_.checkpoint_dir, step).string(),
                 step, from.empty() || from == o_.layout.describe() ? "" : ", written by layout " + from);
  }

  /// Calls `fill` with `dst` itself on the host, or with a host buffer
  /// copied to `dst` afterwards where the stages compute.
  template <class F>
  void with_host(Tensor& dst, F&& fill) {
    if (dst.dev().kind == device_kind::cpu) return fill(dst);
    Tensor host = Tensor::empty(dst.shape());
    fill(host);
    be_.copy(host, dst);
  }

  /// Parameters are the same on every replica: replica 0 of each stage
  /// writes (and sends) its blocks', rank 0 the head's, which the last
  /// stage holds too.
  bool keeps_params(const bucket& b) const { return b.id == head_bucket ? rank_ == 0 : replica_ == 0; }

  void save_checkpoint(int step) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    std::map<std::string, shard_range> ranges;
    for (const bucket& b : buckets_) {
      const std::string name = bucket_name(b.id);
      if (keeps_params(b)) tensors.emplace_back("params." + name, to_host(b.comm_params()));
      tensors.emplace_back("m." + name, to_host(b.m));
      tensors.emplace_back("v." + name, to_host(b.v));
      ranges[name] = {b.lo, b.hi, b.params->size()};
    }
    write_shard(o_.checkpoint_dir, step, rank_, tensors, ranges);
    comm_->send_coordinator(train_msg::saved, encode_body(train_step_note{step, rank_, 0, comm_->job()}));
  }

  // ---- the step ----------------------------------------------------------------------

  void run_actors() {
    auto program = (o_.layout.chunks > 1 ? schedule::make_interleaved(o_.layout.pp, m_, o_.layout.chunks)
                                         : schedule::make_1f1b(o_.layout.pp, m_))
                       .programs[static_cast<std::size_t>(stage_)];
    auto* self = this;
    dp_actor_ = node_.system().spawn<caf::detached>([self](caf::event_based_actor*) -> caf::behavior {
      return {[self](reduce_atom, int slot, std::int64_t step) { self->reduce_bucket(slot, step); }};
    });
    // Shared: the actor may still be inside set_value when this thread
    // wakes up and leaves.
    auto done = std::make_shared<std::promise<void>>();
    auto finished = done->get_future();
    node_.system().spawn<caf::detached>([self, program, done](caf::blocking_actor*) {
      try {
        for (int step = self->steps_done_ + 1; step <= self->o_.steps; ++step) self->run_step(program, step);
        done->set_value();
      } catch (...) {
        done->set_exception(std::current_exception());
      }
    });
    try {
      finished.get();
    } catch (...) {
      // Unblock the DP-group actor before it goes away with this runtime.
      inbox_->fail("rank " + std::to_string(rank_) + " stopped");
      wait_reductions(enqueued_, /*rethrow=*/false);
      stop_dp_actor();
      throw;
    }
    stop_dp_actor();
  }

  // The DP-group actor uses this runtime: it must be gone before the
  // runtime is (it may still be returning from its last handler).
  void stop_dp_actor() {
    caf::anon_send_exit(dp_actor_, caf::exit_reason::user_shutdown);
    caf::scoped_actor waiter{node_.system()};
    waiter->wait_for(dp_actor_);
  }

  void run_step(const std::vector<schedule::instruction>& program, int step) {
    if (!synthetic()) {
      for (stage& part : parts_) part.zero_grads();
      if (head_part_) head_part_->zero_grads();
    }
    step_start_enqueued_ = enqueued_;
    data_.next_batch(o_.batch, o_.seq, ids_, targets_);
    const train_layout& l = o_.layout;
    const int V = l.virtual_stages();
    const std::int64_t rows = static_cast<std::int64_t>(mb_) * o_.seq;
    const std::int64_t D = cfg_.hidden_size;
    // Messages of micro-batch k for virtual stage v are filed under index
    // k * V + v (the receiver's virtual stage).
    auto index = [V](int k, int v) { return k * V + v; };
    std::map<std::pair<int, int>, in_flight> flight;  // (micro-batch, chunk)
    std::vector<int> backwards(static_cast<std::size_t>(l.chunks), 0);
    double loss = 0;
    bool head_enqueued = false;
    for (const schedule::instruction& ins : program) {
      const int k = ins.micro_batch;
      const int c = ins.chunk;
      const int v = l.virtual_stage(stage_, c);
      const std::pair<int, int> key{k, c};
      switch (ins.op) {
        case pipeline_op::load_micro_batch: break;
        case pipeline_op::recv_act: {
          const int from = l.rank_of((v - 1) % l.pp, replica_);
          Tensor x = comm_->receive(train_msg::act, step, index(k, v), 0, rows * D,
                                    "activations of micro-batch " + std::to_string(k) + " from " + l.label(from));
          flight[key].x = to_compute(x.view({rows, D}));
          break;
        }
        case pipeline_op::forward: {
          in_flight& f = flight[key];
          if (synthetic()) {
            sleep_s(o_.synthetic.forward_s.at(static_cast<std::size_t>(stage_)) / l.chunks);
            f.y = synthetic_rows();
            break;
          }
          if (v == 0) {
            f.x = be_.empty({rows, D});
            head_part_->embed(tokens(ids_, k), positions(), f.x);
          }
          f.y = be_.empty({rows, D});
          parts_[static_cast<std::size_t>(c)].forward(f.x, mb_, o_.seq, f.y, &f.acts);
          break;
        }
        case pipeline_op::send_act:
          comm_->send(l.rank_of((v + 1) % l.pp, replica_), train_msg::act, {step, index(k, v + 1), 0, rank_},
                      to_host(flight[key].y));
          break;
        case pipeline_op::recv_grad: {
          const int from = l.rank_of((v + 1) % l.pp, replica_);
          Tensor dy = comm_->receive(train_msg::grad, step, index(k, v), 0, rows * D,
                                     "gradient of micro-batch " + std::to_string(k) + " from " + l.label(from));
          flight[key].dy = to_compute(dy.view({rows, D}));
          break;
        }
        case pipeline_op::backward: {
          in_flight& f = flight[key];
          stage& part = parts_[static_cast<std::size_t>(c)];
          // The chunk's last backward of the step: its buckets are final.
          const bool final_backward = ++backwards[static_cast<std::size_t>(c)] == m_;
          if (synthetic()) {
            // The modelled backward, block by block (last first), so the
            // last micro-batch hands its buckets over as a real one would.
            const int n = part.size();
            const double per_block = o_.synthetic.backward_s.at(static_cast<std::size_t>(stage_)) / l.chunks / n;
            for (int i = n - 1; i >= 0; --i) {
              sleep_s(per_block);
              if (final_backward) enqueue(part.first() + i, step);
            }
            if (v == 0) {
              flight.erase(key);
            } else {
              f = in_flight{};
              f.dx = synthetic_rows();
            }
            break;
          }
          if (v == V - 1) {
            f.dy = be_.empty({rows, D});
            const float scale = static_cast<float>(mb_) / static_cast<float>(o_.batch) * scaler_.scale();
            const float lk = head_part_->loss(f.y, tokens(targets_, k), &f.dy, scale, head_acts_);
            loss += static_cast<double>(lk) * mb_ / o_.batch;
          }
          f.dx = be_.empty({rows, D});
          std::function<void(int)> on_block;
          if (final_backward) on_block = [this, step, &part](int i) { enqueue(part.first() + i, step); };
          part.backward(f.acts, f.dy, f.dx, on_block);
          if (v == 0) head_part_->embed_backward(tokens(ids_, k), positions(), f.dx);
          f.acts = {};
          f.x = f.y = f.dy = Tensor{};
          if (v == 0) flight.erase(key);  // nothing to send back: done with this micro-batch
          break;
        }
        case pipeline_op::send_grad:
          comm_->send(l.rank_of((v - 1) % l.pp, replica_), train_msg::grad, {step, index(k, v - 1), 0, rank_},
                      to_host(flight[key].dx));
          flight.erase(key);
          break;
        case pipeline_op::reduce_grads:
          if (head_part_ && !head_enqueued) {
            enqueue(head_bucket, step);
            head_enqueued = true;
          }
          break;
        case pipeline_op::optimizer_step:
          optimizer_step(step, loss);
          break;
      }
    }
  }

  Tensor tokens(const std::vector<std::int32_t>& all, int k) const {
    const std::int64_t per_replica = static_cast<std::int64_t>(o_.batch / o_.layout.dp) * o_.seq;
    const std::int64_t rows = static_cast<std::int64_t>(mb_) * o_.seq;
    const std::int64_t begin = replica_ * per_replica + k * rows;
    return Tensor::from_i32(std::span(all).subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(rows)),
                            {rows});
  }

  const Tensor& positions() {
    if (!positions_.defined()) {
      std::vector<std::int32_t> p(static_cast<std::size_t>(mb_) * o_.seq);
      for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(o_.seq));
      positions_ = Tensor::from_i32(p, {static_cast<std::int64_t>(p.size())});
    }
    return positions_;
  }

  bool synthetic() const { return o_.synthetic.enabled(); }

  /// A received (host) tensor where the stages compute.
  Tensor to_compute(Tensor host) {
    if (!on_device_) return host;
    Tensor d = be_.empty(host.shape());
    be_.copy(host, d);
    return d;
  }

  /// `t` in host memory, to send (returns once copied).
  Tensor to_host(const Tensor& t) {
    if (t.dev().kind == device_kind::cpu) return t;
    Tensor h = Tensor::empty(t.shape());
    be_.copy(t, h);
    return h;
  }

  /// A host copy of `t` that nothing else writes.
  Tensor own_host_copy(const Tensor& t) { return t.dev().kind == device_kind::cpu ? t.clone() : to_host(t); }

  static void sleep_s(double s) {
    if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
  }

  /// Activations of the right size whose values do not matter.
  Tensor synthetic_rows() {
    if (!synthetic_rows_.defined())
      synthetic_rows_ = Tensor::zeros({static_cast<std::int64_t>(mb_) * o_.seq, cfg_.hidden_size});
    return synthetic_rows_;
  }

  // ---- reductions and the update ----------------------------------------------------

  /// Whether updates wait for the coordinator's global gradient norm: to
  /// clip, or to learn whether a loss-scaled backward overflowed anywhere.
  /// Without it each bucket is updated as soon as it is reduced.
  bool needs_global_norm() const { return o_.optimizer.max_grad_norm > 0.0f || scaler_.dynamic(); }

  void enqueue(int id, std::int64_t step) {
    const int slot = slot_of_.at(id);
    bucket& b = buckets_[static_cast<std::size_t>(slot)];
    // Read by the DP actor after the message. The schedules keep this
    // invariant, which the download and the marker-less upload rely on: no
    // op queued after a bucket's final backward reads or writes its
    // parameters or gradients before optimizer_step has waited for the
    // reduction (recomputation or split weight-gradient schedules would
    // have to mark later).
    if (b.device) b.grads_ready = be_.mark();
    caf::anon_send(dp_actor_, reduce_atom::value, slot, step);
    ++enqueued_;
  }

  // On the DP-group actor: the bucket's reduce-scatter, and without the
  // global norm (no clipping, no loss scaling) its update and all-gather at
  // once.
  void reduce_bucket(int slot, std::int64_t step) {
    try {
      bucket& b = buckets_[static_cast<std::size_t>(slot)];
      if (b.coll) {
        // The companion queues after the bucket's backward (a host wait:
        // its queue is not ordered with the stage thread's).
        be_.wait(b.grads_ready.get());
        device_reduce_scatter(*b.coll, dp_math(), *b.group, b.grads->flat(), coll_scratch_, b.shard);
      } else {
        // After the backward that produced them, on the device's transfer
        // queue: the layers whose backward was queued since keep running.
        if (b.staged()) be_.copy_after(b.grads_ready.get(), b.grads->flat(), b.host_grads);
        ring_reduce_scatter(*comm_, *b.group, b.comm_grads(), step, b.id);
        // Unstaged, the update below reads what the backward wrote on the device.
        if (!needs_global_norm() && b.device && !b.staged()) be_.wait(b.grads_ready.get());
      }
      if (!needs_global_norm()) {
        update_shard(b, step, dp_math());
        gather_params(b, step, dp_math());
      }
      // The stage thread goes on once the companion's collectives are done.
      if (b.coll) b.coll->synchronize(dp_math());
      note_reduced({});
    } catch (const std::exception& e) {
      // Fail the whole rank at once (the stage actor's next wait throws and
      // the coordinator hears this reason), not one bucket per timeout.
      inbox_->fail(o_.layout.label(rank_) + " failed reducing gradients: " + e.what());
      note_reduced(e.what());
    }
  }

  void note_reduced(std::optional<std::string> error) {
    {
      std::lock_guard lock(dp_mu_);
      ++reduced_;
      if (error && !dp_error_) dp_error_ = std::move(error);
    }
    dp_cv_.notify_all();
  }

  void wait_reductions(int count, bool rethrow) {
    std::unique_lock lock(dp_mu_);
    dp_cv_.wait(lock, [&] { return reduced_ >= count; });
    if (rethrow && dp_error_) throw train_error(*dp_error_);
  }

  /// The DP actor's backend: with a device backend its companion (the DP
  /// actor's thread must not share the stage thread's queue and scratch),
  /// else the compute backend (the cpu's is safe for concurrent callers).
  Backend& dp_math() { return dp_be_ ? *dp_be_ : be_; }

  /// Where arithmetic on `t` runs from the stage thread.
  Backend& stage_math(const Tensor& t) { return t.dev().kind == device_kind::cpu ? cpu_backend() : be_; }

  /// This rank's shard of the bucket's reduced gradients (on the host when
  /// staged: where the reduce-scatter left them).
  Tensor reduced_shard(bucket& b) {
    return b.coll ? b.shard.slice(0, b.hi - b.lo) : b.comm_grads().slice(b.lo, b.hi);
  }

  /// AdamW on this rank's shard, with backend `on` (dp_math() from the DP
  /// actor, be_ from the stage thread), where the parameters live. Staged,
  /// the reduced gradient shard goes up first and the updated parameter
  /// shard comes back down for the all-gather. The gradients are taken times
  /// `grad_scale` (unscaling and clipping, folded into AdamW's pass).
  /// Returns once the update is done, except on be_ for an unstaged bucket
  /// (global norm), where it is queued in order with everything after it.
  void update_shard(bucket& b, std::int64_t step, Backend& on, float grad_scale = 1.0f) {
    if (synthetic()) return;
    adamw_params w = o_.optimizer.adamw;
    w.grad_scale *= grad_scale;
    w.lr = scheduled_lr(w.lr, o_.optimizer.schedule, static_cast<int>(step), o_.steps);
    // AdamW counts the updates made: steps skipped for overflow are not
    // (as a single process's adamw_optimizer); the schedule counts steps.
    step -= scaler_.state().skipped;
    Tensor p = b.params->flat().slice(b.lo, b.hi);
    Tensor g = b.coll ? reduced_shard(b) : b.grads->flat().slice(b.lo, b.hi);
    if (b.staged()) {
      // The device gradients are free: their backward finished before the
      // download, and the next step zeroes them after this.
      on.copy(b.host_grads.slice(b.lo, b.hi), g);
      on.adamw(p, g, b.m, b.v, w, step);
      Tensor updated = b.host_params.slice(b.lo, b.hi);
      on.copy(p, updated);  // returns once on the host, so after the update
      return;
    }
    on.adamw(p, g, b.m, b.v, w, step);
    // The stage thread queues the next step's ops once the reductions are
    // noted: a companion's update must be over by then.
    if (b.device && &on != &be_ && !b.coll) on.synchronize();  // device collectives: the caller waits after the gather
  }

  /// All-gathers the updated shards and, staged, copies the other ranks'
  /// shards back to the device (this rank's was updated there), on the
  /// transfer queue with nothing to wait for: the bucket's backward finished
  /// before its download, and its next forward is queued only after
  /// optimizer_step has waited for this (from the DP actor or, with
  /// the global norm, the stage thread). With device collectives, queued
  /// on `on` (the caller's backend: dp_math() or be_).
  void gather_params(bucket& b, std::int64_t step, Backend& on) {
    if (b.coll) return device_all_gather(*b.coll, on, *b.group, b.params->flat(), coll_scratch_, b.shard);
    ring_all_gather(*comm_, *b.group, b.comm_params(), step, b.id);
    if (!b.staged()) return;
    upload_params(b, nullptr, 0, b.lo);
    upload_params(b, nullptr, b.hi, b.params->size());
  }

  /// Elements [lo, hi) of the bucket's host parameters (all by default) to
  /// the device, after the work queued before `after`.
  void upload_params(bucket& b, const queue_marker* after, std::int64_t lo = 0, std::int64_t hi = -1) {
    if (hi < 0) hi = b.params->size();
    if (hi <= lo) return;
    Tensor dst = b.params->flat().slice(lo, hi);
    be_.copy_after(after, b.host_params.slice(lo, hi), dst);
  }

  void optimizer_step(int step, double loss) {
    if (enqueued_ - step_start_enqueued_ != static_cast<int>(buckets_.size()))
      throw train_error("internal: " + std::to_string(enqueued_ - step_start_enqueued_) + " of " +
                        std::to_string(buckets_.size()) + " buckets handed to the DP group in step " + std::to_string(step));
    wait_reductions(enqueued_, true);
    double sum_squares = 0;
    bool skip = false;
    if (needs_global_norm())
      for (bucket& b : buckets_) {
        const Tensor g = reduced_shard(b);
        sum_squares += stage_math(g).sum_squares(g);
      }
    comm_->send_coordinator(train_msg::report, encode_body(train_report{rank_, step, loss, sum_squares, comm_->job()}));
    if (needs_global_norm()) {
      remote_message m = inbox_->take(train_key(train_msg::norm, comm_->job(), step, 0), o_.timeout,
                                      "gradient norm of step " + std::to_string(step) + " from the coordinator");
      auto note = decode_train_step(m.body);
      if (!note) throw train_error("bad gradient norm from the coordinator: " + error_message(note.error()));
      // Every rank sees the same norm, so all skip an overflowed step (the
      // parameters stay as they are everywhere: nothing to gather).
      skip = scaler_.dynamic() && overflowed(note->value);
      const double coef = grad_coefficient(note->value, scaler_.scale(), o_.optimizer.max_grad_norm);
      for (bucket& b : buckets_) {
        if (skip) break;
        update_shard(b, step, be_, static_cast<float>(coef));
        gather_params(b, step, be_);
      }
      // The gathers wait on the other members: a dead one is noticed here,
      // not in whatever waits on this queue next.
      for (device_group* g : {dp_group_.get(), head_group_.get()})
        if (g != nullptr && !skip) g->synchronize(be_);
      scaler_.update(skip);
    }
    // Every bucket's update is in (waited for above, or just made): 16-bit
    // compute copies are converted again before the next forward.
    if (!skip)
      for (stage& part : parts_) part.params_changed();
    if (o_.checkpoints_at(step)) save_checkpoint(step);
  }

  // ---- the end ------------------------------------------------------------------

  void finish() {
    if (!o_.save_dir.empty())
      for (const bucket& b : buckets_) {
        const bool sends = keeps_params(b);
        // One message per bucket: a bucket beyond a node's largest message
        // (1 GiB by default) would be refused on the way; say so here.
        if (sends && static_cast<std::int64_t>(b.comm_params().nbytes()) >= node_options{}.max_message_bytes)
          throw train_error("--save: the parameters of " + bucket_name(b.id) + " (" +
                            std::to_string(b.comm_params().nbytes()) + " bytes) exceed one message; saving a model "
                            "this large is not supported yet (use --checkpoint-dir)");
        if (sends)
          comm_->send_coordinator(train_msg::params, encode_body(train_packet{o_.steps, b.id, 0, rank_, comm_->job()}),
                                  {own_host_copy(b.comm_params())});
      }
    // Done: other ranks may finish and leave first; only the coordinator
    // going away now would be a failure.
    inbox_->drain(coordinator_id_);
    comm_->send_coordinator(train_msg::done, encode_body(train_step_note{o_.steps, rank_, 0, comm_->job()}));
    inbox_->take(train_key(train_msg::finish, comm_->job(), o_.steps, 0), o_.timeout, "the coordinator's end of the job");
    inbox_->close();
  }

  node& node_;
  const dist_train_options& o_;
  int rank_;
  const rank_weights& weights_;
  token_dataset& data_;
  model_config cfg_;
  Backend& be_;     ///< where the stages compute
  bool on_device_;  ///< be_ is not the host: activations go through host memory, buckets stay on the device
  int stage_ = 0, replica_ = 0, mb_ = 1, m_ = 1;
  bool first_ = false, last_ = false;
  int steps_done_ = 0;
  /// Updated from the coordinator's norm each step, identically on every
  /// rank (and in the coordinator).
  loss_scaler scaler_;

  std::shared_ptr<train_inbox> inbox_;
  std::string coordinator_id_;
  caf::actor mailbox_, dp_actor_;
  std::unique_ptr<train_comm> comm_;
  ring dp_ring_, head_ring_;
  std::vector<stage> parts_;  ///< one per chunk
  std::optional<head> head_part_;
  head_activations head_acts_;
  std::vector<bucket> buckets_;
  std::map<int, int> slot_of_;
  std::vector<std::int32_t> ids_, targets_;
  Tensor positions_, synthetic_rows_;

  std::mutex dp_mu_;
  std::condition_variable dp_cv_;
  int enqueued_ = 0, reduced_ = 0, step_start_enqueued_ = 0;
  std::optional<std::string> dp_error_;
  /// The padded layout of the device collectives (--collectives device):
  /// size * pad of the largest bucket, on the device.
  Tensor coll_scratch_;
  /// be_'s companion for the DP actor (device backends only). Late, so it
  /// is destroyed early: its stream is drained before the buffers its
  /// queued work may still use (after a failed step) go back.
  std::unique_ptr<Backend> dp_be_;
  /// The device groups: the data-parallel group, and the head's where its
  /// ring differs. Last, so they are finalised (or aborted: a peer gone)
  /// before the companion drains its stream, which a collective waiting on
  /// a dead peer would never let it do.
  std::unique_ptr<device_group> dp_group_, head_group_;
};

}  // namespace

rank_weights weights_of(transformer& model) {
  rank_weights w;
  w.cfg = model.config();
  w.be = &model.backend();
  w.blocks = [&model](int first, int last) {
    return std::vector<param_set>(model.blocks().begin() + first, model.blocks().begin() + last);
  };
  w.head = [&model] { return model.head(); };
  return w;
}

rank_weights weights_from_checkpoint(const std::filesystem::path& dir, Backend& be) {
  auto ck = std::make_shared<checkpoint>(checkpoint::open(dir));
  rank_weights w;
  w.cfg = load_config(dir);
  w.be = &be;
  w.blocks = [ck, cfg = w.cfg, &be](int first, int last) {
    return stage::load(*ck, cfg, first, last, be).params();
  };
  w.head = [ck, cfg = w.cfg, &be] { return head::load(*ck, cfg, be).params(); };
  return w;
}

void run_train_rank(node& n, const dist_train_options& o, int rank, const std::string& coordinator,
                    const rank_weights& weights, token_dataset& data, Backend* compute) {
  if (rank < 0 || rank >= o.layout.world())
    throw std::invalid_argument("rank " + std::to_string(rank) + " is outside a job of " +
                                std::to_string(o.layout.world()) + " ranks");
  if (!weights.be || !weights.blocks || !weights.head) throw std::invalid_argument("run_train_rank: incomplete weights");
  check_layout(o.layout, weights.cfg.n_layers);
  if (o.synthetic.enabled() && (o.synthetic.forward_s.size() != static_cast<std::size_t>(o.layout.pp) ||
                                o.synthetic.backward_s.size() != static_cast<std::size_t>(o.layout.pp)))
    throw std::invalid_argument("synthetic compute needs one forward and one backward time per stage");
  rank_runtime rt(n, o, rank, weights, data, compute);
  rt.run(coordinator);
}

}  // namespace corolla
