# The Debian package: `cpack -G DEB` in a build tree configured for /usr
# (packaging/build-deb.sh does both). One package, graphd, holds what
# `cmake --install` installs: the daemon, graphctl, libgraphd with its
# headers and CMake and pkg-config files, the units, the sysusers.d file,
# the man pages and the example configuration. packaging/deb-fixup.cmake
# turns the staged tree into Debian's layout before it is packed; the
# maintainer scripts in packaging/ create the groups and tell systemd.
# Nothing here links or depends on CUDA: the driver is loaded at run time.

set(GRAPHD_DEB_MAINTAINER "graphd maintainers <maintainers@graphd.invalid>" CACHE STRING
  "Maintainer: field of the Debian package")

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME graphd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${GRAPHD_DEB_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "CUDA graph replay daemon")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_STRIP_FILES ON)
set(CPACK_GRAPHD_STRIP ${CMAKE_STRIP})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT) # graphd_VERSION_ARCH.deb
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# The extended description, after the synopsis above: CPack starts each
# line with a space and turns an empty one into " .". No ';' in it (CMake
# would take it for a list separator).
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
"graphd owns CUDA graphs on a node's GPUs and replays them for client
processes, mainly JAX programs, over a Unix socket. One worker thread per
GPU owns that device's captures. Clients share their GPU buffers with the
daemon and order replays with their own CUDA streams.

This package holds the daemon (graphd, with systemd units for one daemon
per node or per tenant, and for the MPS control daemon), the admin command
graphctl, and the C client library libgraphd with its headers, pkg-config
and CMake files. The NVIDIA driver for CUDA 13 or newer is loaded at run
time. Without a GPU, graphd --backend host serves CPU devices.")
# dpkg-shlibdeps finds the libraries graphd, graphctl and libgraphd link;
# the groups come from systemd-sysusers (as debhelper's dh_installsysusers
# would depend).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "systemd | systemd-standalone-sysusers | systemd-sysusers")
# A shlibs file for libgraphd.so.0, so that packages linking it depend on
# graphd (>= this version). The symbols file and the ldconfig trigger
# come from packaging/.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(_deb ${CMAKE_CURRENT_SOURCE_DIR}/packaging)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${_deb}/conffiles ${_deb}/triggers ${_deb}/postinst ${_deb}/prerm ${_deb}/postrm
  ${CMAKE_CURRENT_BINARY_DIR}/deb/symbols)
# Run on the staged tree before it is packed (see the file).
set(CPACK_PRE_BUILD_SCRIPTS ${_deb}/deb-fixup.cmake)
set(CPACK_GRAPHD_SOURCE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
set(CPACK_GRAPHD_DEB_DIR ${CMAKE_CURRENT_BINARY_DIR}/deb) # written by deb-fixup.cmake
include(CPack)
