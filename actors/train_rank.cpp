// One rank of a pipeline x data-parallel training job (actors/train_job.hpp):
// joining and link probes (the runtime's state:
// actors/train_rank_runtime.hpp; its setup: train_rank_setup.cpp; the
// stage actor's steps and the end: train_stage.cpp).
#include "actors/train_rank_runtime.hpp"

namespace corolla {

namespace train_detail {

rank_runtime::rank_runtime(node& n, const dist_train_options& o, int rank, const rank_weights& weights,
                           token_dataset& data, Backend* compute)
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
  rings_ = rings_of(l, rank);
  last_step_ = o_.steps;
}

void rank_runtime::run(const std::string& coordinator) {
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
  // Until the roster comes: the coordinator hears why a join failed.
  comm_ = std::make_unique<train_comm>(node_, inbox_, rank_, std::vector<std::string>{}, *coord, o_.timeout);
  try {
    comm_ = join_train_job(node_, o_, cfg_, rank_, inbox_, *comm_, rings_);
    if (o_.snapshot_every > 0 && !o_.checkpoint_dir.empty()) start_keeper();
    start_watchdog();  // with hang_s 0 it only obeys the harness's stall
    {
      // Work, not a rank stuck, for the coordinator's stall check (a big
      // model loads for minutes).
      beacon_mark setting_up(*work_beacon_, "setup");
      if (o_.collectives == dp_collectives::device) join_device_groups();
      build_model();
      if (o_.resume) {
        restore();
        // 16-bit compute copies follow the restored weights (a LoRA job's:
        // the adapter's factors; its frozen weights were not restored).
        if (model_.adapter)
          model_.refresh_factors();
        else
          for (stage& part : model_.parts) part.params_changed();
      }
    }
    run_actors();
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
    // A holding rank keeps what its keeper holds in memory for the next
    // grid (its process waits for the launcher); else it goes to disk.
    if (!o_.hold_snapshots) flush_snapshots();
    throw;
  }
}

rank_runtime::~rank_runtime() {
  if (inbox_) inbox_->close();
  if (watchdog_) {
    node_.unpublish("train-watch");
    caf::anon_send_exit(watchdog_, caf::exit_reason::user_shutdown);
    caf::scoped_actor waiter{node_.system()};
    waiter->wait_for(watchdog_);  // it calls into this runtime
  }
  // A holding rank's keeper outlives the runtime: the next grid reads
  // from it while the process waits (run_train_rank's caller keeps the
  // node up).
  if (keeper_ && !o_.hold_snapshots) {
    node_.unpublish(snapshot_keeper_name(comm_->job()));
    caf::anon_send_exit(keeper_, caf::exit_reason::user_shutdown);
  }
  if (mailbox_) {
    node_.unpublish("train");
    caf::anon_send_exit(mailbox_, caf::exit_reason::user_shutdown);
  }
}

Tensor rank_runtime::to_compute(Tensor host) {
  if (!on_device_) return host;
  Tensor d = be_.empty(host.shape());
  be_.copy(host, d);
  return d;
}

Tensor rank_runtime::to_host(const Tensor& t) {
  if (t.dev().kind == device_kind::cpu) return t;
  Tensor h = Tensor::empty(t.shape());
  be_.copy(t, h);
  return h;
}

std::vector<schedule::link_measurement> rank_runtime::probe_links() {
  std::vector<schedule::link_measurement> out;
  for (int q : neighbours_of(o_.layout, rank_, rings_)) {
    if (q <= rank_) continue;
    link_probe_options po;
    po.bytes = 64 << 10;
    if (const auto last = probe_rates_.find(q); last != probe_rates_.end() && last->second > 0)
      po.bytes = static_cast<std::size_t>(std::clamp(last->second * 0.025, 8192.0, 65536.0));
    po.rounds = 2;
    po.timeout = std::min(o_.timeout, std::chrono::milliseconds(10000));
    auto m = probe_link(node_, comm_->peer_id(q), po);
    if (m) {
      out.push_back({rank_, q, m->bps / 8});
    } else if (m.error().category() == error_category &&
               m.error().code() == static_cast<std::uint8_t>(errc::invalid_argument)) {
      out.push_back({rank_, q, 0});
    } else {
      spdlog::warn("{}: cannot probe the link to {}: {}", o_.layout.label(rank_), o_.layout.label(q),
                   error_message(m.error()));
      continue;
    }
    probe_rates_[q] = out.back().bandwidth;
  }
  return out;
}

}  // namespace train_detail

int run_train_rank(node& n, const dist_train_options& o, int rank, const std::string& coordinator,
                   const rank_weights& weights, token_dataset& data, Backend* compute) {
  if (rank < 0 || rank >= o.layout.world())
    throw std::invalid_argument("rank " + std::to_string(rank) + " is outside a job of " +
                                std::to_string(o.layout.world()) + " ranks");
  if (!weights.be || !weights.blocks || !weights.head) throw std::invalid_argument("run_train_rank: incomplete weights");
  check_layout(o.layout, weights.cfg.n_layers);
  if (o.synthetic.enabled() && (o.synthetic.forward_s.size() != static_cast<std::size_t>(o.layout.pp) ||
                                o.synthetic.backward_s.size() != static_cast<std::size_t>(o.layout.pp)))
    throw std::invalid_argument("synthetic compute needs one forward and one backward time per stage");
  // Before the rank joins anything: QLoRA's blocks are widened to f32 for their turn.
  if (o.lora && o.lora->base_weights != weight_format::f32 && o.compute != dtype::f32)
    throw std::invalid_argument(std::string("an adapter beside ") + weight_format_flag(o.lora->base_weights) +
                                " frozen weights computes in f32, not " + dtype_name(o.compute) +
                                " (each block's weights are widened for its turn)");
  train_detail::rank_runtime rt(n, o, rank, weights, data, compute);
  rt.run(coordinator);
  return rt.last_step();
}

}  // namespace corolla
