// One rank of a training job, its setup (actors/train_rank_runtime.hpp):
// the model of its stage and the DP group's buckets, device groups, a
// restore from a checkpoint, the snapshot keeper and the stage's watchdog.
#include "actors/train_rank_runtime.hpp"

#include <set>

#include "actors/train_snapshot_reads.hpp"

namespace corolla::train_detail {

void rank_runtime::build_model() {
  // LoRA: the whole adapter (the same on every rank: drawn from the job's
  // seed, or read from its directory); this rank trains its blocks' factors.
  const bool lora = o_.lora.has_value();
  // QLoRA: the frozen blocks held as bf16/int8/nf4, widened a block at a
  // time (f32 compute: run_train_rank checked).
  const weight_format frozen = lora ? o_.lora->base_weights : weight_format::f32;
  if (lora) {
    const dist_lora& l = *o_.lora;
    if (o_.resume) {
      // restore() writes every value: nothing to draw or read.
      model_.adapter = std::make_unique<lora_adapter>(lora_adapter::zeros(cfg_, l.config));
      for (int i = 0; i < model_.adapter->n_layers(); ++i) place_params(model_.adapter->block(i), be_);
    } else if (l.from.empty()) {
      model_.adapter = std::make_unique<lora_adapter>(lora_adapter::init(cfg_, l.config, l.seed, be_));
    } else {
      model_.adapter = std::make_unique<lora_adapter>(lora_adapter::load(l.from, cfg_, be_));
      if (model_.adapter->digest() != l.from_digest)
        throw train_error("the adapter in " + l.from.string() + " on this machine (digest " +
                          model_.adapter->digest() + ") is not the one the job trains on (" + l.from_digest + ")");
    }
    model_.adapter->zero_grads();
    model_.factors.reserve(static_cast<std::size_t>(o_.layout.chunks));
  }
  // One part per chunk (one without interleaving): virtual stage
  // c * pp + stage runs blocks [boundaries[v], boundaries[v+1]).
  model_.parts.reserve(static_cast<std::size_t>(o_.layout.chunks));
  for (int c = 0; c < o_.layout.chunks; ++c) {
    const auto v = static_cast<std::size_t>(o_.layout.virtual_stage(stage_, c));
    const int first = o_.layout.boundaries[v];
    const int last = o_.layout.boundaries[v + 1];
    if (frozen != weight_format::f32) {
      model_.parts.push_back(frozen_part(first, last, frozen));
    } else {
      std::vector<param_set> blocks = stage_blocks(first, last);
      model_.parts.emplace_back(cfg_, first, std::move(blocks), be_);
    }
    stage& part = model_.parts.back();
    part.set_compute_dtype(o_.compute);
    if (lora) {
      // Every weight of the part frozen (no gradient buffer), the adapter's
      // terms beside them.
      model_.factors.push_back(model_.adapter->training_factors(be_, o_.compute, first, last - first));
      part.set_trained_weights(std::set<std::string>{}, model_.adapter.get(), &model_.factors.back());
    } else {
      part.grads();
    }
  }
  if (first_ || last_) {
    param_set h = weights_.head();
    place_params(h, be_);
    model_.head_part.emplace(cfg_, std::move(h), be_);
    if (!lora) model_.head_part->grads();  // a LoRA job's head is frozen
  }
  compute_ = make_stage_compute(o_, model_, be_, stage_, replica_);
  // The DP group owns the buckets from here on: every block's, and the head's.
  dp_group_setup s;
  s.options = &o_;
  s.rank = rank_;
  s.label = o_.layout.label(rank_);
  // Parameters are the same on every replica: replica 0 of each stage
  // writes (and sends) its blocks', rank 0 the head's, which the last
  // stage holds too.
  s.keeps_block_params = replica_ == 0;
  s.keeps_head_params = rank_ == 0;
  s.global_norm = needs_global_norm();
  s.compute = &be_;
  s.math = dp_be_ ? dp_be_.get() : &be_;
  s.comm = comm_.get();
  s.inbox = inbox_;
  s.keeper = keeper_;
  s.buddy = keeper_ ? snapshot_buddy(o_.layout, rank_) : -1;
  s.buddy_params = buddy_needs_params(o_.layout, rank_);
  buckets_ = std::make_shared<dp_group>(std::move(s));
  const bool device_coll = o_.collectives == dp_collectives::device;
  if (lora) {
    // The adapter's blocks are the buckets: its factors are what the DP
    // groups reduce and update; the head has none.
    const std::vector<param_group> groups = model_.adapter->groups();
    for (const stage& part : model_.parts)
      for (int i = part.first(); i < part.first() + part.size(); ++i)
        buckets_->add_bucket(i, groups[static_cast<std::size_t>(i)].params, groups[static_cast<std::size_t>(i)].grads,
                             &rings_.dp, device_coll ? group_of(rings_.dp) : nullptr);
    return;
  }
  for (stage& part : model_.parts)
    for (int i = 0; i < part.size(); ++i)
      buckets_->add_bucket(part.first() + i, &part.params()[static_cast<std::size_t>(i)],
                           &part.grads()[static_cast<std::size_t>(i)], &rings_.dp,
                           device_coll ? group_of(rings_.dp) : nullptr);
  if (model_.head_part)
    buckets_->add_bucket(head_bucket, &model_.head_part->params(), &model_.head_part->grads(), &rings_.head,
                         device_coll ? group_of(rings_.head) : nullptr);
}

std::vector<param_set> rank_runtime::stage_blocks(int first, int last) {
  std::vector<param_set> blocks = weights_.blocks(first, last);
  if (static_cast<int>(blocks.size()) != last - first)
    throw train_error("the weights gave " + std::to_string(blocks.size()) + " blocks for blocks " +
                      std::to_string(first) + ".." + std::to_string(last - 1));
  for (param_set& b : blocks) place_params(b, be_);  // no-op where they already are
  return blocks;
}

stage rank_runtime::frozen_part(int first, int last, weight_format f) {
  if (weights_.frozen_stage) {
    stage s = weights_.frozen_stage(first, last, be_, f);
    if (s.first() != first || s.size() != last - first)
      throw train_error("the weights gave blocks " + std::to_string(s.first()) + ".." +
                        std::to_string(s.last() - 1) + " for blocks " + std::to_string(first) + ".." +
                        std::to_string(last - 1));
    return s;
  }
  // Made of the f32 parameters: dropped once it holds its own where the
  // weights hand them over (weights_from_seed); a model in memory
  // (weights_of) keeps its own.
  return stage::inference_of(cfg_, first, stage_blocks(first, last), be_, f);
}

void rank_runtime::join_device_groups() {
  const std::string me = o_.layout.label(rank_);
  if (!on_device_)
    throw train_error(me + " computes on the cpu: --collectives device needs every rank on a device (--device cuda)");
  if (!be_.has_device_groups())
    throw train_error("--collectives device: the " + be_.name() + " backend of " + me +
                      " has no device collectives (corolla was built without NCCL)");
  dp_coll_ = join_device_group(be_, *comm_, inbox_, o_, rings_.dp, 0);
  // A LoRA job's head has no bucket, so no group either.
  if (rings_.head.ranks != rings_.dp.ranks && !o_.lora)
    head_coll_ = join_device_group(be_, *comm_, inbox_, o_, rings_.head, 1);
}

device_group* rank_runtime::group_of(const ring& r) const {
  if (r.size() < 2) return nullptr;
  if (&r == &rings_.dp) return dp_coll_.get();
  return head_coll_ ? head_coll_.get() : dp_coll_.get();  // the head's ring is the DP ring's (pp = 1)
}

void rank_runtime::restore() {
  if (o_.from_memory.step > 0) {
    restore_from_memory();
    return;
  }
  const int step = latest_checkpoint_step(o_.checkpoint_dir);
  if (step == 0) throw train_error("no checkpoint in " + o_.checkpoint_dir.string() + " to resume from");
  check_manifest(o_.checkpoint_dir, step, checkpoint_key(o_, cfg_));
  buckets_->restore(checkpoint_shards(o_.checkpoint_dir, step));
  steps_done_ = step;
  // Also without scaling now: its skipped steps keep AdamW's count right.
  if (const auto st = checkpoint_loss_scale(o_.checkpoint_dir, step)) scaler_.set_state(*st);
  std::vector<std::int32_t> ids, targets;
  for (int s = 0; s < step; ++s) data_.next_batch(o_.batch, o_.seq, ids, targets);
  const std::string from = checkpoint_layout(o_.checkpoint_dir, step);
  spdlog::info("{} resumed from {} (step {}{})", o_.layout.label(rank_), checkpoint_step_dir(o_.checkpoint_dir, step).string(),
               step, from.empty() || from == o_.layout.describe() ? "" : ", written by layout " + from);
}

void rank_runtime::restore_from_memory() {
  const memory_restore& from = o_.from_memory;
  const auto started = std::chrono::steady_clock::now();
  // What each holder has of the step: the copies the launcher chose.
  std::map<std::string, snapshot_index> index;
  for (const auto& [owner, holder] : from.holder_of) {
    if (index.count(holder)) continue;
    // A holder that is already a peer (it runs a rank of this grid in the
    // process holding the snapshots) is read over that link: a second
    // connection to the same node would only duplicate it.
    if (holder != node_.id() && !node_.peer_is_up(holder)) {
      const auto ep = from.endpoints.find(holder);
      if (ep == from.endpoints.end()) throw train_error("no endpoint for the node holding rank " + std::to_string(owner) + "'s snapshot");
      connect_options co;
      co.timeout = std::chrono::seconds(30);
      auto c = node_.connect(ep->second, co);
      if (!c) throw train_error("cannot reach the snapshots held at " + ep->second + ": " + error_message(c.error()));
    }
    auto x = fetch_snapshot_index(node_, holder, from.run, std::chrono::seconds(60));
    if (!x) throw train_error("the keeper at " + holder + " does not list its snapshots: " + error_message(x.error()));
    index[holder] = std::move(*x);
  }
  std::map<int, chosen_copy> chosen;
  for (const auto& [owner, holder] : from.holder_of) {
    const snapshot_index& x = index.at(holder);
    const auto listing = std::find_if(x.snapshots.begin(), x.snapshots.end(), [&, o = owner](const snapshot_listing& l) {
      return l.owner == o && l.step == from.step;
    });
    if (listing == x.snapshots.end())
      throw train_error("the keeper at " + holder + " no longer holds rank " + std::to_string(owner) +
                        "'s snapshot of step " + std::to_string(from.step));
    chosen[owner] = {holder, *listing};
  }
  // This process's own copies of the run, when it held them (it ran a rank
  // of the grid before: apps/rank_hold.hpp): read from here first, and
  // over a link only what they lack.
  const std::size_t holders = index.size();  // the nodes of the chosen copies
  // (Listed above when a chosen copy is here too.)
  if (!index.count(node_.id()) && node_.local_actor(snapshot_keeper_name(from.run)))
    if (auto x = fetch_snapshot_index(node_, node_.id(), from.run, std::chrono::seconds(60)))
      index[node_.id()] = std::move(*x);
  std::vector<snapshot_listing> local;
  if (const auto here = index.find(node_.id()); here != index.end())
    for (const snapshot_listing& l : here->second.snapshots)
      if (l.step == from.step) local.push_back(l);
  // Only the tensors of this rank's buckets (train_snapshot_reads.hpp).
  std::vector<shard_want> wanted;
  for (const dp_group::wanted_shard& w : buckets_->wanted()) wanted.push_back({w.bucket, w.lo, w.hi});
  const auto fetches = plan_snapshot_reads(chosen, local, node_.id(), wanted);
  std::map<int, rank_snapshot> by_owner;  // one piece per owner, whichever copies its tensors came from
  std::size_t bytes = 0, here_bytes = 0;
  for (const auto& [from_where, names] : fetches) {
    const auto& [holder, owner] = from_where;
    auto s = fetch_snapshot(node_, holder, from.run, owner, from.step, names, std::chrono::seconds(300),
                            o_.message_piece_bytes);
    if (!s) throw train_error("cannot fetch rank " + std::to_string(owner) + "'s snapshot of step " +
                              std::to_string(from.step) + " from " + holder + ": " + error_message(s.error()));
    // Only the ranges of the buckets whose moments came.
    std::map<std::string, shard_range> ranges;
    for (const auto& [name, t] : s->tensors) {
      if (name.rfind("m.", 0) != 0) continue;
      const auto r = s->ranges.find(name.substr(2));
      if (r == s->ranges.end())
        throw train_error("rank " + std::to_string(owner) + "'s snapshot from " + holder + " has no range for " + name);
      ranges.insert(*r);
    }
    s->ranges = std::move(ranges);
    bytes += s->bytes();
    if (holder == node_.id()) here_bytes += s->bytes();
    if (auto [it, fresh] = by_owner.try_emplace(owner, std::move(*s)); !fresh) {
      for (auto& t : s->tensors) it->second.tensors.push_back(std::move(t));
      it->second.ranges.insert(s->ranges.begin(), s->ranges.end());
    }
  }
  std::vector<rank_snapshot> pieces;
  for (auto& [owner, piece] : by_owner) pieces.push_back(std::move(piece));
  buckets_->restore(snapshot_shards(std::move(pieces), /*whole=*/false));
  const int step = from.step;
  steps_done_ = step;
  try {
    if (const auto st = parse_loss_scale_text(from.loss_scale)) scaler_.set_state(*st);
  } catch (const std::invalid_argument& e) {
    throw train_error(std::string(e.what()) + " in the snapshots");
  }
  std::vector<std::int32_t> ids, targets;
  for (int s = 0; s < step; ++s) data_.next_batch(o_.batch, o_.seq, ids, targets);
  spdlog::info("{} resumed from the in-memory snapshots of step {} ({} holder(s), {:.2f} MB read in {:.3f} s, {:.2f} MB "
               "of it from this process)",
               o_.layout.label(rank_), step, holders, static_cast<double>(bytes) / 1e6,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
               static_cast<double>(here_bytes) / 1e6);
}

void rank_runtime::start_keeper() {
  snapshot_keeper_setup k;
  k.holder = rank_;
  k.owners = snapshot_owners(o_.layout, rank_);
  k.inbox = inbox_;
  k.dir = memory_snapshot_dir(o_.checkpoint_dir);
  k.coordinator = coordinator_id_;
  auto a = start_snapshot_keeper(node_, std::move(k), comm_->job());
  if (!a) throw train_error("cannot publish the snapshot keeper: " + error_message(a.error()));
  keeper_ = *a;
}

void rank_runtime::start_watchdog() {
  watchdog_ = spawn_train_watchdog(node_.system(), beacon_, o_.hang_s, [this](double s, const std::string& what) {
    const std::string why = hang_reason(o_.layout.label(rank_), s, what, o_.hang_s, beacon_->longest_s());
    spdlog::error("{}", why);
    try {
      comm_->send_coordinator(train_msg::abort, encode_abort_body(why, comm_->job()));
    } catch (const std::exception&) {
    }
    flush_snapshots();
    std::fprintf(stderr, "corolla: error: training failed on %s: %s\n", o_.layout.label(rank_).c_str(), why.c_str());
    std::this_thread::sleep_for(std::chrono::seconds(1));  // the abort leaves before the process
    std::_Exit(1);
  }, [inbox = inbox_, rank = rank_, dp = dp_beacon_, work = work_beacon_](std::uint64_t job) {
    auto a = inbox->activity(rank, job);
    if (!a) return a;
    // The watchdog adds the stage's call; the DP group's work and the
    // stage's setup and link probes are the rank's work too.
    dp->add_to(*a);
    work->add_to(*a);
    return a;
  });
  if (auto err = node_.publish("train-watch", watchdog_)) throw train_error("cannot publish the watchdog: " + error_message(err));
}

void rank_runtime::flush_snapshots() {
  if (keeper_) flush_snapshot_keeper(node_, keeper_, o_.layout.label(rank_));
}

}  // namespace corolla::train_detail
