// corolla train --pp P --dp D: pipeline x data-parallel training. Without a
// rank identity this process is the launcher: it runs the coordinator and
// starts one `corolla train --rank R` process per rank on 127.0.0.1. With
// one (--rank, or the environment of Slurm or torchrun) it is that rank of
// a job whose coordinator rank 0 hosts at --coordinator.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_snapshots.hpp"
#include "actors/train_store.hpp"
#include "apps/cluster_file.hpp"
#include "apps/commands.hpp"
#include "apps/control_token_env.hpp"
#include "apps/launcher_takeover.hpp"
#include "apps/plan_print.hpp"
#include "apps/rank_hold.hpp"
#include "apps/train_args.hpp"
#include "apps/train_job_file.hpp"
#include "apps/train_step_lines.hpp"
#include "model/config.hpp"
#include "model/stage.hpp"
#include "model/trainer.hpp"
#include "net/shaping.hpp"
#include "schedule/cluster.hpp"
#include "schedule/membership.hpp"
#include "schedule/planner.hpp"

namespace corolla::app {

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, const std::string& v) {
  try {
    std::size_t used = 0;
    const int n = std::stoi(v, &used);
    if (used == v.size() && n >= 0) return n;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(std::string("environment variable ") + name + "='" + v + "' is not a count");
}

/// Rank, world size and coordinator from a launcher's environment: Slurm
/// (SLURM_PROCID, SLURM_NTASKS) or torchrun (RANK, WORLD_SIZE,
/// MASTER_ADDR, MASTER_PORT). world = 0 when none is set.
struct launcher_identity {
  int rank = -1, world = 0;
  std::string coordinator;
  std::string source;
};

launcher_identity from_environment() {
  launcher_identity id;
  if (auto r = env("RANK"), w = env("WORLD_SIZE"); r && w) {
    id.rank = env_int("RANK", *r);
    id.world = env_int("WORLD_SIZE", *w);
    id.source = "RANK/WORLD_SIZE";
  } else if (auto sr = env("SLURM_PROCID"), sw = env("SLURM_NTASKS"); sr && sw) {
    id.rank = env_int("SLURM_PROCID", *sr);
    id.world = env_int("SLURM_NTASKS", *sw);
    id.source = "SLURM_PROCID/SLURM_NTASKS";
  }
  if (auto addr = env("MASTER_ADDR"), port = env("MASTER_PORT"); addr && port) id.coordinator = *addr + ":" + *port;
  return id;
}

/// "tcp://HOST:PORT" from "HOST:PORT" (or an endpoint as it is).
std::string tcp_endpoint(const std::string& where) {
  if (where.rfind("tcp://", 0) == 0) return where;
  if (where.find(':') == std::string::npos)
    throw std::invalid_argument("--coordinator '" + where + "' is not HOST:PORT");
  return "tcp://" + where;
}

/// The device of a rank started by a multi-host launcher (--rank): with
/// --device cuda or auto, the GPU of its LOCAL_RANK (torchrun) or
/// SLURM_LOCALID, mod the GPUs visible, so ranks sharing a host share out
/// its GPUs; else --device as given.
device multi_host_rank_device(const train_args& a) {
  device d = parse_device(a.device);
  if (!any_gpu(a.device)) return d;
  for (const char* name : {"LOCAL_RANK", "SLURM_LOCALID"})
    if (auto v = env(name)) {
      d.index = env_int(name, *v) % cuda_device_count();
      break;
    }
  return d;
}

}  // namespace

bool any_gpu(const std::string& device) {
  return (device == "cuda" || device == "auto") && cuda_device_count() > 0;
}

namespace {

/// A LoRA job's adapter as the summary says it (null without one).
nlohmann::json adapter_summary(const dist_train_options& o, const model_config& cfg) {
  if (!o.lora) return nullptr;
  const lora_config& c = o.lora->config;
  return {{"rank", c.rank},
          {"alpha", c.alpha},
          {"rslora", c.rslora},
          {"targets", c.targets},
          {"parameters", lora_adapter::zeros(cfg, c).numel()},
          {"base_weights", weight_format_flag(o.lora->base_weights)}};  // as the flag names it
}

}  // namespace

