#!/bin/sh
# bench/turns_bench's own machinery: against graphd on the host backend it
# measures its four orders and prints a FIGURE line for each and a RESULT
# line with every key; a bad argument exits 2 with a message. (Its
# figures are the bench's to print, not this test's to judge.)
# Usage: test_turns_bench.sh GRAPHD TURNS_BENCH KERNEL_DIR
set -u
graphd=$1 bench=$2 kdir=$3
dir=$(mktemp -d /tmp/graphd-turns-XXXXXX)
trap 'kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
# shellcheck source=tests/host_daemon.sh
. "$(dirname "$0")/host_daemon.sh"
start_host_daemon "$graphd" "$dir/s" "$dir/log"
out=$(timeout 60 "$bench" --socket "$dir/s" --kernels "$kdir" --launches 8 --seconds 0.2 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: turns_bench exited $rc"; cat "$dir/log"; exit 1; }
for o in one programs sets both; do
  echo "$out" | grep -Eq "^FIGURE turns $o: the worker [0-9.]+ us a replay, [0-9.]+x the anchor's; [0-9.]+ us of it running the kernels, -?[0-9.]+ the rest \([1-9][0-9]* replays" ||
    { echo "FAIL: no figure for $o"; exit 1; }
done
echo "$out" | grep -Eq '^RESULT turns_launches=8 turns_one_us=[0-9.]+ turns_programs_us=[0-9.]+ turns_sets_us=[0-9.]+ turns_both_us=[0-9.]+$' ||
  { echo "FAIL: RESULT line"; exit 1; }
# Every replay of the bench ran: none counted as an error by the daemon.
errs=$(timeout 10 "$(dirname "$graphd")/graphctl" --socket "$dir/s" stats --json | tr ',' '\n' | grep -m1 '"errors"' | tr -dc '0-9')
[ "$errs" = 0 ] || { echo "FAIL: the daemon counted errors: $errs"; exit 1; }
bad=$(timeout 10 "$bench" --socket "$dir/s" --launches 1 2>&1)
[ $? -eq 2 ] || { echo "FAIL: --launches 1 did not exit 2"; exit 1; }
echo "$bad" | grep -q "bad arguments" || { echo "FAIL: no message for a bad argument: $bad"; exit 1; }
kill -TERM $pid; wait $pid || { echo "FAIL: graphd did not stop cleanly"; exit 1; }
echo "PASS"
