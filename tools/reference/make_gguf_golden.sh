#!/usr/bin/env bash
# Regenerates tests/data/gguf/ from tests/data/gguf/cases.txt: each case's random model written
# as GGUF by hf_to_gguf.py (llama.cpp's converter, re-implemented), and the PyTorch reference's
# tokens and logits over the weights that file holds. Run by hand (not in CI), after building;
# needs Debian's python3-numpy and python3-torch (/usr/bin/python3) and build/cli/llmesh.
#   tools/reference/make_gguf_golden.sh [build-dir] [case-name ...]   (default: every case)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
llmesh=${1:-$root/build}/cli/llmesh
only=("${@:2}")
out=$root/tests/data/gguf
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
while IFS='|' read -r name prompt flags types; do
  [[ -z "${name// }" || "$name" == \#* ]] && continue
  name=$(echo "$name" | xargs); prompt=$(echo "$prompt" | xargs); types=$(echo "${types:-}" | xargs)
  if (( ${#only[@]} )) && [[ ! " ${only[*]} " == *" $name "* ]]; then continue; fi
  echo "== $name"
  # shellcheck disable=SC2086
  "$llmesh" model random --out "$work/$name" $flags
  mkdir -p "$out/$name"
  /usr/bin/python3 "$root/tools/reference/hf_to_gguf.py" --model "$work/$name" --out "$out/$name/model.gguf" \
    --types "$types" --decoded "$work/$name.decoded"
  # llmesh's rule per matrix: the block types it re-quantizes to int8 (gguf_types.json)
  /usr/bin/python3 "$root/tools/reference/llama_reference.py" --model "$work/$name.decoded" --prompt-ids "$prompt" \
    --max-tokens 32 --out-ids "$out/$name/ids.txt" --out-logits "$out/$name/logits.f32" --quantize gguf
done < "$out/cases.txt"
