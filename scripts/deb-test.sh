#!/usr/bin/env bash
# The Debian package as an operator gets it: builds graphd_VERSION_ARCH.deb
# (packaging/build-deb.sh), runs lintian on it (no error and no warning;
# the overrides it ships are justified in packaging/lintian-overrides),
# installs it with apt-get, and checks the installed system: the groups,
# ldconfig, pkg-config and CMake consumers, the man pages,
# `systemd-analyze verify` on the installed units, then the installed
# /usr/sbin/graphd on the host backend answering the installed graphctl
# (status, status --json) and the Python client (the source package
# through the installed libgraphd, and the wheel scripts/wheel-test.sh left
# in WHEEL_DIR, when it is there). Last it purges the package and checks
# that nothing of it is left (the groups stay, as Debian keeps system
# groups).
# Installing needs root: without it, sudo; with neither, the package is
# built and checked with lintian and the rest is skipped, saying so. So is
# it when graphd is already installed here, which this must not replace.
# Usage: scripts/deb-test.sh [DEB_BUILD_DIR [WHEEL_DIR]]
#        (defaults: build-deb, build/wheel)
set -euo pipefail
case "${1:-}" in -h|--help) echo "usage: scripts/deb-test.sh [DEB_BUILD_DIR [WHEEL_DIR]]"; exit 0 ;; esac
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-$src/build-deb}")
wheels=$(realpath -m "${2:-$src/build/wheel}")

fail() { echo "FAIL: $*" >&2; exit 1; }

"$src/packaging/build-deb.sh" "$build"
deb=$(ls "$build"/graphd_*.deb)
echo "== lintian $(basename "$deb")"
rc=0
out=$(lintian --fail-on error,warning --display-info --pedantic "$deb" 2>&1) || rc=$?
# (as root, lintian says it would rather not be: not a finding)
grep -v '^running with root privileges' <<<"$out" || true
[[ $rc -eq 0 ]] || fail "lintian reports errors or warnings (above)"
echo "lintian: no errors, no warnings"

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if sudo -n true 2>/dev/null; then
    SUDO=(sudo)
  else
    echo "SKIP: installing the package needs root or password-less sudo; built and checked $deb only"
    exit 0
  fi
fi
if dpkg-query -W -f='${Status}' graphd 2>/dev/null | grep -q "ok installed" ||
  [[ -e /usr/sbin/graphd || -e /usr/bin/graphctl ]]; then
  echo "SKIP: graphd is already installed here (package or cmake --install); not replacing it"
  exit 0
fi

tmp=$(mktemp -d /tmp/graphd-deb-XXXXXX)
chmod 755 "$tmp" # apt reads the .deb as its own user
cp "$deb" "$tmp/"
daemon=
installed=0
cleanup() {
  [[ -n $daemon ]] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  # A failure leaves nothing installed either.
  [[ $installed = 1 ]] &&
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get purge -y graphd >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== apt-get install $(basename "$deb")"
installed=1
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -o Dpkg::Use-Pty=0 "$tmp/$(basename "$deb")"
version=$(dpkg-query -W -f='${Version}' graphd)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=/usr/lib/$multiarch
for f in /usr/sbin/graphd /usr/bin/graphctl "$libdir/libgraphd.so.0" "$libdir/libgraphd.so" \
  /usr/include/graphd/graphd.h "$libdir/pkgconfig/libgraphd.pc" \
  "$libdir/cmake/graphd/graphdConfig.cmake" /lib/systemd/system/graphd.service \
  /lib/systemd/system/graphd.socket /lib/systemd/system/graphd-mps.service \
  /lib/systemd/system/graphd@.service /lib/systemd/system/graphd@.socket \
  /usr/lib/sysusers.d/graphd.conf /etc/graphd/graphd.conf.example /etc/graphd/mps.env.example \
  /usr/share/man/man8/graphd.8.gz /usr/share/man/man1/graphctl.1.gz \
  /usr/share/doc/graphd/copyright /usr/share/doc/graphd/changelog.gz \
  /usr/share/doc/graphd/operator.md /usr/share/bash-completion/completions/graphd \
  /usr/share/bash-completion/completions/graphctl /usr/share/zsh/vendor-completions/_graphd \
  /usr/share/zsh/vendor-completions/_graphctl /usr/share/graphd/monitoring/graphd-alerts.yml \
  /usr/share/graphd/monitoring/graphd-dashboard.json; do
  [[ -e $f ]] || fail "the package did not install $f"
done
dpkg-query -W -f='${Conffiles}\n' graphd | grep -q ' /etc/graphd/graphd.conf.example ' ||
  fail "/etc/graphd/graphd.conf.example is not a conffile"
getent group graphd graphd-admin >/dev/null || fail "postinst did not create the groups"
/sbin/ldconfig -p >"$tmp/ldconfig"
# (/lib is /usr/lib on Debian 12: ldconfig may name either)
grep -qE "libgraphd\.so\.0 .*=> (/usr)?/lib/$multiarch/libgraphd\.so\.0\$" "$tmp/ldconfig" ||
  fail "ldconfig does not know libgraphd.so.0"
echo "installed graphd $version: groups graphd and graphd-admin, libgraphd.so.0 in $libdir"

/usr/sbin/graphd --version | grep -q "^graphd " || fail "graphd --version"
/usr/sbin/graphd --config /etc/graphd/graphd.conf.example --check-config >/dev/null ||
  fail "the installed example config does not pass --check-config"
for page in 8:graphd 1:graphctl; do
  out=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings "${page%%:*}" "${page#*:}" 2>&1 >/dev/null) ||
    fail "man ${page%%:*} ${page#*:}"
  [[ -z $out ]] || fail "man warnings for ${page#*:}: $out"
