#!/bin/sh
# A binary built against libgraphd 0.1.0's headers (tests/abi-0.1.0) runs
# against this tree's libgraphd: graphd on the host backend, abi_old
# (tests/abi_old.c) connects, reads the status, replays, lists, evicts and
# reads error text as 0.1.0's header lays them out.
# Usage: test_abi_old.sh GRAPHD ABI_OLD HOST_KERNELS_SO
set -u
graphd=$1 prog=$2 kernels=$3
dir=$(mktemp -d /tmp/graphd-abi-XXXXXX)
trap 'kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
"$graphd" --backend host --host-devices 1 --socket "$dir/s" 2>"$dir/log" &
pid=$!
i=0
while [ ! -S "$dir/s" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
timeout 60 "$prog" "$dir/s" "$kernels" || { echo "FAIL: abi_old exited $?"; cat "$dir/log"; exit 1; }
kill -TERM $pid; wait $pid || { echo "FAIL: graphd did not stop cleanly"; exit 1; }
echo "PASS"
