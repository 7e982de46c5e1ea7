# What `cmake --install build --prefix P` puts under P (all of it under P, nothing outside),
# and the Debian package of the same (`cpack -G DEB`, configured in cmake/packaging.cmake):
#   bin/        braidrun, braidctl, braid-coordinator, braid-bench
#   include/    braid/c_api.h
#   lib/        libbraid_c.so.1 (the C API), cmake/braid/ (find_package(braid): braid::c),
#               pkgconfig/braid.pc
#   BRAID_PYTHON_INSTALL_DIR (lib/python3.X/dist-packages)   the braid Python package
#   share/doc/braid/   README.md, BENCHMARKS.md, docs/*.md (the user guide README.md links to)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS braidrun braidctl braid-coordinator braid-bench
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

install(TARGETS braid_c EXPORT braidTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/braid)
set(BRAID_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/braid)
install(EXPORT braidTargets NAMESPACE braid:: DESTINATION ${BRAID_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/braidConfig.cmake.in
  ${CMAKE_BINARY_DIR}/braidConfig.cmake INSTALL_DESTINATION ${BRAID_CMAKE_DIR})
# The C ABI's promise (bindings/c/include/braid/c_api.h): compatible within a major version.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/braidConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/braidConfig.cmake ${CMAKE_BINARY_DIR}/braidConfigVersion.cmake
  DESTINATION ${BRAID_CMAKE_DIR})

# ${pcfiledir}-relative, so the file stays right wherever the prefix is.
configure_file(${PROJECT_SOURCE_DIR}/cmake/braid.pc.in ${CMAKE_BINARY_DIR}/braid.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/braid.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/BENCHMARKS.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR})
# The user guide keeps its place beside README.md, so README's relative links (docs/X.md)
# resolve in the installed copy too. docs/benchmarks/ (data behind BENCHMARKS.md) stays out.
file(GLOB BRAID_USER_GUIDE CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES ${BRAID_USER_GUIDE} DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
