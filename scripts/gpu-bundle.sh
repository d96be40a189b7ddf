#!/usr/bin/env bash
# Packs the built `llmesh` and `gpu_test` with the non-system libraries they need into DIR
# (default .devcarry/bundle.tar.xz), for running scripts/gpu-check.sh on a GPU machine that
# lacks the build dependencies: there, `tar xJf` it and run `scripts/gpu-check.sh bundle`.
set -eu
build=${BUILD:-build}
dest=${1:-.devcarry}
tmp=$(mktemp -d)
mkdir -p "$tmp/bundle/lib" "$dest"
cp "$build/cli/llmesh" "$build/tests/gpu/gpu_test" "$tmp/bundle/"
for lib in $(ldd "$build/cli/llmesh" "$build/tests/gpu/gpu_test" | awk '/=>/ {print $3}' | sort -u); do
  case "$lib" in
    */libc.so*|*/libm.so*|*/libstdc++*|*/libgcc_s*|*/libpthread*|*/libdl.so*|*/librt.so*|*/cuda*) ;;  # system or CUDA's own
    *) cp -L "$lib" "$tmp/bundle/lib/" ;;
  esac
done
tar -C "$tmp" -cJf "$dest/bundle.tar.xz" bundle
rm -rf "$tmp"
ls -la "$dest/bundle.tar.xz"
