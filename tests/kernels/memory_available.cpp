// What `--max-memory auto` reads and keeps: the host's available memory from
// /proc/meminfo (read here independently), half of it on the cpu; on a GPU
// the free memory less 5 % of the device or 1 GiB, whichever is more.
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "kernels/memory_available.hpp"

using namespace corolla;

namespace {

std::uint64_t meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string k;
    std::uint64_t kib = 0;
    if (f >> k >> kib && k == key + ":") return kib * 1024;
  }
  return 0;
}

constexpr std::uint64_t GiB = std::uint64_t{1} << 30;

}  // namespace

TEST_CASE("available_memory on the cpu is /proc/meminfo's MemAvailable of MemTotal") {
  const memory_available m = available_memory(device{device_kind::cpu, 0});
  CHECK(m.total_bytes == meminfo_bytes("MemTotal"));
  REQUIRE(m.free_bytes > 0);
  CHECK(m.free_bytes <= m.total_bytes);
  // MemAvailable moves with the machine's load; both reads see about the same.
  const double now = static_cast<double>(meminfo_bytes("MemAvailable"));
  CHECK(static_cast<double>(m.free_bytes) == doctest::Approx(now).epsilon(0.2));
}

TEST_CASE("auto_memory_budget: half the host's available memory, or a GPU's free memory less its reserve") {
  const device cpu{device_kind::cpu, 0}, gpu{device_kind::cuda, 0};
  CHECK(auto_memory_budget(cpu, {10 * GiB, 16 * GiB}) == 5 * GiB);
  CHECK(auto_memory_budget(cpu, {1, 16 * GiB}) == 0);
  // An 80 GiB device with 70 free: 5 % (4 GiB) is more than 1 GiB.
  CHECK(auto_memory_budget(gpu, {70 * GiB, 80 * GiB}) == 66 * GiB);
  // A 16 GiB card with 12 free: 5 % is 0.8 GiB, so 1 GiB is kept.
  CHECK(auto_memory_budget(gpu, {12 * GiB, 16 * GiB}) == 11 * GiB);
  // Less free than the reserve: nothing.
  CHECK(auto_memory_budget(gpu, {GiB / 2, 16 * GiB}) == 0);
  CHECK(auto_memory_budget(gpu, {GiB, 16 * GiB}) == 0);
}
