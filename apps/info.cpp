// corolla info — what this binary was built with and which devices it sees.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/commands.hpp"
#include "kernels/backend.hpp"
#include "kernels/memory_available.hpp"
#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/device.hpp"
#endif
#ifdef COROLLA_HAVE_NCCL
#include "kernels/cuda/nccl_comm.hpp"
#endif

namespace corolla::app {

void register_info(CLI::App& app, action_fn& action) {
  auto* cmd = app.add_subcommand("info", "List compiled backends and visible devices");
  cmd->callback([&action] {
    action = [] {
      std::printf("corolla %s\n", COROLLA_VERSION);
      std::string list;
      for (const auto& b : compiled_backends()) list += (list.empty() ? "" : ", ") + b;
      std::printf("backends: %s\n", list.c_str());
      std::printf("cpu: %d threads\n", cpu_threads());
      // What `serve --max-memory auto` would take on each device.
      const auto gib = [](std::uint64_t b) { return static_cast<double>(b) / (1 << 30); };
      const device host{device_kind::cpu, 0};
      try {
        const memory_available m = available_memory(host);
        std::printf("memory: cpu %.1f GiB available of %.1f GiB (serve --max-memory auto: %.1f GiB)\n",
                    gib(m.free_bytes), gib(m.total_bytes), gib(auto_memory_budget(host, m)));
      } catch (const std::exception& e) {
        std::printf("memory: cpu unknown (%s)\n", e.what());
      }
      int n = cuda_device_count();
#ifdef COROLLA_HAVE_CUDA
      if (n == 0) std::printf("cuda: no device (%s)\n", cuda::device_count_error().c_str());
      for (int i = 0; i < n; ++i) {
        // Early launch (programmatic dependent launch) of decode's GEMVs: docs/cuda.md.
        const char* early = !cuda::early_launch_supported(i) ? "no (before sm_90)"
                            : cuda::early_launch_requested() ? "on"
                                                             : "off (COROLLA_CUDA_EARLY_LAUNCH)";
        std::printf("cuda:%d: %s, early launch %s\n", i, cuda::device_description(i).c_str(), early);
        try {
          const auto [free_b, total_b] = cuda::device_memory(i);
          const device gpu{device_kind::cuda, i};
          std::printf("memory: cuda:%d %.1f GiB free of %.1f GiB (serve --max-memory auto: %.1f GiB)\n", i,
                      gib(free_b), gib(total_b), gib(auto_memory_budget(gpu, {free_b, total_b})));
        } catch (const std::exception& e) {
          std::printf("memory: cuda:%d unknown (%s)\n", i, e.what());
        }
      }
#else
      (void)n;
      std::printf("cuda: not compiled in\n");
#endif
      // Device collectives for train --collectives device (docs/training.md).
#ifdef COROLLA_HAVE_NCCL
      std::printf("nccl: %s (train --collectives device)\n", cuda::nccl_version().c_str());
#else
      std::printf("nccl: not compiled in (train --collectives device is unavailable)\n");
#endif
      return 0;
    };
  });
}

}  // namespace corolla::app
