#!/usr/bin/env bash
# scripts/gpu/pack.sh — packs a built tree for a GPU machine that lacks
# corolla's Debian packages (e.g. a cloud image with only the CUDA toolkit):
# the stripped corolla binary and test binaries, plus every shared library
# they load except glibc's and CUDA's own (found on the GPU machine).
#
#   scripts/gpu/pack.sh [BUILD_DIR=build] [OUT=gpu-pack.tgz] [lean]
# lean: only what check.sh's lean mode runs (corolla, test_kernels,
# test_model), which keeps the pack well under the 64 MiB a device call carries.
#   # on the GPU machine, in a checkout of the same commit:
#   scripts/gpu/check.sh gpu-pack.tgz
set -euo pipefail
build=${1:-build}
out=${2:-gpu-pack.tgz}
binaries="apps/corolla tests/test_kernels tests/test_model tests/test_apps tests/test_apps_mp tests/test_actors_mp"
[ "${3:-}" = lean ] && binaries="apps/corolla tests/test_kernels tests/test_model"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for b in $binaries; do
  [ -x "$build/$b" ] && strip -o "$stage/bin/$(basename "$b")" "$build/$b"
done
for b in "$stage"/bin/*; do ldd "$b"; done | awk '/=>/ {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s)\.so|/cuda' |
  xargs -r -I{} cp -L {} "$stage/lib/"
tar -C "$stage" -czf "$out" bin lib
echo "packed $(ls "$stage/bin" | wc -w) binaries and $(ls "$stage/lib" | wc -w) libraries into $out"
