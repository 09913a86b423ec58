// apps/train_args.hpp — the flags of `corolla train`, and how it opens its
// model and data; shared by single-process training (apps/train.cpp) and
// pipeline x data-parallel training (apps/train_dist.cpp, apps/train_local.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "actors/train_job.hpp"
#include "apps/lora_flags.hpp"
#include "kernels/backend.hpp"
#include "model/token_data.hpp"
#include "model/transformer.hpp"
#include "schedule/cluster.hpp"
#include "schedule/planner.hpp"

namespace corolla {
struct node_options;
class node;
}

namespace corolla::app {

class launcher_replicas;

/// The options of a training node (a rank's, the coordinator's, the
/// elastic launcher's lobby): listening on `listen`, answering echoes, a
/// peer timeout of 10 s (eight ranks on two cores can starve a heartbeat).
node_options rank_node_options(const std::string& listen);
/// Starts a node; throws std::runtime_error naming `what` when it cannot.
std::unique_ptr<node> start_node(const node_options& opts, const std::string& what);

struct train_args {
  std::string model;
  std::string data;
  int batch = 0;
  int seq = 0;
  int steps = 0;
  float lr = 0.0f;
  float weight_decay = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float grad_clip = 0.0f;
  int warmup_steps = 0;
  std::string lr_schedule = "constant";
  int log_every = 1;
  std::string save;
  std::uint64_t seed = 0;
  // A LoRA adapter instead of the whole model (model/lora.hpp; in one
  // process, or across ranks: dist_train_options::lora).
  lora_flags lora;                  ///< none given: the whole model trains
  /// --weights: with an adapter, the frozen base's linear weights as
  /// loaded (f32, or bf16/int8/nf4: QLoRA, transformer::load_inference)
  std::string weights = "f32";
  int threads = 0;
  std::string device = "auto";
  std::string matmul = "f32";  ///< --matmul: precision of f32 products on a GPU (set_matmul_precision)
  std::string compute = "f32";  ///< --compute: the blocks' compute dtype (stage::set_compute_dtype)
  std::string loss_scale = "auto";  ///< --loss-scale: auto (dynamic with f16 compute), dynamic or off
  bool json = false;

