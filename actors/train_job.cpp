// Layout rules of a training job and its options (actors/train_job.hpp);
// its coordinator is actors/train_coordinator.cpp.
#include "actors/train_job.hpp"

#include <cstdio>
#include <set>
#include <stdexcept>
#include <string>

#include "actors/train_store.hpp"

namespace corolla {

// ---- layout ---------------------------------------------------------------------

std::string train_layout::label(int rank) const {
  std::string s = "rank " + std::to_string(rank) + " (stage " + std::to_string(stage_of(rank)) + ", replica " +
                  std::to_string(replica_of(rank));
  for (int c = 0; c < chunks; ++c) {
    const auto v = static_cast<std::size_t>(virtual_stage(stage_of(rank), c));
    if (v + 1 < boundaries.size())
      s += (c == 0 ? ", blocks " : ", ") + std::to_string(boundaries[v]) + ".." + std::to_string(boundaries[v + 1] - 1);
  }
  if (rank >= 0 && static_cast<std::size_t>(rank) < worker_names.size())
    s += ", worker " + worker_names[static_cast<std::size_t>(rank)];
  return s + ")";
}

std::string train_layout::describe() const {
  std::string s = std::to_string(pp) + "x" + std::to_string(dp);
  if (chunks > 1) s += " v" + std::to_string(chunks);
  for (std::size_t i = 0; i + 1 < boundaries.size(); ++i)
    s += " [" + std::to_string(boundaries[i]) + "," + std::to_string(boundaries[i + 1]) + ")";
  return s;
}

train_layout even_layout(int n_layers, int pp, int dp, int chunks) {
  if (pp < 1 || dp < 1) throw std::invalid_argument("--pp and --dp must be at least 1");
  if (chunks < 1) throw std::invalid_argument("--chunks must be at least 1");
  const int v = pp * chunks;
  if (v > n_layers)
    throw std::invalid_argument(chunks == 1 ? std::to_string(pp) + " pipeline stages for a model of " +
                                                  std::to_string(n_layers) + " blocks (every stage needs at least one block)"
                                            : std::to_string(pp) + " stages x " + std::to_string(chunks) +
                                                  " chunks for a model of " + std::to_string(n_layers) +
                                                  " blocks (every chunk needs at least one block)");
  train_layout l;
  l.pp = pp;
  l.dp = dp;
  l.chunks = chunks;
  l.boundaries.push_back(0);
  for (int s = 0; s < v; ++s) l.boundaries.push_back(l.boundaries.back() + n_layers / v + (s < n_layers % v ? 1 : 0));
  return l;
}

void check_layout(const train_layout& l, int n_layers) {
  if (l.pp < 1 || l.dp < 1 || l.chunks < 1)
    throw std::invalid_argument("a layout needs at least one stage, replica and chunk");
  const int v = l.virtual_stages();
  if (static_cast<int>(l.boundaries.size()) != v + 1)
    throw std::invalid_argument("a layout of " + std::to_string(v) + " (virtual) stages needs " + std::to_string(v + 1) +
                                " block boundaries, not " + std::to_string(l.boundaries.size()));
  if (l.boundaries.front() != 0 || l.boundaries.back() != n_layers)
    throw std::invalid_argument("the stages must cover blocks 0.." + std::to_string(n_layers - 1) + " (layout " +
                                l.describe() + ")");
  for (int s = 0; s < v; ++s)
    if (l.boundaries[static_cast<std::size_t>(s)] >= l.boundaries[static_cast<std::size_t>(s + 1)])
      throw std::invalid_argument("stage " + std::to_string(s) + " of layout " + l.describe() + " has no blocks");
}

int dist_train_options::micro_batch_size() const {
  if (batch < 1 || seq < 1) throw std::invalid_argument("--batch and --seq must be positive");
  if (batch % layout.dp != 0)
    throw std::invalid_argument("--batch " + std::to_string(batch) + " does not split over " + std::to_string(layout.dp) +
                                " data-parallel replicas");
  const int per_replica = batch / layout.dp;
  const int mb = micro_batch > 0 ? micro_batch : (layout.pp > 1 ? 1 : per_replica);
  if (per_replica % mb != 0)
    throw std::invalid_argument("--micro-batch " + std::to_string(mb) + " does not divide the " +
                                std::to_string(per_replica) + " sequences each replica gets per step");
  return mb;
}

int dist_train_options::micro_batches() const {
  const int m = batch / layout.dp / micro_batch_size();
  if (layout.chunks > 1 && m % layout.pp != 0)
    throw std::invalid_argument("interleaved 1F1B (--chunks " + std::to_string(layout.chunks) + ") needs the " +
                                std::to_string(m) + " micro-batches per replica to be a multiple of --pp " +
                                std::to_string(layout.pp));
  return m;
}

std::string checkpoint_key(const dist_train_options& o, const model_config& cfg) {
  std::string k = "layers=" + std::to_string(cfg.n_layers) + " hidden=" + std::to_string(cfg.hidden_size) +
                  " vocab=" + std::to_string(cfg.vocab_size) + " batch=" + std::to_string(o.batch) +
                  " seq=" + std::to_string(o.seq);
  if (o.lora) {
    // A LoRA job's checkpoint holds the adapter, not the model: only a job
    // training an adapter of the same shape and scale resumes it.
    const lora_config& c = o.lora->config;
    char lora[64];
    std::snprintf(lora, sizeof lora, " lora: r=%d alpha=%.9g rslora=%d", c.rank, static_cast<double>(c.alpha),
                  c.rslora ? 1 : 0);
    k += lora + std::string(" targets=") + c.targets_text() + " base=" + o.lora->base_digest;
  }
  return k;
}

const char* dp_collectives_name(dp_collectives c) { return c == dp_collectives::device ? "device" : "host"; }

dp_collectives parse_dp_collectives(const std::string& s) {
  if (s == "host") return dp_collectives::host;
  if (s == "device") return dp_collectives::device;
  throw std::invalid_argument("--collectives must be host or device, got '" + s + "'");
}

std::set<std::string> param_buckets(const train_layout& l, int rank) {
  std::set<std::string> out;
  const int stage = l.stage_of(rank);
  for (int c = 0; c < l.chunks; ++c) {
    const auto v = static_cast<std::size_t>(l.virtual_stage(stage, c));
    for (int b = l.boundaries.at(v); b < l.boundaries.at(v + 1); ++b) out.insert(bucket_name(b));
  }
  if (stage == 0 || stage == l.pp - 1) out.insert(bucket_name(head_bucket));
  return out;
}

std::vector<std::string> job_buckets(const dist_train_options& o, int n_layers) {
  std::vector<std::string> out;
  if (!o.lora) out.push_back(bucket_name(head_bucket));
  for (int b = 0; b < n_layers; ++b) out.push_back(bucket_name(b));
  return out;
}

std::set<std::string> trained_buckets(const dist_train_options& o, int rank) {
  std::set<std::string> out = param_buckets(o.layout, rank);
  if (o.lora) out.erase(bucket_name(head_bucket));
  return out;
}

void check_message_piece_bytes(std::int64_t bytes) {
  if (bytes < min_message_piece_bytes || bytes > max_message_piece_bytes)
    throw std::invalid_argument("message_piece_bytes of " + std::to_string(bytes) +
                                ": a piece of a message takes from 4 KiB to 512 MiB");
}

std::string join_key(const dist_train_options& o, const model_config& cfg) {
  const auto& w = o.optimizer.adamw;
  char opt[256];
  std::snprintf(opt, sizeof opt, " run: steps=%d lr=%.9g betas=%.9g,%.9g eps=%.9g wd=%.9g clip=%.9g", o.steps,
                static_cast<double>(w.lr), static_cast<double>(w.beta1), static_cast<double>(w.beta2),
                static_cast<double>(w.eps), static_cast<double>(w.weight_decay),
                static_cast<double>(o.optimizer.max_grad_norm));
  const lr_schedule& s = o.optimizer.schedule;
  std::string k = checkpoint_key(o, cfg) + " layout=" + o.layout.describe() +
                  " micro=" + std::to_string(o.micro_batch_size()) + opt + " warmup=" + std::to_string(s.warmup_steps) +
                  " cosine=" + (s.cosine ? "1" : "0") + " checkpoint_every=" + std::to_string(o.checkpoint_every) +
                  " probe_every=" + std::to_string(o.probe_every) +
                  " snapshot_every=" + std::to_string(o.snapshot_every) +
                  " drain_every=" + std::to_string(o.drain_every) +
                  " drain_to_memory=" + (o.drains_to_memory() ? "1" : "0") +
                  " resume=" + (o.resume ? "1" : "0") + " save=" + (o.save_dir.empty() ? "0" : "1") +
                  " synthetic=" + (o.synthetic.enabled() ? "1" : "0") +
                  " compute=" + dtype_name(o.compute) + " collectives=" + dp_collectives_name(o.collectives);
  if (o.lora)  // ranks must draw (or read) the same adapter: beside its shape (above), its seed and source
    k += " lora_seed=" + std::to_string(o.lora->seed) + " lora_from=" + o.lora->from_digest +
         " base_weights=" + weight_format_name(o.lora->base_weights);
  const loss_scaling& ls = o.optimizer.loss_scale;
  k += std::string(" loss_scale=") + loss_scaling_name(ls);
  if (ls.dynamic)
    k += " init=" + std::to_string(ls.init_scale) + " growth_interval=" + std::to_string(ls.growth_interval) +
         " min=" + std::to_string(ls.min_scale);
  return k;
}

}  // namespace corolla
