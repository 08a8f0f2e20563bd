#!/usr/bin/env bash
# Puts the CUDA 13.0 headers (cuda.h, cudaTypedefs.h and the rest of the
# include/ directory of NVIDIA's nvidia-cuda-runtime wheel) under DEST, for
# building without a CUDA toolkit: graphd loads libcuda at run time and
# needs only the driver API's declarations. The wheel comes from PyPI
# through pip, at a pinned version whose cuda.h is the CUDA 13.0 toolkit's,
# and is checked against its sha256. A build-time input, never committed.
# CMake runs this when it finds no CUDA 13 toolkit (cmake/CudaHeaders.cmake).
# pip is `$GRAPHD_PYTHON -m pip` or `python3 -m pip` (Debian: python3-pip).
# Usage: scripts/fetch-cuda-headers.sh DEST
set -euo pipefail
usage="usage: scripts/fetch-cuda-headers.sh DEST"
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { echo "$usage"; exit 0; }
dest=${1:?$usage}
# The same pin as client/python/pyproject.toml's build requirements.
pin=nvidia-cuda-runtime==13.0.96
sha=7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548
[[ -f $dest/cuda.h && "$(cat "$dest/.graphd-pin" 2>/dev/null)" == "$pin" ]] && exit 0

py=""
for p in "${GRAPHD_PYTHON:-}" python3; do
  [[ -n $p ]] && "$p" -m pip --version >/dev/null 2>&1 && { py=$p; break; }
done
if [[ -z $py ]]; then
  echo "fetch-cuda-headers: no pip to download $pin with (Debian: apt-get install python3-pip;" \
       "or install the CUDA 13 toolkit)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The headers are the same on every platform: always the x86_64 wheel, so
# that one checksum holds.
if ! "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$tmp" "$pin"; then
  echo "fetch-cuda-headers: pip could not download $pin" >&2
  exit 1
fi
"$py" - "$tmp" "$dest" "$sha" <<'PY'
import glob, hashlib, os, shutil, sys, zipfile
tmp, dest, sha = sys.argv[1:]
whl = glob.glob(os.path.join(tmp, "nvidia_cuda_runtime-*.whl"))[0]
with open(whl, "rb") as f:
    got = hashlib.sha256(f.read()).hexdigest()
if got != sha:
    sys.exit(f"fetch-cuda-headers: {os.path.basename(whl)} has sha256 {got}, expected {sha}")
prefix = "nvidia/cu13/include/"
staged = dest + ".tmp"
shutil.rmtree(staged, ignore_errors=True)
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = os.path.join(staged, name[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(z.read(name))
        elif name.endswith("/License.txt"):
            os.makedirs(staged, exist_ok=True)
            with open(os.path.join(staged, "LICENSE.nvidia-cuda-runtime.txt"), "wb") as f:
                f.write(z.read(name))
if not os.path.exists(os.path.join(staged, "cuda.h")):
    sys.exit(f"fetch-cuda-headers: {os.path.basename(whl)} has no {prefix}cuda.h")
shutil.rmtree(dest, ignore_errors=True)
os.rename(staged, dest)
PY
echo "$pin" >"$dest/.graphd-pin"
echo "fetch-cuda-headers: CUDA headers from $pin in $dest"
