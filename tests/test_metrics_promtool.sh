#!/bin/sh
# ctest's test_metrics_promtool: what graphd serves on /metrics (fetched
# with curl) and what `graphctl stats --prometheus` prints both pass
# `promtool check metrics` (Prometheus's own linter), and both carry the
# families the alert rules and the dashboard use (build info, device
# health, memory, budget, the latency histogram). Exits 77 (skip) without
# curl or promtool (Debian: curl, prometheus).
# Usage: test_metrics_promtool.sh GRAPHD GRAPHCTL
graphd=$1 graphctl=$2
for t in curl promtool; do
  command -v $t >/dev/null 2>&1 ||
    { echo "no $t (Debian: apt-get install curl prometheus; scripts/deps.sh test): skipping"; exit 77; }
done
dir=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid"
  rm -rf "$dir"
}
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$graphd" --host-devices 2 --socket "$dir/s" --metrics-listen "127.0.0.1:$port" --device-budget 32M \
  --log-level warn 2>"$dir/log" &
pid=$!
i=0
until curl -sf "http://127.0.0.1:$port/metrics" >"$dir/http.txt"; do
  i=$((i + 1))
  [ $i -lt 100 ] || { echo "no /metrics on 127.0.0.1:$port"; cat "$dir/log"; exit 1; }
  sleep 0.1
done
"$graphctl" --socket "$dir/s" stats --prometheus >"$dir/ctl.txt" || exit 1
curl -sf "http://127.0.0.1:$port/metrics" >"$dir/http.txt" || exit 1
rc=0
for f in http ctl; do
  grep -q '^graphd_replays_total{device="1",' "$dir/$f.txt" || { echo "$f: no device 1"; rc=1; }
  for want in '^graphd_build_info{version="[^"]*"} 1$' \
      '^# TYPE graphd_replay_latency_seconds histogram$' \
      '^graphd_replay_latency_seconds_bucket{device="1",uuid="[^"]*",le="+Inf"} ' \
      '^graphd_replay_latency_seconds_bucket{device="1",uuid="[^"]*",le="0.001"} ' \
      '^graphd_replay_latency_seconds_sum{device="1",' \
      '^graphd_replay_latency_seconds_count{device="1",' \
      '^graphd_device_up{device="1",uuid="[^"]*"} 1$' \
      '^graphd_device_state{device="1",uuid="[^"]*",state="ok"} 1$' \
      '^graphd_device_state{device="1",uuid="[^"]*",state="failed"} 0$' \
      '^graphd_device_mps_enabled{device="1",uuid="[^"]*",backend="host"} 0$' \
      '^graphd_device_memory_total_bytes{device="1",uuid="[^"]*"} 1073741824$' \
      '^graphd_device_memory_free_bytes{device="1",' \
      '^graphd_staging_budget_bytes{device="1",uuid="[^"]*"} 33554432$' \
      '^graphd_device_figures_age_seconds{device="1",'; do
    grep -q "$want" "$dir/$f.txt" || { echo "$f: no line matching $want"; rc=1; }
  done
  if out=$(promtool check metrics <"$dir/$f.txt" 2>&1); then
    echo "promtool check metrics ($f): OK"
  else
    echo "promtool check metrics ($f) FAILED:"; echo "$out"; rc=1
  fi
done
exit $rc
