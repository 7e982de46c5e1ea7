#!/bin/sh
# Runs a CMake script (`cmake -D... -P script.cmake`) as a Bazel test, so checks written for
# ctest (e.g. tests/c_api/check_exports.cmake) run unchanged. Arguments go to cmake as given;
# paths are relative to the runfiles tree, the test's working directory.
exec cmake "$@"
