#!/bin/sh
# The installed tree holds what the install rules promise, and it works:
# `cmake --install` into a staging root (DESTDIR, as packagers do), then the
# binaries run, a CMake project and a pkg-config build link against
# libgraphd, and the units point at the installed graphd.
# Usage: test_install.sh BUILD_DIR CMAKE GENERATOR PREFIX SBINDIR BINDIR LIBDIR
#                        INCLUDEDIR MANDIR SYSCONFDIR DOCDIR UNITDIR SYSUSERSDIR
#                        BASHCOMPDIR ZSHCOMPDIR DATADIR
# (all directories absolute, as installed, before DESTDIR). In a sanitizer
# build ($GRAPHD_SANITIZE set), the consumers are built with the same
# sanitizers, as an instrumented libgraphd needs.
set -eu
build=$1 cmake=$2 generator=$3 prefix=$4 sbindir=$5 bindir=$6 libdir=$7
includedir=$8 mandir=$9
shift 9
sysconfdir=$1 docdir=$2 unitdir=$3 sysusersdir=$4 bashcompdir=$5 zshcompdir=$6 datadir=$7

# A build tree carried to another machine (the GPU machine has no cmake at
# this path) cannot install: that is a skip, not a failure.
if [ ! -x "$cmake" ]; then
  echo "SKIP: $cmake is not here"
  exit 77
fi

tmp=$(mktemp -d /tmp/graphd-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }

DESTDIR=$root "$cmake" --install "$build" >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log" >&2
  echo "FAIL: cmake --install" >&2
  exit 1
}

want() { # want TEST PATH...
  t=$1
  shift
  for p in "$@"; do
    [ "$t" "$root$p" ] || bad "missing $p (test $t)"
  done
}
want -x "$sbindir/graphd" "$bindir/graphctl"
want -f "$libdir/libgraphd.so.0" "$libdir/pkgconfig/libgraphd.pc" \
  "$includedir/graphd/graphd.h" "$includedir/graphd/status.h" "$includedir/graphd/protocol.h" \
  "$includedir/graphd/program.h" "$includedir/graphd/host_kernel.h" "$includedir/graphd/version.h" \
  "$includedir/graphd/device_counters.def" \
  "$libdir/cmake/graphd/graphdConfig.cmake" "$libdir/cmake/graphd/graphdConfigVersion.cmake" \
  "$libdir/cmake/graphd/graphdTargets.cmake" \
  "$unitdir/graphd.service" "$unitdir/graphd.socket" "$unitdir/graphd-mps.service" \
  "$unitdir/graphd@.service" "$unitdir/graphd@.socket" \
  "$sysusersdir/graphd.conf" \
  "$mandir/man8/graphd.8" "$mandir/man1/graphctl.1" \
  "$sysconfdir/graphd/graphd.conf.example" "$sysconfdir/graphd/mps.env.example" \
  "$docdir/operator.md" "$docdir/graphd-daemonset.yaml" \
  "$bashcompdir/graphd" "$bashcompdir/graphctl" "$zshcompdir/_graphd" "$zshcompdir/_graphctl" \
  "$datadir/graphd/monitoring/graphd-alerts.yml" "$datadir/graphd/monitoring/graphd-dashboard.json"
want -L "$libdir/libgraphd.so"

