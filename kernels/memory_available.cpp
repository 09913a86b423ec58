#include "kernels/memory_available.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/device.hpp"
#endif

namespace corolla {

namespace {

/// MemAvailable and MemTotal of /proc/meminfo, in bytes.
memory_available host_memory() {
  std::ifstream in("/proc/meminfo");
  if (!in) throw std::runtime_error("cannot read /proc/meminfo to size the host's free memory");
  memory_available m;
  bool have_free = false, have_total = false;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key, unit;
    std::uint64_t kib = 0;
    if (!(fields >> key >> kib)) continue;
    fields >> unit;
    const std::uint64_t scale = unit == "kB" ? 1024 : 1;
    if (key == "MemAvailable:") {
      m.free_bytes = kib * scale;
      have_free = true;
    } else if (key == "MemTotal:") {
      m.total_bytes = kib * scale;
      have_total = true;
    }
  }
  if (!have_free || !have_total)
    throw std::runtime_error("/proc/meminfo has no MemAvailable or MemTotal line to size the host's free memory");
  return m;
}

}  // namespace

memory_available available_memory(device dev) {
  if (dev.kind == device_kind::cpu) return host_memory();
#ifdef COROLLA_HAVE_CUDA
  (void)backend_for(dev);  // a clear error for a device that is not there
  const auto [free_b, total_b] = cuda::device_memory(dev.index);
  return {free_b, total_b};
#else
  throw cuda_not_built(dev);
#endif
}

std::uint64_t auto_memory_budget(device dev, const memory_available& m) {
  if (dev.kind == device_kind::cpu) return m.free_bytes / 2;
  const std::uint64_t reserve = std::max<std::uint64_t>(m.total_bytes / 20, std::uint64_t{1} << 30);
  return m.free_bytes > reserve ? m.free_bytes - reserve : 0;
}

}  // namespace corolla
