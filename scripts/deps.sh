#!/usr/bin/env bash
# Installs the Debian packages of one set, those that are missing (with
# sudo when not root):
#   build    build graphd and run it (scripts/demo.sh): the compiler, CMake,
#            the libraries, check (the default build configures the tests,
#            and the demo's host kernels are built there), python3-pip
#            (without a CUDA toolkit, pip fetches cuda.h; see
#            scripts/fetch-cuda-headers.sh) and python3-venv (the wheel:
#            scripts/wheel-test.sh builds it in a virtual environment)
#   package  build, plus what the Debian package needs to be built, checked
#            and tried (packaging/build-deb.sh, scripts/deb-test.sh)
#   test     package, plus everything else scripts/test.sh uses: clang and
#            clang-format, python3-venv, the test tools
# Usage: scripts/deps.sh [SET]            (default: build)
#        scripts/deps.sh --print [SET]    (lists SET's packages and exits)
set -euo pipefail
usage="usage: scripts/deps.sh [--print] [build|package|test]"

BUILD=(build-essential cmake ninja-build pkg-config
       libuv1-dev libprotobuf-c-dev protobuf-c-compiler check
       libssl-dev libsystemd-dev libjson-c-dev libinih-dev uthash-dev libmicrohttpd-dev
       python3 python3-pip python3-venv)
PACKAGE=("${BUILD[@]}"
         dpkg-dev file lintian # build-deb.sh and lintian
         systemd man-db)       # deb-test.sh: systemd-analyze verify, man --warnings
TEST=("${PACKAGE[@]}"
      git clang-format        # scripts/check-format.sh
      clang libclang-rt-dev   # scripts/fuzz.sh (libFuzzer)
      python3-jsonschema      # test_graphctl_json
      prometheus curl         # promtool and curl: /metrics, alert rules (test_metrics_promtool, test_monitoring)
      zsh)                    # the zsh half of test_completion

print=0
if [[ "${1:-}" == --print ]]; then print=1; shift; fi
case "${1:-build}" in
  build) pkgs=("${BUILD[@]}") ;;
  package) pkgs=("${PACKAGE[@]}") ;;
  test) pkgs=("${TEST[@]}") ;;
  -h|--help) echo "$usage"; exit 0 ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
[[ $# -le 1 ]] || { echo "$usage" >&2; exit 2; }
if [[ $print == 1 ]]; then echo "${pkgs[*]}"; exit 0; fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
SUDO=()
[[ $(id -u) -ne 0 ]] && SUDO=(sudo)
echo "installing: ${missing[*]}"
"${SUDO[@]}" apt-get update
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