done

# A C client builds against the installed headers and runs with the
# installed library, through pkg-config and through find_package(graphd).
cat >"$tmp/main.c" <<'C'
#include <stdio.h>
#include <graphd/graphd.h>
int main(void) {
  printf("libgraphd %s\n", graphd_version());
  return graphd_status_name(GRAPHD_OK) ? 0 : 1;
}
C
# shellcheck disable=SC2046
cc -o "$tmp/pc-consumer" "$tmp/main.c" $(pkg-config --cflags --libs libgraphd)
"$tmp/pc-consumer" | grep -qx "libgraphd $version" || fail "the pkg-config consumer"
mkdir -p "$tmp/cm"
cat >"$tmp/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer LANGUAGES C)
find_package(graphd REQUIRED CONFIG)
add_executable(consumer ../main.c)
target_link_libraries(consumer PRIVATE graphd::graphd)
CM
if ! { cmake -S "$tmp/cm" -B "$tmp/cm/build" && cmake --build "$tmp/cm/build"; } >"$tmp/cm.log" 2>&1; then
  cat "$tmp/cm.log" >&2
  fail "a project using find_package(graphd) does not build"
fi
"$tmp/cm/build/consumer" | grep -qx "libgraphd $version" || fail "the CMake consumer"
echo "C consumers (pkg-config, find_package) build and run against the installed libgraphd"

# The installed units, verified as copies in one directory (systemd-analyze
# loads a unit's dependencies from the directory of the units it is given
# first): byte for byte the installed files, but for templates, verified
# as instance "alpha", and nvidia-cuda-mps-control, which NVIDIA's driver
# packages install, replaced by a stub in graphd-mps.service when absent.
echo "== systemd-analyze verify"
mkdir "$tmp/units"
for u in graphd.socket graphd.service graphd-mps.service graphd@.socket graphd@.service; do
  cp "/lib/systemd/system/$u" "$tmp/units/${u/@/@alpha}"
done
mps=$(sed -n 's|^ExecStart=\([^ ]*\) .*|\1|p' /lib/systemd/system/graphd-mps.service)
if [[ ! -x $mps ]]; then
  printf '#!/bin/sh\nexit 0\n' >"$tmp/mps-control"
  chmod +x "$tmp/mps-control"
  sed -i "s|$mps|$tmp/mps-control|g" "$tmp/units/graphd-mps.service"
  echo "note: $mps is not installed; graphd-mps.service is verified with a stub in its place"
fi
units=(graphd.socket graphd.service graphd-mps.service graphd@alpha.socket graphd@alpha.service)
rc=0
out=$(cd "$tmp/units" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=yes \
  "${units[@]/#/./}" 2>&1) || rc=$?
[[ $rc -eq 0 && -z $out ]] || fail "systemd-analyze verify (exit $rc): $out"
echo "systemd-analyze verify: ${units[*]} OK"

# The installed daemon, on the host backend, in the foreground.
echo "== /usr/sbin/graphd --backend host"
sock=$tmp/graphd.sock
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
/usr/sbin/graphd --backend host --socket "$sock" --metrics-listen "127.0.0.1:$port" \
  >"$tmp/graphd.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do
  [[ -S $sock ]] && break
  kill -0 "$daemon" 2>/dev/null || { cat "$tmp/graphd.log" >&2; fail "graphd exited"; }
  sleep 0.1
done
[[ -S $sock ]] || { cat "$tmp/graphd.log" >&2; fail "graphd made no socket in 10 s"; }
[[ $(readlink "/proc/$daemon/exe") == /usr/sbin/graphd ]] || fail "the daemon is not /usr/sbin/graphd"

