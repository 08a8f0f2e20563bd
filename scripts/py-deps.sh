#!/usr/bin/env bash
# The Python packages the tests use, at pinned versions, each set installed
# with `pip install --target` into a directory of its own under BUILD_DIR,
# where tests/CMakeLists.txt and scripts/wheel-test.sh put it on PYTHONPATH:
#   jax        pyjax        jax and jaxlib 0.10.2 (the newest for Python
#                           3.11), with numpy: graphd.jax's lowering on CPU,
#                           and the JAX side of the Warp and MJX tests
#   warp       pywarp       warp-lang 1.19.0: graphd.warp's tests (no GPU
#                           needed: programs are built with Warp's NVRTC)
#   warp-1.18  pywarp-1.18  warp-lang 1.18.0, the oldest supported release
#                           (MJX pins it): test_python_warp_oldest
#   mjx        pymjx        MuJoCo and MJX 3.17 with the few of their
#                           dependencies that MJX's Warp tests import (not
#                           all they declare): test_python_mjx_own_suite
#   mypy       pymypy       mypy 2.4.1: test_python_mypy (tests/run_mypy.py)
# A set already installed at its pins is left alone. pip is python3's
# (Debian: python3-pip; --target installs outside the system's packages, so
# Debian's PEP 668 marker does not stop it).
# Usage: scripts/py-deps.sh [BUILD_DIR [SET...]]   (default: build, every set)
#        scripts/py-deps.sh --print [SET...]       (name, directory, module, packages)
#        scripts/py-deps.sh --need PYTHON BUILD_DIR SET...
#          (exits 1 when PYTHON, with the caller's PYTHONPATH, cannot import
#          a set's module, saying which package is missing and how to get it)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: scripts/py-deps.sh [BUILD_DIR [SET...]] | --print [SET...] | --need PYTHON BUILD_DIR SET..."

SETS=(jax warp warp-1.18 mjx mypy)
declare -A DIR=([jax]=pyjax [warp]=pywarp [warp-1.18]=pywarp-1.18 [mjx]=pymjx [mypy]=pymypy)
declare -A MODULE=([jax]=jax [warp]=warp [warp-1.18]=warp [mjx]=mujoco.mjx [mypy]=mypy)
declare -A PKGS=(
  [jax]="jax==0.10.2 jaxlib==0.10.2"
  [warp]="warp-lang==1.19.0"
  [warp-1.18]="warp-lang==1.18.0"
  [mjx]="--no-deps mujoco==3.17.0 mujoco-mjx==3.17.0 etils==1.15.0 absl-py==2.5.1 trimesh==5.2.0 typing_extensions==4.15.0"
  [mypy]="mypy==2.4.1")

known() { [[ -n "${DIR[$1]:-}" ]] || { echo "py-deps: no set '$1' (sets: ${SETS[*]})" >&2; exit 2; }; }

case "${1:-}" in
  -h|--help) echo "$usage"; exit 0 ;;
  --print)
    shift
    for s in "${@:-${SETS[@]}}"; do
      known "$s"
      printf '%-10s %-12s %-11s %s\n' "$s" "${DIR[$s]}" "${MODULE[$s]}" "${PKGS[$s]}"
    done
    exit 0 ;;
  --need)
    [[ $# -ge 3 ]] || { echo "$usage" >&2; exit 2; }
    py=$2 build=$3
    shift 3
    rc=0
    for s in "$@"; do
      known "$s"
      m=${MODULE[$s]}
      if ! err=$("$py" -c 'import importlib.util, sys
try:
    ok = importlib.util.find_spec(sys.argv[1]) is not None
except Exception as e:
    sys.exit(f"{type(e).__name__}: {e}")
sys.exit(0 if ok else f"No module named {sys.argv[1]!r}")' "$m" 2>&1); then
        echo "needs $m (${PKGS[$s]#--no-deps }), which $py cannot import"
        echo "  (${err##*$'\n'}; PYTHONPATH=${PYTHONPATH:-}). Get it with:"
        echo "  scripts/py-deps.sh $build $s   (scripts/test.sh does this itself), or"
        echo "  python3 -m pip install --target $build/${DIR[$s]} ${PKGS[$s]}"
        rc=1
      fi
    done
    exit $rc ;;
  -*) echo "$usage" >&2; exit 2 ;;
esac

build=${1:-$src/build}
shift || true
mkdir -p "$build"
build=$(cd "$build" && pwd)
if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "py-deps: python3 has no pip (Debian: apt-get install python3-pip)" >&2
  exit 1
fi
failed=()
for s in "${@:-${SETS[@]}}"; do
  known "$s"
  dir=$build/${DIR[$s]}
  stamp="$s: ${PKGS[$s]}"
  if [[ "$(cat "$dir/.graphd-py-deps" 2>/dev/null)" == "$stamp" ]]; then
    echo "py-deps: $s already in $dir"
    continue
  fi
  echo "py-deps: installing $s (${PKGS[$s]}) into $dir"
  rm -rf "$dir.tmp"
  # shellcheck disable=SC2086
  if python3 -m pip install --quiet --root-user-action=ignore --target "$dir.tmp" ${PKGS[$s]}; then
    echo "$stamp" >"$dir.tmp/.graphd-py-deps"
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  else
    rm -rf "$dir.tmp"
    echo "py-deps: could not install $s (${PKGS[$s]}); the tests that need it say so" >&2
    failed+=("$s")
  fi
done
if ((${#failed[@]})); then
  echo "py-deps: not installed: ${failed[*]}" >&2
  exit 1
fi
