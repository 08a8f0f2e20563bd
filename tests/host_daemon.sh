# Sourced by the shell tests that run graphd on the host backend.
# start_host_daemon GRAPHD SOCKET LOG: starts graphd in the background
# (its stderr to LOG), sets pid to it and waits up to 10 s for its socket.
# No `timeout` wrapper: its pid would get the test's SIGTERM, not graphd's
# (CTest's TIMEOUT bounds the test).
start_host_daemon() {
  "$1" --backend host --socket "$2" 2>"$3" &
  # shellcheck disable=SC2034 # pid is the sourcing test's
  pid=$!
  i=0
  while [ ! -S "$2" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
}
