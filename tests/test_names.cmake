# CTest splits a test name at ';' (catch_discover_tests registers each Catch2 test by its name), so
# a TEST_CASE whose name holds one runs as two tests that both fail. Fails naming each such case.
file(GLOB sources "${TESTS_DIR}/*.cpp")
set(bad "")
foreach(source ${sources})
  file(READ "${source}" text)
  # A CMake list is ';'-separated: mark the semicolons before matching.
  string(REPLACE ";" "<semicolon>" text "${text}")
  string(REGEX MATCHALL "TEST_CASE\\(\"[^\"\n]*<semicolon>[^\"\n]*\"" hits "${text}")
  foreach(hit IN LISTS hits)
    get_filename_component(name "${source}" NAME)
    string(REPLACE "<semicolon>" "[;]" hit "${hit}")
    string(APPEND bad "\n  ${name}: ${hit}")
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "test names with ';' (CTest would split them; use ',' or ':'):${bad}")
endif()
message(STATUS "no test name holds ';'")
