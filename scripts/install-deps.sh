#!/usr/bin/env bash
# Installs every Debian package llmesh's build and tests need. Idempotent: packages already
# present are skipped, so a warm machine pays only a dpkg query. Non-interactive.
set -euo pipefail

packages=(
  cmake ninja-build g++ make pkgconf git
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libpcre2-dev libutf8proc-dev
  libyaml-cpp-dev  # cluster configs
  libssl-dev  # the join challenge: HMAC-SHA256
  libopenblas-dev libcaf-dev libboost-dev capnproto libcapnp-dev
  libucx-dev ucx-utils  # transport/: UCX 1.13 (ucx_info, ucx_perftest for diagnosis)
  prometheus  # promtool: tests check /metrics output with it
  nodejs npm  # tests/e2e: the official openai npm client against llmesh serve
  openssl  # tests/e2e: the HTTPS run's certificate
)

# Packages that a command already on PATH stands in for: NodeSource's nodejs bundles npm and
# conflicts with Debian's npm package, so asking apt for npm on such a machine would fail.
declare -A satisfied_by_command=([nodejs]=node [npm]=npm)

missing=()
for p in "${packages[@]}"; do
  cmd="${satisfied_by_command[$p]:-}"
  if [ -n "$cmd" ] && command -v "$cmd" >/dev/null 2>&1; then
    continue
  fi
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
