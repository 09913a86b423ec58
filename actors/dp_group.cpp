// The DP-group actor of a training rank (actors/dp_group.hpp).
#include "actors/dp_group.hpp"

#include <exception>
#include <map>
#include <utility>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_snapshot_wire.hpp"
#include "actors/train_snapshots.hpp"
#include "actors/train_store.hpp"
#include "model/optimizer.hpp"

namespace corolla {

dp_group::dp_group(dp_group_setup s)
    : s_(std::move(s)) {}

bool dp_group::keeps_params(const grad_bucket& b) const {
  return b.id == head_bucket ? s_.keeps_head_params : s_.keeps_block_params;
}

void dp_group::add_bucket(int id, param_set* p, param_set* g, const ring* group, device_group* coll) {
  Backend& be = *s_.compute;
  grad_bucket b;
  b.id = id;
  b.params = p;
  b.grads = g;
  b.group = group;
  std::tie(b.lo, b.hi) = chunk_range(p->size(), group->size(), owned_chunk(*group));
  b.device = be.dev().kind != device_kind::cpu;
  if (b.device) {
    b.m = be.empty({b.hi - b.lo});
    b.v = be.empty({b.hi - b.lo});
    b.m.zero();
    b.v.zero();
  } else {
    b.m = Tensor::zeros({b.hi - b.lo});
    b.v = Tensor::zeros({b.hi - b.lo});
  }
  b.coll = coll;
  if (b.coll) {  // the longest chunk, for every member (the collectives' layout)
    const std::int64_t pad = device_chunk_pad(p->size(), group->size());
    b.shard = be.empty({pad});
    b.shard.zero();
    if (pad * group->size() > coll_scratch_.numel()) {
      coll_scratch_ = be.empty({pad * group->size()});
      coll_scratch_.zero();
    }
  } else if (b.device && group->size() > 1) {  // page-locked: the copies run asynchronously at full bus speed
    b.host_params = be.host_empty({p->size()});
    be.copy(p->flat(), b.host_params);
    b.host_grads = be.host_empty({p->size()});
  }
  slot_of_[id] = static_cast<int>(buckets_.size());
  buckets_.push_back(std::move(b));
}

namespace {

/// Calls `fill` with `dst` itself on the host, or with a host buffer copied
/// to `dst` (on `be`'s device) afterwards.
template <class F>
void with_host(Backend& be, Tensor& dst, F&& fill) {
  if (dst.dev().kind == device_kind::cpu) return fill(dst);
  Tensor host = Tensor::empty(dst.shape());
  fill(host);
  be.copy(host, dst);
}

}  // namespace

void dp_group::restore(const state_shards& shards) {
  for (grad_bucket& b : buckets_) {
    const std::string name = bucket_name(b.id);
    const std::int64_t n = b.params->size();
    Tensor& params = b.comm_params();
    with_host(*s_.compute, params, [&](Tensor& host) { shards.read_params(name, host); });
    if (b.staged()) upload_params(b, s_.compute->mark().get());  // after the model's own initial copies
    with_host(*s_.compute, b.m, [&](Tensor& host) { shards.read_moment("m", name, b.lo, n, host); });
    with_host(*s_.compute, b.v, [&](Tensor& host) { shards.read_moment("v", name, b.lo, n, host); });
  }
}

std::vector<dp_group::wanted_shard> dp_group::wanted() const {
  std::vector<wanted_shard> out;
  for (const grad_bucket& b : buckets_) out.push_back({bucket_name(b.id), b.params->size(), b.lo, b.hi});
  return out;
}

Tensor dp_group::to_host(const Tensor& t) {
  if (t.dev().kind == device_kind::cpu) return t;
  Tensor h = Tensor::empty(t.shape());
  s_.math->copy(t, h);
  return h;
}

Tensor dp_group::reduced_shard(grad_bucket& b) {
  return b.coll ? b.shard.slice(0, b.hi - b.lo) : b.comm_grads().slice(b.lo, b.hi);
}

dp_step dp_group::reduce(int slot, std::int64_t step, std::int64_t adam_step,
                         std::shared_ptr<queue_marker> grads_ready) {
  grad_bucket& b = buckets_.at(static_cast<std::size_t>(slot));
  Backend& be = *s_.compute;
  b.grads_ready = std::move(grads_ready);
  if (b.coll) {
    // The companion queues after the bucket's backward (a host wait: its
    // queue is not ordered with the stage's).
    be.wait(b.grads_ready.get());
    device_reduce_scatter(*b.coll, *s_.math, *b.group, b.grads->flat(), coll_scratch_, b.shard);
    return after_reduce(b, step, adam_step);
  }
  // After the backward that produced them, on the device's transfer
  // queue: the layers whose backward was queued since keep running.
  if (b.staged()) be.copy_after(b.grads_ready.get(), b.grads->flat(), b.host_grads);
  dp_step ring{ring_pass(ring_phase::reduce_scatter, *b.group, b.comm_grads()), step, b.id, {}};
  ring.then = [this, &b, step, adam_step] {
    // Unstaged, what reads the gradients next runs on the companion and
    // must see what the backward wrote on the device.
    if (b.device && !b.staged()) s_.compute->wait(b.grads_ready.get());
    return after_reduce(b, step, adam_step);
  };
  return ring;
}

dp_step dp_group::after_reduce(grad_bucket& b, std::int64_t step, std::int64_t adam_step) {
  // The stage goes on once the companion's collectives are done.
  auto synchronized = [this, &b] {
    if (b.coll) b.coll->synchronize(*s_.math);
    return dp_step{};
  };
  if (s_.global_norm) return synchronized();
  update_shard(b, step, adam_step, 1.0f);
  return gather_params(b, step, synchronized);
}

caf::expected<double> dp_group::reduced_sum_squares(std::int64_t step) {
  try {
    double sum = 0;
    for (grad_bucket& b : buckets_) {
      const Tensor g = reduced_shard(b);
      sum += (g.dev().kind == device_kind::cpu ? cpu_backend() : *s_.math).sum_squares(g);
    }
    return sum;
  } catch (const std::exception& e) {
    return make_error(errc::remote_error,
                      s_.label + " failed computing its gradient norm of step " + std::to_string(step) + ": " + e.what());
  }
}

void dp_group::update_shard(grad_bucket& b, std::int64_t step, std::int64_t adam_step, float grad_scale) {
  const dist_train_options& o = *s_.options;
  if (o.synthetic.enabled()) return;
  Backend& on = *s_.math;
  adamw_params w = o.optimizer.adamw;
  w.grad_scale *= grad_scale;
  w.lr = scheduled_lr(w.lr, o.optimizer.schedule, static_cast<int>(step), o.steps);
  Tensor p = b.params->flat().slice(b.lo, b.hi);
  Tensor g = b.coll ? reduced_shard(b) : b.grads->flat().slice(b.lo, b.hi);
  if (b.staged()) {
    // The device gradients are free: their backward finished before the
    // download, and the next step zeroes them after this.
    on.copy(b.host_grads.slice(b.lo, b.hi), g);
    on.adamw(p, g, b.m, b.v, w, adam_step);
    Tensor updated = b.host_params.slice(b.lo, b.hi);
    on.copy(p, updated);  // returns once on the host, so after the update
    return;
  }
  on.adamw(p, g, b.m, b.v, w, adam_step);
  // The stage queues the next step's ops once the bucket is answered: a
  // companion's update must be over by then (device collectives: the
  // caller waits after the gather).
  if (b.device && &on != s_.compute && !b.coll) on.synchronize();
}

dp_step dp_group::gather_params(grad_bucket& b, std::int64_t step, std::function<dp_step()> then) {
  // Staged, the other ranks' shards go back up on the transfer queue with
  // nothing to wait for: the bucket's backward finished before its
  // download, and its next forward is queued only after the stage had the
  // answer. With device collectives, queued on the companion.
  if (b.coll) {
    device_all_gather(*b.coll, *s_.math, *b.group, b.params->flat(), coll_scratch_, b.shard);
    return then();
  }
  dp_step ring{ring_pass(ring_phase::all_gather, *b.group, b.comm_params()), step, b.id, {}};
  ring.then = [this, &b, then = std::move(then)] {
    if (b.staged()) {
      upload_params(b, nullptr, 0, b.lo);
      upload_params(b, nullptr, b.hi, b.params->size());
    }
    return then();
  };
  return ring;
}

void dp_group::upload_params(grad_bucket& b, const queue_marker* after, std::int64_t lo, std::int64_t hi) {
  if (hi < 0) hi = b.params->size();
  if (hi <= lo) return;
  Tensor dst = b.params->flat().slice(lo, hi);
  s_.compute->copy_after(after, b.host_params.slice(lo, hi), dst);
}

dp_step dp_group::update(int slot, std::int64_t step, std::int64_t adam_step, double coef) {
  grad_bucket& b = buckets_.at(static_cast<std::size_t>(slot));
  update_shard(b, step, adam_step, static_cast<float>(coef));
  return gather_params(b, step, [this, &b] {
    // The gathers wait on the other members: a dead one is noticed here,
    // not in whatever waits on this queue next.
    if (b.coll) b.coll->synchronize(*s_.math);
    return dp_step{};
  });
}

std::string dp_group::save_checkpoint(int step) {
  try {
    std::vector<std::pair<std::string, Tensor>> tensors;
    std::map<std::string, shard_range> ranges;
    for (const grad_bucket& b : buckets_) {
      const std::string name = bucket_name(b.id);
      if (keeps_params(b)) tensors.emplace_back("params." + name, to_host(b.comm_params()));
      tensors.emplace_back("m." + name, to_host(b.m));
      tensors.emplace_back("v." + name, to_host(b.v));
      ranges[name] = {b.lo, b.hi, b.params->size()};
    }
    write_shard(s_.options->checkpoint_dir, step, s_.rank, tensors, ranges);
    s_.comm->send_coordinator(train_msg::saved, encode_body(train_step_note{step, s_.rank, 0, s_.comm->job()}));
    return {};
  } catch (const std::exception& e) {
    return s_.label + " failed writing its checkpoint shard of step " + std::to_string(step) + ": " + e.what();
  }
}

std::int64_t dp_group::kept_param_values() const {
  std::int64_t n = 0;
  for (const grad_bucket& b : buckets_)
    if (keeps_params(b)) n += b.params->size();
  return n;
}

std::string dp_group::publish_params(int steps, int id, int ask, std::int64_t lo, std::int64_t hi) {
  const std::string what = "the parameters of " + bucket_name(id);
  try {
    const auto slot = slot_of_.find(id);
    if (slot == slot_of_.end() || !keeps_params(buckets_[static_cast<std::size_t>(slot->second)]))
      return s_.label + " was asked for " + what + ", which it does not keep";
    const grad_bucket& b = buckets_[static_cast<std::size_t>(slot->second)];
    std::int64_t& sent = published_[id];
    if (lo != sent || hi <= lo || hi > b.params->size())
      return s_.label + " was asked for values [" + std::to_string(lo) + ", " + std::to_string(hi) + ") of " + what +
             " (" + std::to_string(b.params->size()) + " values), but " + std::to_string(sent) +
             " went already: asks take each bucket's values in order";
    // A piece beyond a node's largest message (1 GiB by default) would be
    // refused on the way; say so here.
    const auto bytes = static_cast<std::int64_t>(sizeof(float)) * (hi - lo);
    if (bytes >= node_options{}.max_message_bytes)
      return "--save: the coordinator asked for " + std::to_string(bytes) + " bytes of " + what +
             " in one piece, more than one message takes";
    const Tensor piece = b.comm_params().slice(lo, hi);
    s_.comm->send_coordinator(train_msg::params, encode_body(train_packet{steps, b.id, ask, s_.rank, s_.comm->job()}),
                              {piece.dev().kind == device_kind::cpu ? piece.clone() : to_host(piece)});
    sent = hi;
    return {};
  } catch (const std::exception& e) {
    return s_.label + " failed sending " + what + ": " + e.what();
  }
}

std::string dp_group::snapshot(int step, const std::string& loss_scale) {
  try {
    rank_snapshot snap;
    snap.owner = s_.rank;
    snap.step = step;
    snap.job = s_.comm->job();
    snap.loss_scale = loss_scale;
    // Copies: the live buffers change with the next step.
    auto copy = [this](const Tensor& t) { return t.dev().kind == device_kind::cpu ? t.clone() : to_host(t); };
    for (const grad_bucket& b : buckets_) {
      const std::string name = bucket_name(b.id);
      snap.tensors.emplace_back("params." + name, copy(b.comm_params()));
      snap.tensors.emplace_back("m." + name, copy(b.m));
      snap.tensors.emplace_back("v." + name, copy(b.v));
      snap.ranges[name] = {b.lo, b.hi, b.params->size()};
    }
    caf::anon_send(s_.keeper, encode_snapshot(snap));
    if (s_.buddy < 0) return {};
    // The buddy on the same stage holds the parameters already. The copy
    // goes in parts of bounded size: a stage's moments are often larger
    // than the most one message may carry.
    const rank_snapshot for_buddy = s_.buddy_params ? snap : snap.without_params();
    try {
      if (!buddy_keeper_) buddy_keeper_ = s_.comm->actor_of(s_.buddy, snapshot_keeper_name(s_.comm->job()));
      for (remote_message& part : encode_snapshot_parts(for_buddy, s_.options->message_piece_bytes))
        caf::anon_send(buddy_keeper_, std::move(part));
    } catch (const train_error& e) {
      spdlog::warn("{}: no copy of its snapshot of step {} at its buddy: {}", s_.label, step, e.what());
    }
    return {};
  } catch (const std::exception& e) {
    return s_.label + " failed taking its snapshot of step " + std::to_string(step) + ": " + e.what();
  }
}

}  // namespace corolla
