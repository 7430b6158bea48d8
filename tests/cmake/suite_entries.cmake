# Writes one ctest entry per GoogleTest suite of a test binary (run after each build of it, as
# gtest_discover_tests does per test): each test of a unit binary is a fraction of a second, loading LibTorch is
# half a second a process, so one process a suite instead of one a test. A failure still names its suite in ctest
# and its test in the output.
#
#   cmake -D BINARY=... -D PREFIX=unit. -D EXCLUDE=A.*:B.C -D LABEL=fast -D OUT=file.cmake -P suite_entries.cmake
#
# EXCLUDE: a GoogleTest filter of the tests that have entries of their own (left out of their suite's entry).
# An entry's binary exits 77 (tests/support/skip_code.h) when it passed but skipped a test: ctest says Skipped.
foreach(var BINARY PREFIX LABEL OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "suite_entries.cmake: -D ${var}=... is missing")
  endif()
endforeach()
set(negative "")
if(EXCLUDE)
  set(negative "-${EXCLUDE}")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/gtest_suites.cmake)
gtest_suites("${BINARY}" "*${negative}" suites)
if(NOT suites)
  message(FATAL_ERROR "suite_entries.cmake: '${BINARY}' lists no test suite")
endif()
set(text "# Written by tests/cmake/suite_entries.cmake from ${BINARY} --gtest_list_tests\n")
foreach(suite IN LISTS suites)
  string(APPEND text "add_test([=[${PREFIX}${suite}]=] [=[${BINARY}]=] [=[--gtest_filter=${suite}.*${negative}]=])\n"
         "set_tests_properties([=[${PREFIX}${suite}]=] PROPERTIES LABELS ${LABEL} SKIP_RETURN_CODE 77)\n")
endforeach()
file(WRITE "${OUT}" "${text}")
