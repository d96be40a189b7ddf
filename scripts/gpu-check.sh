#!/usr/bin/env bash
# The GPU check of the CUDA backend, sized for one call of a lent H200 (< 8 minutes):
# the `gpu` tests (every CUDA op against its CPU oracle, the CUDA engine against the CPU
# engine, NCCL), then `llmesh bench engine --device cuda` on Llama-3.2-1B- and Llama-3.1-8B-
# shaped random BF16 models (prefill 512; decode at batch 1, 8 and 64), then one short table.
#
#   scripts/gpu-check.sh            build with CUDA into build-gpu (needs the project's deps)
#   scripts/gpu-check.sh DIR        use prebuilt binaries DIR/{llmesh,gpu_test} and DIR/lib
#                                   (scripts/gpu-bundle.sh makes such a DIR on a build machine)
# Logs go to $OUT (or /tmp/gpu-check).
set -u
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
if [ $# -ge 1 ]; then
  bin=$(cd "$1" && pwd)
  llmesh=$bin/llmesh
  gpu_test=$bin/gpu_test
  # The bundle's own libraries, then CUDA's (toolkit or the Python wheels) for cuBLASLt and NCCL.
  libdirs=$bin/lib
  for lib in libcudart.so.13 libcublasLt.so.13 libnccl.so.2; do
    found=$(find /usr/local /opt /usr/lib /usr/lib64 -name "$lib" 2>/dev/null | head -1)
    [ -n "$found" ] && libdirs=$libdirs:$(dirname "$found")
  done
  export LD_LIBRARY_PATH=$libdirs:${LD_LIBRARY_PATH:-}
else
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLMESH_CUDA=ON >"$out/configure.log" 2>&1 || { tail "$out/configure.log"; exit 1; }
  cmake --build build-gpu --target llmesh gpu_test >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  llmesh=build-gpu/cli/llmesh
  gpu_test=build-gpu/tests/gpu/gpu_test
fi

nvidia-smi -L 2>&1 | tee "$out/device.txt"
ldd "$llmesh" "$gpu_test" | grep -E "not found|cublas|nccl|cudart" | sort -u | tee -a "$out/device.txt"

echo "== gpu tests"
timeout 200 "$gpu_test" --gtest_color=no >"$out/gpu_test.log" 2>&1
test_rc=$?
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error|nccl:|expected|Which is|rel_error|Expected" "$out/gpu_test.log" | head -60

for shape in 1b 8b; do
  echo "== bench $shape"
  timeout 150 "$llmesh" bench engine --device cuda --shape "$shape" --pp 512 --tg 64 --batches 1,8,64 \
    ${GPU_CHECK_PROFILE:+--profile} >"$out/bench_$shape.txt" 2>&1
  echo "rc=$?" >>"$out/bench_$shape.txt"
  tail -4 "$out/bench_$shape.txt" | grep -v '^{' | grep -v '^|' || true
done

if [ "${GPU_CHECK_SANITIZER:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck (ops tests)"
  timeout 120 compute-sanitizer --tool memcheck --print-limit 5 "$gpu_test" --gtest_filter='Cuda*:-CudaEngine.*' \
    >"$out/sanitizer.log" 2>&1
  grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$out/sanitizer.log" | head -12
fi

echo
echo "== summary (gpu tests rc=$test_rc: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+' "$out/gpu_test.log" | tr '\n' ' '))"
for shape in 1b 8b; do grep -E '^device:|^\| ' "$out/bench_$shape.txt" | grep -v -- '---' | grep -v '| model |' ; done
