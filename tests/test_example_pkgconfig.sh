#!/bin/sh
# The C example builds against an installed libgraphd the way a user's
# program does, and runs: `cmake --install BUILD --prefix TMP --component
# libgraphd` (the library, its headers, its pkg-config and CMake files, and
# nothing outside TMP), then client/examples/graphd_demo.c compiled with
# `cc $(pkg-config --cflags --libs libgraphd)` alone, so that nothing of the
# source or build tree is on its include or library path, then run against
# `graphd --backend host` on a socket of its own, with the results checked.
# Usage: test_example_pkgconfig.sh BUILD_DIR CMAKE SOURCE_DIR GRAPHD KERNEL_DIR
# In a sanitizer build ($GRAPHD_SANITIZE set) the example is built with the
# same sanitizers, as an instrumented libgraphd needs.
set -u
build=$1 cmake=$2 src=$3 graphd=$4 kdir=$5

# A build tree carried to another machine (the GPU machine has no cmake at
# this path), or one without pkg-config or a compiler: a skip.
for tool in "$cmake" pkg-config cc; do
  command -v "$tool" >/dev/null 2>&1 || { echo "SKIP: no $tool here"; exit 77; }
done

tmp=$(mktemp -d /tmp/graphd-example-XXXXXX)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

"$cmake" --install "$build" --prefix "$prefix" --component libgraphd >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; echo "FAIL: cmake --install --prefix"; exit 1; }
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
for d in "$prefix"/lib/*/pkgconfig; do
  [ -d "$d" ] && PKG_CONFIG_PATH="$d"
done
flags=$(pkg-config --cflags --libs libgraphd) || { echo "FAIL: pkg-config libgraphd"; exit 1; }
echo "pkg-config --cflags --libs libgraphd: $flags"
case $flags in
  *"-I$prefix/"*) ;;
  *) echo "FAIL: libgraphd.pc does not name the prefix it was installed to ($prefix)"; exit 1 ;;
esac
san=
[ -n "${GRAPHD_SANITIZE:-}" ] && san="-fsanitize=$GRAPHD_SANITIZE"
# shellcheck disable=SC2086
cc $san -Wall -Wextra -Werror -o "$tmp/graphd-demo" \
  "$src/client/examples/graphd_demo.c" $flags || { echo "FAIL: the example does not build"; exit 1; }

# shellcheck source=tests/host_daemon.sh
. "$(dirname "$0")/host_daemon.sh"
start_host_daemon "$graphd" "$tmp/s" "$tmp/log"
out=$(LD_LIBRARY_PATH=$(pkg-config --variable=libdir libgraphd) \
  timeout 30 "$tmp/graphd-demo" --socket "$tmp/s" "$kdir" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: the example exited $rc"; cat "$tmp/log"; exit 1; }
echo "$out" | grep -q "replay 3 on new buffers: y\[0..2\] = 6 9 12 (correct)" ||
  { echo "FAIL: results"; exit 1; }
# It ran on the installed library, not the build tree's.
LD_LIBRARY_PATH=$(pkg-config --variable=libdir libgraphd) ldd "$tmp/graphd-demo" |
  grep -q "libgraphd.so.* => $prefix/" || { echo "FAIL: not linked to the installed libgraphd"; exit 1; }
kill -TERM $pid
wait $pid || { echo "FAIL: graphd did not stop cleanly"; exit 1; }
pid=
echo "PASS"
