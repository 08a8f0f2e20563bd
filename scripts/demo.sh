#!/usr/bin/env bash
# Sets graphd up on this machine and runs it in the foreground with a demo
# client beside it: installs the Debian packages it needs, builds, starts
# the daemon (on the host backend when there is no GPU) and, once it
# listens, shows `graphctl status`, a ping, and a demo replay (graphd-demo:
# a one-kernel program replayed three times on new buffers, checked). The daemon keeps serving
# until Ctrl-C; with --once it stops after the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
once=0
[[ "${1:-}" == "--once" ]] && once=1
scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)"
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
# Without a GPU, host devices, asked for by name (graphd never falls back to
# them on its own: their clients' modules run as native code inside it).
backend=(--backend auto)
[[ -e /dev/nvidia0 ]] || backend=(--backend host)
exec build/graphd "${backend[@]}" --socket "$sock"