void print_local_summary(const train_args& a, const dist_train_options& o, const model_config& cfg, int steps_run,
                         double last_loss, std::chrono::steady_clock::duration took, nlohmann::json extra) {
  if (a.json) {
    const double seconds = std::chrono::duration<double>(took).count();
    const double tokens = static_cast<double>(steps_run) * a.batch * a.seq;
    nlohmann::json summary = {{"steps", a.steps}, {"tokens", tokens}, {"seconds", seconds},
                              {"tokens_per_s", seconds > 0 ? tokens / seconds : 0.0}, {"layout", o.layout.describe()},
                              {"ranks", o.layout.world()}, {"device", parse_device(a.device).str()}};
    if (steps_run > 0) summary["final_loss"] = last_loss;
    if (!a.save.empty()) summary["saved"] = a.save;
    if (o.lora) summary["adapter"] = adapter_summary(o, cfg);
    if (extra.is_object()) summary.update(extra);
    std::printf("%s\n", summary.dump().c_str());
  }
  std::fprintf(stderr, "trained %d steps on %s (%d ranks)%s\n", a.steps, o.layout.describe().c_str(),
               o.layout.world(),
               a.save.empty() ? "" : ((o.lora ? "; saved the adapter (PEFT layout) to " : "; saved to ") + a.save).c_str());
}

node_options rank_node_options(const std::string& listen) {
  node_options n;
  n.listen = listen;
  n.scheduler_threads = 2;
  // Ranks answer echoes: the link probes of --probe-every.
  n.publish_echo = true;
  // A local harness (a test, faultlab) may reshape a rank's links at
  // runtime with a token only it and the rank processes know.
  n.control_token = inherited_control_token();
  // A dead rank's connection drops at once (reported within milliseconds);
  // silence alone must last longer than a busy host can starve a process
  // (eight ranks on two cores), or a healthy job would fail.
  n.peer_timeout = std::chrono::seconds(10);
  return n;
}

std::unique_ptr<node> start_node(const node_options& opts, const std::string& what) {
  auto n = node::start(opts);
  if (!n) throw std::runtime_error("cannot start the " + what + " node: " + error_message(n.error()));
  return std::move(*n);
}

