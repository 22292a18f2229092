# Installs the build tree into a prefix, then configures, builds and runs tests/consumer against it.
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/build"
                        "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_BUILD_TYPE=Release
                        "-DEXAMPLES_DIR=${EXAMPLES_DIR}"
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" -j 2 RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND "${WORK_DIR}/build/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "consumer output: ${out}${err}")
if(rc)
  message(FATAL_ERROR "the consumer failed: ${rc}")
endif()
# It never calls configure_runtime(): where LibTorch starts on fewer threads than the cores (1 on
# Debian's build), its first fit must say so, once.
execute_process(COMMAND nproc OUTPUT_VARIABLE cores OUTPUT_STRIP_TRAILING_WHITESPACE)
if(cores GREATER 1)
  string(REGEX MATCHALL "call baton::configure_runtime\\(\\)" notes "${err}")
  list(LENGTH notes n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "expected one runtime note on stderr (${cores} cores, configure_runtime never called), got ${n}: ${err}")
  endif()
endif()

# The testing kit in both include orders: the deliberately failing check fails the test binary
# (Catch2 exits with the number of failed assertions: 2) with baton's message, not SIGABRT.
foreach(order catch_first baton_first)
  execute_process(COMMAND "${WORK_DIR}/build/kit_${order}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc STREQUAL "2")
    message(FATAL_ERROR "kit_${order}: expected exit 2 (two failed checks), got ${rc}: ${out}${err}")
  endif()
  string(FIND "${out}${err}" "FAILED: deliberately failing check: the loss went from 0.69 to 0.70" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "kit_${order}: the failing check's message is not shown: ${out}${err}")
  endif()
endforeach()
# The testing kit's example runs its checks (they pass).
execute_process(COMMAND "${WORK_DIR}/build/example_testing_my_model" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc)
  message(FATAL_ERROR "example_testing_my_model failed: ${rc}: ${out}${err}")
endif()
