#!/bin/sh
# `systemd-analyze verify` passes on the units, with no warning at all
# (systemd only warns about unknown keys, so warnings count as failures).
# verify also checks that every Exec*= binary exists, so the units are
# verified as copies whose paths point where the binaries are on this
# machine: graphd at the build's binary, nvidia-cuda-mps-control at a stub
# (there is no NVIDIA driver here). Nothing else is changed.
# Documentation=man: references are checked against the project's own man
# pages when man(1) is installed.
# Usage: test_systemd_units.sh UNIT_DIR GRAPHD_BIN SBINDIR MPS_CONTROL DOCS_DIR
# Exits 77 (skip) only when systemd-analyze is not installed.
set -eu
units=$1 graphd=$2 sbindir=$3 mps=$4 docs=$5

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIP: systemd-analyze not found (Debian package: systemd)" >&2
  exit 77
fi

tmp=$(mktemp -d /tmp/graphd-units-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
printf '#!/bin/sh\nexit 0\n' >"$tmp/nvidia-cuda-mps-control"
chmod +x "$tmp/nvidia-cuda-mps-control"

for u in graphd.service graphd.socket graphd-mps.service graphd@.service graphd@.socket; do
  [ -f "$units/$u" ] || { echo "FAIL: $units/$u was not generated" >&2; exit 1; }
  # A template is verified as an instance, tenant "alpha".
  sed -e "s|$sbindir/graphd |$graphd |g" -e "s|$mps|$tmp/nvidia-cuda-mps-control|g" \
    "$units/$u" >"$tmp/$(echo "$u" | sed 's|@|@alpha|')"
done
# The substitutions must have hit, or this would verify something else.
grep -qx "ExecStart=$graphd --backend cuda" "$tmp/graphd.service" ||
  { echo "FAIL: graphd.service ExecStart is not $sbindir/graphd --backend cuda" >&2; exit 1; }
grep -q "ExecStart=$tmp/nvidia-cuda-mps-control -f -M" "$tmp/graphd-mps.service" ||
  { echo "FAIL: graphd-mps.service does not run $mps -f -M" >&2; exit 1; }
# A tenant's daemon has its own socket, group and runtime directory.
for want in "ExecStart=$graphd --backend cuda --socket /run/graphd-%i/graphd.sock --admin-group graphd-%i-admin \$GRAPHD_OPTS" \
  "Group=graphd-%i" "RuntimeDirectory=graphd-%i" "Requires=graphd@%i.socket"; do
  grep -qxF "$want" "$tmp/graphd@alpha.service" ||
    { echo "FAIL: graphd@.service lacks '$want'" >&2; exit 1; }
done
grep -qxF "ListenStream=/run/graphd-%i/graphd.sock" "$tmp/graphd@alpha.socket" ||
  { echo "FAIL: graphd@.socket does not listen at /run/graphd-%i/graphd.sock" >&2; exit 1; }

man=no
if command -v man >/dev/null 2>&1; then
  mkdir -p "$tmp/man/man1" "$tmp/man/man8"
  cp "$docs/graphd.8" "$tmp/man/man8/"
  cp "$docs/graphctl.1" "$tmp/man/man1/"
  # The units also cite systemd's own pages; keep the system's man path.
  MANPATH="$tmp/man:$(manpath 2>/dev/null || true)"
  export MANPATH
  man=yes
else
  echo "note: man(1) is not installed; Documentation= is not checked" >&2
fi

cd "$tmp"
rc=0
out=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=$man \
  ./graphd.socket ./graphd.service ./graphd-mps.service ./graphd@alpha.socket \
  ./graphd@alpha.service 2>&1) || rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
  echo "FAIL: systemd-analyze verify (exit $rc):" >&2
  echo "$out" >&2
  exit 1
fi
echo "systemd-analyze verify: graphd.socket graphd.service graphd-mps.service graphd@alpha.socket graphd@alpha.service OK"
