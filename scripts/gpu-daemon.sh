# Sourced by the scripts that bench on the lent GPU machine: start_daemon
# and stop_daemon, around graphd from $build on the socket $sock, bounded
# by $daemon_limit seconds (default 600) and at nice -5, as the systemd
# unit starts it (GRAPHD_BENCH_NICE sets another; raising the priority
# needs root). The caller sets build and sock; dpid is the running
# daemon's pid, empty when none. Also start_mps and stop_mps (below).
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

# start_mps: MPS's control daemon in -M mode, its pipes in /tmp/mps
# (exported as CUDA_MPS_PIPE_DIRECTORY, so that every process started
# after it is an MPS client). A control daemon left there by a run that
# was killed is asked to quit first: a new one would refuse to start.
# stop_mps: quits it and unsets the variables.
# The MPS control daemon's processes. The kernel keeps 15 characters of a
# process's name, so pgrep matches the executable's path, not the name.
mps_pids() { pgrep -d, -f '(^|/)nvidia-cuda-mps-control( |$)'; }

start_mps() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if [[ -n $(mps_pids) ]]; then
    echo "an MPS control daemon is running already (pid $(mps_pids)):" \
      "asking it to quit"
    echo quit | timeout 30 nvidia-cuda-mps-control
    for _ in $(seq 100); do
      [[ -n $(mps_pids) ]] || break
      sleep 0.2
    done
  fi
  if ! timeout 30 nvidia-cuda-mps-control -d -M; then
    echo "nvidia-cuda-mps-control -d -M failed"
    pgrep -a -f '(^|/)nvidia-cuda-mps-control( |$)'
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    return 1
  fi
  sleep 1
}

stop_mps() {
  echo quit | timeout 30 nvidia-cuda-mps-control
  sleep 1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
