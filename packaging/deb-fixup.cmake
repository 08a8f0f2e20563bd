# Run by `cpack -G DEB` (CPACK_PRE_BUILD_SCRIPTS, set in cmake/Packaging.cmake)
# on the staged tree, after `cmake --install` and before it is packed: turns
# what the install rules put there into what Debian's policy and lintian
# expect, as debhelper would.
#  - man pages compressed (gzip -9n, no name or time stamp: reproducible);
#  - /usr/share/doc/graphd/copyright and changelog.gz (a native package),
#    the changelog's last entry being this version's;
#  - the lintian overrides, justified in packaging/lintian-overrides;
#  - binaries stripped of .comment and .note, as dh_strip does;
#  - every file under /etc listed in packaging/conffiles, and the reverse.
set(root ${CPACK_TEMPORARY_INSTALL_DIRECTORY})
set(pkg ${CPACK_GRAPHD_SOURCE_DIR}/packaging)
set(doc ${root}/usr/share/doc/graphd)

# Debian's layout, which only a build configured for it has.
foreach(f usr/sbin/graphd etc/graphd/graphd.conf.example lib/systemd/system/graphd.service)
  if(NOT EXISTS ${root}/${f})
    message(FATAL_ERROR "the package has no /${f}: configure the build with "
      "-DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_INSTALL_SYSCONFDIR=/etc "
      "-DGRAPHD_SYSTEMD_UNITDIR=/lib/systemd/system (packaging/build-deb.sh does)")
  endif()
endforeach()

function(gzip_n file)
  execute_process(COMMAND gzip -9nf ${file} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "gzip -9n ${file} failed")
  endif()
endfunction()

file(GLOB _man ${root}/usr/share/man/man*/*)
foreach(f IN LISTS _man)
  if(NOT f MATCHES "\\.gz$")
    gzip_n(${f})
  endif()
endforeach()

# The changelog's last entry is this version's: a version bump needs one.
file(STRINGS ${pkg}/changelog _top LIMIT_COUNT 1)
if(NOT _top MATCHES "^graphd \\(${CPACK_PACKAGE_VERSION}\\) ")
  message(FATAL_ERROR "packaging/changelog starts with '${_top}': "
                      "add an entry for graphd ${CPACK_PACKAGE_VERSION}")
endif()
file(COPY_FILE ${pkg}/copyright ${doc}/copyright)
file(COPY_FILE ${pkg}/changelog ${doc}/changelog)
gzip_n(${doc}/changelog)

file(MAKE_DIRECTORY ${root}/usr/share/lintian/overrides)
file(COPY_FILE ${pkg}/lintian-overrides ${root}/usr/share/lintian/overrides/graphd)

foreach(f usr/sbin/graphd usr/bin/graphctl)
  execute_process(COMMAND ${CPACK_GRAPHD_STRIP} --remove-section=.comment
    --remove-section=.note ${root}/${f} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "strip ${f} failed")
  endif()
endforeach()
file(GLOB _libs ${root}/usr/lib/*/libgraphd.so.*.*)
foreach(f IN LISTS _libs)
  execute_process(COMMAND ${CPACK_GRAPHD_STRIP} --remove-section=.comment
    --remove-section=.note --strip-unneeded ${f} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "strip ${f} failed")
  endif()
endforeach()

file(STRINGS ${pkg}/conffiles _conf)
file(GLOB_RECURSE _etc RELATIVE ${root} ${root}/etc/*)
list(TRANSFORM _etc PREPEND /)
list(SORT _etc)
list(SORT _conf)
if(NOT _etc STREQUAL _conf)
  message(FATAL_ERROR "packaging/conffiles lists ${_conf}, but the package's /etc holds ${_etc}")
endif()

# The symbols file: libgraphd's exported symbols, each with the first
# version that had it (packaging/symbols). Any difference fails the build
# (-c2): a symbol gone from the library needs a new soname, and a new one
# goes into packaging/symbols with the version that first has it.
file(MAKE_DIRECTORY ${CPACK_GRAPHD_DEB_DIR})
execute_process(COMMAND dpkg-gensymbols -v${CPACK_PACKAGE_VERSION} -pgraphd -P${root}
  -I${pkg}/symbols -O${CPACK_GRAPHD_DEB_DIR}/symbols -c2 RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "dpkg-gensymbols: libgraphd's symbols differ from packaging/symbols (see the diff above)")
endif()
