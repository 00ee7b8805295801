# Runs one lab's grader (a rung's GoogleTest executable, filtered to the lab's tests) and judges
# the outcome, so that a grader can neither pass by testing nothing nor "fail" by crashing:
#   cmake -DLAB=<name> -DGRADER=<executable> -DFILTER=<gtest filter> -DTESTS=<how many it runs>
#         -DEXPECT=pass|fail [-DFILE=<what is graded, for messages>] -P run_grader.cmake
# EXPECT=pass: every one of the TESTS tests passes (the answer key; a student's finished lab).
# EXPECT=fail: the grader fails cleanly, by a failed test, on the skeleton as shipped.
# Either way, when every test skipped (a GPU lab on a machine with no GPU) it prints
# "flash_ladder lab skipped", which labs/CMakeLists.txt gives ctest as SKIP_REGULAR_EXPRESSION.
foreach(v LAB GRADER FILTER TESTS EXPECT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_grader.cmake: -D${v}=... is missing")
  endif()
endforeach()
if(NOT DEFINED FILE)
  set(FILE "the file under test")
endif()
if(NOT EXISTS "${GRADER}")
  get_filename_component(target "${GRADER}" NAME_WE)
  message(FATAL_ERROR "lab ${LAB}: its grader ${GRADER} is not built (did the build fail?). "
                      "Build it with: cmake --build <build folder> --target ${target}")
endif()

execute_process(COMMAND "${GRADER}" "--gtest_filter=${FILTER}" --gtest_color=no
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")

# What GoogleTest says it ran, and how many of those it skipped.
set(ran -1)
if(out MATCHES "Running ([0-9]+) tests? from")
  set(ran ${CMAKE_MATCH_1})
endif()
set(skipped 0)
if(out MATCHES "\\[  SKIPPED \\] ([0-9]+) tests?, listed below")
  set(skipped ${CMAKE_MATCH_1})
endif()

if(NOT rc MATCHES "^[01]$")
  message(FATAL_ERROR "lab ${LAB}: the grader did not finish (${rc}) on ${FILE}. A lab must fail "
                      "by a failed test, never by a crash or a hang.")
endif()
if(NOT ran EQUAL TESTS)
  message(FATAL_ERROR "lab ${LAB}: the filter ${FILTER} ran ${ran} tests, not the ${TESTS} this lab "
                      "is graded by. Has the rung's test file (tests/test_<rung>.cpp) renamed or dropped "
                      "one? Update the lab's FILTER and TESTS in labs/CMakeLists.txt.")
endif()
if(rc EQUAL 0 AND skipped EQUAL ran)
  message("flash_ladder lab skipped: lab ${LAB}: every grader test skipped (the reason is above; "
          "a GPU lab needs a CUDA build and a GPU)")
  return()
endif()

if(EXPECT STREQUAL "pass")
  if(NOT rc EQUAL 0)
    get_filename_component(target "${GRADER}" NAME_WE)
    message(FATAL_ERROR "lab ${LAB}: not yet: ${FILE} fails the grader (the failures are above). "
                        "ctest runs the grader as last built: after editing ${FILE}, rebuild it first "
                        "(cmake --build <build folder> --target ${target}).")
  endif()
  message("lab ${LAB}: ${FILE} passes all ${ran} grader tests")
elseif(EXPECT STREQUAL "fail")
  if(rc EQUAL 0)
    message(FATAL_ERROR "lab ${LAB}: the grader PASSED on ${FILE}. As shipped, a lab's skeleton must "
                        "fail its grader, or the grader proves nothing. (If you have solved the lab in "
                        "this file, this is expected: configure with -DFLASH_LADDER_LABS=student.)")
  endif()
  if(NOT out MATCHES "\\[  FAILED  \\]")
    message(FATAL_ERROR "lab ${LAB}: the grader exited 1 without a failed test on ${FILE}")
  endif()
  message("lab ${LAB}: as expected, the grader fails on the skeleton ${FILE}")
else()
  message(FATAL_ERROR "run_grader.cmake: EXPECT must be pass or fail, not '${EXPECT}'")
endif()
