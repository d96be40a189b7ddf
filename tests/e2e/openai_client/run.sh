#!/usr/bin/env bash
# Runs the openai-client end-to-end test in a work directory (the build tree):
#   run.sh WORK_DIR
# Copies the test and its pinned npm dependency list there, installs them with `npm ci`
# (skipped when node_modules is already installed from the same lockfile), then runs
# `node --test`. Needs LLMESH_BINARY and LLMESH_MODEL in the environment (ctest sets them).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 WORK_DIR" >&2
  exit 2
fi
src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="$1"
mkdir -p "$work"

for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "e2e_openai_client: '$tool' not found (install nodejs and npm: scripts/install-deps.sh)" >&2
    exit 1
  fi
done

for f in package.json .npmrc package-lock.json test.mjs; do
  cp "$src/$f" "$work/$f"
done

cd "$work"
# The stamp holds the lockfile that node_modules was installed from; a changed lockfile or
# a missing stamp means a fresh `npm ci` (which itself deletes node_modules first).
stamp=node_modules/.llmesh-lock-stamp
if [ -d node_modules ] && [ -f "$stamp" ] && cmp -s package-lock.json "$stamp"; then
  echo "e2e_openai_client: node_modules up to date, skipping npm ci"
else
  npm ci --no-audit --no-fund
  cp package-lock.json "$stamp"
fi

exec node --test test.mjs