echo "\$ graphctl --socket $sock status"
/usr/bin/graphctl --socket "$sock" status
echo "\$ graphctl --socket $sock status --json"
/usr/bin/graphctl --socket "$sock" status --json | tee "$tmp/status.json"
python3 - "$tmp/status.json" "$daemon" "$version" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["pid"] == int(sys.argv[2]), f"graphctl talked to pid {s['pid']}, not {sys.argv[2]}"
assert s["version"] == sys.argv[3], f"daemon version {s['version']}, package {sys.argv[3]}"
assert len(s["devices"]) == 1, s["devices"]
PY

echo "\$ curl -s http://127.0.0.1:$port/metrics | grep graphd_replays_total"
curl -sf "http://127.0.0.1:$port/metrics" >"$tmp/metrics.txt" || fail "no /metrics from the installed graphd"
grep graphd_replays_total "$tmp/metrics.txt" || fail "/metrics has no graphd_replays_total"
if command -v promtool >/dev/null; then
  promtool check metrics <"$tmp/metrics.txt" || fail "promtool check metrics failed"
  promtool check rules /usr/share/graphd/monitoring/graphd-alerts.yml ||
    fail "promtool check rules failed on the installed alert rules"
fi

# The Python client: status and ping, answered by the daemon started above.
cat >"$tmp/client.py" <<'PY'
import os, sys
import graphd
c = graphd.Client.connect(sys.argv[1])
s = c.status()
c.ping(b"deb-test")
c.close()
assert s["pid"] == int(sys.argv[2]), f"answered by pid {s['pid']}, not {sys.argv[2]}"
maps = open("/proc/self/maps").read().split("\n")
path = next(l.split()[-1] for l in maps if "libgraphd.so" in l)
print(f"graphd {s['version']} (pid {s['pid']}, {len(s['devices'])} device) "
      f"answered graphd {graphd.__file__} through {path}")
if len(sys.argv) > 3:
    want = os.path.realpath(sys.argv[3])
    assert path == want, f"loaded {path}, not {want}"
PY
# The source package finds the installed libgraphd itself (ldconfig).
env -u GRAPHD_LIB PYTHONPATH="$src/client/python" PYTHONDONTWRITEBYTECODE=1 \
  python3 "$tmp/client.py" "$sock" "$daemon" "$libdir/libgraphd.so.0"
whl=$(compgen -G "$wheels/graphd-*.whl" | head -1 || true)
if [[ -n $whl ]]; then
  python3 -m venv "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install --quiet --no-deps "$whl"
  (cd "$tmp" && env -u GRAPHD_LIB -u PYTHONPATH "$tmp/venv/bin/python" client.py "$sock" "$daemon")
else
  echo "note: no wheel in $wheels (scripts/wheel-test.sh builds it); the wheel's client is not tried"
fi

kill -TERM "$daemon"
rc=0
wait "$daemon" || rc=$?
daemon=
[[ $rc -eq 0 ]] || { cat "$tmp/graphd.log" >&2; fail "graphd exited $rc on SIGTERM"; }
echo "graphd stopped on SIGTERM"

# The operator enables the units; an upgrade (here, the same version again)
# keeps them enabled, and the purge removes the links.
echo "== systemctl enable graphd.socket graphd.service, then apt-get install --reinstall"
"${SUDO[@]}" systemctl enable graphd.socket graphd.service
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --reinstall \
  -o Dpkg::Use-Pty=0 "$tmp/$(basename "$deb")" >"$tmp/reinstall.log" 2>&1 ||
  { cat "$tmp/reinstall.log" >&2; fail "apt-get install --reinstall"; }
links=(/etc/systemd/system/sockets.target.wants/graphd.socket
  /etc/systemd/system/multi-user.target.wants/graphd.service)
for l in "${links[@]}"; do
  [[ -L $l ]] || fail "the upgrade lost $l"
done
echo "graphd.socket and graphd.service stay enabled across the upgrade"

echo "== apt-get purge graphd"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get purge -y -o Dpkg::Use-Pty=0 graphd
installed=0
st=$(dpkg-query -W -f='${Status}' graphd 2>/dev/null || true)
[[ -z $st || $st == *not-installed ]] || fail "after the purge, graphd is '$st'"
for f in /usr/sbin/graphd /usr/bin/graphctl "$libdir/libgraphd.so.0" /etc/graphd \
  /lib/systemd/system/graphd.service /usr/share/doc/graphd /usr/include/graphd "${links[@]}"; do
  [[ ! -e $f ]] || fail "$f is left after the purge"
done
echo "deb test OK: graphd $version built, lintian-clean, installed, verified, answered, purged"
