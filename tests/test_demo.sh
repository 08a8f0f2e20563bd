#!/bin/sh
# The README's demo replay works: graphd on the host backend, graphd-demo
# registers a program and replays it three times with correct results.
# Usage: test_demo.sh GRAPHD GRAPHD_DEMO KERNEL_DIR
set -u
graphd=$1 demo=$2 kdir=$3
dir=$(mktemp -d /tmp/graphd-demo-XXXXXX)
trap 'kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
# shellcheck source=tests/host_daemon.sh
. "$(dirname "$0")/host_daemon.sh"
start_host_daemon "$graphd" "$dir/s" "$dir/log"
out=$(timeout 30 "$demo" --socket "$dir/s" "$kdir" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: graphd-demo exited $rc"; cat "$dir/log"; exit 1; }
echo "$out" | grep -q "replay 3 on new buffers: y\[0..2\] = 6 9 12 (correct)" || { echo "FAIL: results"; exit 1; }
echo "$out" | grep -q "1 capture(s), 3 replay(s) done, 0 error(s)" || { echo "FAIL: counters"; exit 1; }
kill -TERM $pid; wait $pid || { echo "FAIL: graphd did not stop cleanly"; exit 1; }
echo "PASS"
