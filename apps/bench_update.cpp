// corolla bench update — a training rank's update of one gradient bucket on
// a device, as actors/dp_group.cpp does it, against the way it did before
// (the baseline, measured in the same run):
//
//   device  the gradients come down to page-locked host memory (the DP
//           group's collectives run there), this rank's reduced shard goes
//           back up, AdamW updates it on the device (moments there, on the
//           backend's companion instance), the updated shard comes down for
//           the all-gather, the other shards go up. A group of one moves
//           nothing: AdamW runs on the device buffers.
//   host    the gradients come down, AdamW updates the shard on the cpu
//           (moments in host memory), the whole bucket goes back up.
//
// The collectives themselves are left out (the same bytes in both). Sizes
// are a bucket's parameters (default: a GPT-2-1.5B block, 30.7M); group is
// the DP group's size (the shard is 1/group of the bucket).
//
// Then, per size, mixed precision's update of a block (--compute-copy):
// AdamW writing the 16-bit compute copy in its own pass
// (Backend::adamw_with_copy, what the single-process trainer runs) against
// AdamW followed by the conversion (what it ran before).
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/bench_timing.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "kernels/backend.hpp"

namespace corolla::app {

namespace {

struct update_options {
  std::string device = "auto";
  std::string sizes = "30720000";
  std::string groups = "1,2,4";
  std::string compute_copy = "bf16";
  int rounds = 3;
  int threads = 0;
  bool json = false;
};

/// The items of a comma-separated list of positive integers, or
/// std::invalid_argument naming `flag` and the bad item.
std::vector<long long> positive_list(const std::string& text, const char* flag, const char* what) {
  std::vector<long long> out;
  for (const std::string& item : split_list(text)) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
    }
    if (v < 1 || used != item.size())
      throw std::invalid_argument(std::string("bench update: ") + flag + " takes positive " + what + ", got '" + item +
                                  "'");
    out.push_back(v);
  }
  return out;
}

