#!/bin/sh
# Builds graphd's Debian package, BUILD_DIR/graphd_VERSION_ARCH.deb: a
# build for /usr (configuration in /etc, units in /lib/systemd/system, as
# Debian 12 keeps them) with the compiler and linker flags dpkg-buildpackage
# would use (dpkg-buildflags, every hardening feature on), then
# `cpack -G DEB` (cmake/Packaging.cmake). Tests, benchmarks and the XLA
# handler are left out: the Python wheel carries its own libgraphd and
# handler. Prints the package's path last.
# Usage: packaging/build-deb.sh [BUILD_DIR]   (default: build-deb)
set -eu
case "${1:-}" in -h|--help) echo "usage: packaging/build-deb.sh [BUILD_DIR]"; exit 0 ;; esac
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build-deb}

export DEB_BUILD_MAINT_OPTIONS=hardening=+all
cflags="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS)"
ldflags=$(dpkg-buildflags --get LDFLAGS)
# An empty GRAPHD_XLA_INCLUDE directory: no jaxlib header, no handler.
mkdir -p "$build/no-xla"
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS="$cflags" -DCMAKE_EXE_LINKER_FLAGS="$ldflags" \
  -DCMAKE_SHARED_LINKER_FLAGS="$ldflags" \
  -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_INSTALL_SYSCONFDIR=/etc \
  -DGRAPHD_SYSTEMD_UNITDIR=/lib/systemd/system \
  -DGRAPHD_BUILD_TESTS=OFF -DGRAPHD_BUILD_BENCH=OFF -DGRAPHD_XLA_INCLUDE="$build/no-xla"
cmake --build "$build"
(cd "$build" && rm -f graphd_*.deb && cpack -G DEB)
ls "$build"/graphd_*.deb
