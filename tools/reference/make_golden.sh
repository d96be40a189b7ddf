#!/usr/bin/env bash
# Regenerates the golden files under tests/data/golden/ with the independent PyTorch reference.
# Run by hand (not in CI), after building: needs Debian's python3-torch and python3-numpy
# (system python: /usr/bin/python3) and build/cli/llmesh.
#   tools/reference/make_golden.sh [build-dir] [case-name ...]   (default: every case)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
llmesh=${1:-$root/build}/cli/llmesh
only=("${@:2}")
golden=$root/tests/data/golden
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
while IFS='|' read -r name prompt flags run_flags; do
  name=$(echo "$name" | xargs); prompt=$(echo "$prompt" | xargs)
  quantize=none
  [[ "${run_flags:-}" == *"--quantization int8"* ]] && quantize=int8
  [[ "${run_flags:-}" == *"--quantization fp8"* ]] && quantize=fp8
  kv=auto
  [[ "${run_flags:-}" == *"--kv-cache-dtype fp8"* ]] && kv=fp8
  [[ "${run_flags:-}" == *"--kv-cache-dtype fp8_e5m2"* ]] && kv=fp8_e5m2
  [[ -z "$name" || "$name" == \#* ]] && continue
  if (( ${#only[@]} )) && [[ ! " ${only[*]} " == *" $name "* ]]; then continue; fi
  echo "== $name"
  # shellcheck disable=SC2086
  "$llmesh" model random --out "$work/$name" $flags
  mkdir -p "$golden/$name"
  /usr/bin/python3 "$root/tools/reference/llama_reference.py" --model "$work/$name" --prompt-ids "$prompt" \
    --max-tokens 32 --out-ids "$golden/$name/ids.txt" --out-logits "$golden/$name/logits.f32" --quantize "$quantize" --kv-cache-dtype "$kv"
  (cd "$work/$name" && sha256sum model*.safetensors config.json) > "$golden/$name/model.sha256"
done < "$golden/cases.txt"