  // Pipeline x data-parallel training (apps/train_dist.cpp).
  int pp = 0;                      ///< pipeline stages (0 = not given)
  int dp = 0;                      ///< data-parallel replicas (0 = not given)
  int micro_batch = 0;             ///< sequences per micro-batch (0 = the default rule)
  int chunks = 1;                  ///< model chunks per stage (interleaved 1F1B when > 1)
  std::string collectives = "host";  ///< --collectives: the DP groups' (dp_collectives)
  int rank = -1;                   ///< this process's rank (-1 = not given)
  std::string coordinator;         ///< HOST:PORT of the coordinator
  bool external_coordinator = false;  ///< rank 0 does not host the coordinator
  std::string listen = "tcp://127.0.0.1:0";  ///< this rank's node endpoint
  std::string checkpoint_dir;
  int checkpoint_every = 0;
  bool resume = false;
  bool elastic = false;  ///< --elastic: the local launcher re-plans on the ranks left when some die
  int min_ranks = 1;     ///< --min-ranks: with --elastic, the fewest ranks a job continues on
  /// --snapshot-every: with --elastic, in-memory snapshots every K steps
  /// (0 = none), or "auto" (every step at first, then as long an interval
  /// as the copies need: schedule/snapshot_interval.hpp); "" = the
  /// default, every step with --elastic.
  std::string snapshot_every;
  /// --join ENDPOINT: offer this process as a worker to the elastic
  /// launcher listening there (apps/train_lobby.hpp) instead of training.
  std::string join;
  /// --join-name: how the launcher names this worker; joining a --cluster
  /// job, the absent worker of the launcher's cluster file it is.
  std::string join_name;
  /// --join-machine FILE: joining a --cluster job as a machine its file
  /// does not describe, what it is (schedule::with_machine's TOML).
  std::string join_machine;
  /// --standby: with --elastic --cluster, workers of the file that are not
  /// there at start (they join later with --join --join-name).
  std::vector<std::string> standby;
  /// --join-listen: where an elastic launcher takes offers of workers ("" =
  /// tcp://127.0.0.1:0); --join-check-every K: how often it looks at them.
  std::string join_listen;
  int join_check_every = 5;
  int probe_every = 0;   ///< --probe-every: measure the ranks' links every K steps (--elastic --cluster re-plans on them)
  double timeout_s = 300;
  double hang_s = 60;
  /// --message-piece-bytes: the most bytes of values in one message of
  /// --save's parameters or of an in-memory snapshot
  std::int64_t message_piece_bytes = dist_train_options{}.message_piece_bytes;
  int rings_at_once = dist_train_options{}.rings_at_once;  ///< --rings-at-once
  std::string cluster;       ///< cluster TOML: the planner's layout, links shaped per the file
  std::string link_profile;  ///< one shaping profile for every link between ranks
  std::string job_file;      ///< internal: the job as the local launcher wrote it (JSON)
  /// internal: a launcher started by a rank process after the one before
  /// died, with that one's state (apps/launcher_takeover.hpp)
  std::string take_over;
};

/// Whether `dir` holds weights (model.safetensors or a sharded index), not
/// only a config.json.
bool has_weights(const std::filesystem::path& dir);

/// A directory with weights is loaded; one with only config.json starts
/// from the GPT-2 initialisation for `seed` (`fresh` says which).
transformer open_model(const std::filesystem::path& dir, std::uint64_t seed, Backend& be, bool& fresh);

/// The token data: llm.c shards and raw uint16 `.bin` files as they are,
/// anything else as text tokenised with the model directory's tokenizer.
token_dataset open_data(const std::filesystem::path& file, const std::filesystem::path& model_dir, int vocab);

/// --lr-schedule and --warmup-steps as an lr_schedule; throws
/// std::invalid_argument for an unknown schedule or negative warm-up.
lr_schedule schedule_of(const train_args& a);

/// --compute as a dtype; throws std::invalid_argument for an unknown one,
/// or for bf16/f16 with --device cpu (or auto without a GPU): the cpu
/// backend computes in f32.
dtype compute_dtype_of(const train_args& a);
/// A distributed job's LoRA (--lora-rank or --adapter; nothing without):
/// a saved adapter is read once here (its config, and any problem before a
/// rank starts), a new one's targets checked against `cfg`. Throws for a
/// model without weights.
std::optional<dist_lora> dist_lora_of(const train_args& a, const model_config& cfg);
/// Prices a job's adapter for the planner: its values per block
/// (training_setup::lora_block_params; nothing without one: the whole model
/// trains) and, beside frozen weights in another format than f32 (QLoRA),
/// the bytes one block's frozen weights take (frozen_block_bytes).
void price_lora(schedule::training_setup& setup, const model_config& cfg, const std::optional<dist_lora>& lora);
/// A distributed job's new adapter `c` (targets by their module paths;
/// throws for a bad rank, alpha or target), drawn from `seed`.
dist_lora new_dist_lora(const model_config& cfg, lora_config c, std::uint64_t seed);
/// A fingerprint of the weights in model directory `dir` (16 hex digits
/// over each .safetensors file's name, size, header and 16 spans of its
/// values: accidents, not forgery). Throws model_error without weights.
std::string frozen_model_digest(const std::filesystem::path& dir);
/// Throws model_error when `dir` holds no weights, or other weights than
/// the frozen model LoRA job `l` trains beside (dist_lora::base_digest).
void check_frozen_model(const std::filesystem::path& dir, const dist_lora& l);
/// --loss-scale for a run computing in `compute`; throws
/// std::invalid_argument for an unknown value.
loss_scaling loss_scaling_of(const train_args& a, dtype compute);
/// A step line's "loss_scale" and "skipped" (--json with loss scaling).
void add_loss_scale(nlohmann::json& line, double scale, bool skipped);
/// " (skipped: gradients overflowed at loss scale S)" for a skipped step's
/// text line, else "".
std::string skipped_note(bool skipped, double scale);

/// The planner's training setup for `a` (fp32, the global batch, the
/// micro-batch or 1, the sequence length; pp and dp free).
schedule::training_setup training_setup_of(const train_args& a);

/// Whether the flags or the launcher's environment ask for a distributed run.
bool wants_distributed(const train_args& a);
/// Pipeline x data-parallel training (apps/train_dist.cpp).
int run_distributed_train(train_args a);
/// Lays job `o` out as plan `p` on `cluster` says: rank r = stage * dp +
/// replica runs on the plan's worker for that stage and replica, and every
/// pair of ranks is shaped as the cluster file links their workers
/// (`override_profile`, when not empty, for every link instead).
void use_plan(const schedule::cluster_description& cluster, const schedule::plan& p, dist_train_options& o,
              const std::string& override_profile = {});
/// Whether --device names the GPU without an index ("cuda", or "auto"
/// with one visible): then ranks spread over the GPUs.
bool any_gpu(const std::string& device);
/// The command line (after the binary) of rank `rank` of a job the local
/// launcher runs: the model and data flags from `a`, the job in `job_file`
/// (apps/train_local.cpp).
std::vector<std::string> rank_args(const train_args& a, int rank, const std::string& coordinator,
                                   const std::string& job_file);
/// Runs job `o` on o.layout.world() rank processes of this binary on
/// 127.0.0.1 (their model and data flags from `a`), with the coordinator in
/// this process calling `on_step`; kills and reaps the ranks on the way
/// out. Throws train_error when the job fails; then `lost` (when given)
/// holds the ranks the job lost: those whose process a signal ended while
/// the job ran, and the rank the failure names (a rank that hung, or whose
/// process exited first).
void run_local_job(const train_args& a, const dist_train_options& o, const model_config& cfg,
                   const std::function<void(const dist_step_report&)>& on_step, std::vector<int>* lost = nullptr);
/// As above with the coordinator's hooks (a drain: the return value is the
/// step the job stopped after). With --json, once every rank joined, one
/// line `{"event": "ranks", "layout", "ranks": [{"rank", "label", "pid",
/// "endpoint", "worker" (--cluster)}]}` says which process is which rank and where its node
/// listens (what a harness needs to shape or kill one).
///
/// With `remote`, the ranks remote->is_remote(rank) says are not started
/// here: remote->assign(rank, args, job_json) hands each the command line
/// of its rank and the job description (workers that joined,
/// apps/train_lobby.hpp).
/// remote->gone (polled while the job runs) names a remote rank whose
/// worker went away, which fails the job as a dead child process would.
struct remote_ranks {
  std::function<bool(int rank)> is_remote;
  std::function<void(int rank, const std::vector<std::string>& args, const std::string& job_json)> assign;
  std::function<std::optional<std::string>()> gone;
};
/// With o.hold_snapshots and `held`: when the job fails, the surviving
/// ranks keep their processes and snapshot keepers (instead of writing to
/// disk), and the launcher asks each keeper what it holds
/// (fetch_snapshot_index) and chooses the step the next grid reads from
/// their memory (schedule::choose_snapshot_step, up to *held->newest, the
/// last step printed). held->restore says where (step 0: no complete
/// step, held->why_not); held->processes are then the survivors' processes
/// (whose keepers answered), which the caller ends once the next grid no
/// longer needs them. With o.drains_to_memory() the same after a drain:
/// every rank holds, and the step chosen is the drain step (the job's
/// return value).
///
/// A job that reads its state from memory (o.from_memory) runs its local
/// ranks in the processes holding it (*held->reusable, the grid before's),
/// each of which takes a rank with train.next (apps/rank_hold.hpp) instead
/// of a new process being started; those move from *reusable to
/// held->adopted, and are told (train.snapdrop) to end the keeper of the
/// run they held once this job completes its first step.
struct holder_process {
  pid_t pid = -1;         ///< a child of this launcher (or of the one it took over from)
  std::string node_id;    ///< its node
  std::string endpoint;   ///< where its node listens
  std::set<std::string> buckets;  ///< whose parameters it holds of the step chosen (what a rank run in it reads there)
  std::map<std::string, double> bytes;  ///< the size of each of those buckets' parameters
};
struct held_snapshots {
  const int* newest = nullptr;  ///< in: the last step printed, read at the failure (null: any step)
  std::vector<holder_process>* reusable = nullptr;  ///< in/out: processes that may run this job's ranks
  memory_restore restore;   ///< out
  std::string why_not;
  std::size_t bytes = 0;    ///< of the copies chosen
  int holders = 0;          ///< survivors whose keepers answered
  std::vector<holder_process> processes;  ///< the survivors' processes, now the caller's
  std::vector<holder_process> adopted;    ///< processes of *reusable that ran this job's ranks
  /// in: keeps the launcher's state replicated in the job's processes
  /// (apps/launcher_takeover.hpp); null: none
  launcher_replicas* replicas = nullptr;
};
/// What the keepers of run `run` in `procs` hold, and the step a grid
/// after it reads (schedule::choose_snapshot_step over the `world` ranks
/// of that run's grid, up to *held.newest, newer than the latest
/// checkpoint) and from whom: held.restore (step 0: none, held.why_not),
/// held.bytes, held.holders (the processes that answered); each process's
/// `buckets`, what it holds of that step.
void choose_held_step(node& n, const dist_train_options& o, const model_config& cfg, int world,
                      std::vector<holder_process>& procs, std::uint64_t run, held_snapshots& held);
int run_local_job(const train_args& a, const dist_train_options& o, const model_config& cfg,
                  const coordinator_hooks& hooks, std::vector<int>* lost = nullptr,
                  const remote_ranks* remote = nullptr, held_snapshots* held = nullptr);
/// The local launcher's last words: the --json summary line (with `extra`'s
/// keys; a LoRA job's `adapter`) and "trained N steps on LAYOUT" on stderr.
/// `o` is the final layout.
void print_local_summary(const train_args& a, const dist_train_options& o, const model_config& cfg, int steps_run,
                         double last_loss, std::chrono::steady_clock::duration took, nlohmann::json extra = {});
/// The local launcher with --elastic (apps/train_elastic.cpp): runs `o`,
/// and whenever ranks die or hang, re-plans the grid on the ranks left
/// (schedule::regrid), continues from the latest committed checkpoint
/// re-sharded to the new grid (or from the start without one), and prints
/// every step once plus one line per re-plan. Throws train_error when fewer
/// than --min-ranks remain or no grid fits. Returns the exit status.
/// With `cluster` (a --cluster job: the whole file) the planner re-plans on
/// the cluster without the lost ranks' workers instead (plan_on, use_plan);
/// `plan` is the plan the job starts on, on the file's workers less those
/// of --standby. Workers that join as an absent worker of the file
/// (apps/train_cluster_members.hpp) are taken at --join-check-every steps
/// when schedule::advise_replan says the grown plan pays. With --probe-every too, the ranks' measured
/// links go into the description (schedule::with_measurements), and when
/// schedule::advise_replan says another plan pays, the job drains at a
/// step boundary and continues on that plan from there: no step lost.
int launch_local_elastic(const train_args& a, dist_train_options o, const model_config& cfg,
                         const schedule::cluster_description* cluster = nullptr,
                         const schedule::plan* plan = nullptr);
/// The planner's best plan for the flags' batch, micro-batch and sequence
/// length on `cluster` (pp, dp: fixed depth and width; 0 = the planner's
/// choice), priced as `lora`'s LoRA job where one is given (price_lora).
/// Check plan::feasible.
schedule::plan plan_on(const train_args& a, const model_config& cfg, const schedule::cluster_description& cluster,
                       int pp = 0, int dp = 0, const std::optional<dist_lora>& lora = std::nullopt);

}  // namespace corolla::app
