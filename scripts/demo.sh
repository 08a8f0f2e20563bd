#!/usr/bin/env bash
# Sets graphd up on this machine and runs it in the foreground with a demo
# client beside it: installs the Debian packages it needs, builds, starts
# the daemon (on the host backend when there is no GPU) and, once it
# listens, shows `graphctl status`, a ping, and a demo replay (graphd-demo:
# a one-kernel program replayed three times on new buffers, checked). The daemon keeps serving
# until Ctrl-C; with --once it stops after the demo. Only what the demo runs
# is built (scripts/test.sh builds the rest in the same build/).
# Usage: scripts/demo.sh [--once]
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/demo.sh [--once]   (--once: stop graphd after the demo)"
once=0
case "${1:-}" in
  "") ;;
  --once) once=1 ;;
  -h|--help) echo "$usage"; exit 0 ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
scripts/deps.sh build
mkdir -p build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >build/configure.log ||
  { cat build/configure.log; exit 1; }
# What this build has of CUDA: where cuda.h came from, which kernels nvcc built.
grep -E '^-- (No CUDA|CUDA|graphd.s GPU kernels)' build/configure.log || true
targets=(graphd graphctl graphd-demo graphd_host_kernels)
# The demo's CUDA kernel, where nvcc built the test kernels.
cmake --build build --target help | grep -q '^graphd_cuda_kernels:' && targets+=(graphd_cuda_kernels)
cmake --build build -j "$(nproc)" --target "${targets[@]}"
# Without a GPU, host devices, asked for by name (graphd never falls back to
# them on its own: their clients' modules run as native code inside it).
backend=(--backend auto)
if [[ ! -e /dev/nvidia0 ]]; then
  backend=(--backend host)
elif [[ ! -f build/tests/kernels/test_kernels.cubin ]]; then
  echo "demo: there is a GPU, but this build has no CUDA kernel for the demo (no nvcc: install the"
  echo "      CUDA 13 toolkit and run this again); graphd runs on the host backend instead"
  backend=(--backend host)
fi
sock=${GRAPHD_SOCKET:-$PWD/build/demo.sock}
export GRAPHD_SOCKET=$sock
daemon_pid=$$ # exec below makes this shell's pid the daemon's
(
  for _ in $(seq 200); do [[ -S "$sock" ]] && break; sleep 0.05; done
  sleep 0.2
  echo; echo "=== demo: graphctl status"
  build/graphctl status
  echo; echo "=== demo: graphctl ping"
  build/graphctl ping
  echo; echo "=== demo: a program registered and replayed on new buffers each time"
  build/graphd-demo build/tests/kernels
  echo; echo "=== demo: graphctl list and stats after the replays (the capture stays)"
  build/graphctl list
  build/graphctl stats
  echo; echo "=== demo: graphctl evict --all (the next replay would capture again)"
  build/graphctl evict --all
  echo
  if [[ $once == 1 ]]; then
    kill -TERM "$daemon_pid"
  else
    echo "=== graphd is serving on $sock; try 'build/graphctl --socket $sock status'. Ctrl-C stops it."
  fi
) &
exec build/graphd "${backend[@]}" --socket "$sock"
