// apps/main.cpp — the corolla command line (idle OpenMP threads: apps/openmp_spin.hpp).
#include <cstdio>

#include <CLI/CLI.hpp>

#include "apps/commands.hpp"

int main(int argc, char** argv) {
  return corolla::app::run_cli(argc, argv);
}
