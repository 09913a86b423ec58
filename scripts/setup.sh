#!/usr/bin/env bash
# scripts/setup.sh — installs corolla's Debian packages (when missing),
# configures and builds into build/. Idempotent: a second run only rebuilds
# what changed. Extra arguments are passed to the CMake configure step, e.g.
#   scripts/setup.sh -DCOROLLA_CUDA=OFF
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${COROLLA_BUILD_DIR:-$root/build}

packages=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-dev doctest-dev libcli11-dev libspdlog-dev nlohmann-json3-dev
  libsentencepiece-dev libtomlplusplus-dev libicu-dev
  libcaf-dev libzmq3-dev cppzmq-dev capnproto libcapnp-dev
  libibverbs-dev libopendht-dev libcpp-httplib-dev libxxhash-dev libboost-context-dev
  clang libclang-rt-14-dev
  chromium nodejs
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${#missing[@]} Debian package(s): ${missing[*]}" >&2
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install packages" >&2; exit 1; }
    sudo_cmd=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq || { echo "setup: apt-get update failed" >&2; exit 1; }
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { echo "setup: apt-get install failed for: ${missing[*]}" >&2; exit 1; }
fi

# Node tools the tests drive, from npm (tests/web/package-lock.json pins
# them): playwright-core for the dashboard's browser test (Debian's
# chromium), HF's tokenizers, the reference the tokenizer.json tests
# compare with, and the official openai SDK, a client of `corolla api`.
# Debian's nodejs comes without npm; NodeSource's includes it.
if ! command -v npm >/dev/null; then
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends npm >/dev/null \
    || { echo "setup: apt-get install failed for: npm" >&2; exit 1; }
fi
if [[ ! -d $root/tests/web/node_modules/playwright-core ]] || [[ ! -d $root/tests/web/node_modules/tokenizers ]] ||
   [[ ! -d $root/tests/web/node_modules/openai ]] ||
   [[ $root/tests/web/package-lock.json -nt $root/tests/web/node_modules/.package-lock.json ]]; then
  (cd "$root/tests/web" && npm ci --no-audit --no-fund --silent) \
    || { echo "setup: npm ci in tests/web failed (playwright-core, tokenizers, openai for the tests)" >&2; exit 1; }
fi

jobs=$(nproc 2>/dev/null || echo 2)
if [[ ! -f $build/CMakeCache.txt ]] || (($#)); then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null \
    || { echo "setup: CMake configure failed (rerun: cmake -S $root -B $build)" >&2; exit 1; }
fi
cmake --build "$build" -j "$jobs" \
  || { echo "setup: build failed" >&2; exit 1; }
echo "setup: built $build/apps/corolla" >&2
