# The Debian package of what cmake/install.cmake installs, with prefix /usr:
#   cmake --build build --target package     (or: cd build && cpack -G DEB)
# gives build/braid_<version>_amd64.deb. Its dependencies are the Debian packages of the
# shared libraries braid links (found by dpkg-shlibdeps) and those its Python package and
# tools use at run time.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME braid)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "braid developers <braid@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "collective communication runtime for data-parallel training, with gradient compression")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Run time, beyond the shared libraries: the Python package's numpy, the ssh client braidrun
# starts remote ranks with, setsid (util-linux) on the hosts it reaches, and OpenBLAS, which
# PowerSGD opens with dlopen (so dpkg-shlibdeps cannot see it).
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "python3 (>= 3.11), python3-numpy, openssh-client, util-linux, libopenblas0")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torch, openmpi-bin, slurm-client")
# Debug information stays in the build tree; the package carries stripped binaries.
set(CPACK_STRIP_FILES ON)
# gzip: a few seconds instead of xz's minute on two cores.
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
include(CPack)