# Nothing lands outside the prefix and the configured directories.
( cd "$root" && find . -type f -o -type l ) | sed 's|^\.||' | sort >"$tmp/files"
while read -r f; do
  case $f in
    "$prefix"/* | "$sysconfdir"/* | "$unitdir"/* | "$bashcompdir"/* | "$zshcompdir"/*) ;;
    *) bad "installed outside the prefix: $f" ;;
  esac
done <"$tmp/files"

# The installed programs run.
"$root$sbindir/graphd" --version | grep -q '^graphd ' || bad "graphd --version"
LD_LIBRARY_PATH=$root$libdir "$root$bindir/graphctl" version | grep -q '^graphctl ' ||
  bad "graphctl version"
"$root$sbindir/graphd" --config "$root$sysconfdir/graphd/graphd.conf.example" --check-config \
  >/dev/null || bad "the installed example config does not pass --check-config"

# The installed bash completions complete (what they offer is
# test_completion's).
for p in graphd graphctl; do
  bash -c '. "$1"; complete -p "$2"' sh "$root$bashcompdir/$p" $p >/dev/null 2>&1 ||
    bad "$bashcompdir/$p does not set up completion for $p"
done

# The units run the installed graphd.
grep -qx "ExecStart=$sbindir/graphd --backend cuda" "$root$unitdir/graphd.service" ||
  bad "graphd.service does not run $sbindir/graphd"
if grep -n '@[A-Z_]*@' "$root$unitdir"/graphd*.service "$root$unitdir/graphd.socket"; then
  bad "unsubstituted @VARIABLES@ in the units"
fi

# The groups the units name come from the sysusers.d file.
if command -v systemd-sysusers >/dev/null 2>&1; then
  mkdir -p "$tmp/sysroot/etc"
  systemd-sysusers --root="$tmp/sysroot" "$root$sysusersdir/graphd.conf" >/dev/null 2>&1 ||
    bad "systemd-sysusers rejects $sysusersdir/graphd.conf"
  for g in graphd graphd-admin; do
    grep -q "^$g:" "$tmp/sysroot/etc/group" || bad "sysusers.d does not create group $g"
  done
fi

# The man pages format without warnings.
if command -v man >/dev/null 2>&1; then
  for page in "$mandir/man8/graphd.8" "$mandir/man1/graphctl.1"; do
    out=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$root$page" 2>&1 >/dev/null) ||
      bad "man -l $page failed"
    [ -z "$out" ] || bad "man warnings for $page: $out"
  done
fi

san=
[ -n "${GRAPHD_SANITIZE:-}" ] && san="-fsanitize=$GRAPHD_SANITIZE"

# A client project finds libgraphd through the CMake package ...
mkdir -p "$tmp/consumer"
cat >"$tmp/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer LANGUAGES C)
find_package(graphd 0.1 REQUIRED CONFIG)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE graphd::graphd)
CM
cat >"$tmp/consumer/main.c" <<'C'
#include <stdio.h>
#include <graphd/graphd.h>
int main(void) {
  printf("libgraphd %s\n", graphd_version());
  return graphd_status_name(GRAPHD_OK) ? 0 : 1;
}
C
if "$cmake" -S "$tmp/consumer" -B "$tmp/consumer/build" -G "$generator" \
     -DCMAKE_PREFIX_PATH="$root$prefix" -DCMAKE_C_FLAGS="$san" >"$tmp/consumer.log" 2>&1 &&
   "$cmake" --build "$tmp/consumer/build" >>"$tmp/consumer.log" 2>&1; then
  LD_LIBRARY_PATH=$root$libdir "$tmp/consumer/build/consumer" | grep -q '^libgraphd ' ||
    bad "the CMake consumer does not run"
else
  cat "$tmp/consumer.log" >&2
  bad "a project using find_package(graphd) does not build"
fi

# ... and through pkg-config.
if command -v pkg-config >/dev/null 2>&1; then
  flags=$(PKG_CONFIG_PATH=$root$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root \
    pkg-config --cflags --libs libgraphd) || bad "pkg-config libgraphd"
  # shellcheck disable=SC2086
  cc $san -o "$tmp/pc-consumer" "$tmp/consumer/main.c" $flags || bad "a pkg-config build fails"
  LD_LIBRARY_PATH=$root$libdir "$tmp/pc-consumer" | grep -q '^libgraphd ' ||
    bad "the pkg-config consumer does not run"
fi

[ $fail = 0 ] && echo "installed tree OK ($(wc -l <"$tmp/files") files)"
exit $fail
