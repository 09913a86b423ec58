#include "apps/openmp_spin.hpp"

#include <cstdlib>

namespace {

void bound_openmp_spin(int, char**, char**) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  ::setenv("GOMP_SPINCOUNT", corolla::app::openmp_spin_count, 0);
}

}  // namespace

// Before libgomp's initialiser reads the environment (apps/openmp_spin.hpp).
__attribute__((section(".preinit_array"), used)) static void (*const corolla_bound_openmp_spin)(int, char**,
                                                                                                  char**) =
    bound_openmp_spin;
