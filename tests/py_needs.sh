#!/bin/sh
# Runs a Python test that needs pip packages, sets of scripts/py-deps.sh
# (jax, warp, ...), when the test's Python can import them (with the
# PYTHONPATH CTest gives it). When it cannot, it says which package is
# missing and how to get it, and exits 77 (skip), or 1 when
# GRAPHD_TEST_REQUIRE_PY=1 (scripts/test.sh, which installs them first).
# Usage: py_needs.sh PYTHON BUILD_DIR "SET..." COMMAND...
py=$1 build=$2 sets=$3
shift 3
here=$(dirname "$0")
# shellcheck disable=SC2086
if ! "$here/../scripts/py-deps.sh" --need "$py" "$build" $sets; then
  if [ "${GRAPHD_TEST_REQUIRE_PY:-0}" = 1 ]; then
    echo "GRAPHD_TEST_REQUIRE_PY=1: failing instead of skipping"
    exit 1
  fi
  echo "skipping"
  exit 77
fi
exec "$@"
