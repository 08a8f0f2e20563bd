# Sourced by the scripts that bench on the lent GPU machine: start_daemon
# and stop_daemon, around graphd from $build on the socket $sock, bounded
# by $daemon_limit seconds (default 600) and at nice -5, as the systemd
# unit starts it (GRAPHD_BENCH_NICE sets another; raising the priority
# needs root). The caller sets build and sock; dpid is the running
# daemon's pid, empty when none.
dpid=

# start_daemon LOG [flags]: starts graphd on $sock, logging to LOG, with
# the flags; waits until it answers a ping.
start_daemon() {
  local log=$1
  shift
  rm -f "$sock"
  timeout "${daemon_limit:-600}" nice -n "${GRAPHD_BENCH_NICE:--5}" "$build/graphd" --backend cuda \
    --socket "$sock" --log-level info "$@" >"$log" 2>&1 &
  dpid=$!
  for _ in $(seq 150); do
    if [[ -S $sock ]] && timeout 5 "$build/graphctl" --socket "$sock" ping >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$dpid" 2>/dev/null || break
    sleep 0.1
  done
  echo "graphd did not come up on $sock:"; tail -5 "$log"
  stop_daemon
  return 1
}

# SIGTERM (timeout passes it on to graphd) and wait for it.
stop_daemon() {
  [[ -n $dpid ]] || return 0
  kill -TERM "$dpid" 2>/dev/null
  wait "$dpid"; local r=$?
  echo "graphd exit status $r"
  dpid=
  rm -f "$sock"
}