namespace {

// ---- one rank -----------------------------------------------------------------------

int run_rank(const train_args& a, const dist_train_options& o, const model_config& cfg) {
  apply_common_options(a.threads, "warn");
  // Rank 0 of a multi-host job hosts the coordinator (like torchrun's
  // MASTER_ADDR), on a node of its own.
  std::unique_ptr<node> coord_node;
  std::thread coord_thread;
  std::exception_ptr coord_error;
  auto coord_inbox = std::make_shared<train_inbox>();
  step_lines lines(a);
  if (a.rank == 0 && !a.external_coordinator) {
    coord_node = start_node(rank_node_options(tcp_endpoint(a.coordinator)), "coordinator");
    coord_thread = std::thread([&] {
      try {
        run_train_coordinator(*coord_node, o, cfg, [&](const dist_step_report& r) { lines.step(o, r); }, coord_inbox);
      } catch (...) {
        coord_error = std::current_exception();
      }
    });
  }
  auto join_coordinator = [&] {
    if (coord_thread.joinable()) coord_thread.join();
  };
  Backend* compute = nullptr;
  std::unique_ptr<node> n;
  // What this process runs: its rank of the job it was started for, then,
  // while its grids fail or drain with hold_snapshots, the ranks of the
  // next grids the launcher hands it (apps/rank_hold.hpp).
  dist_train_options job = o;
  int rank = a.rank;
  std::string coordinator = tcp_endpoint(a.coordinator);
  for (;;) {
    int last = job.steps;
    std::string held_because;
    try {
      if (!n) n = start_node(rank_node_options(a.listen), "rank");
      // It may carry the job on if the launcher dies (apps/launcher_takeover.hpp).
      if (!job.takeover_token.empty()) start_successor(*n, job.takeover_token, job.launcher_pid);
      if (!compute) compute = &backend_for(multi_host_rank_device(a));
      token_dataset data = open_data(a.data, a.model, cfg.vocab_size);
      // Weights: only this rank's tensors are read from a checkpoint; a fresh
      // start draws the whole model's initialisation (the same values on
      // every rank and in single-process training) and keeps only its part;
      // a resume (from a checkpoint, or a grid after a failure or a drain
      // from the snapshots in memory) overwrites every parameter, so it
      // neither draws nor reads them; but a LoRA job's restores the
      // adapter only, and reads the frozen model.
      // This machine's model must be the launcher's (a joined worker's
      // --model is its own path).
      if (job.lora && !job.lora->base_digest.empty()) check_frozen_model(a.model, *job.lora);
      const rank_weights weights = job.resume && !job.lora   ? weights_to_restore(cfg, cpu_backend())
                                   : has_weights(a.model) ? weights_from_checkpoint(a.model, cpu_backend())
                                                          : weights_from_seed(cfg, a.seed, cpu_backend(), job.layout, rank);
      last = run_train_rank(*n, job, rank, coordinator, weights, data, compute);
    } catch (const std::exception& e) {
      // The coordinator this process hosts fails with it (and tells the
      // other ranks), instead of waiting for a join that never comes.
      coord_inbox->fail(job.layout.label(rank) + " (hosting the coordinator) failed: " + e.what());
      join_coordinator();
      if (coord_node) coord_node->stop();
      // A process that ran this rank in while holding the grid before's
      // snapshots holds them still (its grid failed before the launcher
      // let them go), also in a grid that does not hold its own.
      const bool holds_older = n && [&] {
        const auto names = n->published_names();
        return std::any_of(names.begin(), names.end(), [](const std::string& x) { return is_snapshot_keeper_name(x); });
      }();
      if ((!job.hold_snapshots && !holds_older) || !n)
        throw train_error(std::string("training failed on ") + job.layout.label(rank) + ": " + e.what());
      held_because = std::string("training failed: ") + e.what();
    }
    // Drained for another plan: the next grid reads the drain step from
    // this process's keeper.
    if (held_because.empty() && last < job.steps && job.drains_to_memory() && !coord_node)
      held_because = "drained after step " + std::to_string(last);
    if (held_because.empty()) break;
    lines.clear();  // its lines say where the rank goes next
    next_rank next = hold_for_next_rank(*n, compute, job.layout.label(rank), held_because);
    job = std::move(next.job);
    rank = next.rank;
    coordinator = std::move(next.coordinator);
  }
  join_coordinator();
  lines.finish();
  if (coord_node) {
    // The coordinator's last messages (train.finish) go through proxy
    // actors, its node's goodbye straight to the links: let the ranks leave
    // first (they do once told the job is over), so nothing overtakes them.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    auto any_up = [&] {
      for (const auto& p : coord_node->peers())
        if (coord_node->peer_is_up(p)) return true;
      return false;
    };
    while (!coord_error && any_up() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (coord_error) std::rethrow_exception(coord_error);
  return 0;
}

// ---- the local launcher -----------------------------------------------------------------

int launch_local(const train_args& a, const dist_train_options& o, const model_config& cfg,
                 const schedule::cluster_description* cluster, const schedule::plan* plan) {
  apply_common_options(1, "warn");
  // Bad data is one error here, not one per rank.
  open_data(a.data, a.model, cfg.vocab_size);
  if (o.lora && !a.json) {
    const std::int64_t values = adapter_summary(o, cfg)["parameters"];
    const weight_format f = o.lora->base_weights;
    std::fprintf(stderr,
                 "training a LoRA adapter on %d ranks: r %d, alpha %g, %s; %lld parameters (%.3f%% of the model's)%s\n",
                 o.layout.world(), o.lora->config.rank, static_cast<double>(o.lora->config.alpha),
                 o.lora->config.targets_text().c_str(), static_cast<long long>(values),
                 100.0 * static_cast<double>(values) / static_cast<double>(cfg.parameter_count()),
                 f == weight_format::f32 ? "" : (std::string(" beside ") + weight_format_flag(f) + " weights").c_str());
  }
  if (a.elastic) return launch_local_elastic(a, o, cfg, cluster, plan);
  const auto start = std::chrono::steady_clock::now();
  int steps_run = 0;
  double last_loss = 0;
  step_lines lines(a);
  run_local_job(a, o, cfg, [&](const dist_step_report& r) {
    ++steps_run;
    last_loss = r.loss;
    lines.step(o, r);
  });
  lines.finish();
  print_local_summary(a, o, cfg, steps_run, last_loss, std::chrono::steady_clock::now() - start);
  return 0;
}

// ---- --cluster: the planner's layout, links shaped by the cluster file ----------------

struct planned_cluster {
  schedule::cluster_description cluster;  ///< the file
  schedule::cluster_description present;  ///< its workers less --standby's, which the plan is on
  schedule::plan plan;
};

planned_cluster plan_cluster(const train_args& a, const model_config& cfg, const std::optional<dist_lora>& lora) {
  planned_cluster p{load_cluster_file(a.cluster), {}, {}};
  const schedule::cluster_members members(p.cluster, {a.standby.begin(), a.standby.end()});
  p.present = members.present();
  p.plan = plan_on(a, cfg, p.present, a.pp, a.dp, lora);
  if (!p.plan.feasible) throw std::invalid_argument("no feasible plan on " + a.cluster + ": " + p.plan.reason);
  return p;
}

/// A link of the cost model as a shaping profile ("" for an unbounded one).
std::string profile_of(const schedule::link_spec& l) {
  if (!std::isfinite(l.bandwidth)) return "";
  char buf[96];
  std::snprintf(buf, sizeof buf, "bw=%.6gMbit,lat=%.6gus", l.bandwidth * 8 / 1e6, l.latency * 1e6);
  return buf;
}

}  // namespace

schedule::training_setup training_setup_of(const train_args& a) {
  schedule::training_setup setup;
  setup.set_precision(schedule::precision::fp32);  // what the CPU backend trains in
  setup.global_batch = a.batch;
  setup.micro_batch = a.micro_batch > 0 ? a.micro_batch : 1;
  setup.seq = a.seq;
  return setup;
}

schedule::plan plan_on(const train_args& a, const model_config& cfg, const schedule::cluster_description& cluster,
                       int pp, int dp, const std::optional<dist_lora>& lora) {
  schedule::training_setup setup = training_setup_of(a);
  setup.pp = pp;
  setup.dp = dp;
  price_lora(setup, cfg, lora);  // a LoRA job trains (and reduces) its adapter only
  setup.validate(cfg);
  return schedule::make_plan(cluster, cfg, setup).best;
}

void use_plan(const schedule::cluster_description& cluster, const schedule::plan& p, dist_train_options& o,
              const std::string& override_profile) {
  o.layout.pp = p.pp;
  o.layout.dp = p.dp;
  o.layout.boundaries = {0};
  o.layout.worker_names.clear();
  std::vector<int> worker;
  for (const auto& st : p.stages) o.layout.boundaries.push_back(st.last_layer);
  for (const auto& st : p.stages)
    for (int r = 0; r < p.dp; ++r) {
      worker.push_back(st.workers[static_cast<std::size_t>(r)]);
      o.layout.worker_names.push_back(cluster.workers[static_cast<std::size_t>(worker.back())].name);
    }
  o.micro_batch = p.micro_batch;
  const std::size_t world = worker.size();
  o.link_profiles.assign(world * world, "");
  for (std::size_t x = 0; x < world; ++x)
    for (std::size_t y = 0; y < world; ++y)
      if (x != y)
        o.link_profiles[x * world + y] =
            override_profile.empty() ? profile_of(cluster.link_between(worker[x], worker[y])) : override_profile;
}

bool wants_distributed(const train_args& a) {
  return a.pp > 0 || a.dp > 0 || a.rank >= 0 || !a.cluster.empty() || !a.job_file.empty() ||
         from_environment().world > 1;
}

int run_distributed_train(train_args a) {
  const launcher_identity id = from_environment();
  if (a.rank < 0 && id.world > 0) a.rank = id.rank;
  if (a.coordinator.empty()) a.coordinator = id.coordinator;
  parse_device(a.device);  // bad names are one error here, not one per rank
  set_matmul_precision(parse_matmul_precision(a.matmul));
  const model_config cfg = load_config(a.model);
  if (!a.link_profile.empty()) {
    try {
      net::parse_link_profile(a.link_profile);
    } catch (const std::exception& e) {
      throw std::invalid_argument("--link-profile '" + a.link_profile + "': " + e.what());
    }
  }
  if (!a.job_file.empty()) {
    if (a.rank < 0) throw std::invalid_argument("--job-file is for ranks started by the local launcher (with --rank)");
    const dist_train_options job = job_from_json(a.job_file);
    if (is_worker_job_file(a.job_file)) {
      std::error_code ec;
      std::filesystem::remove(a.job_file, ec);  // read once; see worker_job_file_prefix
    }
    check_layout(job.layout, cfg.n_layers);
    return run_rank(a, job, cfg);
  }
  dist_train_options o;
  o.lora = dist_lora_of(a, cfg);  // before planning: a LoRA job is priced as one
  std::optional<planned_cluster> planned;
  if (!a.standby.empty() && a.cluster.empty())
    throw std::invalid_argument("--standby names workers of a --cluster file: add --cluster");
  if (!a.cluster.empty()) {
    if (a.chunks != 1) throw std::invalid_argument("--chunks is not planned for a --cluster yet: use --pp/--dp");
    if (!a.standby.empty() && !a.elastic)
      throw std::invalid_argument("--standby names workers that join an --elastic job later: add --elastic");
    planned = plan_cluster(a, cfg, o.lora);
    use_plan(planned->present, planned->plan, o, a.link_profile);
  } else {
    const int pp = a.pp > 0 ? a.pp : 1;
    const int dp = a.dp > 0 ? a.dp : (id.world > 0 ? std::max(1, id.world / pp) : 1);
    o.layout = even_layout(cfg.n_layers, pp, dp, a.chunks);
    o.micro_batch = a.micro_batch;
    if (!a.link_profile.empty() && a.link_profile != "none")
      o.link_profiles.assign(static_cast<std::size_t>(o.layout.world() * o.layout.world()), a.link_profile);
  }
  if (id.world > 0 && id.world != o.layout.world())
    throw std::invalid_argument(id.source + " says " + std::to_string(id.world) + " ranks, but the job has " +
                                std::to_string(o.layout.world()) + " (" + o.layout.describe() + ")");
  o.batch = a.batch;
  o.seq = a.seq;
  o.steps = a.steps;
  o.optimizer.adamw = {.lr = a.lr, .beta1 = a.beta1, .beta2 = a.beta2, .eps = a.eps, .weight_decay = a.weight_decay};
  o.optimizer.max_grad_norm = a.grad_clip;
  o.optimizer.schedule = schedule_of(a);
  o.compute = compute_dtype_of(a);
  o.collectives = parse_dp_collectives(a.collectives);
  // Before any rank starts (each rank checks again, for multi-host jobs).
  if (o.collectives == dp_collectives::device && parse_device(a.device).kind == device_kind::cpu)
    throw std::invalid_argument("--collectives device needs every rank on a GPU of its own, but --device " + a.device +
                                " is the cpu here");
  // NCCL's traffic does not go through corolla's links, so their shaping
  // would not apply to it.
  if (o.collectives == dp_collectives::device && !o.link_profiles.empty())
    throw std::invalid_argument("--collectives device runs the data-parallel traffic over NCCL, around the emulated "
                                "links of --link-profile / --cluster: use --collectives host to emulate them");
  o.optimizer.loss_scale = loss_scaling_of(a, o.compute);
  o.checkpoint_dir = a.checkpoint_dir;
  o.checkpoint_every = a.checkpoint_every;
  if (a.probe_every < 0) throw std::invalid_argument("--probe-every must be >= 0");
  if (a.rings_at_once < 1 || a.rings_at_once > max_rings_at_once)
    throw std::invalid_argument("--rings-at-once must be between 1 and " + std::to_string(max_rings_at_once) +
                                ", not " + std::to_string(a.rings_at_once));
  o.probe_every = a.probe_every;
  o.message_piece_bytes = a.message_piece_bytes;
  int snapshot_every = 1;  // the default with --elastic
  o.snapshot_auto = a.snapshot_every == "auto";
  if (!a.snapshot_every.empty() && !o.snapshot_auto) {
    std::size_t used = 0;
    try {
      snapshot_every = std::stoi(a.snapshot_every, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != a.snapshot_every.size() || snapshot_every < 0)
      throw std::invalid_argument("--snapshot-every must be a number of steps >= 0 or 'auto', got '" +
                                  a.snapshot_every + "'");
  }
  if (!a.snapshot_every.empty() && (o.snapshot_auto || snapshot_every > 0) && !a.elastic)
    throw std::invalid_argument("--snapshot-every keeps in-memory snapshots for --elastic to recover from: add --elastic");
  o.snapshot_every = a.elastic ? snapshot_every : 0;
  o.snapshot_auto = o.snapshot_auto && a.elastic;
  o.resume = a.resume;
  o.save_dir = a.save;
  o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(a.timeout_s * 1000));
  o.hang_s = a.hang_s;
  o.rings_at_once = a.rings_at_once;
  if (a.seq > cfg.max_positions)
    throw std::invalid_argument("--seq " + std::to_string(a.seq) + " is longer than the model's context (" +
                                std::to_string(cfg.max_positions) + ")");
  if (a.steps < 0 || a.log_every < 1) throw std::invalid_argument("--steps must be >= 0 and --log-every >= 1");
  o.micro_batches();  // checks the batch split (and interleaving's multiple of --pp)
  if (a.elastic && (a.rank >= 0 || id.world > 0))
    throw std::invalid_argument("--elastic is for the local launcher (--pp/--dp or --cluster without --rank): ranks "
                                "on other machines join it with corolla train --join ENDPOINT --listen "
                                "tcp://THEIR_ADDRESS:0 (ENDPOINT: the launcher's --join-listen)");
  if (a.min_ranks < 1) throw std::invalid_argument("--min-ranks must be at least 1");
  if (a.min_ranks != 1 && !a.elastic)
    throw std::invalid_argument("--min-ranks is the fewest ranks an --elastic job goes on with: add --elastic");
  if (!a.take_over.empty() && !a.elastic)
    throw std::invalid_argument("--take-over carries on an --elastic job (it is added by a rank process, with the "
                                "launcher's own flags): add --elastic");
  if (a.external_coordinator && a.rank < 0)
    throw std::invalid_argument("--external-coordinator is for a rank (--rank) whose coordinator runs elsewhere");
  if (a.rank >= o.layout.world())
    throw std::invalid_argument("--rank " + std::to_string(a.rank) + " is outside a job of " +
                                std::to_string(o.layout.world()) + " ranks");
  if ((a.checkpoint_every > 0 || a.resume) && a.checkpoint_dir.empty())
    throw std::invalid_argument("--checkpoint-every and --resume need --checkpoint-dir");
  if (!(a.timeout_s > 0)) throw std::invalid_argument("--timeout-s must be positive");
  if (!(a.hang_s >= 0)) throw std::invalid_argument("--hang-s must be >= 0 (0: never)");
  // The file system last: a command line refused above leaves nothing behind.
  if (!a.checkpoint_dir.empty()) check_output_dir(a.checkpoint_dir, "--checkpoint-dir");
  if (!a.save.empty() && a.rank <= 0) check_output_dir(a.save, "--save");
  // A fresh run would write its shards over the checkpoint `latest` names
  // (a launcher taking over continues the job that wrote it).
  if (!a.resume && a.checkpoint_every > 0 && a.rank <= 0 && a.take_over.empty()) {
    if (const int latest = latest_checkpoint_step(o.checkpoint_dir); latest > 0)
      throw std::invalid_argument("--checkpoint-dir " + a.checkpoint_dir + " already holds a checkpoint (step " +
                                  std::to_string(latest) + "): add --resume to continue it, or choose another directory");
  }
  if (a.resume) {
    const int latest = latest_checkpoint_step(o.checkpoint_dir);
    if (latest == 0) throw std::invalid_argument("no complete checkpoint in " + a.checkpoint_dir + " to resume from");
    check_manifest(o.checkpoint_dir, latest, checkpoint_key(o, cfg));
    // Every shard's header, its tensors' extents and the moments' tiling,
    // here and not once per rank after they start (the files are mapped,
    // not read).
    if (a.rank < 0) {
      const checkpoint_shards readable(o.checkpoint_dir, latest);
    }
    if (a.rank < 0 && a.take_over.empty()) {
      const std::string from = checkpoint_layout(o.checkpoint_dir, latest);
      std::fprintf(stderr, "resuming from step %d of %s%s\n", latest, a.checkpoint_dir.c_str(),
                   from.empty() || from == o.layout.describe()
                       ? ""
                       : (" (written by layout " + from + ", re-sharded to " + o.layout.describe() + ")").c_str());
    }
  }
  if (a.rank >= 0) {
    if (a.coordinator.empty())
      throw std::invalid_argument("a rank needs --coordinator HOST:PORT (or MASTER_ADDR and MASTER_PORT)");
    return run_rank(a, o, cfg);
  }
  if (planned) {
    // One write (a launcher that takes over prints it while others log).
    const std::string standby = a.standby.empty() ? "" : " (" + std::to_string(a.standby.size()) + " on standby)";
    std::fprintf(stderr, "cluster %s: %d workers%s; %s", planned->cluster.name.c_str(), planned->present.size(),
                 standby.c_str(), plan_text(planned->present, planned->plan).c_str());
  }
  return launch_local(a, o, cfg, planned ? &planned->cluster : nullptr, planned ? &planned->plan : nullptr);
}

}  // namespace corolla::app
