# gtest_suites(BINARY FILTER OUT): the GoogleTest suites of BINARY whose tests FILTER selects, in order
# ("Suite", "Prefix/Suite" for parameterized ones), from its --gtest_list_tests.
function(gtest_suites binary filter out)
  execute_process(COMMAND "${binary}" --gtest_list_tests "--gtest_filter=${filter}"
                  OUTPUT_VARIABLE listing RESULT_VARIABLE status TIMEOUT 60)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "'${binary} --gtest_list_tests' exited with ${status}:\n${listing}")
  endif()
  string(REPLACE "\n" ";" lines "${listing}")
  set(suites "")
  foreach(line IN LISTS lines)
    # A suite's line is "Suite." (typed ones: "Suite.  # TypeParam = ..."); its tests follow indented.
    if(line MATCHES "^([A-Za-z0-9_/]+)\\.( |$)")
      list(APPEND suites "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${out} "${suites}" PARENT_SCOPE)
endfunction()
