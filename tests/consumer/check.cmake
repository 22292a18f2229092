# Installs the build tree into a prefix, then configures, builds and runs tests/consumer against it.
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G Ninja
                        "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_BUILD_TYPE=Release
                        "-DEXAMPLES_DIR=${EXAMPLES_DIR}" "-DDOCS_DIR=${DOCS_DIR}"
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
# -k 0: every target that can be built is, so all the blocks that fail are named at once.
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" -j 2 -- -k 0 RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc)
  # A block of the docs that does not compile or link: name it (its diagnostics carry the
  # Markdown's file and line through #line; a link error names the block's namespace).
  include("${WORK_DIR}/build/doc_snippets/manifest.cmake")
  set(broken "")
  foreach(block IN LISTS doc_blocks)
    string(REPLACE "|" ";" block "${block}")
    list(GET block 0 name)
    list(GET block 1 file)
    list(GET block 2 first)
    list(GET block 3 last)
    string(REPLACE "." "\\." file_re "${file}")
    string(REGEX MATCHALL "${file_re}:[0-9]+:([0-9]+:)? (fatal )?error" hits "${out}")
    set(hit FALSE)
    foreach(h IN LISTS hits)
      string(REGEX MATCH ":([0-9]+):" _ "${h}")
      if(CMAKE_MATCH_1 GREATER_EQUAL first AND CMAKE_MATCH_1 LESS_EQUAL last)
        set(hit TRUE)
      endif()
    endforeach()
    string(FIND "${out}" "${name}::" at)
    if(hit OR NOT at EQUAL -1)
      math(EXPR fence "${first} + 1")
      string(APPEND broken "  ${file}:${fence}\n")
    endif()
  endforeach()
  message(NOTICE "${out}")   # as the compiler wrote it (FATAL_ERROR would rewrap it)
  if(broken)
    message(FATAL_ERROR "These C++ blocks of the docs do not compile or link against the installed "
                        "package (fix the block, or mark it as tests/consumer/snippets.cmake says):\n${broken}")
  endif()
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

# The complete programs among the docs' C++ blocks run and succeed.
include("${WORK_DIR}/build/doc_snippets/manifest.cmake")
foreach(run IN LISTS doc_runs)
  if(run STREQUAL "")
    continue()
  endif()
  string(REPLACE "|" ";" run "${run}")
  list(GET run 0 program)
  list(GET run 1 where)
  execute_process(COMMAND "${WORK_DIR}/build/${program}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  WORKING_DIRECTORY "${WORK_DIR}")
  if(rc)
    message(FATAL_ERROR "the C++ program at ${where} failed: ${rc}: ${out}${err}")
  endif()
endforeach()
