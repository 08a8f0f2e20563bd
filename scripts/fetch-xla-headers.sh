#!/usr/bin/env bash
# Puts jaxlib's XLA FFI headers (xla/ffi/api/c_api.h) under DEST, for
# building the FFI handler. A build-time input, never committed.
# Takes them from an installed jax if there is one, else from a jaxlib wheel
# that pip downloads (any Python; the headers are the same). Exits non-zero
# when neither works; the build then skips the handler with a message.
# pip is `$GRAPHD_PYTHON -m pip` or `python3 -m pip` (Debian: python3-pip).
# Usage: scripts/fetch-xla-headers.sh DEST [JAXLIB_VERSION]
set -euo pipefail
usage="usage: scripts/fetch-xla-headers.sh DEST [JAXLIB_VERSION]"
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { echo "$usage"; exit 0; }
dest=${1:?$usage}
version=${2:-0.11.2}
hdr=xla/ffi/api/c_api.h
[[ -f "$dest/$hdr" ]] && exit 0
mkdir -p "$dest"
if inc=$(python3 -c 'import jax.ffi; print(jax.ffi.include_dir())' 2>/dev/null) && [[ -f "$inc/$hdr" ]]; then
  mkdir -p "$dest/xla/ffi/api" && cp "$inc/$hdr" "$dest/$hdr"
  echo "XLA FFI headers from the installed jax ($inc)"
  exit 0
fi
py=""
for p in "${GRAPHD_PYTHON:-}" python3; do
  [[ -n $p ]] && "$p" -m pip --version >/dev/null 2>&1 && { py=$p; break; }
done
if [[ -z $py ]]; then
  echo "fetch-xla-headers: no pip to download jaxlib $version with (Debian: apt-get install python3-pip)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 \
  -d "$tmp" "jaxlib==$version"
"$py" - "$tmp" "$dest" "$hdr" <<'PY'
import glob, sys, zipfile, os
tmp, dest, hdr = sys.argv[1:]
whl = glob.glob(os.path.join(tmp, "jaxlib-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    data = z.read("jaxlib/include/" + hdr)
os.makedirs(os.path.join(dest, os.path.dirname(hdr)), exist_ok=True)
with open(os.path.join(dest, hdr), "wb") as f:
    f.write(data)
PY
echo "XLA FFI headers from jaxlib $version's wheel"
