#!/usr/bin/env bash
# Runs the openai-client end-to-end test in a work directory (the build tree):
#   run.sh WORK_DIR
# Copies the test and its pinned npm dependency list there, installs them with `npm ci`
# (skipped when node_modules is already installed from the same lockfile), then runs
# `node --test` on test.mjs, then on tls.mjs over HTTPS (a certificate made with the openssl
# command). Needs LLMESH_BINARY and LLMESH_MODEL in the environment (ctest sets them).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 WORK_DIR" >&2
  exit 2
fi
src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="$1"
mkdir -p "$work"

for tool in node npm openssl; do
  if ! command -v "$tool" >/dev/null; then
    echo "e2e_openai_client: '$tool' not found (install it: scripts/install-deps.sh installs nodejs, npm and openssl)" >&2
    exit 1
  fi
done

for f in package.json .npmrc package-lock.json test.mjs tls.mjs; do
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

node --test test.mjs
# HTTPS: a self-signed certificate for 127.0.0.1, trusted by node through NODE_EXTRA_CA_CERTS.
mkdir -p tls
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost \
  -addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout tls/key.pem -out tls/cert.pem 2>tls/openssl.log ||
  { echo "e2e_openai_client: openssl req failed:" >&2; cat tls/openssl.log >&2; exit 1; }
LLMESH_TLS_DIR="$PWD/tls" NODE_EXTRA_CA_CERTS="$PWD/tls/cert.pem" exec node --test tls.mjs
