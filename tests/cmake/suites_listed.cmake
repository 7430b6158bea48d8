# Fails naming each GoogleTest suite of a binary that a list of suites leaves out: the multi-process binary's ctest
# entries are one per listed suite and world size (tests/CMakeLists.txt), so an unlisted suite would never run.
#
#   cmake -D BINARY=... -D LISTED=A,B,C -P suites_listed.cmake
cmake_minimum_required(VERSION 3.16)  # script mode: if(IN_LIST) needs the policy
include(${CMAKE_CURRENT_LIST_DIR}/gtest_suites.cmake)
string(REPLACE "," ";" LISTED "${LISTED}")
gtest_suites("${BINARY}" "*" suites)
set(missing "")
foreach(suite IN LISTS suites)
  if(NOT suite IN_LIST LISTED)
    list(APPEND missing "${suite}")
  endif()
endforeach()
if(missing)
  string(REPLACE ";" ", " missing "${missing}")
  message(FATAL_ERROR "suites without ctest entries: ${missing} (add them to SHARDTRAIN_MULTIPROCESS_SUITES in "
                      "tests/CMakeLists.txt)")
endif()
list(LENGTH suites count)
message(STATUS "every one of the ${count} suites has its entries")
