# Run by `cmake --install` (the install(CODE) beside libgraphd's install rules
# in CMakeLists.txt): writes libgraphd.pc for the prefix of this install,
# which `cmake --install --prefix DIR` may have changed since configuring,
# and installs it as install(FILES) would (DESTDIR and the manifest alike).
# Takes GRAPHD_PC_IN, GRAPHD_PC_OUT, PROJECT_VERSION, and GRAPHD_PC_LIBDIR
# and GRAPHD_PC_INCLUDEDIR as configured (relative to the prefix, or
# absolute).
set(GRAPHD_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
foreach(_dir LIBDIR INCLUDEDIR)
  if(NOT IS_ABSOLUTE "${GRAPHD_PC_${_dir}}")
    set(GRAPHD_PC_${_dir} "\${prefix}/${GRAPHD_PC_${_dir}}")
  endif()
endforeach()
configure_file("${GRAPHD_PC_IN}" "${GRAPHD_PC_OUT}" @ONLY)
string(REPLACE "\${prefix}" "${CMAKE_INSTALL_PREFIX}" _libdir "${GRAPHD_PC_LIBDIR}")
file(INSTALL DESTINATION "${_libdir}/pkgconfig" TYPE FILE FILES "${GRAPHD_PC_OUT}")