int run_update(const update_options& o) {
  apply_common_options(o.threads, "warn");
  if (o.rounds < 1) throw std::invalid_argument("bench update: need --rounds >= 1");
  const std::vector<long long> sizes = positive_list(o.sizes, "--sizes", "parameter counts");
  const std::vector<long long> groups = positive_list(o.groups, "--groups", "group sizes");
  if (sizes.empty() || groups.empty()) throw std::invalid_argument("bench update: --sizes and --groups must not be empty");
  if (o.compute_copy != "bf16" && o.compute_copy != "f16" && o.compute_copy != "none")
    throw std::invalid_argument("bench update: --compute-copy is bf16, f16 or none, not '" + o.compute_copy + "'");
  const device dev = parse_device(o.device);
  if (dev.kind == device_kind::cpu)
    throw std::invalid_argument("bench update compares a device's update with the host's: it needs --device cuda[:N] "
                                "(on the cpu both are the same AdamW)");
  Backend& be = backend_for(dev);
  std::unique_ptr<Backend> companion = be.companion();
  if (!companion) throw std::runtime_error("bench update: the " + be.name() + " backend has no companion instance");
  adamw_params w;
  w.lr = 1e-4f;
  w.weight_decay = 0.1f;

  nlohmann::json results = nlohmann::json::array();
  if (!o.json)
    std::printf("%-12s %5s %14s %12s %8s\n", "parameters", "group", "device ms", "host ms", "host/dev");
  for (const std::int64_t n : sizes) {
    Tensor params = random_tensor_on(be, {n}, dtype::f32, 1), grads = random_tensor_on(be, {n}, dtype::f32, 2);
    Tensor host_params = be.host_empty({n}), host_grads = be.host_empty({n});
    be.copy(params, host_params);
    for (const std::int64_t g : groups) {
      if (g > n) throw std::invalid_argument("bench update: a group of " + std::to_string(g) + " over " +
                                             std::to_string(n) + " parameters leaves shards empty");
      const std::int64_t lo = 0, hi = (n + g - 1) / g;  // this rank's shard: the first
      Tensor dm = be.empty({hi - lo}), dv = be.empty({hi - lo});
      dm.zero();
      dv.zero();
      Tensor hm = Tensor::zeros({hi - lo}), hv = Tensor::zeros({hi - lo});
      Tensor p_shard = params.slice(lo, hi), g_shard = grads.slice(lo, hi);
      Tensor rest = params.slice(hi, n);
      std::int64_t step = 0;
      const double device_s = best_seconds(be, o.rounds, 1, [&] {
        ++step;
        if (g == 1) {  // nothing leaves the device
          be.wait(be.mark().get());
          companion->adamw(params, grads, dm, dv, w, step);
          companion->synchronize();
          return;
        }
        be.copy_after(be.mark().get(), grads, host_grads);
        companion->copy(host_grads.slice(lo, hi), g_shard);
        companion->adamw(p_shard, g_shard, dm, dv, w, step);
        Tensor updated = host_params.slice(lo, hi);
        companion->copy(p_shard, updated);
        be.copy_after(nullptr, host_params.slice(hi, n), rest);
      });
      step = 0;
      const double host_s = best_seconds(be, o.rounds, 1, [&] {
        ++step;
        be.copy_after(be.mark().get(), grads, host_grads);
        Tensor hp = host_params.slice(lo, hi);
        cpu_backend().adamw(hp, host_grads.slice(lo, hi), hm, hv, w, step);
        be.copy_after(nullptr, host_params, params);
      });
      results.push_back({{"parameters", n},
                         {"group", g},
                         {"device_ms", device_s * 1e3},
                         {"host_ms", host_s * 1e3},
                         {"host_over_device", host_s / device_s}});
      if (!o.json)
        std::printf("%-12lld %5lld %14.3f %12.3f %7.1fx\n", static_cast<long long>(n), static_cast<long long>(g),
                    device_s * 1e3, host_s * 1e3, host_s / device_s);
    }
  }
  nlohmann::json copies = nlohmann::json::array();
  if (o.compute_copy != "none") {
    const dtype t = o.compute_copy == "f16" ? dtype::f16 : dtype::bf16;
    if (!o.json)
      std::printf("\n%-12s %14s %14s %8s   (AdamW writing the %s compute copy vs AdamW, then the copy)\n",
                  "parameters", "fused ms", "separate ms", "sep/fused", dtype_name(t));
    for (const std::int64_t n : sizes) {
      Tensor params = random_tensor_on(be, {n}, dtype::f32, 3), grads = random_tensor_on(be, {n}, dtype::f32, 4);
      Tensor m = be.empty({n}), v = be.empty({n}), copy = be.empty({n}, t);
      m.zero();
      v.zero();
      std::int64_t step = 0;
      const double fused_s = best_seconds(be, o.rounds, 1, [&] {
        be.adamw_with_copy(params, grads, m, v, w, ++step, copy);
        be.synchronize();
      });
      const double separate_s = best_seconds(be, o.rounds, 1, [&] {
        be.adamw(params, grads, m, v, w, ++step);
        be.copy(params, copy);
        be.synchronize();
      });
      copies.push_back({{"parameters", n},
                        {"copy", dtype_name(t)},
                        {"fused_ms", fused_s * 1e3},
                        {"separate_ms", separate_s * 1e3},
                        {"separate_over_fused", separate_s / fused_s}});
      if (!o.json)
        std::printf("%-12lld %14.3f %14.3f %7.2fx\n", static_cast<long long>(n), fused_s * 1e3, separate_s * 1e3,
                    separate_s / fused_s);
    }
  }
  const nlohmann::json j = {{"bench", "update"},     {"device", be.name()}, {"threads", cpu_threads()},
                            {"results", results},    {"compute_copy", copies}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_bench_update(CLI::App* bench, action_fn& action) {
  static update_options o;
  auto* cmd = bench->add_subcommand(
      "update", "A training rank's bucket update on the device (AdamW there) vs on the host, per bucket and DP group");
  cmd->add_option("--device", o.device, "auto (cuda:0 when a GPU is visible), cuda or cuda:N; the cpu is refused")
      ->capture_default_str();
  cmd->add_option("--sizes", o.sizes, "Comma-separated bucket sizes in parameters")->capture_default_str();
  cmd->add_option("--groups", o.groups, "Comma-separated DP group sizes (the shard is 1/group)")->capture_default_str();
  cmd->add_option("--compute-copy", o.compute_copy,
                  "Also time AdamW writing a bf16 or f16 compute copy against AdamW then the copy (none: not)")
      ->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "Timed rounds; the best counts")->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU threads of the host AdamW (0 = all cores)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_flag("--json", o.json, "Print only the JSON result line");
  cmd->callback([&action] { action = [] { return run_update(o); }; });
}

}  // namespace corolla::app
