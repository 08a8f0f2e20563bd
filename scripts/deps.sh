#!/usr/bin/env bash
# Installs the Debian packages graphd builds and tests with, when missing.
# Usage: scripts/deps.sh [--print]   (--print lists them and exits)
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config
      libuv1-dev libprotobuf-c-dev protobuf-c-compiler check
      libssl-dev libsystemd-dev libjson-c-dev libinih-dev uthash-dev libmicrohttpd-dev
      systemd man-db clang-format clang libclang-rt-dev python3-venv python3-jsonschema
      dpkg-dev file lintian # the Debian package (scripts/deb-test.sh)
      prometheus curl)      # promtool and curl check /metrics (test_metrics_promtool)
if [[ "${1:-}" == "--print" ]]; then echo "${PKGS[*]}"; exit 0; fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
echo "installing: ${missing[*]}"
$SUDO apt-get update
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
